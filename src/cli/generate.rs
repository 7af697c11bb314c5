//! `tern generate`: one prompt in, streamed text out (or one JSON object).

use std::io::Write;

use anyhow::Result;
use serde_json::json;
use tern_runtime::chat::ChatMessage;
use tern_runtime::generate::{generate, GenerateRequest};
use tern_runtime::sampler::SamplingParams;
use tern_runtime::{memory, LoadedModel};

use super::args::{GenerateArgs, SamplingArgs};
use super::resolve;

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
    }
}

/// Token ids of the prompt: raw text, or a user turn through the chat template.
pub fn prompt_ids(model: &LoadedModel, a: &GenerateArgs) -> Result<Vec<u32>> {
    if !a.chat {
        return Ok(model.tokenizer.encode(&a.prompt, true, true)?);
    }
    let mut messages = Vec::new();
    if let Some(sys) = &a.system {
        messages.push(ChatMessage::new("system", sys.as_str()));
    }
    messages.push(ChatMessage::new("user", a.prompt.as_str()));
    let text = model.chat_template()?.render(&messages, true)?;
    Ok(model.tokenizer.encode(&text, true, true)?)
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &GenerateArgs) -> Result<()> {
    let model = resolve::load(&a.model.model)?;
    let prompt = prompt_ids(&model, a)?;
    let req = GenerateRequest {
        prompt,
        sampling: sampling_params(&a.sampling, a.top_logprobs),
        max_tokens: a.sampling.max_tokens,
        ignore_eos: a.ignore_eos,
        stop: a.sampling.stop.clone(),
        prefill_chunk: a.prefill_chunk,
        kv_policy: a.kv.kv_policy.clone(),
    };
    let json_mode = a.model.json;
    let mut stdout = std::io::stdout();
    let out = generate(&model, &req, |piece| {
        if !json_mode {
            // A closed pipe must not crash generation; ignore write errors.
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    let completion = out.token_ids.len();
    let prefill_tps = out.prompt_tokens as f64 / out.prefill_secs.max(1e-9);
    let decode_tps = out.decode_steps as f64 / out.decode_secs.max(1e-9);
    if json_mode {
        let logprobs: Vec<_> = out
            .logprobs
            .iter()
            .map(|l| {
                json!({
                    "token": l.token,
                    "text": model.tokenizer.decode(&[l.token], true),
                    "logprob": l.logprob,
                    "top_logprobs": l.top.iter().map(|(t, p)| json!({"token": t, "logprob": p})).collect::<Vec<_>>(),
                })
            })
            .collect();
        let report = json!({
            "text": out.text,
            "token_ids": out.token_ids,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": completion,
            "finish_reason": out.finish_reason,
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "prefill_seconds": out.prefill_secs,
            "decode_seconds": out.decode_secs,
            "kv_policy": a.kv.kv_policy.to_string(),
            "kv_bytes": out.kv_bytes,
            "kv_bytes_full": out.kv_bytes_full,
            "peak_rss_bytes": memory::peak_rss_bytes(),
            "logprobs": logprobs,
        });
        println!("{report}");
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {:.1} tok/s prefill; {} generated, {:.1} tok/s decode; finish: {:?}]",
            out.prompt_tokens, prefill_tps, completion, decode_tps, out.finish_reason
        );
    }
    Ok(())
}
