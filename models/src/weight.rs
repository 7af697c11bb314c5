//! A projection's frozen base weight, held the way the caller needs it:
//! Tern's quantized kernels for serving, or dense f32 for the learner.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::quant::QLinear;

/// How a model's projection weights are held ([`crate::Model::load_as`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// GGUF blocks on Tern's quantized kernels: serving and rollouts.
    Quantized,
    /// Dequantized f32 with differentiable ops: the learner. Same forward code,
    /// same shapes; only the matmuls and a few fused ops differ.
    DenseF32,
}

/// A projection's frozen base weight.
pub(crate) enum Weight {
    /// Serving (and the LoRA learner): Tern's quantized kernels on the GGUF
    /// blocks.
    Quant(Arc<QLinear>),
    /// Learning: the GGUF weight dequantized once to f32 `[out, in]`, so every op
    /// after it is differentiable.
    Dense(Tensor),
}

impl Weight {
    /// `x W^T` for `x` `[T, in]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            // A learner's activation: the same kernel, with an input gradient.
            Weight::Quant(q) if x.track_op() => x
                .contiguous()?
                .apply_op1(crate::grad::QuantMatmul { w: q.clone() })?,
            Weight::Quant(q) => q.forward(x)?,
            // A trained weight needs candle's matmul (and its weight gradient);
            // a frozen one only passes gradients through to `x`.
            Weight::Dense(w) if w.is_variable() => x.matmul(&w.t()?)?,
            Weight::Dense(w) => x.apply_op1(crate::frozen::FrozenMatmul { w: w.clone() })?,
        })
    }

    /// `act(x G^T) * (x U^T)` for the gate `gate` and up `up` in one fused
    /// pass where serving's kernels take the pair ([`crate::quant::glu`]);
    /// `None` otherwise, and for the learner (the caller runs them apart).
    pub(crate) fn glu(
        gate: &Weight,
        up: &Weight,
        x: &Tensor,
        gelu: bool,
    ) -> Result<Option<Tensor>> {
        match (gate, up) {
            (Weight::Quant(g), Weight::Quant(u)) if !x.track_op() => {
                Ok(crate::quant::glu(g, u, x, gelu)?)
            }
            _ => Ok(None),
        }
    }

    /// Rows `ids` of the matrix (the embedding lookup), f32 `[T, cols]`.
    pub(crate) fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        Ok(match self {
            Weight::Quant(q) => q.rows(ids)?,
            Weight::Dense(w) => {
                let idx = Tensor::from_slice(ids, ids.len(), &Device::Cpu)?;
                w.index_select(&idx, 0)?
            }
        })
    }
}
