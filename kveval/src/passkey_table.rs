//! The passkey table: under each policy at each budget, the share of keys
//! (built by [`crate::passkey`]) a greedy answer repeats, per prompt length.

use serde_json::json;
use tern_runtime::backend::TernBackend;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use crate::config::KvEvalConfig;
use crate::error::Result;
use crate::generate::{generate, GenerateRequest};
use crate::passkey;
use crate::policy::{policy, policy_names};
use crate::printer::Printer;

/// Runs the passkey table; returns its JSON report.
pub fn eval_passkey(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    out: &mut dyn Printer,
) -> Result<serde_json::Value> {
    let a = &cfg.passkey;
    let mut configs: Vec<(String, usize, KvPolicy)> = vec![("full".into(), 0, KvPolicy::Full)];
    for name in &policy_names(&cfg.policies) {
        for &b in &a.budgets {
            configs.push((name.clone(), b, policy(name, b)?));
        }
    }
    let mut rows = Vec::new();
    out.table(&format!(
        "\n### Passkey retrieval ({} trial(s) per cell, depths {:?}%)\n",
        a.trials, a.depths
    ));
    let header: Vec<String> = a.contexts.iter().map(|c| format!("ctx {c}")).collect();
    out.table(&format!("| policy | budget | {} |", header.join(" | ")));
    out.table(&format!("|---|---|{}", "---|".repeat(a.contexts.len())));
    for (name, budget, p) in &configs {
        let mut cells = Vec::new();
        for &ctx in &a.contexts {
            let (ok, n) = cell(model, cfg, (name, *budget, p), ctx, &mut rows)?;
            out.progress(&format!("passkey {p} ctx {ctx}: {ok}/{n}"));
            cells.push(format!("{ok}/{n}"));
        }
        let b = if *budget == 0 {
            "-".to_string()
        } else {
            budget.to_string()
        };
        out.table(&format!("| {name} | {b} | {} |", cells.join(" | ")));
    }
    Ok(json!({"rows": rows}))
}

/// One cell: every depth and trial at prompt length `ctx` under one policy
/// (named, at its budget); appends a record per answer to `rows` and returns
/// (keys found, trials).
fn cell(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    (name, budget, p): (&str, usize, &KvPolicy),
    ctx: usize,
    rows: &mut Vec<serde_json::Value>,
) -> Result<(usize, usize)> {
    let (mut ok, mut n) = (0, 0);
    for &depth in &cfg.passkey.depths {
        for t in 0..cfg.passkey.trials {
            let key = passkey::key_for(cfg.seed, (ctx * 1000 + depth) as u64 * 100 + t as u64);
            let prompt = passkey::build(&model.tokenizer, key, ctx, depth as f64 / 100.0)?;
            let req = GenerateRequest {
                prefill_chunk: prompt.tokens.len(),
                prompt: prompt.tokens,
                sampling: SamplingParams::greedy(),
                max_tokens: 8,
                ignore_eos: false,
                stop: Vec::new(),
                kv_policy: p.clone(),
                kv_dtype: Default::default(),
            };
            let answer = generate(&mut TernBackend::new(model), model, &req, |_| {})?;
            let hit = passkey::is_correct(key, &answer.text);
            ok += hit as usize;
            n += 1;
            rows.push(
                json!({"policy": p.to_string(), "name": name, "budget": budget, "ctx": ctx,
                "depth": depth, "key": key, "answer": answer.text, "correct": hit}),
            );
        }
    }
    Ok((ok, n))
}
