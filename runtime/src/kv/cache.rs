//! A sequence's KV cache: per layer and KV head, the keys (after RoPE) and
//! values of every kept token with their original positions, compressed to a
//! budget by a [`KvPolicy`].
//!
//! Storage per layer is one preallocated buffer `[n_kv_head, capacity, ..]` for
//! K and one for V, in the cache's [`KvDtype`] (f16 by default for serving, as
//! llama.cpp's; q8_0 and q4_0 as ggml blocks; f32 for exact storage of
//! whatever is appended), written in place and grown geometrically, so an
//! append costs the new tokens only. Eviction compacts kept entries to the front
//! of the same buffer (each head keeps its own index set, all heads the same
//! count), so the buffer stops growing once the policy holds a budget. Views
//! handed to the model are narrowed slices of the buffer, not copies.
//!
//! A head-wise policy (adakv) keeps different counts per head; the shorter heads
//! are padded to the layer's largest count with slots at [`HIDDEN_POSITION`],
//! which every query's causal mask hides. Padding is memory like any entry
//! ([`SeqCache::bytes`] counts it), but it is never logged as an eviction,
//! never kept by the next compression, and not counted against the budget.
//!
//! Sliding-window layers (Gemma 3's) are the policy's exception: their
//! attention never reads an entry `window` or more positions behind the
//! query, so after each step they drop every entry no later query can see and
//! hold at most `window - 1` between steps, whatever the policy; the policy
//! and its budget govern the global layers only.
//!
//! The cache also keeps what a policy scores by: attention received so far
//! (H2O) and the attention rows of the most recent queries (SnapKV, R-KV),
//! recorded only when the policy asks for attention, and statistics of the
//! recent queries (Expected Attention), kept only when the policy asks for them.
//!
//! A cache allowed to overflow ([`SeqCache::overflowing`]) outlives the
//! model's context: when the next tokens would pass the last position the
//! model has a rotation for, [`SeqCache::make_room`] compresses every layer
//! to the policy's budget and re-numbers what is kept, StreamingLLM's rule
//! of positions within the cache (llama.cpp's context shift does the same
//! for a contiguous run): each KV head's entries are given consecutive
//! positions ending just before the next token's, so the newest tokens keep
//! their distances to the query and older kept ones move up behind them;
//! each cached key is turned by its change of position (RoPE composes), so
//! nothing is recomputed. Positions then run from the kept count again. A
//! dormant policy (a context-overflow rule over an otherwise full cache)
//! evicts only there, so a conversation that fits is read whole.

use std::collections::VecDeque;

use candle_core::{Device, IndexOp, Tensor};
use tern_models::{
    EvictionLog, KvDtype, KvStore, ModelConfig, Rotary, WeightsWanted, HIDDEN_POSITION,
};

use super::policy::{self, KvPolicy, QueryStats, ScoreInput};

/// Smallest capacity a layer's buffer is allocated with.
const MIN_CAPACITY: usize = 64;

#[derive(Clone)]
struct LayerKv {
    /// `[n_kv_head, capacity, ..]` in the cache's storage, first `len` entries valid.
    k: Option<Tensor>,
    /// Same shape as `k`.
    v: Option<Tensor>,
    capacity: usize,
    len: usize,
    /// Original position of each entry, per KV head: `[KV][len]`.
    positions: Vec<Vec<u32>>,
    /// Attention each entry received since it was cached: `[KV][len]`.
    cumulative: Vec<Vec<f32>>,
    /// Attention rows of the latest queries, oldest first: `[KV][rows][<= len]`.
    recent: Vec<VecDeque<Vec<f32>>>,
    /// Tokens appended since the last compression.
    since_compress: usize,
    /// Tokens in the latest append (more than one: a prefill chunk).
    last_append: usize,
    /// Statistics of the queries since the last compression, when the policy
    /// scores by them.
    queries: Option<QueryStats>,
}

/// What a cache holds back while a speculative draft is verified (see
/// [`SeqCache::begin_verify`]): where each layer stood before the draft's
/// forward, and the scoring its rows handed over, applied by
/// [`SeqCache::rewind`] for the rows kept only.
#[derive(Clone)]
struct Verify {
    /// [`SeqCache::seen`] before the draft.
    seen: usize,
    /// The peak before it: a rejected row's bytes were never plain decoding's.
    peak: usize,
    layers: Vec<HeldBack>,
}

/// One layer's share of a [`Verify`].
#[derive(Clone)]
struct HeldBack {
    /// Entries and tokens since the last compression, before the draft.
    len: usize,
    since: usize,
    /// Attention handed over, one call per row in order (the rows are
    /// attended one by one): the weights and any column sums.
    attention: Vec<(Tensor, Option<Vec<f32>>)>,
    /// Queries handed over: `[n_head, rows, head_dim]` and their positions.
    queries: Option<(Tensor, Vec<u32>)>,
}

/// Rows ahead [`SeqCache::verify_rows`] looks for the policy's next
/// compression: more than any draft verifies at once.
const VERIFY_LOOKAHEAD: usize = 64;

/// The cache of one sequence, across all layers.
pub struct SeqCache {
    layers: Vec<LayerKv>,
    policy: KvPolicy,
    n_layer: usize,
    n_kv_head: usize,
    head_dim: usize,
    /// Highest position appended plus one: what a full cache would hold.
    seen: usize,
    peak_bytes: usize,
    /// Entries per layer a full cache is expected to reach: geometric growth
    /// stops there, so allocation matches what the engine reserved.
    capacity_hint: Option<usize>,
    /// What was evicted and when, if asked for (the trainer replays it).
    log: Option<EvictionLog>,
    /// Per layer, its sliding window when it has one.
    windows: Vec<Option<usize>>,
    /// How keys and values are stored.
    dtype: KvDtype,
    /// Set by [`SeqCache::freeze`]: nothing more is evicted.
    frozen: bool,
    /// Whether [`SeqCache::make_room`] may re-number this cache to go on
    /// past the model's context.
    overflow: bool,
    /// Whether the policy evicts only in [`SeqCache::make_room`] (the cache
    /// is full until the context is).
    dormant: bool,
    /// Positions given back by [`SeqCache::make_room`] so far: a token the
    /// sequence reads as its `p`-th is cached at position `p - shift`.
    shift: usize,
    /// Times [`SeqCache::make_room`] re-numbered the cache.
    shifts: usize,
    /// A speculative draft being verified on a compressing cache.
    verifying: Option<Verify>,
}

impl SeqCache {
    /// An empty cache shaped for `config` that keeps everything, stored in
    /// f32 (exactly what is appended, learner or server).
    pub fn new(config: &ModelConfig) -> Self {
        Self::with_policy(config, KvPolicy::Full)
    }

    /// An empty cache shaped for `config`, compressed by `policy`, stored in f32.
    pub fn with_policy(config: &ModelConfig, policy: KvPolicy) -> Self {
        Self::shaped(config, policy, KvDtype::F32)
    }

    /// An empty cache shaped for `config`, compressed by `policy`, storing
    /// keys and values as `dtype`; refused when the model's head size cannot
    /// be stored in that type.
    pub fn with_storage(
        config: &ModelConfig,
        policy: KvPolicy,
        dtype: KvDtype,
    ) -> tern_models::Result<Self> {
        dtype.check(config.head_dim)?;
        Ok(Self::shaped(config, policy, dtype))
    }

    fn shaped(config: &ModelConfig, policy: KvPolicy, dtype: KvDtype) -> Self {
        let kvh = config.n_kv_head;
        let layer = LayerKv {
            k: None,
            v: None,
            capacity: 0,
            len: 0,
            positions: vec![Vec::new(); kvh],
            cumulative: vec![Vec::new(); kvh],
            recent: vec![VecDeque::new(); kvh],
            since_compress: 0,
            last_append: 0,
            queries: QueryStats::for_policy(&policy, config.n_head, config.head_dim),
        };
        Self {
            layers: vec![layer; config.n_layer],
            policy,
            n_layer: config.n_layer,
            n_kv_head: kvh,
            head_dim: config.head_dim,
            seen: 0,
            peak_bytes: 0,
            capacity_hint: None,
            log: None,
            windows: (0..config.n_layer)
                .map(|l| config.sliding_window(l))
                .collect(),
            dtype,
            frozen: false,
            overflow: false,
            dormant: false,
            shift: 0,
            shifts: 0,
            verifying: None,
        }
    }

    /// Lets the cache go on past the model's context through
    /// [`Self::make_room`]. `dormant`: the policy evicts there only, and the
    /// cache keeps everything until then.
    pub fn overflowing(mut self, dormant: bool) -> Self {
        self.overflow = true;
        self.dormant = dormant;
        self
    }

    /// Whether [`Self::make_room`] may re-number this cache.
    pub fn overflows(&self) -> bool {
        self.overflow
    }

    /// Positions given back so far: the sequence's `p`-th token sits at
    /// cache position `p - shift`.
    pub fn shift(&self) -> usize {
        self.shift
    }

    /// Times the cache was re-numbered to make room.
    pub fn shifts(&self) -> usize {
        self.shifts
    }

    /// Most entries a layer holds now, padding left out: what a compressed
    /// cache kept of everything it read.
    pub fn held_entries(&self) -> usize {
        (0..self.n_layer).map(|l| self.held(l)).max().unwrap_or(0)
    }

    /// Makes room for `tokens` more positions below `limit` (the positions
    /// the model has rotations for) when the next ones would pass it; a
    /// no-op otherwise, or for a cache not [`Self::overflowing`]. Every
    /// policy-governed layer is compressed to its budget (sliding layers
    /// hold their window already), then each KV head's kept entries are
    /// re-numbered to consecutive positions ending at the most any head
    /// kept, each key turned by `rotary(layer)` through its change of
    /// position. Returns whether it re-numbered; an error when what the
    /// policy keeps leaves no room for `tokens`.
    pub fn make_room<'r>(
        &mut self,
        tokens: usize,
        limit: usize,
        rotary: impl Fn(usize) -> &'r Rotary,
    ) -> tern_models::Result<bool> {
        if !self.overflow || self.seen + tokens <= limit {
            return Ok(false);
        }
        let no_room = |reason: String| tern_models::ModelError::BadTensor {
            name: "positions".into(),
            reason,
        };
        if self.log.is_some() {
            return Err(no_room(
                "a cache recording its evictions cannot be re-numbered past the context".into(),
            ));
        }
        if self.policy.budget().is_some() {
            for layer in 0..self.n_layer {
                if self.windows[layer].is_none() && self.held(layer) > 0 {
                    self.compress(layer)?;
                }
            }
        }
        let kept = self
            .layers
            .iter()
            .flat_map(|l| l.positions.iter())
            .map(|p| p.iter().filter(|&&x| x != HIDDEN_POSITION).count())
            .max()
            .unwrap_or(0);
        if kept + tokens > limit {
            return Err(no_room(format!(
                "the policy keeps {kept} entries, which leave no room for {tokens} more \
                 positions in a context of {limit}"
            )));
        }
        for layer in 0..self.n_layer {
            self.renumber(layer, kept, rotary(layer))?;
        }
        self.shift += self.seen - kept;
        self.seen = kept;
        self.shifts += 1;
        Ok(true)
    }

    /// Gives `layer`'s kept entries, per KV head, the positions
    /// `end - n .. end` in their order (`n` the head's real entries) and
    /// turns each key by its change of position.
    fn renumber(&mut self, layer: usize, end: usize, rotary: &Rotary) -> tern_models::Result<()> {
        let (kvh, hd, dtype) = (self.n_kv_head, self.head_dim, self.dtype);
        let l = &mut self.layers[layer];
        if let Some(q) = l.queries.as_mut() {
            q.reset();
        }
        let Some(kb) = &l.k else {
            return Ok(());
        };
        let len = l.len;
        let mut keys: Vec<f32> = dtype
            .decode(&kb.narrow(1, 0, len)?.contiguous()?, hd)?
            .flatten_all()?
            .to_vec1()?;
        let rotation = dtype.rotation(hd);
        let mut turned = vec![0f64; hd];
        for h in 0..kvh {
            let positions = &mut l.positions[h];
            let real = positions.iter().filter(|&&p| p != HIDDEN_POSITION).count();
            let mut next = (end - real) as u32;
            for (i, pos) in positions.iter_mut().enumerate() {
                if *pos == HIDDEN_POSITION {
                    continue;
                }
                let delta = f64::from(next) - f64::from(*pos);
                *pos = next;
                next += 1;
                if delta == 0.0 {
                    continue;
                }
                let row = &mut keys[(h * len + i) * hd..(h * len + i + 1) * hd];
                // A quantized cache stores keys in a rotated frame: back to
                // the model's, turned, and forward again.
                if let Some(rot) = rotation {
                    tern_models::kv_dtype::hadamard(row, rot.k);
                }
                for (t, &x) in turned.iter_mut().zip(row.iter()) {
                    *t = f64::from(x);
                }
                rotary.rotate(&mut turned, delta);
                for (x, &t) in row.iter_mut().zip(&turned) {
                    *x = t as f32;
                }
                if let Some(rot) = rotation {
                    tern_models::kv_dtype::hadamard(row, rot.k);
                }
            }
        }
        let keys = Tensor::from_vec(keys, (kvh, len, hd), &Device::Cpu)?;
        kb.slice_set(&dtype.encode(&keys)?, 1, 0)?;
        Ok(())
    }

    /// How keys and values are stored.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Starts recording every eviction from now on (see [`EvictionLog`]): a
    /// learner replays the record to score tokens under the visibility they
    /// were sampled with.
    pub fn record_evictions(&mut self) {
        if self.log.is_none() {
            self.log = Some(EvictionLog::new(self.n_layer, self.n_kv_head));
        }
    }

    /// The evictions recorded so far, if recording.
    pub fn evictions(&self) -> Option<&EvictionLog> {
        self.log.as_ref()
    }

    /// Caps geometric growth at `entries` per layer (growth past it still
    /// happens if more are appended), so a cache that knows its final length
    /// never allocates twice that.
    pub fn set_capacity_hint(&mut self, entries: usize) {
        self.capacity_hint = Some(entries);
    }

    /// The most KV bytes one sequence can hold at once under `policy`, stored
    /// as `dtype`, for a
    /// prompt of `prompt` tokens read in chunks of `chunk`, followed by
    /// `max_new` generated tokens: what the engine reserves before admitting it.
    ///
    /// Per layer: a full cache reaches `prompt + max_new`; a budgeted one its
    /// layer budget plus one chunk (policies that compress while reading the
    /// prompt) or the whole prompt (those that start at decode), plus the
    /// tokens between two compressions. On top of the keys and values comes
    /// what the policy scores by ([`Self::scoring_bytes`]), so a policy whose
    /// scoring memory grows with its parameters is admitted by what it
    /// really holds. A relative budget is reserved at its budget for the
    /// whole length (`prompt + max_new`), the most it ever keeps.
    pub fn reservation_bytes(
        config: &ModelConfig,
        policy: &KvPolicy,
        dtype: KvDtype,
        prompt: usize,
        max_new: usize,
        chunk: usize,
    ) -> usize {
        let total = prompt + max_new;
        let policy = &*policy.at_length(total);
        let per_entry = 2 * config.n_kv_head * dtype.row_bytes(config.head_dim);
        let entries: Vec<usize> = (0..config.n_layer)
            .map(
                |layer| match policy.head_capacity(layer, config.n_layer, config.n_kv_head) {
                    // A sliding layer: its window, plus the newest chunk while
                    // it attends.
                    _ if config.sliding_window(layer).is_some() => {
                        let w = config.sliding_window(layer).unwrap_or(total);
                        total.min(w + chunk.max(1))
                    }
                    None => total,
                    Some(budget) => {
                        let cap = if policy.compresses_prompt() {
                            budget + chunk.max(1).max(policy.every())
                        } else {
                            budget.max(prompt) + policy.every()
                        };
                        total.min(cap)
                    }
                },
            )
            .collect();
        let kv = entries.iter().sum::<usize>() * per_entry;
        kv + Self::scoring_bytes(config, policy, &entries, total, chunk)
    }

    /// The most bytes `policy`'s scoring holds for one sequence whose
    /// layers hold at most `entries[layer]` entries each (of `total` tokens
    /// read in chunks of `chunk`), f32 throughout:
    ///
    /// - kept per scored layer: the attention rows of the last `window`
    ///   queries (snapkv, pyramidkv, rkv; `[n_kv_head, window, entries]`)
    ///   and the attention each entry received (h2o; `[n_kv_head, entries]`);
    /// - while one layer is scored or compressed (one at a time): the
    ///   attention weights the model hands over (`[n_head, rows, entries]`,
    ///   rows = the window, at most one chunk) and the keys and values a
    ///   policy decodes to score (`[n_kv_head, entries, head_dim]` each).
    ///
    /// Sliding-window layers are never scored. Zero for full and streaming.
    pub fn scoring_bytes(
        config: &ModelConfig,
        policy: &KvPolicy,
        entries: &[usize],
        total: usize,
        chunk: usize,
    ) -> usize {
        const F32: usize = std::mem::size_of::<f32>();
        let (kvh, heads, hd) = (config.n_kv_head, config.n_head, config.head_dim);
        let rows = if policy.needs_recent_rows() {
            policy.window().max(1).min(total)
        } else {
            0
        };
        let scored = |layer: &usize| config.sliding_window(*layer).is_none();
        let scored_entries: Vec<usize> = (0..entries.len())
            .filter(scored)
            .map(|l| entries[l])
            .collect();
        let kept: usize = scored_entries
            .iter()
            .map(|&e| {
                let rows_bytes = kvh * rows * e;
                let cumulative = if policy.needs_cumulative() {
                    kvh * e
                } else {
                    0
                };
                rows_bytes + cumulative
            })
            .sum();
        let widest = scored_entries.iter().copied().max().unwrap_or(0);
        let weights = heads * rows.min(chunk.max(1)) * widest;
        let decoded = [policy.needs_keys(), policy.needs_values()]
            .iter()
            .filter(|&&b| b)
            .count()
            * kvh
            * widest
            * hd;
        (kept + weights + decoded) * F32
    }

    /// The policy this cache compresses by.
    pub fn policy(&self) -> &KvPolicy {
        &self.policy
    }

    /// Entries held by layer 0.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens this sequence has appended in all (the next token's position).
    pub fn seen(&self) -> usize {
        self.seen
    }

    fn bytes_per_entry(&self) -> usize {
        2 * self.n_kv_head * self.dtype.row_bytes(self.head_dim)
    }

    /// Bytes of keys and values currently held (valid entries, all layers;
    /// under adakv the padding slots too, which take the same memory).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.len).sum::<usize>() * self.bytes_per_entry()
    }

    /// Bytes of the buffers allocated for keys and values (capacity, all
    /// layers): what the cache costs in memory, valid entries or not.
    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.capacity).sum::<usize>() * self.bytes_per_entry()
    }

    /// Bytes the policy's scoring state holds now (the recent queries'
    /// attention rows and each entry's received attention, f32), beside
    /// the keys and values of [`Self::bytes`]; [`Self::scoring_bytes`]
    /// bounds it.
    pub fn scoring_held_bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .map(|l| {
                let rows: usize = l.recent.iter().flatten().map(Vec::len).sum();
                rows + l.cumulative.iter().map(Vec::len).sum::<usize>()
            })
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// The largest [`Self::bytes`] seen since creation.
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// Bytes a full (uncompressed) cache would hold for the same tokens.
    pub fn full_bytes(&self) -> usize {
        (self.seen + self.shift) * self.n_layer * self.bytes_per_entry()
    }

    /// A deep copy that evolves independently (best-of-N children share a
    /// prefilled prompt this way).
    pub fn fork(&self) -> candle_core::Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(LayerKv {
                    k: copy(&l.k)?,
                    v: copy(&l.v)?,
                    ..l.clone()
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self {
            layers,
            policy: self.policy.clone(),
            log: self.log.clone(),
            windows: self.windows.clone(),
            verifying: self.verifying.clone(),
            ..*self
        })
    }

    /// A copy of the first `len` entries of a full cache, sized to them (a
    /// prompt-prefix cache entry, or a new sequence starting from one). `None`
    /// for a compressing policy, whose entries are no longer a prefix.
    pub fn prefix(&self, len: usize) -> candle_core::Result<Option<Self>> {
        // Sliding layers keep only their window: not a prefix either.
        let sliding = self.windows.iter().any(Option::is_some);
        if self.policy.budget().is_some() || sliding || len > self.len() || self.log.is_some() {
            return Ok(None);
        }
        let cut = |t: &Option<Tensor>| {
            t.as_ref()
                .map(|t| t.narrow(1, 0, len.max(1))?.copy())
                .transpose()
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(LayerKv {
                    k: cut(&l.k)?,
                    v: cut(&l.v)?,
                    capacity: if l.k.is_some() { len.max(1) } else { 0 },
                    len,
                    positions: l.positions.iter().map(|p| p[..len].to_vec()).collect(),
                    cumulative: l
                        .cumulative
                        .iter()
                        .map(|c| c[..len.min(c.len())].to_vec())
                        .collect(),
                    recent: l.recent.iter().map(|_| VecDeque::new()).collect(),
                    since_compress: 0,
                    last_append: 0,
                    queries: l.queries.clone().map(|mut q| {
                        q.reset();
                        q
                    }),
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Some(Self {
            layers,
            policy: self.policy.clone(),
            log: None,
            seen: len,
            peak_bytes: len * self.n_layer * self.bytes_per_entry(),
            capacity_hint: None,
            windows: self.windows.clone(),
            verifying: None,
            ..*self
        }))
    }

    /// Whether a speculative draft's rejected tokens can be taken back out
    /// of this cache ([`Self::rewind`]): a full cache is cut; a compressing
    /// one verifies its draft in [`Self::begin_verify`]'s mode. Not with
    /// sliding-window layers (they drop entries every step), an eviction
    /// record, or re-numbering past the context.
    pub fn rewindable(&self) -> bool {
        self.windows.iter().all(Option::is_none) && self.log.is_none() && !self.overflow
    }

    /// Most rows the next forward may carry for a draft verified on this
    /// cache: plain decoding of them would compress after the last at the
    /// earliest, never between two, so every row sees what it would have
    /// seen one token at a time. Unbounded for a cache that never evicts
    /// again (full, frozen); 1 for a window that evicts every step.
    pub fn verify_rows(&self) -> usize {
        if self.policy.budget().is_none() || self.frozen || self.dormant {
            return usize::MAX;
        }
        if let Some(budget) = self.window_budget() {
            // A window slides by position alone: each row skips what it
            // slid past ([`KvStore::draft_gap`]), from a cache within budget.
            let within = (0..self.n_layer).all(|l| self.held(l) <= budget);
            return if within { usize::MAX } else { 1 };
        }
        let mut most = usize::MAX;
        for (layer, l) in self.layers.iter().enumerate() {
            if self.windows[layer].is_some() {
                continue;
            }
            let held = self.held(layer);
            let first = (1..=VERIFY_LOOKAHEAD).find(|&r| {
                policy::should_compress(
                    &self.policy.at_length(self.seen + r),
                    held + r,
                    l.since_compress + r,
                    false,
                )
            });
            if let Some(r) = first {
                most = most.min(r);
            }
        }
        most
    }

    /// Starts verifying a speculative draft on a compressing cache: the next
    /// forward's rows are the draft's (at most [`Self::verify_rows`] of
    /// them, attended one by one), and [`Self::rewind`] then keeps some.
    /// Until that rewind the policy evicts nothing and the scoring the rows
    /// hand over is held back; the rewind applies it for the kept rows only,
    /// row by row, and compresses where plain decoding would have, so the
    /// cache ends exactly as if the kept tokens had been decoded one at a
    /// time. A no-op on a full cache, which a rewind simply cuts.
    pub fn begin_verify(&mut self) {
        if self.policy.budget().is_none() || !self.rewindable() {
            return;
        }
        self.verifying = Some(Verify {
            seen: self.seen,
            peak: self.peak_bytes,
            layers: self
                .layers
                .iter()
                .map(|l| HeldBack {
                    len: l.len,
                    since: l.since_compress,
                    attention: Vec::new(),
                    queries: None,
                })
                .collect(),
        });
    }

    /// Drops every entry from position `len` on, so the next append lands
    /// at `len` (speculative decoding's rejected draft tokens). On a cache
    /// verifying a draft ([`Self::begin_verify`]) this also settles it: the
    /// kept rows' scoring is applied and the policy compresses where plain
    /// decoding would have. Returns false and changes nothing when the cache
    /// is not [`Self::rewindable`], holds fewer than `len` entries, or
    /// (compressing) `len` is not within the draft verified; an error when
    /// the verified rows ran past a compression ([`Self::verify_rows`]).
    pub fn rewind(&mut self, len: usize) -> tern_models::Result<bool> {
        if let Some(v) = self.verifying.take() {
            return self.settle(v, len);
        }
        if self.policy.budget().is_some() {
            return Ok(len == self.seen && self.rewindable());
        }
        if !self.rewindable() || len > self.len() {
            return Ok(false);
        }
        for l in &mut self.layers {
            l.len = l.len.min(len);
            for p in &mut l.positions {
                p.truncate(len);
            }
            for c in &mut l.cumulative {
                c.truncate(len);
            }
            for rows in &mut l.recent {
                for row in rows.iter_mut() {
                    row.truncate(len);
                }
            }
            l.since_compress = l.since_compress.min(len);
            l.last_append = l.last_append.min(len);
        }
        self.seen = len;
        Ok(true)
    }

    /// Keeps the first `len - v.seen` rows of the draft verified since `v`
    /// and applies what plain decoding of them would have, row by row.
    fn settle(&mut self, v: Verify, len: usize) -> tern_models::Result<bool> {
        if len < v.seen || len > self.seen {
            self.verifying = Some(v);
            return Ok(false);
        }
        let keep = len - v.seen;
        let ran_past = || tern_models::ModelError::BadTensor {
            name: "kv cache".into(),
            reason: "a verified draft ran past the KV policy's next compression".into(),
        };
        self.seen = len;
        if let Some(budget) = self.window_budget() {
            return self.settle_window(&v, keep, budget).map(|()| true);
        }
        let mut due = Vec::new();
        for (layer, held) in v.layers.into_iter().enumerate() {
            let l = &mut self.layers[layer];
            let kept = held.len + keep;
            if l.len < kept {
                return Err(ran_past());
            }
            l.len = kept;
            for p in &mut l.positions {
                p.truncate(kept);
            }
            for c in &mut l.cumulative {
                c.truncate(kept);
            }
            l.since_compress = held.since;
            l.last_append = 1;
            if keep == 0 {
                continue;
            }
            if let (Some(stats), Some((q, positions))) = (l.queries.as_mut(), &held.queries) {
                let q: Vec<f32> = q
                    .narrow(1, 0, keep)?
                    .contiguous()?
                    .flatten_all()?
                    .to_vec1()?;
                stats.observe_held(&q, &positions[..keep]);
            }
            for t in 0..keep {
                if let Some((w, sums)) = held.attention.get(t) {
                    if w.dim(2)? > 1 {
                        return Err(ran_past());
                    }
                    self.observe_now(layer, w, sums.as_deref())?;
                }
                self.layers[layer].since_compress += 1;
                if self.frozen {
                    continue;
                }
                // What plain decoding held after this row.
                let at = self.held(layer) - (keep - 1 - t);
                let now = self.policy.at_length(v.seen + t + 1);
                if policy::should_compress(&now, at, self.layers[layer].since_compress, false) {
                    if t + 1 < keep {
                        return Err(ran_past());
                    }
                    due.push(layer);
                }
            }
        }
        // The last kept row as plain decoding ran it, layer by layer: each
        // appends, its bytes count, then it compresses if due, before the
        // next layer appends.
        self.peak_bytes = v.peak;
        for layer in 0..self.n_layer {
            if keep > 0 {
                let behind = (self.n_layer - 1 - layer) * self.bytes_per_entry();
                self.peak_bytes = self.peak_bytes.max(self.bytes() - behind);
            }
            if due.contains(&layer) {
                self.compress(layer)?;
            }
        }
        Ok(true)
    }

    /// The budget of a streaming window, the one policy whose evictions
    /// depend on positions alone: a draft's rows see past its evictions
    /// through [`KvStore::draft_gap`] instead of stopping at them.
    fn window_budget(&self) -> Option<usize> {
        match &self.policy {
            KvPolicy::Streaming(p) => Some(p.budget),
            _ => None,
        }
    }

    /// [`Self::settle`] for a streaming window: the kept rows' entries stay
    /// and the window slides past them at once, which leaves what sliding
    /// after each row leaves (sinks and the newest entries, in order); the
    /// peak is the one each row reached as plain decoding ran it, layer by
    /// layer.
    fn settle_window(&mut self, v: &Verify, keep: usize, budget: usize) -> tern_models::Result<()> {
        let mut held: Vec<usize> = v.layers.iter().map(|h| h.len).collect();
        let per_entry = self.bytes_per_entry();
        self.peak_bytes = v.peak;
        for _ in 0..keep {
            for layer in 0..self.n_layer {
                held[layer] += 1;
                let now = held.iter().sum::<usize>() * per_entry;
                self.peak_bytes = self.peak_bytes.max(now);
                held[layer] = held[layer].min(budget);
            }
        }
        for (layer, h) in v.layers.iter().enumerate() {
            let l = &mut self.layers[layer];
            let kept = h.len + keep;
            l.len = kept;
            for p in &mut l.positions {
                p.truncate(kept);
            }
            l.since_compress = h.since + keep;
            l.last_append = 1;
            if self.held(layer) > budget {
                self.compress(layer)?;
            }
        }
        Ok(())
    }

    /// Compresses every layer over the budget now, whatever the policy's
    /// schedule, then stops evicting: everything appended from here on is
    /// kept (sliding-window layers still slide, as the model requires). This
    /// is the query-agnostic setting of kvpress and KVzip: a context is
    /// compressed once, before the question is known, and the question and
    /// answer are then read against what was kept.
    pub fn freeze(&mut self) -> tern_models::Result<()> {
        let budget = self.policy.at_length(self.seen).budget();
        if let Some(budget) = budget {
            for layer in 0..self.n_layer {
                if self.windows[layer].is_none() && self.held(layer) > budget {
                    self.compress(layer)?;
                }
            }
        }
        self.frozen = true;
        Ok(())
    }

    /// Applies the policy's end-of-prompt compression (SnapKV and PyramidKV
    /// compress the prompt once it has been read). Call after the last prefill
    /// chunk.
    pub fn finish_prefill(&mut self) -> tern_models::Result<()> {
        if self.frozen || self.dormant {
            return Ok(());
        }
        for layer in 0..self.n_layer {
            let l = &self.layers[layer];
            if self.windows[layer].is_none()
                && policy::should_compress(
                    &self.policy.at_length(self.seen),
                    self.held(layer),
                    l.since_compress,
                    true,
                )
            {
                self.compress(layer)?;
            }
        }
        Ok(())
    }

    /// Entries `layer` holds per KV head for the budget: its length, or under a
    /// head-wise policy the mean real entries per head (padding left out),
    /// rounded up.
    fn held(&self, layer: usize) -> usize {
        let l = &self.layers[layer];
        if !self.policy.is_head_wise() {
            return l.len;
        }
        let real: usize = l
            .positions
            .iter()
            .map(|p| p.iter().filter(|&&x| x != HIDDEN_POSITION).count())
            .sum();
        real.div_ceil(self.n_kv_head.max(1))
    }

    fn grow(&mut self, layer: usize, needed: usize) -> candle_core::Result<()> {
        let (kvh, hd) = (self.n_kv_head, self.head_dim);
        let budgeted =
            (self.policy.budget().is_some() && !self.dormant) || self.windows[layer].is_some();
        let l = &mut self.layers[layer];
        if needed <= l.capacity {
            return Ok(());
        }
        // A full cache grows geometrically; a budgeted one only ever needs its
        // budget plus one step's tokens, so it grows to exactly that.
        let capacity = if budgeted {
            needed.max(MIN_CAPACITY)
        } else {
            let doubled = needed.max(2 * l.capacity).max(MIN_CAPACITY);
            match self.capacity_hint {
                Some(hint) => doubled.min(hint.max(needed)),
                None => doubled,
            }
        };
        let k = self.dtype.zeros(kvh, capacity, hd)?;
        let v = self.dtype.zeros(kvh, capacity, hd)?;
        if let (Some(old_k), Some(old_v), true) = (&l.k, &l.v, l.len > 0) {
            k.slice_set(&old_k.narrow(1, 0, l.len)?.contiguous()?, 1, 0)?;
            v.slice_set(&old_v.narrow(1, 0, l.len)?.contiguous()?, 1, 0)?;
        }
        l.k = Some(k);
        l.v = Some(v);
        l.capacity = capacity;
        Ok(())
    }

    /// Keeps only the entries the policy selects in `layer`, compacted to the
    /// front of the buffers.
    fn compress(&mut self, layer: usize) -> tern_models::Result<()> {
        let (kvh, hd, n_layer) = (self.n_kv_head, self.head_dim, self.n_layer);
        let l = &mut self.layers[layer];
        let (Some(kb), Some(_)) = (&l.k, &l.v) else {
            return Ok(());
        };
        let keys: Vec<Vec<f32>> = if self.policy.needs_keys() {
            let k = self
                .dtype
                .decode(&kb.narrow(1, 0, l.len)?.contiguous()?, hd)?;
            let rotation = self.dtype.rotation(hd);
            (0..kvh)
                .map(|h| {
                    let mut row = k.i(h)?.flatten_all()?.to_vec1::<f32>()?;
                    // Policies score keys in the model's frame, not the
                    // rotated one a quantized cache stores.
                    if let Some(rot) = rotation {
                        tern_models::kv_dtype::hadamard(&mut row, rot.k);
                    }
                    Ok(row)
                })
                .collect::<candle_core::Result<_>>()?
        } else {
            Vec::new()
        };
        let values: Vec<Vec<f32>> = match (&l.v, self.policy.needs_values()) {
            (Some(vb), true) => {
                let v = self
                    .dtype
                    .decode(&vb.narrow(1, 0, l.len)?.contiguous()?, hd)?;
                let rotation = self.dtype.rotation(hd);
                (0..kvh)
                    .map(|h| {
                        let mut row = v.i(h)?.flatten_all()?.to_vec1::<f32>()?;
                        if let Some(rot) = rotation {
                            tern_models::kv_dtype::hadamard(&mut row, rot.v);
                        }
                        Ok(row)
                    })
                    .collect::<candle_core::Result<_>>()?
            }
            _ => Vec::new(),
        };
        // Lend the rows to the policy without copying them (a copy would
        // double the scoring memory the reservation counts): a VecDeque
        // becomes a Vec and back in place.
        let recent: Vec<Vec<Vec<f32>>> = l
            .recent
            .iter_mut()
            .map(|d| Vec::from(std::mem::take(d)))
            .collect();
        let keep = policy::select(
            &self.policy,
            &ScoreInput {
                layer,
                n_layer,
                n_cached: l.len,
                positions: &l.positions,
                cumulative: &l.cumulative,
                recent_rows: &recent,
                keys: &keys,
                values: &values,
                queries: l.queries.as_ref(),
                head_dim: hd,
            },
        );
        for (d, rows) in l.recent.iter_mut().zip(recent) {
            *d = VecDeque::from(rows);
        }
        if let Some(q) = l.queries.as_mut() {
            q.reset();
        }
        self.retain(layer, &keep.per_head, true)
    }

    /// Drops the entries of sliding `layer` that no later query can see:
    /// those `window` or more positions behind the next one.
    fn slide(&mut self, layer: usize, window: usize) -> tern_models::Result<()> {
        let next = self.seen;
        let l = &self.layers[layer];
        let keep: Vec<Vec<usize>> = l
            .positions
            .iter()
            .map(|p| {
                (0..p.len())
                    .filter(|&i| p[i] as usize + window > next)
                    .collect()
            })
            .collect();
        if keep.first().map_or(0, Vec::len) < l.len {
            // Not an eviction: the model's window hides these entries from
            // every later query anyway, so a replayed record need not.
            self.retain(layer, &keep, false)?;
        }
        Ok(())
    }

    /// Keeps entries `keep[h]` (ascending) of `layer`, compacted to the front
    /// of its buffers; heads keeping fewer than the most are padded to it with
    /// hidden slots. `log` records the rest as evicted when recording (padding
    /// is not an entry and is never recorded).
    fn retain(&mut self, layer: usize, keep: &[Vec<usize>], log: bool) -> tern_models::Result<()> {
        let kvh = self.n_kv_head;
        let l = &mut self.layers[layer];
        let (Some(kb), Some(vb)) = (&l.k, &l.v) else {
            return Ok(());
        };
        let kept = keep.iter().map(Vec::len).max().unwrap_or(0);
        if keep.iter().all(|k| k.len() >= l.len) {
            l.since_compress = 0;
            return Ok(());
        }
        // Entries leave after the newest query's attention: it saw them, later ones do not.
        let last_query = self.seen.saturating_sub(1) as u32;
        let (mut ks, mut vs) = (Vec::with_capacity(kvh), Vec::with_capacity(kvh));
        for (h, idx) in keep.iter().enumerate() {
            if let Some(log) = self.log.as_mut().filter(|_| log) {
                let mut kept_mask = vec![false; l.len];
                for &i in idx {
                    kept_mask[i] = true;
                }
                for (i, &pos) in l.positions[h].iter().enumerate() {
                    if !kept_mask[i] && pos != HIDDEN_POSITION {
                        log.record(layer, h, pos, last_query);
                    }
                }
            }
            // Padding slots copy entry 0's data; their position hides them.
            let pad = kept - idx.len();
            let ids: Vec<u32> = idx.iter().map(|&i| i as u32).chain(vec![0; pad]).collect();
            let ids = Tensor::from_vec(ids, kept, &Device::Cpu)?;
            ks.push(kb.i(h)?.narrow(0, 0, l.len)?.index_select(&ids, 0)?);
            vs.push(vb.i(h)?.narrow(0, 0, l.len)?.index_select(&ids, 0)?);
            let remap = |v: &[f32]| {
                idx.iter()
                    .map(|&i| v.get(i).copied().unwrap_or(0.0))
                    .chain(vec![0.0; pad])
                    .collect()
            };
            l.positions[h] = idx
                .iter()
                .map(|&i| l.positions[h][i])
                .chain(vec![HIDDEN_POSITION; pad])
                .collect();
            if !l.cumulative[h].is_empty() {
                l.cumulative[h] = remap(&l.cumulative[h]);
            }
            for row in l.recent[h].iter_mut() {
                *row = remap(row);
            }
        }
        kb.slice_set(&Tensor::stack(&ks, 0)?, 1, 0)?;
        vb.slice_set(&Tensor::stack(&vs, 0)?, 1, 0)?;
        l.len = kept;
        l.since_compress = 0;
        Ok(())
    }
}

impl KvStore for SeqCache {
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(Tensor, Tensor)> {
        let n = positions.len();
        let total = self.layers[layer].len + n;
        self.grow(layer, total.max(1))?;
        let track = self.policy.needs_attention();
        let (k, v) = (self.dtype.encode(k)?, self.dtype.encode(v)?);
        let l = &mut self.layers[layer];
        let (Some(kb), Some(vb)) = (&l.k, &l.v) else {
            unreachable!("grow() allocated the buffers for at least one entry")
        };
        kb.slice_set(&k.contiguous()?, 1, l.len)?;
        vb.slice_set(&v.contiguous()?, 1, l.len)?;
        for h in 0..self.n_kv_head {
            l.positions[h].extend_from_slice(positions);
            if track {
                l.cumulative[h].resize(total, 0.0);
            }
        }
        l.len = total;
        l.since_compress += n;
        l.last_append = n;
        let views = (kb.narrow(1, 0, total)?, vb.narrow(1, 0, total)?);
        if let Some(&last) = positions.last() {
            self.seen = self.seen.max(last as usize + 1);
        }
        self.peak_bytes = self.peak_bytes.max(self.bytes());
        Ok(views)
    }

    fn dtype(&self) -> KvDtype {
        self.dtype
    }

    fn positions(&self, layer: usize, head: usize) -> &[u32] {
        &self.layers[layer].positions[head]
    }

    fn hides_entries(&self, layer: usize) -> bool {
        // Only a head-wise policy pads, and never on a sliding layer.
        self.policy.is_head_wise() && self.windows[layer].is_none()
    }

    fn draft_gap(&self, layer: usize, q_pos: u32) -> Option<std::ops::Range<usize>> {
        let v = self.verifying.as_ref()?;
        let KvPolicy::Streaming(p) = &self.policy else {
            return None;
        };
        // Row `j` of the draft: plain decoding had slid past the oldest
        // non-sink entries, one per token beyond the budget.
        let j = (q_pos as usize).checked_sub(v.seen)?;
        let evicted = (v.layers.get(layer)?.len + j).saturating_sub(p.budget);
        let sink = p.sink.min(p.budget);
        (evicted > 0).then_some(sink..sink + evicted)
    }

    fn wants_attention(&self, layer: usize) -> bool {
        // Sliding layers are not scored: the policy does not evict there.
        !self.frozen && self.policy.needs_attention() && self.windows[layer].is_none()
    }

    fn attention_rows(&self, _layer: usize) -> WeightsWanted {
        // Scorers read the last `window` rows; H2O's running totals read
        // every row, as per-entry sums.
        let rows = self.policy.needs_recent_rows();
        WeightsWanted {
            last_rows: if rows { self.policy.window().max(1) } else { 0 },
            column_means: self.policy.needs_cumulative(),
        }
    }

    fn observe_attention(
        &mut self,
        layer: usize,
        weights: &Tensor,
        column_means: Option<&[f32]>,
    ) -> tern_models::Result<()> {
        if let Some(v) = self.verifying.as_mut() {
            v.layers[layer]
                .attention
                .push((weights.clone(), column_means.map(<[f32]>::to_vec)));
            return Ok(());
        }
        self.observe_now(layer, weights, column_means)
    }

    fn wants_queries(&self, layer: usize) -> bool {
        // Sliding layers are not scored: the policy does not evict there.
        !self.frozen && self.layers[layer].queries.is_some() && self.windows[layer].is_none()
    }

    fn observe_queries(
        &mut self,
        layer: usize,
        q: &Tensor,
        positions: &[u32],
        rope: &Rotary,
    ) -> tern_models::Result<()> {
        let Some(stats) = self.layers[layer].queries.as_mut() else {
            return Ok(());
        };
        if let Some(v) = self.verifying.as_mut() {
            stats.keep_rope(rope);
            v.layers[layer].queries = Some((q.clone(), positions.to_vec()));
            return Ok(());
        }
        let q: Vec<f32> = q.contiguous()?.flatten_all()?.to_vec1()?;
        stats.observe(&q, positions, rope);
        Ok(())
    }

    fn after_attention(&mut self, layer: usize) -> tern_models::Result<()> {
        if let Some(window) = self.windows[layer] {
            return self.slide(layer, window);
        }
        if self.frozen || self.dormant || self.verifying.is_some() {
            return Ok(());
        }
        let l = &self.layers[layer];
        // A prefill chunk ends like a short prompt: policies that compress at
        // prefill end do so now (scored by the chunk's last queries), so a long
        // prompt never holds more than budget + chunk entries.
        let held = self.held(layer);
        // A relative budget is the share of what the sequence has read so far.
        let now = self.policy.at_length(self.seen);
        let chunk_end =
            l.last_append > 1 && policy::should_compress(&now, held, l.since_compress, true);
        if chunk_end || policy::should_compress(&now, held, l.since_compress, false) {
            self.compress(layer)?;
        }
        Ok(())
    }
}

impl SeqCache {
    /// Takes in one step's attention weights for `layer` (see
    /// [`KvStore::observe_attention`]).
    fn observe_now(
        &mut self,
        layer: usize,
        weights: &Tensor,
        column_means: Option<&[f32]>,
    ) -> tern_models::Result<()> {
        // [KV, G, rows, C] -> the group's mean per row. H2O's running sums
        // take the step's column sums when the kernel made them, else every
        // row; the other scorers keep the last `window` rows, so only those
        // are reduced.
        let (kvh, g, n, c) = weights.dims4()?;
        let window = self.policy.window().max(1);
        let track = self.policy.needs_cumulative();
        let from_rows = track && column_means.is_none();
        // H2O's `window` counts recent entries, not query rows: it keeps none.
        let keep_rows = self.policy.needs_recent_rows();
        let first = match (from_rows, keep_rows) {
            (true, _) => 0,
            (false, true) => n.saturating_sub(window),
            (false, false) => n,
        };
        let l = &mut self.layers[layer];
        if let (true, Some(sums)) = (track, column_means) {
            for (h, cum) in l.cumulative.iter_mut().enumerate() {
                for (x, m) in cum.iter_mut().zip(&sums[h * c..(h + 1) * c]) {
                    *x += m;
                }
            }
        }
        let mut row = vec![0f32; c];
        with_group_means(weights, (kvh, g, n, c), first, |h, i, mean| {
            if from_rows {
                for (x, m) in l.cumulative[h].iter_mut().zip(mean) {
                    *x += m;
                }
            }
            if keep_rows && i + window >= n {
                row.copy_from_slice(mean);
                let recent = &mut l.recent[h];
                recent.push_back(row.clone());
                while recent.len() > window {
                    recent.pop_front();
                }
            }
        })
    }
}

/// Calls `each(kv_head, row, mean)` for query rows `first..n` of attention
/// weights `[KV, G, n, C]` (f32), in head then row order, `mean` being the
/// row averaged over the group's `G` query heads exactly as candle's
/// `mean(1)` rounds it (sum in head order, times `1/G`), without copying the
/// weights.
fn with_group_means(
    weights: &Tensor,
    (kvh, g, n, c): (usize, usize, usize, usize),
    first: usize,
    mut each: impl FnMut(usize, usize, &[f32]),
) -> tern_models::Result<()> {
    let weights = weights.contiguous()?;
    let (storage, layout) = weights.storage_and_layout();
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(all)) = &*storage else {
        return Err(
            candle_core::Error::Msg("attention weights must be f32 on the CPU".into()).into(),
        );
    };
    let w = &all[layout.start_offset()..layout.start_offset() + kvh * g * n * c];
    let scale = (1f64 / g as f64) as f32;
    let mut mean = vec![0f32; c];
    for h in 0..kvh {
        for i in first..n {
            mean.fill(0.0);
            for j in 0..g {
                let at = ((h * g + j) * n + i) * c;
                for (m, x) in mean.iter_mut().zip(&w[at..at + c]) {
                    *m += x;
                }
            }
            for m in &mut mean {
                *m *= scale;
            }
            each(h, i, &mean);
        }
    }
    Ok(())
}

#[cfg(test)]
mod group_mean_tests {
    use super::with_group_means;
    use candle_core::{Device, Tensor};

    #[test]
    fn group_means_round_as_candles_mean() {
        let (kvh, g, n, c) = (2, 3, 5, 7);
        let data: Vec<f32> = (0..kvh * g * n * c)
            .map(|i| ((i * 7919 % 1013) as f32 / 977.0).powi(3))
            .collect();
        let t = Tensor::from_vec(data, (kvh, g, n, c), &Device::Cpu).unwrap();
        let want: Vec<Vec<Vec<f32>>> = t.mean(1).unwrap().to_vec3().unwrap();
        let mut seen = 0;
        with_group_means(&t, (kvh, g, n, c), 2, |h, i, mean| {
            assert_eq!(mean, &want[h][i][..], "head {h} row {i}");
            seen += 1;
        })
        .unwrap();
        assert_eq!(seen, kvh * (n - 2));
    }
}

#[cfg(test)]
#[path = "cache_verify_tests.rs"]
mod verify_tests;

#[cfg(test)]
#[path = "cache_test_support.rs"]
mod test_support;

#[cfg(test)]
#[path = "cache_compaction_tests.rs"]
mod compaction_tests;

#[cfg(test)]
#[path = "cache_reservation_tests.rs"]
mod reservation_tests;

#[cfg(test)]
mod scoring_tests {
    use candle_core::{Device, Tensor};
    use tern_models::{KvDtype, KvStore, ModelConfig};

    use super::SeqCache;
    use crate::kv::policy::KvPolicy;

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            name: None,
            n_layer: 2,
            n_embd: 32,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 8,
            n_ff: 8,
            vocab_size: 8,
            context_length: 512,
            rope_base: 10_000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
            sliding: None,
        }
    }

    /// Runs `prompt` tokens in chunks of `chunk`, then `decode` single
    /// tokens, through a cache under `spec`, feeding uniform attention as
    /// the model would; returns the most scoring bytes it held at once.
    fn drive(spec: &str, prompt: usize, chunk: usize, decode: usize) -> usize {
        let c = config();
        let policy: KvPolicy = spec.parse().unwrap();
        let mut cache = SeqCache::with_policy(&c, policy.clone());
        let (kvh, g, hd) = (c.n_kv_head, c.n_head / c.n_kv_head, c.head_dim);
        let mut most = 0;
        let mut pos = 0usize;
        let mut steps: Vec<usize> = (0..prompt)
            .step_by(chunk)
            .map(|s| chunk.min(prompt - s))
            .collect();
        steps.extend(std::iter::repeat_n(1, decode));
        for n in steps {
            let positions: Vec<u32> = (pos..pos + n).map(|p| p as u32).collect();
            for layer in 0..c.n_layer {
                let k = Tensor::ones((kvh, n, hd), candle_core::DType::F32, &Device::Cpu).unwrap();
                let (keys, _) = cache.append(layer, &k, &k, &positions).unwrap();
                let cached = keys.dim(1).unwrap();
                if cache.wants_attention(layer) {
                    let rows = match cache.attention_rows(layer).last_rows {
                        0 => n,
                        r => r.min(n),
                    };
                    let w = Tensor::full(1.0 / cached as f32, (kvh, g, rows, cached), &Device::Cpu)
                        .unwrap();
                    cache.observe_attention(layer, &w, None).unwrap();
                }
                most = most.max(cache.scoring_held_bytes());
                cache.after_attention(layer).unwrap();
            }
            pos += n;
        }
        most
    }

    #[test]
    fn the_reservation_covers_what_scoring_holds() {
        for spec in [
            "snapkv:budget=64,window=48,every=8",
            "snapkv:budget=300,window=299,prefill=false",
            "rkv:budget=64,window=32,every=16",
            "h2o:budget=64,recent=8",
            "pyramidkv:budget=64,window=16,every=8",
        ] {
            let held = drive(spec, 200, 64, 40);
            assert!(held > 0, "{spec}: scoring held nothing");
            let policy: KvPolicy = spec.parse().unwrap();
            let reserved = scoring(&config(), &policy, 200, 40, 64);
            assert!(
                held <= reserved,
                "{spec}: held {held} scoring bytes, reserved {reserved}"
            );
        }
        // Nothing to score: nothing reserved for it.
        let c = config();
        for spec in ["full", "streaming:budget=64,sink=4", "keydiff:budget=64"] {
            let p: KvPolicy = spec.parse().unwrap();
            assert_eq!(scoring(&c, &p, 200, 40, 64) > 0, p.needs_keys(), "{spec}");
        }
    }

    /// The scoring part of a reservation.
    fn scoring(
        c: &ModelConfig,
        p: &KvPolicy,
        prompt: usize,
        max_new: usize,
        chunk: usize,
    ) -> usize {
        let with = SeqCache::reservation_bytes(c, p, KvDtype::F32, prompt, max_new, chunk);
        let per_entry = 2 * c.n_kv_head * KvDtype::F32.row_bytes(c.head_dim);
        with - kv_entries(c, p, prompt, max_new, chunk) * per_entry
    }

    /// Entries per sequence the reservation's KV part counts (its formula, restated).
    fn kv_entries(
        c: &ModelConfig,
        p: &KvPolicy,
        prompt: usize,
        max_new: usize,
        chunk: usize,
    ) -> usize {
        let total = prompt + max_new;
        (0..c.n_layer)
            .map(|l| match p.head_capacity(l, c.n_layer, c.n_kv_head) {
                None => total,
                Some(b) if p.compresses_prompt() => total.min(b + chunk.max(p.every())),
                Some(b) => total.min(b.max(prompt) + p.every()),
            })
            .sum()
    }

    #[test]
    fn a_relative_budget_keeps_its_share_as_the_sequence_grows() {
        // A 40-token prompt, then one token at a time: rkv compresses every
        // 16 decoded tokens to half of what was read (never under 32).
        let c = config();
        let spec = "rkv:budget=50%,min_budget=32,window=8,every=16";
        let policy: KvPolicy = spec.parse().unwrap();
        let mut cache = SeqCache::with_policy(&c, policy.clone());
        let (kvh, g, hd) = (c.n_kv_head, c.n_head / c.n_kv_head, c.head_dim);
        let mut pos = 0usize;
        let mut steps = vec![40];
        steps.extend(std::iter::repeat_n(1, 400));
        let mut checked = 0;
        for n in steps {
            let positions: Vec<u32> = (pos..pos + n).map(|p| p as u32).collect();
            for layer in 0..c.n_layer {
                let k = Tensor::ones((kvh, n, hd), candle_core::DType::F32, &Device::Cpu).unwrap();
                let (keys, _) = cache.append(layer, &k, &k, &positions).unwrap();
                let cached = keys.dim(1).unwrap();
                let rows = match cache.attention_rows(layer).last_rows {
                    0 => n,
                    r => r.min(n),
                };
                let w = Tensor::full(1.0 / cached as f32, (kvh, g, rows, cached), &Device::Cpu)
                    .unwrap();
                cache.observe_attention(layer, &w, None).unwrap();
                cache.after_attention(layer).unwrap();
            }
            pos += n;
            let want = pos.div_ceil(2).max(32).min(pos);
            assert!(
                cache.len() >= want && cache.len() <= want + 16,
                "{pos} read: {} held, share {want}",
                cache.len()
            );
            // Right after a compression (the prompt's end, then every 16
            // tokens): exactly the share.
            if [40, 56, 200, 296, 424].contains(&pos) {
                checked += 1;
                assert_eq!(cache.len(), want, "at {pos}");
            }
        }
        assert_eq!(checked, 5);
        // The reservation covers the most it held: half of the whole length
        // plus one interval.
        let reserved = SeqCache::reservation_bytes(&c, &policy, KvDtype::F32, 40, 400, 64);
        assert!(
            cache.peak_bytes() <= reserved,
            "{} > {reserved}",
            cache.peak_bytes()
        );
        let fixed: KvPolicy = "rkv:budget=32,window=8,every=16".parse().unwrap();
        assert!(reserved > SeqCache::reservation_bytes(&c, &fixed, KvDtype::F32, 40, 400, 64));
    }

    #[test]
    fn the_issues_probe_reserves_its_scoring_rows() {
        // A 3,000-token prompt under snapkv with the window at the context:
        // its rows ([kv, window, entries] f32 per layer) dwarf its keys and values.
        let c = ModelConfig {
            context_length: 4096,
            ..config()
        };
        let p: KvPolicy = "snapkv:budget=4000,window=3999".parse().unwrap();
        let rows = scoring(&c, &p, 3000, 16, 512);
        let kv = kv_entries(&c, &p, 3000, 16, 512)
            * 2
            * c.n_kv_head
            * KvDtype::F16.row_bytes(c.head_dim);
        assert!(rows > 50 * kv, "rows {rows} vs kv {kv}");
        // [2 layers][2 kv heads][3016 rows][3016 entries] f32 at least.
        assert!(rows >= 2 * 2 * 3016 * 3016 * 4, "{rows}");
    }
}
