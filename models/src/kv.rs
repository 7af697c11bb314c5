//! The KV seam: how the model reaches a sequence's key/value cache.
//!
//! The cache lives outside the model (one per sequence) so the runtime can batch
//! sequences, evict tokens under a policy, and fork caches for best-of-N. The
//! model only appends the keys and values it computed, attends over what the cache
//! hands back, and, when the cache asks for them, reports the attention weights it
//! computed so a policy can score cached tokens.

use candle_core::Tensor;

use std::ops::Range;

use crate::error::Result;
use crate::flash::FlashKernel;
use crate::kv_dtype::KvDtype;
use crate::rope::Rotary;
use crate::visibility::Visibility;

/// The position of a padding slot: a head-wise policy keeps fewer entries in
/// some KV heads than in others, and the cache pads those heads to the layer's
/// count with slots at this position, beyond every query's, so the causal mask
/// (`k_pos <= q_pos`) hides them. `i32::MAX` rather than `u32::MAX` because the
/// vectorized mask compares positions as signed 32-bit integers.
pub const HIDDEN_POSITION: u32 = i32::MAX as u32;

/// Which of a step's attention weights a policy reads ([`KvStore::attention_rows`]).
///
/// A long prompt's full weights are `n x n` per head (2.4 GB a layer for
/// SmolLM2 at 8k tokens): scorers that look at the last queries only, or keep
/// running totals, say so and the kernel hands over just that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightsWanted {
    /// How many of the step's last query rows to hand over in full
    /// (`usize::MAX`: every row).
    pub last_rows: usize,
    /// Whether to also hand over each entry's weight summed over every query
    /// row of the step (each row first averaged over its group's heads), as
    /// H2O's running totals need.
    pub column_means: bool,
}

impl WeightsWanted {
    /// Every row, no sums: what the tensor paths hand over.
    pub const ALL_ROWS: WeightsWanted = WeightsWanted {
        last_rows: usize::MAX,
        column_means: false,
    };

    /// The union of two wants (a cache shared by several policies).
    pub fn union(self, other: WeightsWanted) -> WeightsWanted {
        WeightsWanted {
            last_rows: self.last_rows.max(other.last_rows),
            column_means: self.column_means || other.column_means,
        }
    }
}

/// A per-sequence key/value store the forward pass reads and writes, layer by layer.
pub trait KvStore: Send {
    /// Appends this step's keys and values for `layer` and returns every cached key
    /// and value to attend over, new ones included, in position order.
    ///
    /// `k`, `v`: `[n_kv_head, n_new, head_dim]` f32, keys after RoPE.
    /// `positions`: the original position of each new token.
    /// Returns `(keys, values)`, each `[n_kv_head, n_cached, ..]` in the
    /// storage of [`KvStore::dtype`].
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &[u32],
    ) -> Result<(Tensor, Tensor)>;

    /// How the tensors [`KvStore::append`] returns store their rows: f32
    /// (`[KV, C, head_dim]`), f16 (same shape), or ggml quant blocks (`u8`
    /// `[KV, C, row_bytes]`). The attention kernels read each in place.
    fn dtype(&self) -> KvDtype {
        KvDtype::F32
    }

    /// Original positions of the cached entries of `layer` and KV head `head`
    /// (after the last `append`), in the order `append` returned them; used to
    /// build the causal mask when several new tokens attend at once. Heads may
    /// hold different positions once a head-wise policy has evicted.
    fn positions(&self, layer: usize, head: usize) -> &[u32];

    /// Whether `layer` may hold padding slots ([`HIDDEN_POSITION`]): then even a
    /// single new token must attend through the causal mask, never the unmasked
    /// decode path.
    fn hides_entries(&self, _layer: usize) -> bool {
        false
    }

    /// Whether the policy behind this cache wants the attention weights of `layer`
    /// for the step being computed; `false` lets the model skip reporting them.
    fn wants_attention(&self, _layer: usize) -> bool {
        false
    }

    /// Which of the step's attention weights [`KvStore::observe_attention`]
    /// needs when [`KvStore::wants_attention`] says yes. A path may hand over
    /// more (every row, no sums); never less.
    fn attention_rows(&self, _layer: usize) -> WeightsWanted {
        WeightsWanted::ALL_ROWS
    }

    /// Receives the attention weights of this step's queries for `layer`.
    ///
    /// `weights`: `[n_kv_head, group, rows, n_cached]` f32 (softmax rows), the
    /// step's last `rows` query rows (all of them unless
    /// [`KvStore::attention_rows`] asked for fewer), where `group` is the
    /// number of query heads sharing one KV head. `column_means`:
    /// `[n_kv_head, n_cached]`, when asked for and the path computed them,
    /// each entry's group-averaged weight summed over all the step's rows
    /// (`None` when not asked for, or when `weights` holds every row).
    fn observe_attention(
        &mut self,
        _layer: usize,
        _weights: &Tensor,
        _column_means: Option<&[f32]>,
    ) -> Result<()> {
        Ok(())
    }

    /// Whether the policy behind this cache wants the queries of `layer` for the
    /// step being computed (Expected Attention predicts future queries from
    /// them); `false` lets the model skip handing them over.
    fn wants_queries(&self, _layer: usize) -> bool {
        false
    }

    /// Receives this step's queries for `layer`, before its attention runs.
    ///
    /// `q`: `[n_head, n_new, head_dim]` f32, after RoPE and scaled so that
    /// `q . k` is the attention logit (the `1/sqrt(head_dim)` or the model's own
    /// query scale folded in). `positions`: each query's position. `rope`: the
    /// rotation this layer applied, to carry queries to other positions.
    fn observe_queries(
        &mut self,
        _layer: usize,
        _q: &Tensor,
        _positions: &[u32],
        _rope: &Rotary,
    ) -> Result<()> {
        Ok(())
    }

    /// Called once the step's attention for `layer` is done and the views
    /// `append` returned are no longer used: the moment a policy may evict.
    fn after_attention(&mut self, _layer: usize) -> Result<()> {
        Ok(())
    }

    /// Entries (indices into what [`KvStore::append`] returned) that a
    /// speculative draft's row at `q_pos` must not see in `layer`: those
    /// plain decoding, one token at a time, would have evicted before that
    /// token (a streaming window that is full). The row then attends as if
    /// they were gone. `None`: it sees every earlier entry.
    fn draft_gap(&self, _layer: usize, _q_pos: u32) -> Option<std::ops::Range<usize>> {
        None
    }

    /// Extra masking on top of causality when several new tokens attend at
    /// once: a replayed eviction record, so a teacher-forced pass sees exactly
    /// what each query saw when the sequence was sampled under a KV policy.
    fn visibility(&self) -> Option<&Visibility> {
        None
    }

    /// How the sampler ran this call's `n` query rows, when this cache scores
    /// again a sequence a sampler produced (the learner's): runs of rows and
    /// the attention kernel each ran on, so the rows round as they did then.
    /// `None` (serving): the call chooses as llama.cpp would. A cache that
    /// answers `Some` is also run in batch order, never beside the others.
    fn sampled_kernels(&self, _n: usize) -> Option<Vec<(Range<usize>, FlashKernel)>> {
        None
    }
}
