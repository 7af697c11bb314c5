//! Which cached entries each query could see: the record a compressed cache
//! leaves of its evictions, and the mask that replays it.
//!
//! Under a KV policy a token's query attends only to the entries still cached
//! when it was computed. The sparse sampler's probabilities are those of that
//! restricted attention, so a learner that wants the same policy (Sparse-RL's
//! "train as you serve") must mask the same entries: key `k` is visible to
//! query `q` iff `k <= q` and `k` had not been evicted before `q` was computed.
//! An eviction decided after query `q`'s attention (the cache compresses once
//! a step's attention is done) is recorded as "last seen by `q`".

/// Evictions of one sequence: per layer and KV head, `(position, last query
/// position that saw it)`, in the order they happened. Grows with evictions
/// only, so a sequence that never compresses records nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EvictionLog {
    n_kv_head: usize,
    /// `[layer * n_kv_head + head]` -> evicted entries.
    evicted: Vec<Vec<(u32, u32)>>,
}

impl EvictionLog {
    /// An empty log for a model with `n_layer` layers and `n_kv_head` KV heads.
    pub fn new(n_layer: usize, n_kv_head: usize) -> Self {
        Self {
            n_kv_head,
            evicted: vec![Vec::new(); n_layer * n_kv_head],
        }
    }

    /// Records that `position` left `(layer, head)` after query `last_query`'s attention.
    pub fn record(&mut self, layer: usize, head: usize, position: u32, last_query: u32) {
        if let Some(v) = self.evicted.get_mut(layer * self.n_kv_head + head) {
            v.push((position, last_query));
        }
    }

    /// Entries evicted, summed over layers and heads.
    pub fn len(&self) -> usize {
        self.evicted.iter().map(Vec::len).sum()
    }

    /// Whether nothing was evicted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The evictions that queries before position `q` could notice (those
    /// whose last query came before `q`): a prompt's share of a completion's
    /// record when `q` is the prompt length.
    pub fn before(&self, q: u32) -> EvictionLog {
        Self {
            n_kv_head: self.n_kv_head,
            evicted: self
                .evicted
                .iter()
                .map(|v| v.iter().copied().filter(|&(_, l)| l < q).collect())
                .collect(),
        }
    }

    /// What the queries at positions `from..to` attended over, summed over
    /// every (layer, KV head) slot: `(kept, full)`, `kept` the entries each
    /// query could see (causal and not yet evicted), `full` those a cache
    /// that never evicts would have shown it (`q + 1` per slot). `kept /
    /// full` is the share of the KV a sequence really kept, as its tokens
    /// saw it, rather than its bytes at one moment (a peak or the end).
    /// Only evictions are recorded, so a sliding-window layer counts as
    /// kept whole.
    pub fn attended(&self, from: u32, to: u32) -> (u64, u64) {
        let slots = self.evicted.len() as u64;
        let queries = u64::from(to.saturating_sub(from));
        // Sum over q of (q + 1), per slot.
        let full = (u64::from(from) * queries + queries * (queries + 1) / 2) * slots;
        let mut hidden = 0u64;
        let mut lasts: Vec<u32> = Vec::new();
        for entries in &self.evicted {
            // Entry e is hidden from query q once q > e.last (its position is
            // before its last query, so it is always causal for q).
            lasts.clear();
            lasts.extend(entries.iter().map(|&(_, last)| last));
            lasts.sort_unstable();
            let mut before = 0usize;
            for q in from..to {
                while before < lasts.len() && lasts[before] < q {
                    before += 1;
                }
                hidden += before as u64;
            }
        }
        (full - hidden.min(full), full)
    }

    /// The dense mask over positions `0..len` that [`Visibility::visible`] reads.
    pub fn visibility(&self, len: usize) -> Visibility {
        let mut last_seen = vec![u32::MAX; self.evicted.len() * len];
        for (slot, entries) in self.evicted.iter().enumerate() {
            for &(pos, q) in entries {
                if (pos as usize) < len {
                    let cell = &mut last_seen[slot * len + pos as usize];
                    *cell = (*cell).min(q);
                }
            }
        }
        Visibility {
            n_kv_head: self.n_kv_head,
            len,
            last_seen,
        }
    }
}

/// A replayed eviction record, dense for lookups inside the attention mask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visibility {
    n_kv_head: usize,
    len: usize,
    /// `[layer][head][position]`: the last query position that saw the entry
    /// (`u32::MAX`: never evicted).
    last_seen: Vec<u32>,
}

impl Visibility {
    /// Whether the query at `q_pos` saw the entry at `k_pos` in `(layer, head)`.
    pub fn visible(&self, layer: usize, head: usize, q_pos: u32, k_pos: u32) -> bool {
        if k_pos > q_pos {
            return false;
        }
        let at = (layer * self.n_kv_head + head) * self.len + k_pos as usize;
        (k_pos as usize) >= self.len || self.last_seen.get(at).is_none_or(|&l| q_pos <= l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicted_entries_vanish_for_later_queries_only() {
        let mut log = EvictionLog::new(2, 2);
        // Layer 1, head 0: position 3 evicted after query 10 attended.
        log.record(1, 0, 3, 10);
        assert_eq!(log.len(), 1);
        let v = log.visibility(16);
        assert!(v.visible(1, 0, 10, 3));
        assert!(!v.visible(1, 0, 11, 3));
        // Other heads and layers keep it; causality still holds.
        assert!(v.visible(1, 1, 11, 3));
        assert!(v.visible(0, 0, 11, 3));
        assert!(!v.visible(0, 0, 2, 3));
        // Positions past the mask's length are causal only.
        assert!(v.visible(1, 0, 40, 20));
    }

    #[test]
    fn attended_counts_what_each_query_could_see() {
        // One layer, one head; queries 4..8 (each sees q + 1 entries in full).
        let mut log = EvictionLog::new(1, 1);
        assert_eq!(log.attended(4, 8), (5 + 6 + 7 + 8, 26));
        // Positions 0 and 1 leave after query 5: queries 6 and 7 miss both.
        log.record(0, 0, 0, 5);
        log.record(0, 0, 1, 5);
        assert_eq!(log.attended(4, 8), (26 - 4, 26));
        // The dense mask agrees query by query.
        let v = log.visibility(8);
        let seen: u64 = (4..8u32)
            .map(|q| (0..=q).filter(|&k| v.visible(0, 0, q, k)).count() as u64)
            .sum();
        assert_eq!(seen, 22);
        // Two slots count twice the full cache.
        assert_eq!(EvictionLog::new(2, 1).attended(0, 2), (6, 6));
    }
}
