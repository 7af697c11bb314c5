//! The ragged batch every architecture's forward pass takes: the new tokens of
//! several sequences concatenated, each with its own start position, its own
//! KV cache and its own choice of logits, and the layout (rows, positions)
//! worked out from it once per step.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv::KvStore;

/// Which logits a sequence in a batch needs back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// Only the last new token's (generation).
    Last,
    /// Every new token's (perplexity, teacher forcing).
    All,
}

/// One sequence's slice of a ragged batch.
pub struct SeqBatch<'a> {
    /// New token ids of this sequence.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence (the count of tokens before it).
    pub start_pos: usize,
    /// This sequence's cache.
    pub cache: &'a mut dyn KvStore,
    /// Which logits to return for it.
    pub logits: LogitsWanted,
}

/// One sequence of a batched step while the pool computes its attention: the
/// sequence, its first row in the batch, and the result once computed.
pub(crate) type SeqSlot<'s, 'a> = (&'s mut SeqBatch<'a>, usize, Option<Result<Tensor>>);

/// Where each sequence's tokens sit in the concatenated batch.
pub(crate) struct BatchLayout {
    /// First row of each sequence in the concatenated batch.
    pub(crate) offsets: Vec<usize>,
    /// Position of every token in the batch.
    pub(crate) positions: Vec<u32>,
}

/// Checks `batch` against `config` (context length, vocabulary) and works out
/// each sequence's rows and token positions.
pub(crate) fn plan(config: &ModelConfig, batch: &[SeqBatch<'_>]) -> Result<BatchLayout> {
    let mut offsets = Vec::with_capacity(batch.len());
    let mut positions = Vec::new();
    for seq in batch {
        let end = seq.start_pos + seq.tokens.len();
        if end > config.context_length {
            return Err(ModelError::BadTensor {
                name: "positions".into(),
                reason: format!(
                    "position {end} exceeds the model's context length {}",
                    config.context_length
                ),
            });
        }
        if let Some(&bad) = seq
            .tokens
            .iter()
            .find(|&&t| t as usize >= config.vocab_size)
        {
            return Err(ModelError::BadTensor {
                name: "tokens".into(),
                reason: format!(
                    "token id {bad} is outside the vocabulary ({})",
                    config.vocab_size
                ),
            });
        }
        offsets.push(positions.len());
        positions.extend((seq.start_pos..end).map(|p| p as u32));
    }
    Ok(BatchLayout { offsets, positions })
}
