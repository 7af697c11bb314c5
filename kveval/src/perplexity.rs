//! Perplexity the way llama.cpp's `llama-perplexity` computes it, so the two can
//! be compared number for number.
//!
//! The text is tokenized once (BOS only if the model asks for it), cut into
//! non-overlapping windows of `ctx` tokens (a trailing partial window is
//! dropped), and each window is run from an empty cache; only its second half is
//! scored, so every scored token sees at least `ctx/2` tokens of context.
//!
//! Under a compressing policy the scored half is decoded a token at a time
//! (the perplexity-under-policy path the KV tables measure); under `full` it
//! is `tern perplexity`'s exactness check against llama.cpp.

use std::time::Instant;

use tern_runtime::backend::{Backend, LogitsWanted, Row, SeqId, TernBackend};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::{LoadedModel, RuntimeError};

use crate::error::{KvEvalError, Result};

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
    /// How the cache stored keys and values.
    pub kv_dtype: KvDtype,
    /// The backend that ran it (`candle`, `llama-cpp`).
    pub backend: String,
}

/// Scores `tokens` in windows of `ctx` with the KV cache compressed by
/// `policy` and stored as f16 (the default), on Tern's own backend;
/// `on_chunk(i, n, running_ppl)` reports progress after each window.
pub fn perplexity(
    model: &LoadedModel,
    tokens: &[u32],
    ctx: usize,
    policy: &KvPolicy,
    on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    perplexity_stored(model, tokens, ctx, policy, KvDtype::default(), on_chunk)
}

/// [`perplexity`] with the cache stored as `dtype`.
pub fn perplexity_stored(
    model: &LoadedModel,
    tokens: &[u32],
    ctx: usize,
    policy: &KvPolicy,
    dtype: KvDtype,
    on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    let mut backend = TernBackend::new(model);
    perplexity_on(&mut backend, model, tokens, ctx, policy, dtype, on_chunk)
}

/// [`perplexity`] on any backend; `model` supplies the context length and BOS.
///
/// Under `full` the scored half runs as one forward (llama.cpp's way). Under any
/// other policy the first half is prefilled (and compressed at its end, for
/// policies that do), then the scored half is decoded one token at a time so
/// every prediction sees exactly the cache the policy would leave in generation.
pub fn perplexity_on(
    backend: &mut dyn Backend,
    model: &LoadedModel,
    tokens: &[u32],
    ctx: usize,
    policy: &KvPolicy,
    dtype: KvDtype,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    let max_ctx = model.config().context_length;
    let vocab = model.config().vocab_size;
    if ctx < 4 || ctx > max_ctx {
        return Err(KvEvalError::Window {
            window: ctx,
            max: max_ctx,
        });
    }
    let n_chunks = tokens.len() / ctx;
    if n_chunks == 0 {
        return Err(KvEvalError::TooFewTokens {
            tokens: tokens.len(),
            window: ctx,
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
        let seq = backend.new_seq(policy, dtype, ctx)?;
        let result = score_window(backend, seq, &window, first, policy);
        let kv = backend.kv(seq);
        backend.free(seq);
        let logits = result?;
        // Row r predicts window[first + r + 1]; a last row, if any, has no target.
        for (r, row) in logits.chunks(vocab).enumerate().take(ctx - first - 1) {
            let target = window[first + r + 1];
            nll -= f64::from(tern_runtime::sampler::log_softmax_at(row, target));
            count += 1;
        }
        kv_bytes = kv_bytes.max(kv.peak);
        kv_bytes_full = kv_bytes_full.max(kv.full);
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
        kv_dtype: dtype,
        backend: backend.name().to_string(),
    })
}

/// Logits (row-major) of the positions `first..` of one window.
fn score_window(
    backend: &mut dyn Backend,
    seq: SeqId,
    window: &[u32],
    first: usize,
    policy: &KvPolicy,
) -> tern_runtime::Result<Vec<f32>> {
    let missing = || RuntimeError::Backend("the backend returned no logits".into());
    // Unscored first half: no logits needed.
    backend.forward(&[Row {
        seq,
        tokens: &window[..first],
        start_pos: 0,
        logits: LogitsWanted::None,
    }])?;
    backend.finish_prefill(seq)?;
    if matches!(policy, KvPolicy::Full) {
        let rows = backend.forward(&[Row {
            seq,
            tokens: &window[first..],
            start_pos: first,
            logits: LogitsWanted::All,
        }])?;
        return rows.into_iter().next().flatten().ok_or_else(missing);
    }
    let mut logits = Vec::new();
    for pos in first..window.len() - 1 {
        let rows = backend.forward(&[Row {
            seq,
            tokens: &window[pos..pos + 1],
            start_pos: pos,
            logits: LogitsWanted::Last,
        }])?;
        logits.extend(rows.into_iter().next().flatten().ok_or_else(missing)?);
    }
    Ok(logits)
}
