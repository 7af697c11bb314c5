//! Attention over the cache: one sequence's new queries against the keys and
//! values its [`KvStore`] holds, on the kernel whose numbers the case calls
//! for. Serving takes llama.cpp's per-key kernel ([`crate::flash`]), or for
//! one token over a long cache the vectorized decode ([`crate::attention`]);
//! a sequence scored again takes the kernels its sampler ran; the learner (and
//! what the kernels cannot read) takes the differentiable tensor path. The
//! cache sees the queries, the weights it asked for, and its chance to evict.
//!
//! Shapes: `H` = query heads, `KV` = key/value heads, `G = H / KV`, `hd` =
//! head dim, `n` = the sequence's new tokens, `C` = cached entries seen.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor, D};

use super::Decoder;
use crate::error::{ModelError, Result};
use crate::exact::round_f16;
use crate::flash::{FlashKernel, Observed};
use crate::kv::KvStore;
use crate::kv_dtype::{hadamard, KvDtype};
use crate::mask::causal_mask;
use crate::weight::Precision;

/// Cached positions from which one new token's attention takes the
/// vectorized decode rather than llama.cpp's exact per-key kernel (llama.cpp
/// itself splits the cache across its threads from here).
const FAST_DECODE_MIN: usize = 512;

/// What one attention call's queries see of a layer's cache.
struct Reach {
    layer: usize,
    /// Entries of the views `append` returned that the call reads.
    stored: usize,
    /// The run a draft's row skips ([`KvStore::draft_gap`]), when it is a
    /// non-empty run inside `stored`.
    gap: Option<Range<usize>>,
    /// Entries the queries see: `stored` less the gap.
    n_cached: usize,
    /// The layer's sliding window, if it slides.
    window: Option<u32>,
    /// What a query-key dot product is multiplied by to give a logit.
    scale: f32,
}

impl Reach {
    /// The positions of KV head `h`'s entries the queries see, laid out as
    /// plain decoding holds them after its evictions.
    fn k_pos(&self, view: &dyn KvStore, h: usize) -> Vec<u32> {
        let all = &view.positions(self.layer, h)[..self.stored];
        match &self.gap {
            Some(r) => all[..r.start]
                .iter()
                .chain(&all[r.end..])
                .copied()
                .collect(),
            None => all.to_vec(),
        }
    }
}

impl Decoder {
    /// Scaled dot-product attention of one sequence's new queries over its cache.
    /// `q`: `[H, n, hd]`; `k`, `v`: `[KV, n, hd]`. Returns `[n, H*hd]`.
    ///
    /// A quantized cache stores keys and values rotated (see
    /// [`KvDtype::rotation`]): the queries turn with the keys, and the output
    /// turns back, as llama.cpp's graph does.
    pub(super) fn attention(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        q_pos: &[u32],
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        if cache.wants_queries(layer) {
            // In the model's frame, before any rotation for the cache.
            let scale = self.score_scale() as f64;
            let rotary = self.rotary(layer);
            let logit_q = (q.detach() * scale)?;
            cache.observe_queries(layer, &logit_q, q_pos, rotary)?;
        }
        let rotation = match self.precision {
            Precision::Quantized => cache.dtype().rotation(self.config.head_dim),
            Precision::DenseF32 => None,
        };
        let Some(rot) = rotation else {
            return self.attend_cache(layer, q, k, v, q_pos, cache);
        };
        let turn = |t: &Tensor, block: usize| -> Result<Tensor> {
            let mut x: Vec<f32> = t.flatten_all()?.to_vec1()?;
            hadamard(&mut x, block);
            Ok(Tensor::from_vec(x, t.shape(), t.device())?)
        };
        let (q, k, v) = (turn(q, rot.k)?, turn(k, rot.k)?, turn(v, rot.v)?);
        let out = self.attend_cache(layer, &q, &k, &v, q_pos, cache)?;
        turn(&out, rot.v)
    }

    /// What a query-key dot product is multiplied by to give a logit: 1 where
    /// the queries arrive scaled (Gemma's query scale), else `1/sqrt(head_dim)`.
    fn score_scale(&self) -> f32 {
        match self.query_scale {
            Some(_) => 1.0,
            None => (1.0 / (self.config.head_dim as f64).sqrt()) as f32,
        }
    }

    /// [`Self::attention`] in the frame the cache stores: appends the new
    /// keys and values, attends, then lets the cache evict.
    ///
    /// Under [`crate::quant::alone::scope`] (a speculative draft verified in
    /// one forward) several rows are attended one by one, each over the
    /// entries up to its own, on the path plain decoding takes for one token
    /// over that many entries (llama.cpp's per-key kernel below
    /// [`FAST_DECODE_MIN`], the vectorized decode from there): the draft's
    /// rows get plain decoding's bits, weights a policy observes included.
    fn attend_cache(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        q_pos: &[u32],
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let n = q_pos.len();
        let (kc, vc) = cache.append(layer, k, v, q_pos)?; // [KV, C, hd]
        let serving = self.precision == Precision::Quantized;
        let one_by_one = n > 1
            && serving
            && crate::quant::alone::active()
            && cache.visibility().is_none()
            && cache.sampled_kernels(n).is_none();
        let out = if one_by_one {
            let n_cached = kc.dim(1)?;
            let mut rows = Vec::with_capacity(n);
            for j in 0..n {
                let len = n_cached - (n - 1 - j);
                let gap = cache.draft_gap(layer, q_pos[j]);
                rows.push(self.attend_views(
                    layer,
                    &q.narrow(1, j, 1)?,
                    kc.narrow(1, 0, len)?,
                    vc.narrow(1, 0, len)?,
                    &q_pos[j..j + 1],
                    gap,
                    cache,
                )?);
            }
            Tensor::cat(&rows, 0)?
        } else {
            self.attend_views(layer, q, kc, vc, q_pos, None, cache)?
        };
        cache.after_attention(layer)?;
        Ok(out)
    }

    /// The attention of queries `q` at `q_pos` over the cache's first
    /// `kc.dim(1)` entries (`kc`, `vc`: views `append` returned, or their
    /// leading part) less the run `gap` (a draft's row: entries plain
    /// decoding evicted before it, [`KvStore::draft_gap`]), the weights
    /// handed to the cache when it scores.
    #[allow(clippy::too_many_arguments)]
    fn attend_views(
        &self,
        layer: usize,
        q: &Tensor,
        kc: Tensor,
        vc: Tensor,
        q_pos: &[u32],
        gap: Option<Range<usize>>,
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (g, n) = (c.group_size(), q_pos.len());
        let stored = kc.dim(1)?;
        let gap = gap.filter(|r| r.start < r.end && r.end <= stored);
        let reach = Reach {
            layer,
            stored,
            // Without the gap, laid out as plain decoding holds them after
            // its evictions.
            n_cached: stored - gap.as_ref().map_or(0, |r| r.len()),
            gap,
            window: self.sliding_window(layer).map(|w| w as u32),
            scale: self.score_scale(),
        };
        let dtype = cache.dtype();
        // Serving reads the cache in place; the learner keeps the tensor path
        // (autograd).
        let serving = self.precision == Precision::Quantized;
        let replayed = cache.visibility().is_some();
        // A sequence scored again: each row on the kernel the sampler ran
        // for it, with gradients when the learner asks.
        if let Some(segments) = cache.sampled_kernels(n).filter(|_| serving) {
            return self.attend_sampled(q, &kc, &vc, q_pos, &reach, segments, cache);
        }
        // llama.cpp's numerics (see `flash`), except one new token over a long
        // cache, where llama.cpp's own result depends on its thread count and
        // speed matters most: there the vectorized decode below.
        // Padding slots (a head-wise policy) need the mask even for one token;
        // a quantized cache always: llama.cpp reads one with its per-row kernel.
        let hidden = cache.hides_entries(layer);
        if serving
            && (n > 1
                || reach.n_cached < FAST_DECODE_MIN
                || replayed
                || reach.window.is_some()
                || hidden
                || dtype.is_quantized())
        {
            if let Some((out, seen)) = self.attend_exact(q, &kc, &vc, q_pos, &reach, cache)? {
                drop((kc, vc));
                if let Some(seen) = seen {
                    let shape = (c.n_kv_head, g, seen.rows, reach.n_cached);
                    let w = Tensor::from_vec(seen.weights, shape, q.device())?;
                    cache.observe_attention(layer, &w, seen.column_means.as_deref())?;
                }
                return self.heads_out(out, n, q.device());
            }
        }
        // Queries at f16 precision, as llama.cpp's f16 products take them.
        let q = match self.precision {
            Precision::Quantized => round_f16(q)?,
            Precision::DenseF32 => q.clone(),
        };
        let q = &q;
        if n == 1 && serving && !replayed && reach.window.is_none() && !hidden {
            let want = cache.wants_attention(layer);
            let gap = reach.gap.clone();
            let decoded =
                crate::attention::decode_tensors(q, &kc, &vc, dtype, g, reach.scale, want, gap)?;
            if let Some((out, weights)) = decoded {
                drop((kc, vc));
                if let Some(w) = weights {
                    let w = Tensor::from_vec(w, (c.n_kv_head, g, 1, reach.n_cached), q.device())?;
                    cache.observe_attention(layer, &w, None)?;
                }
                return self.heads_out(out, 1, q.device());
            }
        }
        if reach.gap.is_some() {
            return Err(ModelError::BadTensor {
                name: "kv cache".into(),
                reason: "a draft's row skipping evicted entries needs the in-place attention \
                         kernels (CPU cache tensors)"
                    .into(),
            });
        }
        self.attend_tensors(q, kc, vc, q_pos, &reach, hidden, cache)
    }

    /// A sequence scored again: each row on the kernel its sampler ran
    /// (`segments`), as one op the learner can differentiate.
    #[allow(clippy::too_many_arguments)]
    fn attend_sampled(
        &self,
        q: &Tensor,
        kc: &Tensor,
        vc: &Tensor,
        q_pos: &[u32],
        reach: &Reach,
        segments: Vec<(Range<usize>, FlashKernel)>,
        cache: &dyn KvStore,
    ) -> Result<Tensor> {
        let layer = reach.layer;
        let op = crate::grad::Attention {
            q_pos: q_pos.to_vec(),
            k_pos: (0..self.config.n_kv_head)
                .map(|h| cache.positions(layer, h).to_vec())
                .collect(),
            replay: cache.visibility().map(|v| (Arc::new(v.clone()), layer)),
            window: reach.window,
            scale: reach.scale,
            segments,
        };
        Ok(q.contiguous()?.apply_op3(kc, vc, op)?)
    }

    /// llama.cpp's per-key kernel over the cache in place: the output
    /// `[n * H * hd]` and the weights the cache asked for, or `None` where
    /// the kernel cannot read these views.
    fn attend_exact(
        &self,
        q: &Tensor,
        kc: &Tensor,
        vc: &Tensor,
        q_pos: &[u32],
        reach: &Reach,
        cache: &dyn KvStore,
    ) -> Result<Option<(Vec<f32>, Option<Observed>)>> {
        let layer = reach.layer;
        let want = cache
            .wants_attention(layer)
            .then(|| cache.attention_rows(layer));
        let owned: Vec<Vec<u32>> = (0..self.config.n_kv_head)
            .map(|h| reach.k_pos(cache, h))
            .collect();
        let k_pos: Vec<&[u32]> = owned.iter().map(Vec::as_slice).collect();
        let replay = cache.visibility().map(|v| (v, layer));
        crate::flash::attend_tensors_windowed(
            q,
            q_pos,
            kc,
            vc,
            cache.dtype(),
            &k_pos,
            replay,
            reach.window,
            reach.scale,
            want,
            reach.gap.clone(),
        )
    }

    /// A kernel's output rows `[n * H * hd]` as the tensor `[n, H*hd]`.
    fn heads_out(&self, out: Vec<f32>, n: usize, device: &Device) -> Result<Tensor> {
        let c = &self.config;
        Ok(Tensor::from_vec(out, (n, c.n_head * c.head_dim), device)?)
    }

    /// The tensor path (the learner's, with autograd; and whatever the
    /// in-place kernels cannot read): scores, mask, softmax and the weighted
    /// values as tensor ops on f32 keys and values.
    #[allow(clippy::too_many_arguments)]
    fn attend_tensors(
        &self,
        q: &Tensor,
        kc: Tensor,
        vc: Tensor,
        q_pos: &[u32],
        reach: &Reach,
        hidden: bool,
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (g, n, n_cached) = (c.group_size(), q_pos.len(), reach.n_cached);
        let (layer, window) = (reach.layer, reach.window);
        // The tensor path works on f32 keys and values.
        let (kc, vc) = match cache.dtype() {
            KvDtype::F32 => (kc, vc),
            other => (
                other.decode(&kc, c.head_dim)?,
                other.decode(&vc, c.head_dim)?,
            ),
        };
        // Query heads of one group attend to the same KV head: fold them into rows.
        let q = q.contiguous()?.reshape((c.n_kv_head, g * n, c.head_dim))?;
        let mut scores = (q.matmul(&kc.t()?)? * reach.scale as f64)?; // [KV, G*n, C]

        // One new token sees every cached entry, unless a replayed eviction
        // record, a window or padding slots hide some of them.
        if n > 1 || cache.visibility().is_some() || window.is_some() || hidden {
            let mask = causal_mask(q_pos, cache, layer, c.n_kv_head, n_cached, window)?; // [KV, 1, n, C]
            scores = scores
                .reshape((c.n_kv_head, g, n, n_cached))?
                .broadcast_add(&mask)?
                .reshape((c.n_kv_head, g * n, n_cached))?;
        }
        let weights = match self.precision {
            Precision::Quantized => candle_nn::ops::softmax_last_dim(&scores)?,
            Precision::DenseF32 => candle_nn::ops::softmax(&scores, D::Minus1)?,
        };
        if cache.wants_attention(layer) {
            let w = weights.reshape((c.n_kv_head, g, n, n_cached))?;
            cache.observe_attention(layer, &w, None)?;
        }
        // llama.cpp multiplies the f16 V cache by f16-converted weights.
        let weights = match self.precision {
            Precision::Quantized => round_f16(&weights)?,
            Precision::DenseF32 => weights,
        };
        let out = weights.matmul(&vc)?; // [KV, G*n, hd]
        Ok(out
            .reshape((c.n_head, n, c.head_dim))?
            .transpose(0, 1)?
            .reshape((n, c.n_head * c.head_dim))?)
    }
}
