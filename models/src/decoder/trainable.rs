//! What the learner reaches in a decoder held as [`crate::Precision::DenseF32`]:
//! the f32 projections (what LoRA merging adds to and the log-softmax reads)
//! and, for full fine-tuning, every block projection and norm as a
//! trainable variable.

use std::sync::Arc;

use candle_core::{Tensor, Var};

use super::Decoder;
use crate::error::{ModelError, Result};
use crate::lora::LoraTarget;
use crate::quant::QLinear;
use crate::weight::Weight;

impl Decoder {
    /// `(out, in)` of a block projection: the shape an adapter on it must fit.
    pub fn projection_shape(&self, target: LoraTarget) -> (usize, usize) {
        target.shape(&self.config)
    }

    /// The f32 weight `[out, in]` of a projection ([`crate::Precision::DenseF32`] only):
    /// what LoRA merging adds to.
    pub fn dense_projection(&self, layer: usize, target: LoraTarget) -> Option<&Tensor> {
        match self.blocks.get(layer)?.weight(target) {
            Weight::Dense(w) => Some(w),
            Weight::Quant(_) => None,
        }
    }

    /// Turns every block projection and norm of a [`crate::Precision::DenseF32`] model
    /// into a trainable variable (full fine-tuning) and returns them by GGUF
    /// tensor name. The forward reads the variables in place, so an optimiser
    /// updating them updates the model. The token embedding (the tied output
    /// projection) stays frozen.
    pub fn make_trainable(&mut self) -> Result<Vec<(String, Var)>> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter_mut().enumerate() {
            let mut norms = vec![
                ("attn_norm", &mut b.attn_norm),
                ("ffn_norm", &mut b.ffn_norm),
            ];
            if let Some([attn_post, ffn_post]) = b.post_norms.as_mut() {
                norms.push(("post_attention_norm", attn_post));
                norms.push(("post_ffw_norm", ffn_post));
            }
            for (stem, norm) in norms {
                let var = Var::from_tensor(norm)?;
                *norm = var.as_tensor().clone();
                out.push((format!("blk.{i}.{stem}.weight"), var));
            }
            for t in LoraTarget::ALL {
                let Weight::Dense(dense) = b.weight_mut(t) else {
                    return Err(ModelError::BadTensor {
                        name: format!("blk.{i}.{}.weight", t.gguf_stem()),
                        reason: "only a DenseF32 model can be trained".into(),
                    });
                };
                let var = Var::from_tensor(dense)?;
                *dense = var.as_tensor().clone();
                out.push((format!("blk.{i}.{}.weight", t.gguf_stem()), var));
            }
        }
        let var = Var::from_tensor(&self.output_norm)?;
        self.output_norm = var.as_tensor().clone();
        out.push(("output_norm.weight".into(), var));
        Ok(out)
    }

    /// The f32 output projection `[vocab, D]` ([`crate::Precision::DenseF32`] only; the
    /// token embedding when tied): the learner's log-softmax reads it in chunks.
    pub fn dense_output(&self) -> Option<&Tensor> {
        match self.output.as_ref().unwrap_or(&self.embedding) {
            Weight::Dense(w) => Some(w),
            Weight::Quant(_) => None,
        }
    }

    /// The quantized output projection `[vocab, D]` (the token embedding when
    /// tied), for a learner that scores with the sampler's own kernel.
    pub fn quant_output(&self) -> Option<&Arc<QLinear>> {
        match self.output.as_ref().unwrap_or(&self.embedding) {
            Weight::Quant(q) => Some(q),
            Weight::Dense(_) => None,
        }
    }
}
