//! The block's gated MLP, `down(act(gate(h)) * up(h))` after the FFN norm:
//! SwiGLU (SiLU) or GeGLU (GELU, tanh form) as the architecture's
//! [`Mlp`] says, with llama.cpp's rounding when serving.

use candle_core::Tensor;

use super::block::Block;
use super::features::Mlp;
use super::Decoder;
use crate::error::Result;
use crate::lora::{LoraSet, LoraTarget};
use crate::weight::{Precision, Weight};

impl Decoder {
    /// The MLP's output `[T, D]` for the residual stream `x` `[T, D]`, post-normed
    /// where the architecture has post-norms (not yet added to `x`).
    pub(super) fn mlp(
        &self,
        layer: usize,
        b: &Block,
        x: &Tensor,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let dense = self.precision == Precision::DenseF32;
        let h = self.norm(x, &b.ffn_norm)?;
        let gelu = self.features.mlp == Mlp::GeluTanh;
        let adapted = adapters.is_some_and(|s| {
            s.get(layer, LoraTarget::Gate).is_some() || s.get(layer, LoraTarget::Up).is_some()
        });
        // Serving without adapters on the pair: one fused pass where the
        // kernels take it (same bits as the three steps below).
        let fused = match dense || adapted {
            true => None,
            false => Weight::glu(&b.w_gate, &b.w_up, &h, gelu)?,
        };
        let sw = match fused {
            Some(sw) => sw,
            None => self.glu_apart(layer, b, &h, adapters)?,
        };
        let mut ff = self.project(b, layer, LoraTarget::Down, &sw, adapters)?; // [T, D]
        if let Some([_, post]) = &b.post_norms {
            ff = self.norm(&ff, post)?;
        }
        Ok(ff)
    }

    /// The gated unit as three steps: gate and up projections (each with
    /// its adapter), then the activation product.
    fn glu_apart(
        &self,
        layer: usize,
        b: &Block,
        h: &Tensor,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let dense = self.precision == Precision::DenseF32;
        let gate = self.project(b, layer, LoraTarget::Gate, h, adapters)?; // [T, F]
        let up = self.project(b, layer, LoraTarget::Up, h, adapters)?;
        Ok(match (dense, self.features.mlp) {
            (true, Mlp::Silu) => (candle_nn::ops::silu(&gate)? * up)?,
            (true, Mlp::GeluTanh) => (gate.gelu()? * up)?,
            // Serving and the learner alike: llama.cpp's rounding, on the
            // tensors' own storage (no copies of a prefill's megabytes).
            (false, mlp) => gate.contiguous()?.apply_op2(
                &up.contiguous()?,
                crate::grad::Glu {
                    gelu: mlp == Mlp::GeluTanh,
                },
            )?,
        })
    }
}
