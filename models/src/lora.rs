//! LoRA adapters (Hu et al. 2021): a low-rank update `W + (alpha / r) B A` on a
//! projection, applied beside the frozen weight instead of into it.
//!
//! The same adapters run in the learner (dense f32 weights, `A` and `B` trainable)
//! and in serving (quantized weights, `A` and `B` plain f32), so a model can be
//! trained and served with its adapters before anything is merged or exported.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// A projection of a llama block that can carry an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoraTarget {
    /// Query projection (`attn_q`).
    Q,
    /// Key projection (`attn_k`).
    K,
    /// Value projection (`attn_v`).
    V,
    /// Attention output (`attn_output`).
    O,
    /// MLP gate (`ffn_gate`).
    Gate,
    /// MLP up (`ffn_up`).
    Up,
    /// MLP down (`ffn_down`).
    Down,
}

impl LoraTarget {
    /// Every target, in block order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// The GGUF tensor stem of this projection (`blk.N.<stem>.weight`).
    pub fn gguf_stem(self) -> &'static str {
        match self {
            LoraTarget::Q => "attn_q",
            LoraTarget::K => "attn_k",
            LoraTarget::V => "attn_v",
            LoraTarget::O => "attn_output",
            LoraTarget::Gate => "ffn_gate",
            LoraTarget::Up => "ffn_up",
            LoraTarget::Down => "ffn_down",
        }
    }

    /// `(out, in)` of this projection in a model of shape `c`: what an adapter
    /// on it must fit.
    pub fn shape(self, c: &crate::ModelConfig) -> (usize, usize) {
        let (d, qd, kvd) = (c.n_embd, c.q_dim(), c.n_kv_head * c.head_dim);
        match self {
            LoraTarget::Q => (qd, d),
            LoraTarget::O => (d, qd),
            LoraTarget::K | LoraTarget::V => (kvd, d),
            LoraTarget::Gate | LoraTarget::Up => (c.n_ff, d),
            LoraTarget::Down => (d, c.n_ff),
        }
    }

    /// Parses a comma-separated list such as `q,v` or `all`.
    pub fn parse_list(s: &str) -> std::result::Result<Vec<LoraTarget>, String> {
        if s.trim() == "all" {
            return Ok(Self::ALL.to_vec());
        }
        let mut out: Vec<LoraTarget> = s
            .split(',')
            .map(|t| t.trim().parse())
            .collect::<std::result::Result<_, _>>()?;
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err("no LoRA targets".into());
        }
        Ok(out)
    }
}

impl FromStr for LoraTarget {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "q" => LoraTarget::Q,
            "k" => LoraTarget::K,
            "v" => LoraTarget::V,
            "o" => LoraTarget::O,
            "gate" => LoraTarget::Gate,
            "up" => LoraTarget::Up,
            "down" => LoraTarget::Down,
            other => {
                return Err(format!(
                    "unknown LoRA target `{other}` (use q, k, v, o, gate, up, down or all)"
                ))
            }
        })
    }
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::O => "o",
            LoraTarget::Gate => "gate",
            LoraTarget::Up => "up",
            LoraTarget::Down => "down",
        };
        f.write_str(s)
    }
}

/// One adapter: `y += scale * (x A^T) B^T`.
#[derive(Clone, Debug)]
pub struct LoraAdapter {
    /// `[rank, in]`, f32.
    pub a: Tensor,
    /// `[out, rank]`, f32 (zero at the start, so a new adapter changes nothing).
    pub b: Tensor,
    /// `alpha / rank`.
    pub scale: f64,
}

impl LoraAdapter {
    /// The adapter's contribution for `x` `[T, in]`: `[T, out]`.
    ///
    /// Each row is computed alone in one fixed order, so a token's delta is
    /// the same decoded alone, in a batch, or in a learner's long pass.
    pub fn delta(&self, x: &Tensor) -> Result<Tensor> {
        let op = crate::grad::LoraDelta {
            scale: self.scale as f32,
        };
        Ok(x.contiguous()?
            .apply_op3(&self.a.contiguous()?, &self.b.contiguous()?, op)?)
    }

    /// The dense update `scale * B A` `[out, in]`, for merging into a weight.
    pub fn merged_delta(&self) -> Result<Tensor> {
        Ok((self.b.matmul(&self.a)? * self.scale)?)
    }
}

/// The adapters of a whole model, keyed by (layer, target).
#[derive(Clone, Debug, Default)]
pub struct LoraSet {
    /// Adapter per (block index, projection).
    pub adapters: BTreeMap<(usize, LoraTarget), LoraAdapter>,
}

impl LoraSet {
    /// The adapter on `target` of block `layer`, if any.
    pub fn get(&self, layer: usize, target: LoraTarget) -> Option<&LoraAdapter> {
        self.adapters.get(&(layer, target))
    }

    /// Tensor names for checkpoints: `blk.N.<stem>.lora_a` / `.lora_b`.
    pub fn tensor_name(layer: usize, target: LoraTarget, which: char) -> String {
        format!("blk.{layer}.{}.lora_{which}", target.gguf_stem())
    }

    /// Every adapter tensor by its checkpoint name, as f32 on the CPU (copies
    /// detached from any gradient graph).
    pub fn named_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(self.adapters.len() * 2);
        for (&(layer, target), ad) in &self.adapters {
            out.push((
                Self::tensor_name(layer, target, 'a'),
                ad.a.detach().to_dtype(DType::F32)?,
            ));
            out.push((
                Self::tensor_name(layer, target, 'b'),
                ad.b.detach().to_dtype(DType::F32)?,
            ));
        }
        Ok(out)
    }

    /// Rebuilds a set from [`LoraSet::named_tensors`]' names; `scale` is
    /// `alpha / rank`. Unknown or unpaired names are errors.
    pub fn from_named(
        tensors: impl IntoIterator<Item = (String, Tensor)>,
        scale: f64,
    ) -> Result<LoraSet> {
        let mut halves: BTreeMap<(usize, LoraTarget), (Option<Tensor>, Option<Tensor>)> =
            BTreeMap::new();
        for (name, t) in tensors {
            let bad = || ModelError::BadTensor {
                name: name.clone(),
                reason: "not a LoRA tensor name (blk.N.<proj>.lora_a|lora_b)".into(),
            };
            let rest = name.strip_prefix("blk.").ok_or_else(bad)?;
            let (layer, rest) = rest.split_once('.').ok_or_else(bad)?;
            let layer: usize = layer.parse().map_err(|_| bad())?;
            let (stem, which) = rest.rsplit_once(".lora_").ok_or_else(bad)?;
            let target = LoraTarget::ALL
                .into_iter()
                .find(|t| t.gguf_stem() == stem)
                .ok_or_else(bad)?;
            let slot = halves.entry((layer, target)).or_default();
            match which {
                "a" => slot.0 = Some(t.to_device(&Device::Cpu)?),
                "b" => slot.1 = Some(t.to_device(&Device::Cpu)?),
                _ => return Err(bad()),
            }
        }
        let mut set = LoraSet::default();
        for (key, (a, b)) in halves {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(ModelError::BadTensor {
                    name: Self::tensor_name(key.0, key.1, 'a'),
                    reason: "LoRA A and B must both be present".into(),
                });
            };
            set.adapters.insert(key, LoraAdapter { a, b, scale });
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_name() {
        assert_eq!(
            LoraTarget::parse_list("v, q,q").unwrap(),
            vec![LoraTarget::Q, LoraTarget::V]
        );
        assert_eq!(LoraTarget::parse_list("all").unwrap().len(), 7);
        assert!(LoraTarget::parse_list("q,x").unwrap_err().contains("`x`"));
        assert_eq!(
            LoraSet::tensor_name(3, LoraTarget::Down, 'b'),
            "blk.3.ffn_down.lora_b"
        );
    }

    #[test]
    fn named_round_trip_and_delta() {
        let dev = Device::Cpu;
        let a = Tensor::new(&[[1f32, 0., 2.]], &dev).unwrap(); // [1, 3]
        let b = Tensor::new(&[[1f32], [3.]], &dev).unwrap(); // [2, 1]
        let mut set = LoraSet::default();
        set.adapters
            .insert((0, LoraTarget::Up), LoraAdapter { a, b, scale: 0.5 });
        let back = LoraSet::from_named(set.named_tensors().unwrap(), 0.5).unwrap();
        let ad = back.get(0, LoraTarget::Up).unwrap();
        let x = Tensor::new(&[[1f32, 1., 1.]], &dev).unwrap();
        // x A^T = 3; times B^T = [3, 9]; times 0.5.
        assert_eq!(
            ad.delta(&x).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![1.5, 4.5]]
        );
        let m = ad.merged_delta().unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(m, vec![vec![0.5, 0., 1.], vec![1.5, 0., 3.]]);
        assert!(LoraSet::from_named(vec![("blk.0.attn_q.lora_a".into(), x)], 1.0).is_err());
    }
}
