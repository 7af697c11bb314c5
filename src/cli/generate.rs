//! `tern generate`: one prompt in, streamed text out (or one JSON object).

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{
    Completion, EngineConfig, EngineHandle, Event, FinishReason, KvUsage, SubmitRequest,
};
use tern_runtime::sampler::SamplingParams;
use tern_runtime::{memory, LoadedModel};

use super::args::{parse_speculative, KvArgs, ModelArgs, PromptArgs, SamplingArgs};
use super::backend::{self, Sizing};
use super::resolve;
use clap::Args;

/// `tern generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long)]
    pub chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Let control-token text such as `<|im_start|>` in the prompt become
    /// control tokens inside the chat template (default: it stays text).
    #[arg(long)]
    pub allow_special_tokens_in_content: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Keep generating past end-of-sequence up to --max-tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Return this many most likely alternatives per token in --json (0-20).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: usize,
    /// Prompt tokens per prefill forward pass.
    #[arg(long, default_value_t = tern_runtime::engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// What runs the forward pass: Tern's own kernels or llama.cpp.
    #[arg(long, value_enum, default_value = "tern")]
    pub backend: crate::cli::backend::BackendKind,
    /// Speculative decoding: `off` (the default without --draft-model),
    /// `ngram` (prompt lookup; the output is the same, faster where it
    /// repeats the prompt), `draft` (the --draft-model proposes; the default
    /// with one), or `ngram:max_draft=N` / `draft:max_draft=N`.
    #[arg(long, value_parser = parse_speculative)]
    pub speculative: Option<tern_runtime::engine::Speculative>,
    /// A smaller model of the same vocabulary (path or registry name) that
    /// drafts tokens for --model to verify (`--speculative draft`); the
    /// output is --model's own. Refused if its vocabulary differs.
    #[arg(long)]
    pub draft_model: Option<String>,
}

/// Sampling parameters from the shared CLI options.
pub fn sampling_params(s: &SamplingArgs, top_logprobs: usize) -> SamplingParams {
    SamplingParams {
        temperature: s.temperature,
        top_k: (s.top_k > 0).then_some(s.top_k),
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repeat_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        penalty_last_n: s.repeat_last_n,
        logit_bias: Vec::new(),
        seed: s.seed,
        top_logprobs,
        ..SamplingParams::default()
    }
}

/// Token ids of `prompt`: raw text, or a user turn through the chat template.
pub fn prompt_ids(model: &LoadedModel, a: &GenerateArgs, prompt: &str) -> Result<Vec<u32>> {
    if !a.chat {
        return Ok(model.tokenizer.encode(prompt, true, true)?);
    }
    let messages = ChatMessage::turn(a.system.as_deref(), prompt);
    Ok(model.chat_prompt(&messages, content_tokens(a.allow_special_tokens_in_content))?)
}

/// `--allow-special-tokens-in-content` as the runtime's policy value.
pub fn content_tokens(allow: bool) -> ContentTokens {
    if allow {
        ContentTokens::Special
    } else {
        ContentTokens::Text
    }
}

/// What one engine request produced (its one completion, as the engine
/// collected it), with the timings the CLI reports.
pub struct Completed {
    pub completion: Completion,
    pub prompt_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
}

impl Completed {
    /// Why the completion ended (a completion cut off without a reason ran
    /// out of tokens).
    fn finish_reason(&self) -> FinishReason {
        self.completion
            .finish_reason
            .unwrap_or(FinishReason::Length)
    }
}

/// Submits one single-completion request and drains its events, calling
/// `on_text` with each piece of final text as it arrives.
pub fn run_request(
    engine: &EngineHandle,
    req: SubmitRequest,
    mut on_text: impl FnMut(&str),
) -> Result<Completed> {
    let t0 = Instant::now();
    let mut prefilled = None;
    let collected = engine.submit(req)?.collect_blocking_with(|ev| match ev {
        Event::Prefilled { .. } => prefilled = Some(Instant::now()),
        Event::Token { text, .. } => on_text(text),
        _ => {}
    })?;
    let prefilled = prefilled.unwrap_or(t0);
    let prompt_tokens = collected.prompt_tokens;
    Ok(Completed {
        completion: collected.into_completions().swap_remove(0),
        prompt_tokens,
        prefill_secs: (prefilled - t0).as_secs_f64(),
        decode_secs: prefilled.elapsed().as_secs_f64(),
    })
}

/// An engine for one CLI process on Tern's backend: prefill chunk as asked,
/// everything else default.
pub fn cli_engine(model: LoadedModel, prefill_chunk: usize) -> EngineHandle {
    EngineHandle::spawn(Arc::new(model), cli_config(prefill_chunk))
}

fn cli_config(prefill_chunk: usize) -> EngineConfig {
    let chunk = prefill_chunk.max(1);
    EngineConfig {
        prefill_chunk: chunk,
        step_tokens: chunk,
        ..EngineConfig::default()
    }
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &GenerateArgs) -> Result<()> {
    let text = a.prompt.text()?;
    let model = resolve::load(&a.model.model)?;
    let prompt = prompt_ids(&model, a, &text)?;
    let max_tokens = model.fit_max_tokens(prompt.len(), a.sampling.max_tokens);
    let mut req = SubmitRequest::new(
        prompt,
        sampling_params(&a.sampling, a.top_logprobs),
        max_tokens,
    );
    req.ignore_eos = a.ignore_eos;
    req.stop = a.sampling.stop.clone();
    req.kv_policy = a.kv.kv_policy.clone();
    req.kv_dtype = a.kv.kv_dtype;
    req.logprobs = a.model.json;
    let draft = resolve::draft_model(a.draft_model.as_deref(), &model)?;
    req.speculative = Some(resolve::speculative(a.speculative, draft.is_some())?);
    let sizing = Sizing {
        n_ctx: req.prompt.len() + req.max_tokens + 8,
        n_seq: 1,
        kv_dtype: a.kv.kv_dtype,
    };
    let model = Arc::new(model);
    let backend = backend::open(a.backend, &model.path, &model, &sizing)?;
    let engine = EngineHandle::spawn_with_draft(model, backend, draft, cli_config(a.prefill_chunk));
    let json_mode = a.model.json;
    let mut stdout = std::io::stdout();
    let out = run_request(&engine, req, |piece| {
        if !json_mode {
            // A closed pipe must not crash generation; ignore write errors.
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    let completion = out.completion.tokens.len();
    let prefill_tps = out.prompt_tokens as f64 / out.prefill_secs.max(1e-9);
    let decode_tps = completion.saturating_sub(1) as f64 / out.decode_secs.max(1e-9);
    let kv = out.completion.kv.clone().unwrap_or(KvUsage {
        policy: a.kv.kv_policy.to_string(),
        dtype: a.kv.kv_dtype,
        bytes_peak: 0,
        bytes_final: 0,
        bytes_full: 0,
        evictions: None,
        shifts: 0,
        entries_final: 0,
    });
    if json_mode {
        let tokenizer = &engine.model().tokenizer;
        let logprobs: Vec<_> = out
            .completion
            .logprobs
            .iter()
            .map(|l| {
                json!({
                    "token": l.token,
                    "text": tokenizer.decode(&[l.token], true),
                    "logprob": l.logprob,
                    "top_logprobs": l.top.iter().map(|(t, p)| json!({"token": t, "logprob": p})).collect::<Vec<_>>(),
                })
            })
            .collect();
        let report = json!({
            "text": out.completion.text,
            "token_ids": out.completion.tokens,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": completion,
            "finish_reason": out.finish_reason(),
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "prefill_seconds": out.prefill_secs,
            "decode_seconds": out.decode_secs,
            "kv_policy": kv.policy,
            "kv_dtype": kv.dtype,
            "kv_bytes": kv.bytes_peak,
            "kv_bytes_full": kv.bytes_full,
            "kv_bytes_final": kv.bytes_final,
            "kv_entries_final": kv.entries_final,
            "peak_rss_bytes": memory::peak_rss_bytes(),
            "logprobs": logprobs,
            "speculative": out.completion.speculation,
        });
        println!("{report}");
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {:.1} tok/s prefill; {} generated, {:.1} tok/s decode; finish: {:?}]",
            out.prompt_tokens, prefill_tps, completion, decode_tps, out.finish_reason()
        );
        if let Some(s) = &out.completion.speculation {
            match &s.off {
                Some(why) => eprintln!("[speculative decoding off: {why}]"),
                None => {
                    eprintln!(
                        "[speculative: {} of {} drafted tokens accepted in {} verifying forwards]",
                        s.accepted, s.drafted, s.verify_steps
                    );
                    if s.held_by_policy > 0 {
                        eprintln!(
                            "[speculative: no draft on {} steps: the KV policy evicts at the next token]",
                            s.held_by_policy
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
