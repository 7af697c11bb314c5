//! Projections a GGUF stores fused, several in one tensor (Phi-3's
//! `attn_qkv`, `[q; k; v]`, and `ffn_up`, `[gate; up]`): split by rows at
//! load, located for the trainer's merge, and written back fused at export.
//!
//! Every output of a matmul is its own dot product of one weight row with one
//! activation row, so the parts compute exactly the numbers of the fused
//! product, and the trainer's Q/K/V/gate/up adapters keep the unfused shapes.
//! Which architectures fuse is their [`super::Features::fused_projections`].

use std::collections::HashMap;
use std::ops::Range;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::lora::LoraTarget;

/// The fused Q/K/V tensor of block `layer`.
pub(crate) fn qkv_name(layer: usize) -> String {
    format!("blk.{layer}.attn_qkv.weight")
}

/// The fused gate/up tensor of block `layer`.
pub(crate) fn gate_up_name(layer: usize) -> String {
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

/// Where projection `target` of block `layer` lives in `file`: the tensor and
/// its rows. With `fused` storage one tensor holds several projections;
/// everything else is one tensor, all rows.
pub fn projection_location(
    file: &GgufFile,
    c: &ModelConfig,
    layer: usize,
    target: LoraTarget,
    fused: bool,
) -> (String, Range<usize>) {
    let (qd, kvd, ff) = (c.q_dim(), c.n_kv_head * c.head_dim, c.n_ff);
    let whole = || {
        let rows = target.shape(c).0;
        (
            format!("blk.{layer}.{}.weight", target.gguf_stem()),
            0..rows,
        )
    };
    if !fused {
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
    fused: bool,
) -> Result<Tensor> {
    let (name, rows) = projection_location(file, c, layer, target, fused);
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
/// them) rewritten into the fused tensors `file` holds: Q/K/V go into
/// `attn_qkv` and gate/up into `ffn_up`, the rows not replaced taken from the
/// file. Other names pass through unchanged. (For a file whose architecture
/// does not fuse, the replacements need no rewriting at all.)
pub fn fuse_replacements(
    file: &GgufFile,
    replacements: HashMap<String, Tensor>,
) -> Result<HashMap<String, Tensor>> {
    let c = ModelConfig::from_gguf(file)?;
    let mut out = HashMap::with_capacity(replacements.len());
    let mut parts: Vec<(String, Range<usize>, Tensor)> = Vec::new();
    for (name, t) in replacements {
        let Some((layer, target)) = projection_of(&name) else {
            out.insert(name, t);
            continue;
        };
        let (holder, rows) = projection_location(file, &c, layer, target, true);
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::GgmlDType;

    /// Hidden size; two query heads and one KV head of 16.
    const D: usize = 32;
    const QD: usize = 32;
    const KVD: usize = 16;
    const FF: usize = 64;

    /// Distinct, row-identifying values `[rows, D]`, Q8_0 as real files hold them.
    fn rows(n: usize, base: f32) -> QTensor {
        let data: Vec<f32> = (0..n * D)
            .map(|i| base + (i / D) as f32 + (i % D) as f32 / 64.0)
            .collect();
        let t = Tensor::from_vec(data, (n, D), &Device::Cpu).unwrap();
        QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()
    }

    /// A one-block phi3 file with fused `attn_qkv` and `ffn_up`, opened.
    fn fused_file(dir: &std::path::Path) -> GgufFile {
        let path = dir.join("fused.gguf");
        let named = [
            (qkv_name(0), rows(QD + 2 * KVD, 0.0)),
            (gate_up_name(0), rows(2 * FF, 100.0)),
            ("blk.0.attn_output.weight".to_string(), rows(D, 300.0)),
        ];
        let u = |v: usize| Value::U32(v as u32);
        let meta = [
            ("general.architecture", Value::String("phi3".into())),
            ("phi3.block_count", u(1)),
            ("phi3.embedding_length", u(D)),
            ("phi3.feed_forward_length", u(FF)),
            ("phi3.attention.head_count", u(2)),
            ("phi3.attention.head_count_kv", u(1)),
            ("phi3.context_length", u(64)),
            ("phi3.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("phi3.vocab_size", u(8)),
        ];
        let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        let tensors: Vec<(&str, &QTensor)> = named.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut out = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut out, &meta, &tensors).unwrap();
        GgufFile::open(&path).unwrap()
    }

    fn dequantized(file: &GgufFile, name: &str) -> Tensor {
        crate::quant::dequantize(file.tensor(name).unwrap()).unwrap()
    }

    fn same(a: &Tensor, b: &Tensor) -> bool {
        a.dims() == b.dims()
            && a.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                == b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn split_parts_hold_exactly_the_fused_rows() {
        let dir = tempfile::tempdir().unwrap();
        let file = fused_file(dir.path());
        let full = dequantized(&file, &qkv_name(0));
        let parts = split_rows(&file, &qkv_name(0), &[QD, KVD, KVD], D).unwrap();
        let mut start = 0;
        for (part, n) in parts.into_iter().zip([QD, KVD, KVD]) {
            assert_eq!(part.dtype(), GgmlDType::Q8_0, "blocks kept as stored");
            let part = crate::quant::dequantize(part).unwrap();
            assert!(same(&part, &full.narrow(0, start, n).unwrap()));
            start += n;
        }
        // Parts that do not add up to the tensor are refused by name.
        let err = split_rows(&file, &qkv_name(0), &[QD, KVD], D).unwrap_err();
        assert!(err.to_string().contains("attn_qkv"), "{err}");
    }

    #[test]
    fn each_projection_is_located_in_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let file = fused_file(dir.path());
        let c = ModelConfig::from_gguf(&file).unwrap();
        let at = |t, fused| projection_location(&file, &c, 0, t, fused);
        assert_eq!(at(LoraTarget::Q, true), (qkv_name(0), 0..QD));
        assert_eq!(at(LoraTarget::K, true), (qkv_name(0), QD..QD + KVD));
        assert_eq!(
            at(LoraTarget::V, true),
            (qkv_name(0), QD + KVD..QD + 2 * KVD)
        );
        assert_eq!(at(LoraTarget::Gate, true), (gate_up_name(0), 0..FF));
        assert_eq!(at(LoraTarget::Up, true), (gate_up_name(0), FF..2 * FF));
        let output = "blk.0.attn_output.weight".to_string();
        assert_eq!(at(LoraTarget::O, true), (output, 0..D));
        // Unfused storage: every projection its own tensor, all rows.
        assert_eq!(
            at(LoraTarget::K, false),
            ("blk.0.attn_k.weight".into(), 0..KVD)
        );
        // The weight is those rows of the holder.
        let v = projection_weight(&file, &c, 0, LoraTarget::V, true).unwrap();
        let full = dequantized(&file, &qkv_name(0));
        assert!(same(&v, &full.narrow(0, QD + KVD, KVD).unwrap()));
    }

    #[test]
    fn replacements_are_written_into_their_fused_rows() {
        let dir = tempfile::tempdir().unwrap();
        let file = fused_file(dir.path());
        let k = Tensor::ones((KVD, D), DType::F32, &Device::Cpu).unwrap();
        let gate = (Tensor::ones((FF, D), DType::F32, &Device::Cpu).unwrap() * 2.0).unwrap();
        let norm = Tensor::zeros(D, DType::F32, &Device::Cpu).unwrap();
        let replacements = HashMap::from([
            ("blk.0.attn_k.weight".to_string(), k.clone()),
            ("blk.0.ffn_gate.weight".to_string(), gate.clone()),
            ("output_norm.weight".to_string(), norm.clone()),
        ]);
        let out = fuse_replacements(&file, replacements).unwrap();
        let mut names: Vec<&str> = out.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "blk.0.attn_qkv.weight",
                "blk.0.ffn_up.weight",
                "output_norm.weight"
            ]
        );
        assert!(same(&out["output_norm.weight"], &norm));
        // The replaced rows are the new ones; every other row is the file's.
        let qkv = &out[&qkv_name(0)];
        let held = dequantized(&file, &qkv_name(0));
        assert!(same(&qkv.narrow(0, QD, KVD).unwrap(), &k));
        assert!(same(
            &qkv.narrow(0, 0, QD).unwrap(),
            &held.narrow(0, 0, QD).unwrap()
        ));
        let v_rows = |t: &Tensor| t.narrow(0, QD + KVD, KVD).unwrap();
        assert!(same(&v_rows(qkv), &v_rows(&held)));
        let gate_up = &out[&gate_up_name(0)];
        let held = dequantized(&file, &gate_up_name(0));
        assert!(same(&gate_up.narrow(0, 0, FF).unwrap(), &gate));
        assert!(same(
            &gate_up.narrow(0, FF, FF).unwrap(),
            &held.narrow(0, FF, FF).unwrap()
        ));
    }
}
