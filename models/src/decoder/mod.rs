//! The decoder every supported architecture is built on: a pre-norm
//! transformer (Touvron et al. 2023, "LLaMA") with grouped-query attention,
//! rotary position embeddings, RMSNorm and a gated MLP, over GGUF weights
//! held as candle quantized tensors (or f32 for the learner). What an
//! architecture changes in it is data, its [`Features`]
//! ([`crate::arch`] holds one file per architecture saying which).
//!
//! The forward pass takes a ragged batch ([`crate::batch`]): dense
//! projections run once over all tokens; attention runs per sequence against
//! that sequence's cache. The cache is reached only through
//! [`crate::KvStore`], so the runtime can evict, fork and account for it
//! without the model knowing. In reading order: `load` (tensors into
//! layers), `trunk` (embeddings, then block after block), `block` (one
//! block), `attention` (over the cache), `mlp`, `logits` (the head).
//!
//! Shapes: `T` = tokens in the batch, `D` = hidden size, `H` = query heads,
//! `KV` = key/value heads, `hd` = head dim.

mod attention;
mod block;
mod features;
pub mod fused;
mod load;
mod logits;
mod mlp;
mod rotation;
mod trainable;
mod trunk;

use std::sync::{Arc, RwLock};

use candle_core::Tensor;

use crate::batch::{plan, SeqBatch};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::lora::{LoraSet, LoraTarget};
use crate::rope::Rotary;
use crate::weight::{Precision, Weight};
use block::Block;
use rotation::RopeTables;

pub use features::{Features, Mlp, RopeFactors, RopeStyle};
pub use trunk::Trunk;

/// A loaded decoder: weights plus RoPE tables. Immutable and shareable
/// (adapters are swapped through [`Decoder::set_adapters`]).
pub struct Decoder {
    config: ModelConfig,
    /// Token embedding `[vocab, D]`; also the output projection when tied.
    embedding: Weight,
    blocks: Vec<Block>,
    output_norm: Tensor,
    /// A separate output projection, when the model has one.
    output: Option<Weight>,
    precision: Precision,
    /// Adapters applied by [`Decoder::forward`]; swapped between engine steps.
    adapters: RwLock<Option<Arc<LoraSet>>>,
    /// The global layers' RoPE tables and (if any) the sliding layers'.
    rope: RopeTables,
    /// What this architecture has (biases, RoPE style, ...).
    features: Features,
    /// Multiplies the queries after RoPE, attention then unscaled (Gemma's
    /// and Phi-3's order); `None`: attention scales scores by `1/sqrt(head_dim)`.
    query_scale: Option<f32>,
    /// Final logits soft-capped as `cap * tanh(logits / cap)`.
    logit_softcap: Option<f32>,
}

impl Decoder {
    /// Scales the queries by `scale` after RoPE instead of the scores.
    pub fn with_query_scale(mut self, scale: f32) -> Self {
        self.query_scale = Some(scale);
        self
    }

    /// Soft-caps the final logits at `cap`.
    pub fn with_logit_softcap(mut self, cap: f32) -> Self {
        self.logit_softcap = Some(cap);
        self
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// What the architecture switches on in this decoder.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// How the projection weights are held.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Serves a context of `n` positions instead of the trained one (`n`
    /// no larger): sequences, and the RoPE rows they use, stop there.
    pub fn limit_context(&mut self, n: usize) {
        self.config.context_length = self.config.context_length.min(n.max(1));
    }

    /// The window of `layer` when it is a sliding-window layer: the most
    /// positions its attention ever reads.
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        self.config.sliding_window(layer)
    }

    /// The rotation `layer`'s RoPE applies (the local one on a sliding
    /// layer): what re-positions a key already in a cache.
    pub fn rotary(&self, layer: usize) -> &Rotary {
        &self.rope.of(self.sliding_window(layer).is_some()).rotary
    }

    /// Installs (or with `None` removes) the adapters [`Decoder::forward`] applies.
    /// A forward already running keeps the set it started with.
    pub fn set_adapters(&self, adapters: Option<Arc<LoraSet>>) {
        *self.adapters.write().unwrap_or_else(|e| e.into_inner()) = adapters;
    }

    /// The adapters [`Decoder::forward`] applies now.
    pub fn adapters(&self) -> Option<Arc<LoraSet>> {
        self.adapters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs one ragged batch and returns, per sequence, the logits it asked for:
    /// `[rows, vocab]` f32 with rows = 0, 1 or its token count.
    pub fn forward(&self, batch: &mut [SeqBatch<'_>]) -> Result<Vec<Option<Tensor>>> {
        let adapters = self.adapters();
        self.forward_with(batch, adapters.as_deref())
    }

    /// [`Decoder::forward`] with explicit adapters (the learner's trainable ones).
    pub fn forward_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Vec<Option<Tensor>>> {
        let layout = plan(&self.config, batch)?;
        let x = self.trunk(batch, &layout, adapters)?;
        self.logits(&x, batch, &layout)
    }

    /// Every new token's final hidden state after the output norm, `[T, D]` in
    /// batch order: what the learner projects onto the vocabulary chunk by chunk
    /// instead of materialising `[T, vocab]` logits.
    pub fn hidden_with(
        &self,
        batch: &mut [SeqBatch<'_>],
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        if let Some(cap) = self.logit_softcap {
            // The learner projects these itself and would skip the cap.
            return Err(ModelError::UnsupportedFeature {
                key: format!("{}.final_logit_softcapping", self.config.architecture),
                value: cap.to_string(),
                supported: "no soft-capping when training".into(),
            });
        }
        let layout = plan(&self.config, batch)?;
        let x = self.trunk(batch, &layout, adapters)?;
        self.norm(&x, &self.output_norm)
    }

    /// Every new token's final hidden state after the output norm, `[T, D]` f32
    /// in batch order, with the model's own adapters: what an embedding pools.
    /// Unlike [`Decoder::hidden_with`] it is not refused under a logit soft-cap,
    /// since the cap acts on logits and no logits are made here.
    pub fn hidden(&self, batch: &mut [SeqBatch<'_>]) -> Result<Tensor> {
        let adapters = self.adapters();
        let layout = plan(&self.config, batch)?;
        let x = self.trunk(batch, &layout, adapters.as_deref())?;
        self.norm(&x, &self.output_norm)
    }

    /// The output norm of the residual stream: the hidden states the output
    /// projection reads.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm(x, &self.output_norm)
    }

    /// RMSNorm: candle's fused kernel when serving, the differentiable form when
    /// learning.
    fn norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let eps = self.config.rms_eps;
        Ok(match self.precision {
            // A learner's activation: the same rounding, with a gradient.
            Precision::Quantized if x.track_op() => {
                x.contiguous()?.apply_op1(crate::grad::RmsNorm {
                    w: w.to_vec1()?,
                    eps,
                })?
            }
            Precision::Quantized => {
                let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
                let ws: Vec<f32> = w.to_vec1()?;
                Tensor::from_vec(crate::exact::rms_norm(&xs, &ws, eps), x.shape(), x.device())?
            }
            Precision::DenseF32 => candle_nn::ops::rms_norm_slow(x, w, eps)?,
        })
    }

    /// A projection plus its adapter, if the set has one.
    fn project(
        &self,
        b: &Block,
        layer: usize,
        target: LoraTarget,
        x: &Tensor,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        let y = b.weight(target).forward(x)?;
        match adapters.and_then(|s| s.get(layer, target)) {
            Some(ad) => Ok((y + ad.delta(x)?)?),
            None => Ok(y),
        }
    }
}

/// Parameters of a decoder of `cfg`'s shape with `features`: per block the
/// four attention projections, the three MLP projections and two norms (and
/// the QKV biases, per-head QK norms and post-norms where the architecture
/// has them); the embedding (tied output) and the output norm. (Fused
/// storage holds the same parameters.)
pub fn parameter_count(cfg: &ModelConfig, features: &Features) -> u64 {
    let (d, f, kvd, l) = (
        cfg.n_embd as u64,
        cfg.n_ff as u64,
        (cfg.n_kv_head * cfg.head_dim) as u64,
        cfg.n_layer as u64,
    );
    let qd = cfg.q_dim() as u64;
    let hd = cfg.head_dim as u64;
    let extra = if features.qkv_bias { qd + 2 * kvd } else { 0 }
        + if features.qk_norm { 2 * hd } else { 0 }
        + if features.post_norms { 2 * d } else { 0 };
    let per_layer = 2 * qd * d + 2 * kvd * d + 3 * d * f + extra;
    l * per_layer + cfg.vocab_size as u64 * d + (2 * l + 1) * d
}
