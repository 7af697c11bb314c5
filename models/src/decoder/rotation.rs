//! The RoPE tables a decoder rotates with, read at load: the global layers'
//! (with any long-context frequency factors and LongRoPE's magnitude
//! correction) and, when the configuration has sliding-window layers, theirs
//! (their own base, no scaling), each with the [`Rotary`] a cache that
//! re-positions keys is handed.

use candle_core::{Device, Tensor};

use super::features::{Features, RopeFactors, RopeStyle};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::rope::{rope_tables, Rotary};

/// One pair of RoPE tables and the rotation they apply.
pub(super) struct RopeTable {
    /// `[context_length, hd/2]` f32.
    pub(super) cos: Tensor,
    /// `[context_length, hd/2]` f32.
    pub(super) sin: Tensor,
    /// The same rotation, handed to caches that watch queries.
    pub(super) rotary: Rotary,
}

/// The tables of the global layers and, if any, the sliding-window layers.
pub(super) struct RopeTables {
    pub(super) global: RopeTable,
    pub(super) local: Option<RopeTable>,
}

impl RopeTables {
    /// The tables `file` and `config` call for, rotating in `features`' style.
    pub(super) fn load(file: &GgufFile, config: &ModelConfig, features: &Features) -> Result<Self> {
        // Long-context RoPE: per-pair frequency factors.
        let factors = freq_factors(file, config, features.rope_factors)?;
        let (mut cos, mut sin) = rope_tables(config, factors.as_deref())?;
        let neox = features.rope == RopeStyle::Neox;
        let rotary = Rotary::new(config, neox, factors.as_deref());
        if let Some(m) = attn_factor(file, config)? {
            cos = (cos * m as f64)?;
            sin = (sin * m as f64)?;
        }
        let local = match &config.sliding {
            Some(s) => {
                let local = ModelConfig {
                    rope_base: s.rope_base,
                    rope_freq_scale: 1.0,
                    ..config.clone()
                };
                let (cos, sin) = rope_tables(&local, None)?;
                let rotary = Rotary::new(&local, neox, None);
                Some(RopeTable { cos, sin, rotary })
            }
            None => None,
        };
        Ok(Self {
            global: RopeTable { cos, sin, rotary },
            local,
        })
    }

    /// The tables of a layer: the local ones on a sliding layer (when there
    /// are any), else the global ones.
    pub(super) fn of(&self, sliding: bool) -> &RopeTable {
        match (&self.local, sliding) {
            (Some(local), true) => local,
            _ => &self.global,
        }
    }
}

/// The per-pair frequency factors the architecture's `kind` reads, if the
/// file has them.
fn freq_factors(
    file: &GgufFile,
    config: &ModelConfig,
    kind: RopeFactors,
) -> Result<Option<Vec<f32>>> {
    Ok(match kind {
        RopeFactors::Llama3 if file.has_tensor("rope_freqs.weight") => {
            let t = file.tensor_shaped("rope_freqs.weight", &[config.head_dim / 2])?;
            Some(t.dequantize(&Device::Cpu)?.to_vec1()?)
        }
        RopeFactors::Llama3 => None,
        RopeFactors::LongRope => long_rope_factors(file, config)?,
    })
}

/// The LongRoPE frequency factors (one per rotated pair), chosen as llama.cpp
/// chooses them for a context of `c.context_length`: the long factors when
/// it exceeds `rope.scaling.original_context_length` (default: the context
/// length itself), else the short ones; either may be absent (no factors).
/// (`rope.scaling.attn_factor` is applied to the tables, [`attn_factor`].)
fn long_rope_factors(file: &GgufFile, c: &ModelConfig) -> Result<Option<Vec<f32>>> {
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

/// The factor llama.cpp multiplies every cos and sin by, in f32
/// (`rope.scaling.attn_factor`, LongRoPE's magnitude correction), when the
/// file declares one other than 1.
fn attn_factor(file: &GgufFile, config: &ModelConfig) -> Result<Option<f32>> {
    let key = format!("{}.rope.scaling.attn_factor", config.architecture);
    if file.get(&key).is_none() {
        return Ok(None);
    }
    let m = file.f32(&key)?;
    if !(m.is_finite() && m > 0.0) {
        return Err(ModelError::MissingMetadata { key });
    }
    Ok((m != 1.0).then_some(m))
}
