//! Perplexity the way llama.cpp's `llama-perplexity` computes it, so the two can
//! be compared number for number.
//!
//! The text is tokenized once (BOS only if the model asks for it), cut into
//! non-overlapping windows of `ctx` tokens (a trailing partial window is
//! dropped), and each window is run from an empty cache; only its second half is
//! scored, so every scored token sees at least `ctx/2` tokens of context.

use std::time::Instant;

use tern_models::{LogitsWanted, SeqBatch};

use crate::error::{Result, RuntimeError};
use crate::kv::policy::KvPolicy;
use crate::kv::SeqCache;
use crate::model::LoadedModel;

/// The outcome of a perplexity run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PerplexityReport {
    /// exp(mean negative log-likelihood) over scored tokens.
    pub perplexity: f64,
    /// Tokens in the whole text.
    pub tokens: usize,
    /// Tokens whose likelihood was scored.
    pub scored_tokens: usize,
    /// Windows evaluated.
    pub chunks: usize,
    /// Window size.
    pub ctx: usize,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Peak KV-cache bytes of one window.
    pub kv_bytes: usize,
    /// Bytes a full cache would have held for one window.
    pub kv_bytes_full: usize,
    /// The policy, as its spec string.
    pub kv_policy: String,
}

/// Scores `tokens` in windows of `ctx` with the KV cache compressed by
/// `policy`; `on_chunk(i, n, running_ppl)` reports progress after each window.
///
/// Under `full` the scored half runs as one forward (llama.cpp's way). Under any
/// other policy the first half is prefilled (and compressed at its end, for
/// policies that do), then the scored half is decoded one token at a time so
/// every prediction sees exactly the cache the policy would leave in generation.
pub fn perplexity(
    model: &LoadedModel,
    tokens: &[u32],
    ctx: usize,
    policy: &KvPolicy,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    let max_ctx = model.config().context_length;
    if ctx < 4 || ctx > max_ctx {
        return Err(RuntimeError::InvalidParam {
            param: "ctx".into(),
            reason: format!(
                "must be between 4 and the model's context length {max_ctx}, got {ctx}"
            ),
        });
    }
    let n_chunks = tokens.len() / ctx;
    if n_chunks == 0 {
        return Err(RuntimeError::InvalidParam {
            param: "file".into(),
            reason: format!(
                "the text has {} tokens; at least ctx = {ctx} are needed for one window",
                tokens.len()
            ),
        });
    }
    let first = ctx / 2;
    let bos = model
        .tokenizer
        .adds_bos()
        .then(|| model.tokenizer.bos())
        .flatten();
    let t0 = Instant::now();
    let (mut nll, mut count, mut kv_bytes, mut kv_bytes_full) = (0.0f64, 0usize, 0usize, 0usize);
    for c in 0..n_chunks {
        let mut window = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let mut cache = SeqCache::with_policy(model.config(), policy.clone());
        // Unscored first half: no logits needed.
        let mut head = [SeqBatch {
            tokens: &window[..first],
            start_pos: 0,
            cache: &mut cache,
            logits: LogitsWanted::None,
        }];
        model.llama.forward(&mut head)?;
        cache.finish_prefill()?;
        let rows = if matches!(policy, KvPolicy::Full) {
            let mut tail = [SeqBatch {
                tokens: &window[first..],
                start_pos: first,
                cache: &mut cache,
                logits: LogitsWanted::All,
            }];
            let logits = model.llama.forward(&mut tail)?.pop().flatten();
            logits.ok_or(RuntimeError::EmptyPrompt)?.to_vec2::<f32>()?
        } else {
            let mut rows = Vec::with_capacity(ctx - first);
            for pos in first..ctx - 1 {
                let mut step = [SeqBatch {
                    tokens: &window[pos..pos + 1],
                    start_pos: pos,
                    cache: &mut cache,
                    logits: LogitsWanted::Last,
                }];
                let logits = model.llama.forward(&mut step)?.pop().flatten();
                rows.push(
                    logits
                        .ok_or(RuntimeError::EmptyPrompt)?
                        .squeeze(0)?
                        .to_vec1::<f32>()?,
                );
            }
            rows
        };
        // Row r predicts window[first + r + 1]; a last row, if any, has no target.
        for (r, row) in rows.iter().enumerate().take(ctx - first - 1) {
            let target = tokens[c * ctx + first + r + 1];
            nll -= f64::from(crate::sampler::log_softmax_at(row, target));
            count += 1;
        }
        kv_bytes = kv_bytes.max(cache.peak_bytes());
        kv_bytes_full = kv_bytes_full.max(cache.full_bytes());
        on_chunk(c + 1, n_chunks, (nll / count as f64).exp());
    }
    Ok(PerplexityReport {
        perplexity: (nll / count as f64).exp(),
        tokens: tokens.len(),
        scored_tokens: count,
        chunks: n_chunks,
        ctx,
        seconds: t0.elapsed().as_secs_f64(),
        kv_bytes,
        kv_bytes_full,
        kv_policy: policy.to_string(),
    })
}
