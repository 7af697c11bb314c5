//! Single-sequence generation on a [`Backend`], without the engine's
//! scheduler: chunked prefill, then one token per forward until a stop token, a
//! stop string or the token limit. The evaluations use it (one sequence at a
//! time, its KV bytes read from the backend), and the engine's tests use it as
//! the straight-line reference the batched engine must equal. It is not an
//! engine API: every serving caller goes through the engine
//! (`tern_runtime::engine`), whose types it shares.

use std::time::Instant;

use tern_runtime::backend::{Backend, LogitsWanted, Row, SeqId};
use tern_runtime::engine::{FinishReason, StopMatcher, TokenLogprob};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::sampler::{Sampler, SamplingParams};
use tern_runtime::tokenizer::StreamDecoder;
use tern_runtime::{LoadedModel, RuntimeError};

use crate::error::{KvEvalError, Result};

/// What to generate and how.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids (already templated and tokenized).
    pub prompt: Vec<u32>,
    /// Sampling parameters (temperature, penalties, seed ...).
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Keep going past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// Strings that end generation; the text is cut before them.
    pub stop: Vec<String>,
    /// Prompt tokens per prefill forward.
    pub prefill_chunk: usize,
    /// How the KV cache is compressed while generating.
    pub kv_policy: KvPolicy,
    /// How the KV cache stores keys and values.
    pub kv_dtype: KvDtype,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Generated text (stop string excluded, control tokens hidden).
    pub text: String,
    /// Generated token ids (including a final stop token if one was sampled).
    pub token_ids: Vec<u32>,
    /// Per-token log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Seconds spent in prefill (prompt forward passes plus first sample).
    pub prefill_secs: f64,
    /// Seconds spent in decode forward passes.
    pub decode_secs: f64,
    /// Decode forward passes run.
    pub decode_steps: usize,
    /// Peak bytes held by the KV cache.
    pub kv_bytes: usize,
    /// Bytes a full cache would have held for the same tokens.
    pub kv_bytes_full: usize,
    /// Bytes of KV buffers allocated at the end (capacity, not just valid
    /// entries; what the backend holds them in).
    pub kv_bytes_allocated: usize,
}

/// Runs `prompt` into sequence `seq` from position `start` in chunks of
/// `chunk`; returns the last token's logits.
pub(crate) fn prefill(
    backend: &mut dyn Backend,
    seq: SeqId,
    prompt: &[u32],
    start: usize,
    chunk: usize,
) -> Result<Vec<f32>> {
    let chunk = chunk.max(1);
    let mut last = None;
    for (i, piece) in prompt.chunks(chunk).enumerate() {
        let is_last = (i + 1) * chunk >= prompt.len();
        let row = Row {
            seq,
            tokens: piece,
            start_pos: start + i * chunk,
            logits: if is_last {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        };
        last = backend.forward(&[row])?.pop().flatten();
    }
    backend.finish_prefill(seq)?;
    last.ok_or(KvEvalError::Runtime(RuntimeError::EmptyPrompt))
}

/// Generates from `req.prompt` on `backend` (running `model`), calling
/// `on_text` with each piece of text as it becomes complete UTF-8. The
/// sequence is freed whatever happens.
pub fn generate(
    backend: &mut dyn Backend,
    model: &LoadedModel,
    req: &GenerateRequest,
    on_text: impl FnMut(&str),
) -> Result<GenerateOutput> {
    req.sampling.validate().map_err(RuntimeError::from)?;
    model.check_prompt(req.prompt.len())?;
    let seq = backend.new_seq(
        &req.kv_policy,
        req.kv_dtype,
        req.prompt.len() + req.max_tokens,
    )?;
    let out = run(backend, seq, model, req, on_text);
    backend.free(seq);
    out
}

fn run(
    backend: &mut dyn Backend,
    seq: SeqId,
    model: &LoadedModel,
    req: &GenerateRequest,
    on_text: impl FnMut(&str),
) -> Result<GenerateOutput> {
    let t0 = Instant::now();
    let logits = prefill(backend, seq, &req.prompt, 0, req.prefill_chunk)?;
    decode(
        backend,
        seq,
        model,
        req,
        logits,
        t0.elapsed().as_secs_f64(),
        on_text,
    )
}

/// Samples from the prompt's last `logits` on: one token per forward until a
/// stop or the limit.
pub(crate) fn decode(
    backend: &mut dyn Backend,
    seq: SeqId,
    model: &LoadedModel,
    req: &GenerateRequest,
    mut logits: Vec<f32>,
    prefill_secs: f64,
    mut on_text: impl FnMut(&str),
) -> Result<GenerateOutput> {
    let ctx = model.config().context_length;
    let stop_ids = if req.ignore_eos {
        Vec::new()
    } else {
        model.stop_tokens()
    };
    let mut sampler = Sampler::new(req.sampling.clone());
    if req.sampling.dry_enabled() {
        sampler.set_dry_breakers(model.dry_breakers(&req.sampling.dry_sequence_breakers));
    }
    let mut history = req.prompt.clone();
    let mut out = GenerateOutput {
        text: String::new(),
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Length,
        prompt_tokens: req.prompt.len(),
        prefill_secs,
        decode_secs: 0.0,
        decode_steps: 0,
        kv_bytes: 0,
        kv_bytes_full: 0,
        kv_bytes_allocated: 0,
    };
    let mut decoder = StreamDecoder::new();
    let mut stops = StopMatcher::new(req.stop.clone());

    let t1 = Instant::now();
    while out.token_ids.len() < req.max_tokens {
        let s = sampler.sample(&logits, &history);
        out.token_ids.push(s.token);
        out.logprobs.push(TokenLogprob {
            token: s.token,
            logprob: s.logprob,
            top: s.top,
        });
        history.push(s.token);
        if stop_ids.contains(&s.token) {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        let piece = decoder.push(&model.tokenizer, s.token);
        if let Some(emit) = stops.feed(&piece) {
            out.text.push_str(&emit.text);
            on_text(&emit.text);
            if emit.stopped {
                out.finish_reason = FinishReason::Stop;
                break;
            }
        }
        let pos = history.len() - 1;
        if out.token_ids.len() >= req.max_tokens || pos + 1 >= ctx {
            break;
        }
        let row = Row {
            seq,
            tokens: &history[pos..],
            start_pos: pos,
            logits: LogitsWanted::Last,
        };
        logits = backend
            .forward(&[row])?
            .pop()
            .flatten()
            .ok_or(RuntimeError::EmptyPrompt)?;
        out.decode_steps += 1;
    }
    out.decode_secs = t1.elapsed().as_secs_f64();
    if out.finish_reason == FinishReason::Length {
        let tail = stops.flush(decoder.finish());
        out.text.push_str(&tail);
        on_text(&tail);
    }
    let kv = backend.kv(seq);
    out.kv_bytes = kv.peak;
    out.kv_bytes_full = kv.full;
    out.kv_bytes_allocated = kv.allocated;
    Ok(out)
}
