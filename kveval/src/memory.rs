//! The KV-bytes table: what one sequence's cache holds at long contexts with
//! a full cache and under SnapKV at a budget, and the buffers allocated.

use serde_json::json;
use tern_runtime::backend::TernBackend;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use crate::config::KvEvalConfig;
use crate::error::Result;
use crate::generate::{generate, GenerateRequest};
use crate::policy::policy;
use crate::printer::Printer;

/// Runs the KV-bytes table; returns its JSON report.
pub fn eval_memory(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    out: &mut dyn Printer,
) -> Result<serde_json::Value> {
    let p = policy("snapkv", cfg.memory.budget)?;
    let mut rows = Vec::new();
    out.table(&format!(
        "\n### KV bytes per sequence ({p}, prefill in chunks of 512, then 16 decoded tokens)\n"
    ));
    out.table("| context | full cache | with budget: peak held | ratio | buffers allocated |");
    out.table("|---|---|---|---|---|");
    for &ctx in &cfg.memory.contexts {
        let req = GenerateRequest {
            prompt: synthetic_prompt(model, ctx),
            sampling: SamplingParams::greedy(),
            max_tokens: 16,
            ignore_eos: true,
            stop: Vec::new(),
            prefill_chunk: 512,
            kv_policy: p.clone(),
            kv_dtype: Default::default(),
        };
        let o = generate(&mut TernBackend::new(model), model, &req, |_| {})?;
        let ratio = o.kv_bytes_full as f64 / o.kv_bytes.max(1) as f64;
        out.progress(&format!(
            "memory ctx {ctx}: {} of {} bytes",
            o.kv_bytes, o.kv_bytes_full
        ));
        out.table(&format!(
            "| {ctx} | {:.1} MB | {:.1} MB | 1/{ratio:.1} | {:.1} MB |",
            o.kv_bytes_full as f64 / 1e6,
            o.kv_bytes as f64 / 1e6,
            o.kv_bytes_allocated as f64 / 1e6
        ));
        rows.push(
            json!({"ctx": ctx, "policy": p.to_string(), "kv_bytes": o.kv_bytes,
            "kv_bytes_full": o.kv_bytes_full, "kv_bytes_allocated": o.kv_bytes_allocated}),
        );
    }
    Ok(json!({"rows": rows}))
}

/// A prompt of `ctx` tokens (fewer where the model's context needs room for
/// 16 more) spread over the vocabulary, skipping the low ids where control
/// tokens live: what it says does not matter, only how many entries it makes.
fn synthetic_prompt(model: &LoadedModel, ctx: usize) -> Vec<u32> {
    let n = ctx.min(model.config().context_length - 17);
    let vocab = model.config().vocab_size;
    let low = vocab / 20;
    (0..n)
        .map(|i| (low + (i * 7919) % (vocab - low)) as u32)
        .collect()
}
