//! One transformer block's forward over a ragged batch, in llama.cpp's order:
//! norm, Q/K/V projections (biases, per-head norms), RoPE at each token's own
//! position, attention per sequence against its own cache
//! ([`super::attention`]), the output projection into the residual, then the
//! gated MLP ([`super::mlp`]). Dense projections run once over all tokens.
//!
//! Shapes: `T` = tokens in the batch, `D` = hidden size, `H` = query heads,
//! `KV` = key/value heads, `hd` = head dim.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::Tensor;

use super::features::RopeStyle;
use super::trunk::RopeRows;
use super::Decoder;
use crate::batch::{BatchLayout, SeqBatch, SeqSlot};
use crate::error::Result;
use crate::exact::round_f16;
use crate::lora::{LoraSet, LoraTarget};
use crate::quant::pool::Pool;
use crate::weight::{Precision, Weight};

/// One block's weights.
pub(super) struct Block {
    pub(super) attn_norm: Tensor,
    /// Q, K, V biases `[out]` f32, when the architecture has them.
    pub(super) qkv_bias: Option<[Tensor; 3]>,
    /// Per-head Q and K norm weights `[head_dim]`, when it has them.
    pub(super) qk_norm: Option<[Tensor; 2]>,
    pub(super) wq: Weight,
    pub(super) wk: Weight,
    pub(super) wv: Weight,
    pub(super) wo: Weight,
    pub(super) ffn_norm: Tensor,
    /// Attention and MLP post-norms `[D]`, when the architecture has them.
    pub(super) post_norms: Option<[Tensor; 2]>,
    pub(super) w_gate: Weight,
    pub(super) w_up: Weight,
    pub(super) w_down: Weight,
}

impl Block {
    /// The projection `target` names.
    pub(super) fn weight(&self, target: LoraTarget) -> &Weight {
        match target {
            LoraTarget::Q => &self.wq,
            LoraTarget::K => &self.wk,
            LoraTarget::V => &self.wv,
            LoraTarget::O => &self.wo,
            LoraTarget::Gate => &self.w_gate,
            LoraTarget::Up => &self.w_up,
            LoraTarget::Down => &self.w_down,
        }
    }

    /// The projection `target` names, to be made trainable.
    pub(super) fn weight_mut(&mut self, target: LoraTarget) -> &mut Weight {
        match target {
            LoraTarget::Q => &mut self.wq,
            LoraTarget::K => &mut self.wk,
            LoraTarget::V => &mut self.wv,
            LoraTarget::O => &mut self.wo,
            LoraTarget::Gate => &mut self.w_gate,
            LoraTarget::Up => &mut self.w_up,
            LoraTarget::Down => &mut self.w_down,
        }
    }
}

/// A batch's rotated queries and keys and its values, per head:
/// `[1, H, T, hd]`, `[1, KV, T, hd]`, `[1, KV, T, hd]`.
struct Heads {
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

impl Decoder {
    /// Block `layer` (weights `b`) on the residual stream `x` `[T, D]`, with
    /// the batch's RoPE angles `rows` of the layer's kind.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn block_forward(
        &self,
        layer: usize,
        b: &Block,
        x: &Tensor,
        rows: &RopeRows,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
        adapters: Option<&LoraSet>,
    ) -> Result<Tensor> {
        // 1. Attention projections over the whole batch.
        let h = self.norm(x, &b.attn_norm)?; // [T, D]
        let [q, k, v] = self.qkv(layer, b, &h, adapters)?;
        // 2. RoPE at each token's own position, in the architecture's pairing.
        let heads = self.rotate(q, k, v, rows)?;
        // 3. Attention per sequence, against its own cache.
        let attn = self.attend_batch(layer, &heads, batch, layout)?; // [T, D]
        let mut attn = self.project(b, layer, LoraTarget::O, &attn, adapters)?;
        if let Some([post, _]) = &b.post_norms {
            attn = self.norm(&attn, post)?;
        }
        let x = (x + attn)?;
        // 4. Gated MLP (SwiGLU or GeGLU).
        let ff = self.mlp(layer, b, &x, adapters)?; // [T, D]
        Ok((x + ff)?)
    }

    /// The normed stream `h`'s queries `[T, H*hd]`, keys and values
    /// `[T, KV*hd]`, with their biases and per-head norms.
    fn qkv(
        &self,
        layer: usize,
        b: &Block,
        h: &Tensor,
        adapters: Option<&LoraSet>,
    ) -> Result<[Tensor; 3]> {
        let c = &self.config;
        let n_tokens = h.dim(0)?;
        let proj = |t: LoraTarget| self.project(b, layer, t, h, adapters);
        let mut q = proj(LoraTarget::Q)?; // [T, H*hd]
        let mut k = proj(LoraTarget::K)?; // [T, KV*hd]
        let mut v = proj(LoraTarget::V)?; // [T, KV*hd]
        if let Some([bq, bk, bv]) = &b.qkv_bias {
            // After the projection and its adapter, as llama.cpp adds them.
            q = q.broadcast_add(bq)?;
            k = k.broadcast_add(bk)?;
            v = v.broadcast_add(bv)?;
        }
        if let Some([nq, nk]) = &b.qk_norm {
            // Each head's vector normed on its own, before RoPE.
            let per_head = |t: &Tensor, heads: usize, w: &Tensor| -> Result<Tensor> {
                let normed = self.norm(&t.reshape((n_tokens, heads, c.head_dim))?, w)?;
                Ok(normed.reshape((n_tokens, heads * c.head_dim))?)
            };
            q = per_head(&q, c.n_head, nq)?;
            k = per_head(&k, c.n_kv_head, nk)?;
        }
        Ok([q, k, v])
    }

    /// Queries and keys rotated at their tokens' positions (`rows`), the
    /// queries then scaled where the architecture scales them, all three
    /// split into heads.
    fn rotate(&self, q: Tensor, k: Tensor, v: Tensor, rows: &RopeRows) -> Result<Heads> {
        let c = &self.config;
        let (cos, sin) = (&rows.cos, &rows.sin);
        let n_tokens = q.dim(0)?;
        let neox = self.features.rope == RopeStyle::Neox;
        let to_heads = |t: Tensor, heads: usize| -> Result<Tensor> {
            Ok(t.reshape((1, n_tokens, heads, c.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        // The learner's differentiable rotation (serving takes `exact`'s).
        let rope = |t: &Tensor| -> Result<Tensor> {
            Ok(if neox {
                candle_nn::rotary_emb::rope_slow(t, cos, sin)?
            } else {
                candle_nn::rotary_emb::rope_i_slow(t, cos, sin)?
            })
        };
        let (q, k) = match &rows.angles {
            None => (
                rope(&to_heads(q, c.n_head)?)?,    // [1, H, T, hd]
                rope(&to_heads(k, c.n_kv_head)?)?, // [1, KV, T, hd]
            ),
            // Serving: llama.cpp's rounding (see `exact`).
            Some((cos, sin)) => {
                let turn = |t: Tensor, heads: usize| -> Result<Tensor> {
                    let op = crate::grad::Rope {
                        cos: cos.clone(),
                        sin: sin.clone(),
                        head_dim: c.head_dim,
                        neox,
                    };
                    to_heads(t.contiguous()?.apply_op1(op)?, heads)
                };
                (turn(q, c.n_head)?, turn(k, c.n_kv_head)?)
            }
        };
        // Gemma and Phi-3 scale the rotated queries themselves, in f32.
        let q = match self.query_scale {
            Some(s) if self.precision == Precision::DenseF32 => (q * s as f64)?,
            Some(s) => q.contiguous()?.apply_op1(crate::grad::Scale(s))?,
            None => q,
        };
        let v = to_heads(v, c.n_kv_head)?; // [1, KV, T, hd]
        Ok(Heads { q, k, v })
    }

    /// Every sequence's attention over its own cache, `[T, H*hd]` in batch
    /// order: in order for the learner (its caches share a prompt's pass
    /// layer by layer), one sequence per pool work item when serving several.
    fn attend_batch(
        &self,
        layer: usize,
        heads: &Heads,
        batch: &mut [SeqBatch<'_>],
        layout: &BatchLayout,
    ) -> Result<Tensor> {
        let dense = self.precision == Precision::DenseF32;
        let one = |seq: &mut SeqBatch<'_>, off: usize| -> Result<Tensor> {
            self.attend_seq(layer, heads, seq, off, layout)
        };
        // A learner's caches share a prompt's pass layer by layer: in order.
        let ordered = batch
            .iter()
            .any(|s| s.cache.sampled_kernels(s.tokens.len()).is_some());
        let outs: Vec<Tensor> = if dense || ordered || batch.len() < 2 {
            batch
                .iter_mut()
                .zip(&layout.offsets)
                .map(|(seq, &off)| one(seq, off))
                .collect::<Result<_>>()?
        } else {
            // Serving several sequences (a batched decode step): they are
            // independent, so the pool takes them one sequence per work item and
            // each sequence's attention runs whole on one thread, its numbers
            // the same as alone. (The learner's caches share a prompt's pass
            // layer by layer, so it stays in order.)
            let slots: Vec<Mutex<SeqSlot<'_, '_>>> = batch
                .iter_mut()
                .zip(&layout.offsets)
                .map(|(seq, &off)| Mutex::new((seq, off, None)))
                .collect();
            let next = AtomicUsize::new(0);
            Pool::global().run(&|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = slots.get(i) else { break };
                let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
                let (seq, off, out) = &mut *slot;
                *out = Some(one(seq, *off));
            });
            slots
                .into_iter()
                .map(|m| {
                    let (_, _, out) = m.into_inner().unwrap_or_else(|p| p.into_inner());
                    out.unwrap_or_else(|| {
                        Err(candle_core::Error::Msg("attention not run".into()).into())
                    })
                })
                .collect::<Result<_>>()?
        };
        Ok(Tensor::cat(&outs, 0)?)
    }

    /// One sequence's rows `off..` of the batch's heads, its keys and values
    /// rounded as its cache holds them, attended over that cache.
    fn attend_seq(
        &self,
        layer: usize,
        heads: &Heads,
        seq: &mut SeqBatch<'_>,
        off: usize,
        layout: &BatchLayout,
    ) -> Result<Tensor> {
        let n = seq.tokens.len();
        let qs = heads.q.narrow(2, off, n)?.squeeze(0)?; // [H, n, hd]
        let ks = heads.k.narrow(2, off, n)?.squeeze(0)?.contiguous()?; // [KV, n, hd]
        let vs = heads.v.narrow(2, off, n)?.squeeze(0)?.contiguous()?;
        let q_pos = &layout.positions[off..off + n];
        // Keys and values at f16 precision, as llama.cpp's f16 KV cache
        // holds them: our correctness reference, token for token. The
        // learner stays in f32.
        let dense = self.precision == Precision::DenseF32;
        let (ks, vs) = if dense || seq.cache.dtype().is_quantized() {
            // A quantized cache takes the f32 values, as llama.cpp's
            // quantizes them.
            (ks, vs)
        } else if ks.track_op() || vs.track_op() {
            // The learner: the gradient stays f32.
            (
                ks.apply_op1(crate::grad::RoundF16)?,
                vs.apply_op1(crate::grad::RoundF16)?,
            )
        } else {
            (round_f16(&ks)?, round_f16(&vs)?)
        };
        self.attention(layer, &qs, &ks, &vs, q_pos, &mut *seq.cache)
    }
}
