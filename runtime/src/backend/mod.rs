//! Backends: what runs the forward pass for the engine. Tern's own (`tern`:
//! Tern's quantized kernels over candle tensors, Tern's KV policies) is always there;
//! llama.cpp joins behind the `llama-cpp` feature as a reference and a peer.
//!
//! The engine talks to a backend only through [`Backend`]: sequences are ids the
//! backend owns, a step is a list of [`Row`]s, and logits come back as plain
//! vectors, so the scheduler, sampler and stop logic are shared by every backend.

#[cfg(feature = "llama-cpp")]
mod llama_cpp;
#[cfg(feature = "llama-cpp")]
mod llama_jinja;
mod tern;

#[cfg(feature = "llama-cpp")]
pub use self::llama_cpp::{LlamaCppBackend, LlamaCppOptions};
#[cfg(feature = "llama-cpp")]
pub use self::llama_jinja::{render_chat_llama_cpp, JinjaRequest};
pub use self::tern::TernBackend;
pub use tern_models::LogitsWanted;

use std::sync::Arc;

use tern_models::{EvictionLog, KvDtype, LoraSet};

use crate::error::{Result, RuntimeError};
use crate::kv::policy::KvPolicy;

/// A sequence inside a backend.
pub type SeqId = u64;

/// One sequence's new tokens in a step.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    /// The sequence they extend.
    pub seq: SeqId,
    /// New token ids.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start_pos: usize,
    /// Which logits are wanted back.
    pub logits: LogitsWanted,
}

/// KV figures of one sequence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqKv {
    /// Bytes of keys and values held now.
    pub bytes: usize,
    /// The most bytes held at once so far.
    pub peak: usize,
    /// Bytes a full cache would hold for the same tokens.
    pub full: usize,
    /// Bytes of the buffers holding them (capacity, not just valid entries).
    pub allocated: usize,
    /// Times the cache was re-numbered to go on past the model's context.
    pub shifts: usize,
    /// Entries the fullest layer holds now (what a compressed cache kept).
    pub held: usize,
}

/// A forward-pass implementation with per-sequence KV state.
pub trait Backend: Send {
    /// Short name (`tern`, `llama-cpp`), for reports and errors.
    fn name(&self) -> &'static str;
    /// Names of the KV policies this backend runs (`None`: all of them).
    fn supported_policies(&self) -> Option<&'static [&'static str]> {
        None
    }
    /// The KV storage types this backend honours per sequence (`None`: all
    /// of them). llama.cpp fixes its cache's type when the context is made.
    fn supported_kv_dtypes(&self) -> Option<Vec<KvDtype>> {
        None
    }
    /// A new empty sequence compressed by `policy`, its keys and values
    /// stored as `dtype`, expected to reach `expected_len` tokens.
    fn new_seq(&mut self, policy: &KvPolicy, dtype: KvDtype, expected_len: usize) -> Result<SeqId>;
    /// A new empty sequence like [`Backend::new_seq`] that goes on past the
    /// model's context: when its next tokens would pass the last position,
    /// `overflow` evicts down to its budget and what is kept is re-numbered
    /// (see [`crate::kv::SeqCache::make_room`]). `overflow` evicts only
    /// there when `policy` is full; otherwise the two are the same policy.
    /// Backends that cannot re-number their cache refuse.
    fn new_overflow_seq(
        &mut self,
        _policy: &KvPolicy,
        _overflow: &KvPolicy,
        _dtype: KvDtype,
        _expected_len: usize,
    ) -> Result<SeqId> {
        Err(RuntimeError::Backend(format!(
            "the {} backend cannot go on past the model's context under a KV policy",
            self.name()
        )))
    }
    /// Runs one ragged step; per row, the logits it asked for, row-major
    /// (`vocab` values per returned token).
    fn forward(&mut self, rows: &[Row<'_>]) -> Result<Vec<Option<Vec<f32>>>>;
    /// [`Backend::forward`] where every token's logits have the bits that
    /// token would get decoded on its own, one row a step, whatever the
    /// step's row count (a speculative draft's verify step promises plain
    /// decoding's output). The default is `forward`: right for backends
    /// that cannot rewind, where speculation is off.
    fn forward_alone(&mut self, rows: &[Row<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        self.forward(rows)
    }
    /// Runs one ragged step and returns, per row, every new token's final
    /// hidden state after the output norm, row-major (`n_embd` values per
    /// token): what embeddings pool. Backends that cannot expose hidden
    /// states refuse (see [`Backend::embeds`]).
    fn hidden(&mut self, _rows: &[Row<'_>]) -> Result<Vec<Vec<f32>>> {
        Err(RuntimeError::Backend(format!(
            "the {} backend cannot compute embeddings (use the tern backend)",
            self.name()
        )))
    }
    /// Whether [`Backend::hidden`] works, so an embedding request is refused
    /// before it is queued rather than failing inside the engine.
    fn embeds(&self) -> bool {
        false
    }
    /// Called once a sequence's prompt has been read (end-of-prompt compression).
    fn finish_prefill(&mut self, seq: SeqId) -> Result<()>;
    /// A copy of `seq` that evolves independently (shared-prompt best-of-N).
    fn fork(&mut self, seq: SeqId) -> Result<SeqId>;
    /// A new sequence holding a copy of the first `len` cached tokens of
    /// `seq`, expected to reach `expected_len` tokens (the prompt-prefix
    /// cache). `Ok(None)` where the backend or the sequence's policy cannot
    /// (only an uncompressed cache is a prefix of its prompt).
    fn fork_prefix(
        &mut self,
        _seq: SeqId,
        _len: usize,
        _expected_len: usize,
    ) -> Result<Option<SeqId>> {
        Ok(None)
    }
    /// New prompt rows from which this backend's prefill attention runs a
    /// different kernel (so rounds differently): a reused prefix must leave
    /// the rest of a prompt on the kernel a cold prefill would take. `None`
    /// for a backend with one kernel at every size.
    fn attention_kernel_switch_rows(&self) -> Option<usize> {
        None
    }
    /// Whether [`Backend::rewind`] can take entries back out of `seq`'s
    /// cache (speculative decoding is off for a sequence that cannot).
    fn can_rewind(&self, _seq: SeqId) -> bool {
        false
    }
    /// Drops every cached entry of `seq` from position `len` on (a
    /// speculative draft's rejected tokens), so the next row continues at
    /// `len`. `Ok(false)` where the backend or the sequence cannot.
    fn rewind(&mut self, _seq: SeqId, _len: usize) -> Result<bool> {
        Ok(false)
    }
    /// Most rows `seq`'s next forward may carry for a draft verified in it
    /// to stay lossless: a compressing cache must not evict between two of
    /// them (`usize::MAX`: no bound).
    fn verify_rows(&self, _seq: SeqId) -> usize {
        usize::MAX
    }
    /// Marks `seq`'s next forward as a draft's verification: a compressing
    /// cache evicts nothing and holds back its scoring until the
    /// [`Backend::rewind`] that follows, which keeps the accepted rows as
    /// plain decoding would have left them. Call it for every row that
    /// carries a draft, and rewind after, also when the whole draft is kept.
    fn begin_verify(&mut self, _seq: SeqId) {}
    /// Frees a sequence and its cache.
    fn free(&mut self, seq: SeqId);
    /// The sequence's KV figures.
    fn kv(&self, seq: SeqId) -> SeqKv;
    /// Starts recording the sequence's evictions (its forks inherit the
    /// record), so a learner can replay what each token saw. Backends whose
    /// cache is not Tern's refuse.
    fn record_evictions(&mut self, _seq: SeqId) -> Result<()> {
        Err(RuntimeError::Backend(format!(
            "the {} backend cannot record KV evictions (use the tern backend)",
            self.name()
        )))
    }
    /// The sequence's eviction record, if recording.
    fn evictions(&self, _seq: SeqId) -> Option<Arc<EvictionLog>> {
        None
    }
    /// Replaces the LoRA adapters every later step applies (`None`: none); how
    /// the trainer hands the engine its updated policy. Backends that cannot
    /// apply adapters refuse.
    fn set_adapters(&mut self, adapters: Option<Arc<LoraSet>>) -> Result<()> {
        if adapters.is_none() {
            return Ok(());
        }
        Err(RuntimeError::Backend(format!(
            "the {} backend cannot apply LoRA adapters (use the tern backend)",
            self.name()
        )))
    }
}
