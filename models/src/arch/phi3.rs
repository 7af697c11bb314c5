//! The phi3 architecture (Phi-3 and Phi-3.5, Microsoft 2024): llama's decoder
//! (pre-norm blocks, RMSNorm, grouped-query attention, SwiGLU MLP) as
//! llama.cpp runs it, with four differences, all read from the GGUF:
//!
//! 1. Fused storage. Q, K and V are usually one `blk.N.attn_qkv.weight` of
//!    `qd + 2 kvd` rows (separate `attn_{q,k,v}` are accepted too, as
//!    llama.cpp accepts them), and gate and up are always one
//!    `blk.N.ffn_up.weight` of `2 n_ff` rows, gate first (ggml's `swiglu`
//!    activates the first half and multiplies by the second). Both are split
//!    by rows at load: every output of a matmul is its own dot product of one
//!    weight row with one activation row, so the parts compute exactly the
//!    numbers of the fused product, and the trainer's Q/K/V/gate/up adapters
//!    keep llama's shapes. Export writes them fused again ([`fuse_replacements`]).
//! 2. RoPE rotates halves (NeoX).
//! 3. The query is multiplied by `1/sqrt(head_dim)` after RoPE and the scores
//!    are not scaled, where llama scales the scores: another rounding of the
//!    f16 query, so it matters for bit-exactness.
//! 4. LongRoPE (Phi-3 128k): per-pair frequency factors
//!    `rope_factors_long.weight` and `rope_factors_short.weight`, llama.cpp
//!    taking the long ones when the context exceeds
//!    `phi3.rope.scaling.original_context_length` (Tern's context is the
//!    model's `context_length`), and `phi3.rope.scaling.attn_factor` scaling
//!    every cos and sin ([`rope_factors`]).
//!
//! llama.cpp disables Phi-3's sliding window (`attention.sliding_window` is
//! read and then ignored), so Tern ignores it too. Projection biases, which
//! llama.cpp's phi3 would add, are refused by name rather than dropped. The
//! forward itself is [`super::llama`]'s, run with [`FEATURES`].

use std::collections::HashMap;
use std::ops::Range;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, QTensor};
use candle_core::{DType, Device, Tensor};

use super::llama::{Features, Llama, RopeFactors, RopeStyle, LLAMA};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::lora::LoraTarget;
use crate::weight::Precision;

/// What phi3 changes in the llama decoder.
pub const FEATURES: Features = Features {
    rope: RopeStyle::Neox,
    fused_projections: true,
    scale_query: true,
    rope_factors: RopeFactors::LongRope,
    ..LLAMA
};

/// Loads a phi3 GGUF held as `precision`.
pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Llama> {
    let config = ModelConfig::from_gguf(file)?;
    refuse_unsupported(file, &config)?;
    Llama::load_with(file, precision, FEATURES)
}

/// What llama.cpp's phi3 would run and Tern does not: projection biases and a
/// partial rotary dimension.
fn refuse_unsupported(file: &GgufFile, c: &ModelConfig) -> Result<()> {
    let key = "phi3.rope.dimension_count";
    if let Ok(n_rot) = file.u32(key) {
        if n_rot as usize != c.head_dim {
            return Err(ModelError::UnsupportedFeature {
                key: key.into(),
                value: n_rot.to_string(),
                supported: format!("the head dimension, {}", c.head_dim),
            });
        }
    }
    for i in 0..c.n_layer {
        for stem in ["attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output"] {
            let name = format!("blk.{i}.{stem}.bias");
            if file.has_tensor(&name) {
                return Err(ModelError::BadTensor {
                    name,
                    reason: "phi3 projection biases are not supported".into(),
                });
            }
        }
    }
    Ok(())
}

/// The fused Q/K/V tensor of block `layer`.
fn qkv_name(layer: usize) -> String {
    format!("blk.{layer}.attn_qkv.weight")
}

/// The fused gate/up tensor of block `layer`.
fn gate_up_name(layer: usize) -> String {
    format!("blk.{layer}.ffn_up.weight")
}

/// Rows `parts[0]`, then `parts[1]`, ... of the `[sum(parts), cols]` tensor
/// `name`, each as its own quantized tensor with the source's blocks
/// unchanged (a row is whole blocks, so a row range is a byte range).
pub(crate) fn split_rows(
    file: &GgufFile,
    name: &str,
    parts: &[usize],
    cols: usize,
) -> Result<Vec<QTensor>> {
    let total: usize = parts.iter().sum();
    let t = file.tensor(name)?;
    if t.shape().dims() != [total, cols] {
        return Err(ModelError::BadTensor {
            name: name.into(),
            reason: format!(
                "expected shape {:?}, found {:?}",
                [total, cols],
                t.shape().dims()
            ),
        });
    }
    let dtype = t.dtype();
    let row_bytes = cols / dtype.block_size() * dtype.type_size();
    let data = t.data()?;
    let mut out = Vec::with_capacity(parts.len());
    let mut start = 0;
    for &rows in parts {
        let bytes = &data[start * row_bytes..(start + rows) * row_bytes];
        out.push(qtensor_from_ggml(
            dtype,
            bytes,
            vec![rows, cols],
            &Device::Cpu,
        )?);
        start += rows;
    }
    Ok(out)
}

/// The LongRoPE frequency factors (one per rotated pair), chosen as llama.cpp
/// chooses them for a context of `c.context_length`: the long factors when
/// it exceeds `rope.scaling.original_context_length` (default: the context
/// length itself), else the short ones; either may be absent (no factors).
/// (`rope.scaling.attn_factor` is applied to the tables by the loader.)
pub(crate) fn rope_factors(file: &GgufFile, c: &ModelConfig) -> Result<Option<Vec<f32>>> {
    let arch = &c.architecture;
    let original = file
        .u32(&format!("{arch}.rope.scaling.original_context_length"))
        .map_or(c.context_length, |v| v as usize);
    let name = if c.context_length > original {
        "rope_factors_long.weight"
    } else {
        "rope_factors_short.weight"
    };
    if !file.has_tensor(name) {
        return Ok(None);
    }
    let t = file.tensor(name)?;
    if t.shape().dims() != [c.head_dim / 2] {
        return Err(ModelError::BadTensor {
            name: name.into(),
            reason: format!(
                "expected shape [{}], found {:?}",
                c.head_dim / 2,
                t.shape().dims()
            ),
        });
    }
    let f: Vec<f32> = t.dequantize(&Device::Cpu)?.to_vec1()?;
    if let Some(bad) = f.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        return Err(ModelError::BadTensor {
            name: name.into(),
            reason: format!("factor {bad} is not a positive number"),
        });
    }
    Ok(Some(f))
}

/// Where projection `target` of block `layer` lives in `file`: the tensor and
/// its rows. Phi-3's fused tensors hold several projections; everything else
/// (and every other architecture) is one tensor, all rows.
pub fn projection_location(
    file: &GgufFile,
    c: &ModelConfig,
    layer: usize,
    target: LoraTarget,
) -> (String, Range<usize>) {
    let (qd, kvd, ff) = (c.q_dim(), c.n_kv_head * c.head_dim, c.n_ff);
    let whole = || {
        let rows = target.shape(c).0;
        (
            format!("blk.{layer}.{}.weight", target.gguf_stem()),
            0..rows,
        )
    };
    if c.architecture != "phi3" {
        return whole();
    }
    let qkv = qkv_name(layer);
    match target {
        LoraTarget::Q if file.has_tensor(&qkv) => (qkv, 0..qd),
        LoraTarget::K if file.has_tensor(&qkv) => (qkv, qd..qd + kvd),
        LoraTarget::V if file.has_tensor(&qkv) => (qkv, qd + kvd..qd + 2 * kvd),
        LoraTarget::Gate => (gate_up_name(layer), 0..ff),
        LoraTarget::Up => (gate_up_name(layer), ff..2 * ff),
        _ => whole(),
    }
}

/// Projection `target` of block `layer` as the model computes with it, f32
/// `[out, in]`: its rows of the tensor that holds it (see
/// [`projection_location`]).
pub fn projection_weight(
    file: &GgufFile,
    c: &ModelConfig,
    layer: usize,
    target: LoraTarget,
) -> Result<Tensor> {
    let (name, rows) = projection_location(file, c, layer, target);
    let w = crate::quant::dequantize(file.tensor(&name)?)?;
    if w.dim(0)? < rows.end {
        return Err(ModelError::BadTensor {
            name,
            reason: format!("has {} rows, {} expected", w.dim(0)?, rows.end),
        });
    }
    Ok(w.narrow(0, rows.start, rows.len())?.contiguous()?)
}

/// Replacement tensors named by the model's own projections
/// (`blk.N.attn_q.weight`, `blk.N.ffn_gate.weight`, ... as the trainer names
/// them) rewritten into the tensors `file` holds: a phi3 model's Q/K/V go into
/// `attn_qkv` and its gate/up into `ffn_up`, the rows not replaced taken from
/// the file. Other names, and other architectures, pass through unchanged.
pub fn fuse_replacements(
    file: &GgufFile,
    replacements: HashMap<String, Tensor>,
) -> Result<HashMap<String, Tensor>> {
    if file.str("general.architecture")? != "phi3" {
        return Ok(replacements);
    }
    let c = ModelConfig::from_gguf(file)?;
    let mut out = HashMap::with_capacity(replacements.len());
    let mut parts: Vec<(String, Range<usize>, Tensor)> = Vec::new();
    for (name, t) in replacements {
        let Some((layer, target)) = projection_of(&name) else {
            out.insert(name, t);
            continue;
        };
        let (holder, rows) = projection_location(file, &c, layer, target);
        // A tensor the file holds under this name, replaced whole (a fused
        // `ffn_up` of `2 n_ff` rows, or any unfused projection).
        let held_rows = file.tensor_dims(&holder).and_then(|d| d.first().copied());
        if holder == name && t.dims().first().copied() == held_rows {
            out.insert(name, t);
            continue;
        }
        parts.push((holder, rows, t));
    }
    for (holder, rows, part) in parts {
        let full = match out.remove(&holder) {
            Some(t) => t,
            None => crate::quant::dequantize(file.tensor(&holder)?)?,
        };
        let cols = full.dim(1)?;
        if part.dims() != [rows.len(), cols] {
            return Err(ModelError::ShapeMismatch {
                name: holder,
                expected: vec![rows.len(), cols],
                found: part.dims().to_vec(),
            });
        }
        let part = part.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
        let full = full.slice_assign(&[rows, 0..cols], &part)?;
        out.insert(holder, full);
    }
    Ok(out)
}

/// `(layer, target)` of a name `blk.N.<projection stem>.weight`.
fn projection_of(name: &str) -> Option<(usize, LoraTarget)> {
    let rest = name.strip_prefix("blk.")?.strip_suffix(".weight")?;
    let (layer, stem) = rest.split_once('.')?;
    let target = LoraTarget::ALL
        .into_iter()
        .find(|t| t.gguf_stem() == stem)?;
    Some((layer.parse().ok()?, target))
}
