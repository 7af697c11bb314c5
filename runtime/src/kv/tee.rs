//! One prompt read into several caches at once: the forward runs once and
//! every member cache receives what it would have received alone.
//!
//! Why: a KV-policy sweep (`tern kv-eval --tasks ruler`) answers the same
//! long prompt under dozens of policies and budgets, and the prompt's forward
//! pass is most of each answer's time (about 50 s of 54 s at 4k tokens on two
//! cores). When the whole prompt is one prefill chunk into empty caches, every
//! member holds the same entries while the chunk attends (no policy evicts
//! inside `append`), so the attention outputs, and with them every hidden
//! state and the last token's logits, are the same for all of them; the
//! members part only in `after_attention`, where each compresses by its own
//! policy from the queries or weights it was handed. Reading the prompt once
//! into a tee and then decoding each member alone therefore gives each
//! member's answer exactly (`tests/kv_tee.rs` checks it token for token).

use candle_core::Tensor;
use tern_models::{KvDtype, KvStore, Rotary, WeightsWanted};

use super::SeqCache;

/// Fans one prefill out to several empty caches of one storage type.
pub struct TeeCache {
    /// The caches; the first one's entries are the ones attended over.
    members: Vec<SeqCache>,
}

/// Why caches cannot be read into together.
#[derive(Debug, thiserror::Error)]
pub enum TeeError {
    /// No cache to read into.
    #[error("a tee needs at least one cache")]
    Empty,
    /// The members store keys and values differently, so their attention
    /// would differ.
    #[error("every cache of a tee must store the same type (found {0} and {1})")]
    MixedStorage(KvDtype, KvDtype),
    /// A member already holds entries: the members would not attend over
    /// the same ones.
    #[error("every cache of a tee must start empty")]
    NotEmpty,
}

impl TeeCache {
    /// A tee over `members`, which must be empty and share one storage type.
    /// Feed it the whole prompt in one forward (one chunk): later chunks
    /// would attend over caches that have compressed differently.
    pub fn new(members: Vec<SeqCache>) -> Result<Self, TeeError> {
        let first = members.first().ok_or(TeeError::Empty)?;
        if let Some(other) = members.iter().find(|m| m.dtype() != first.dtype()) {
            return Err(TeeError::MixedStorage(first.dtype(), other.dtype()));
        }
        if members.iter().any(|m| m.seen() > 0) {
            return Err(TeeError::NotEmpty);
        }
        Ok(Self { members })
    }

    /// The caches, in the order given, each as it would be after reading the
    /// prompt alone.
    pub fn into_members(self) -> Vec<SeqCache> {
        self.members
    }

    /// Ends the prompt for every member ([`SeqCache::finish_prefill`]).
    pub fn finish_prefill(&mut self) -> tern_models::Result<()> {
        self.members
            .iter_mut()
            .try_for_each(SeqCache::finish_prefill)
    }
}

impl KvStore for TeeCache {
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &[u32],
    ) -> tern_models::Result<(Tensor, Tensor)> {
        let (first, rest) = self
            .members
            .split_first_mut()
            .expect("TeeCache::new refuses an empty tee");
        for m in rest {
            m.append(layer, k, v, positions)?;
        }
        first.append(layer, k, v, positions)
    }

    fn dtype(&self) -> KvDtype {
        self.members[0].dtype()
    }

    fn positions(&self, layer: usize, head: usize) -> &[u32] {
        self.members[0].positions(layer, head)
    }

    fn hides_entries(&self, layer: usize) -> bool {
        self.members.iter().any(|m| m.hides_entries(layer))
    }

    fn wants_attention(&self, layer: usize) -> bool {
        self.members.iter().any(|m| m.wants_attention(layer))
    }

    fn attention_rows(&self, layer: usize) -> WeightsWanted {
        self.members
            .iter()
            .filter(|m| m.wants_attention(layer))
            .map(|m| m.attention_rows(layer))
            .reduce(WeightsWanted::union)
            .unwrap_or(WeightsWanted::ALL_ROWS)
    }

    fn observe_attention(
        &mut self,
        layer: usize,
        weights: &Tensor,
        column_means: Option<&[f32]>,
    ) -> tern_models::Result<()> {
        for m in self.members.iter_mut().filter(|m| m.wants_attention(layer)) {
            m.observe_attention(layer, weights, column_means)?;
        }
        Ok(())
    }

    fn wants_queries(&self, layer: usize) -> bool {
        self.members.iter().any(|m| m.wants_queries(layer))
    }

    fn observe_queries(
        &mut self,
        layer: usize,
        q: &Tensor,
        positions: &[u32],
        rope: &Rotary,
    ) -> tern_models::Result<()> {
        for m in self.members.iter_mut().filter(|m| m.wants_queries(layer)) {
            m.observe_queries(layer, q, positions, rope)?;
        }
        Ok(())
    }

    fn after_attention(&mut self, layer: usize) -> tern_models::Result<()> {
        self.members
            .iter_mut()
            .try_for_each(|m| m.after_attention(layer))
    }
}
