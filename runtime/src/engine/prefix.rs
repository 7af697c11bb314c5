//! The prompt-prefix cache: the KV of recent prompts, kept so that a later
//! prompt sharing a beginning with one (a system prompt, an earlier turn)
//! prefills only the rest. Entries are sequences the backend owns; their bytes
//! count in the scheduler's KV reservation, and they give way to requests.

use super::SubmitRequest;
use crate::backend::{Backend, SeqId};
use crate::kv::cache::SeqCache;
use crate::kv::policy::KvPolicy;
use tern_models::{KvDtype, ModelConfig};

/// A recent prompt's KV.
struct Prefix {
    tokens: Vec<u32>,
    /// Its storage type: a prefix serves only requests storing the same.
    dtype: KvDtype,
    seq: SeqId,
    bytes: usize,
    used: u64,
}

/// Shortest shared beginning worth reusing, in tokens.
const PREFIX_MIN: usize = 16;

/// How much of a `shared`-token cached prefix a prompt of `n` tokens may reuse
/// and still get the logits a cold prefill gives, bit for bit. Where the
/// backend's attention takes another kernel from `switch` new rows
/// ([`Backend::attention_kernel_switch_rows`], llama.cpp's rule on Tern's
/// kernels), the rest must reach that kernel when the cold prompt did and stay
/// under it when it did not. Long prompts prefilled in several chunks are not
/// reused.
fn exact_reuse(n: usize, shared: usize, prefill_chunk: usize, switch: Option<usize>) -> usize {
    let switch = switch.unwrap_or(0);
    if n < switch {
        shared
    } else if n <= prefill_chunk {
        shared.min(n - switch)
    } else {
        0
    }
}

/// Up to `capacity` cached prompts, evicted least recently used first.
pub(super) struct PrefixCache {
    entries: Vec<Prefix>,
    capacity: usize,
    /// Ticks once per lookup hit or insertion: the LRU clock.
    clock: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity` prompts (0: off).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Vec::new(),
            capacity,
            clock: 0,
        }
    }

    /// Whether nothing is cached (nothing left to give way).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `req` may read from and write to the cache: only an
    /// uncompressed cache holds its prompt as a prefix, and the trainer's
    /// recorded rollouts stay independent of earlier requests; a request
    /// with adapters of its own computes other keys and values.
    pub fn eligible(&self, req: &SubmitRequest) -> bool {
        self.capacity > 0
            && matches!(req.kv_policy, KvPolicy::Full)
            && !req.record_evictions
            && req.adapters.is_none()
            && req.prompt.len() > PREFIX_MIN
    }

    /// A new sequence for `req` (room for `expected` tokens) starting from the
    /// cached prefix sharing the most tokens with its prompt (at least
    /// `PREFIX_MIN`, and never the whole prompt: its last token must run to
    /// give logits), with that length; `None` when nothing is worth reusing.
    pub fn reuse(
        &mut self,
        backend: &mut dyn Backend,
        req: &SubmitRequest,
        expected: usize,
        prefill_chunk: usize,
    ) -> Option<(SeqId, usize)> {
        if !self.eligible(req) {
            return None;
        }
        let shared = |e: &Prefix| {
            e.tokens
                .iter()
                .zip(&req.prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(req.prompt.len() - 1)
        };
        let (i, len) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.dtype == req.kv_dtype)
            .map(|(i, e)| (i, shared(e)))
            .max_by_key(|&(_, len)| len)?;
        let len = exact_reuse(
            req.prompt.len(),
            len,
            prefill_chunk,
            backend.attention_kernel_switch_rows(),
        );
        if len < PREFIX_MIN {
            return None;
        }
        let seq = backend
            .fork_prefix(self.entries[i].seq, len, expected)
            .ok()??;
        self.clock += 1;
        self.entries[i].used = self.clock;
        Some((seq, len))
    }

    /// Keeps a copy of `seq`, which holds `req`'s whole prompt just prefilled,
    /// if its bytes fit in `room`, evicting the least recently used entries
    /// beyond the capacity. Returns the bytes taken and the bytes freed.
    pub fn remember(
        &mut self,
        backend: &mut dyn Backend,
        config: &ModelConfig,
        req: &SubmitRequest,
        seq: SeqId,
        room: usize,
    ) -> (usize, usize) {
        if !self.eligible(req) {
            return (0, 0);
        }
        self.clock += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens == req.prompt && e.dtype == req.kv_dtype)
        {
            e.used = self.clock;
            return (0, 0);
        }
        let len = req.prompt.len();
        let bytes = SeqCache::reservation_bytes(config, &KvPolicy::Full, req.kv_dtype, len, 0, 0);
        if bytes > room {
            return (0, 0);
        }
        let Ok(Some(copy)) = backend.fork_prefix(seq, len, len) else {
            return (0, 0);
        };
        self.entries.push(Prefix {
            tokens: req.prompt.clone(),
            dtype: req.kv_dtype,
            seq: copy,
            bytes,
            used: self.clock,
        });
        let mut freed = 0;
        while self.entries.len() > self.capacity {
            freed += self.evict(backend);
        }
        (bytes, freed)
    }

    /// Frees the least recently used entry; returns its bytes (0 if empty).
    pub fn evict(&mut self, backend: &mut dyn Backend) -> usize {
        let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else {
            return 0;
        };
        let e = self.entries.swap_remove(i);
        backend.free(e.seq);
        e.bytes
    }
}
