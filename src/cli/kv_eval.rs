//! `tern kv-eval`: what each KV policy costs in quality and saves in memory, in
//! one run: perplexity under eviction, passkey retrieval, and KV bytes at long
//! contexts, and the RULER-style suite (`kv_ruler.rs`). Prints Markdown tables
//! (docs/KV.md is made from them) or JSON.

use anyhow::{bail, Context, Result};
use serde_json::json;
use tern_runtime::backend::TernBackend;
use tern_runtime::generate::{generate, GenerateRequest};
use tern_runtime::kv::passkey;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::perplexity::perplexity_stored;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use super::args::KvEvalArgs;
use super::resolve;

/// The policy `name` at `budget`, with eval-wide settings: decode-triggered
/// policies compress every 32 tokens so the cache tracks its budget closely
/// (H2O compresses every step and takes its default split, half recent).
/// A name with a `:` is a spec run as written (its own defaults, no eval-wide
/// settings) with `budget` added, e.g. `snapkv:window=32,kernel=5,pool=avg`.
pub(super) fn policy(name: &str, budget: usize) -> Result<KvPolicy> {
    let spec = match name {
        _ if name.contains(':') => format!("{name},budget={budget}"),
        "full" => "full".to_string(),
        "streaming" => format!("streaming:budget={budget}"),
        "h2o" => format!("h2o:budget={budget}"),
        "snapkv" | "pyramidkv" | "rkv" | "adakv" | "keydiff" | "expected" => {
            format!("{name}:budget={budget},every=32")
        }
        other => {
            bail!(
                "unknown policy `{other}` (known: full, streaming, h2o, snapkv, pyramidkv, rkv, \
                 adakv, keydiff, expected, or a spec such as `snapkv:window=32`)"
            )
        }
    };
    spec.parse::<KvPolicy>()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("policy {spec}"))
}

/// `--policies` as written: the comma list splits specs apart at their own
/// commas, so an item with `=` but no `:` continues the spec before it
/// (`snapkv:window=32,kernel=5` is one policy).
fn policy_names(items: &[String]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for item in items {
        match names.last_mut() {
            Some(last) if item.contains('=') && !item.contains(':') && last.contains(':') => {
                last.push(',');
                last.push_str(item);
            }
            _ => names.push(item.clone()),
        }
    }
    names
}

fn eval_ppl(model: &LoadedModel, a: &KvEvalArgs) -> Result<serde_json::Value> {
    if super::kv_texts::wanted(a) {
        return super::kv_texts::eval(model, a);
    }
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {} as UTF-8 text", a.file.display()))?;
    let mut tokens = model.tokenizer.encode(&text, true, false)?;
    tokens.truncate(a.ctx * a.windows);
    let run = |p: &KvPolicy| -> Result<(f64, usize)> {
        let r = perplexity_stored(model, &tokens, a.ctx, p, a.kv_dtype, |_, _, _| {})?;
        Ok((r.perplexity, r.kv_bytes))
    };
    let (full_ppl, full_bytes) = run(&KvPolicy::Full)?;
    eprintln!("ppl full: {full_ppl:.4}");
    let mut rows = Vec::new();
    println!(
        "\n### Perplexity at context {} ({} window(s), {} scored tokens each)\n",
        a.ctx,
        a.windows,
        a.ctx - a.ctx / 2 - 1
    );
    println!(
        "full: **{full_ppl:.4}** (KV peak {:.1} MB)\n",
        full_bytes as f64 / 1e6
    );
    let header: Vec<String> = a.budgets.iter().map(|b| format!("budget {b}")).collect();
    println!("| policy | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(a.budgets.len()));
    for name in &policy_names(&a.policies) {
        let mut cells = Vec::new();
        for &b in &a.budgets {
            let p = policy(name, b)?;
            let (ppl, bytes) = run(&p)?;
            eprintln!("ppl {p}: {ppl:.4}");
            cells.push(format!("{ppl:.3} ({:.3}x)", ppl / full_ppl));
            rows.push(
                json!({"policy": p.to_string(), "name": name, "budget": b, "perplexity": ppl,
                "ratio": ppl / full_ppl, "kv_bytes": bytes, "kv_bytes_full": full_bytes}),
            );
        }
        println!("| {name} | {} |", cells.join(" | "));
    }
    Ok(json!({"ctx": a.ctx, "windows": a.windows, "full": full_ppl, "rows": rows}))
}

fn eval_passkey(model: &LoadedModel, a: &KvEvalArgs) -> Result<serde_json::Value> {
    let mut configs: Vec<(String, usize, KvPolicy)> = vec![("full".into(), 0, KvPolicy::Full)];
    for name in &policy_names(&a.policies) {
        for &b in &a.passkey_budgets {
            configs.push((name.clone(), b, policy(name, b)?));
        }
    }
    let mut rows = Vec::new();
    println!(
        "\n### Passkey retrieval ({} trial(s) per cell, depths {:?}%)\n",
        a.trials, a.depths
    );
    let header: Vec<String> = a.contexts.iter().map(|c| format!("ctx {c}")).collect();
    println!("| policy | budget | {} |", header.join(" | "));
    println!("|---|---|{}", "---|".repeat(a.contexts.len()));
    for (name, budget, p) in &configs {
        let mut cells = Vec::new();
        for &ctx in &a.contexts {
            let (mut ok, mut n) = (0, 0);
            for &depth in &a.depths {
                for t in 0..a.trials {
                    let key =
                        passkey::key_for(a.seed, (ctx * 1000 + depth) as u64 * 100 + t as u64);
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
                    let out = generate(&mut TernBackend::new(model), model, &req, |_| {})?;
                    let hit = passkey::is_correct(key, &out.text);
                    ok += hit as usize;
                    n += 1;
                    rows.push(
                        json!({"policy": p.to_string(), "name": name, "budget": budget, "ctx": ctx,
                        "depth": depth, "key": key, "answer": out.text, "correct": hit}),
                    );
                }
            }
            eprintln!("passkey {p} ctx {ctx}: {ok}/{n}");
            cells.push(format!("{ok}/{n}"));
        }
        let b = if *budget == 0 {
            "-".to_string()
        } else {
            budget.to_string()
        };
        println!("| {name} | {b} | {} |", cells.join(" | "));
    }
    Ok(json!({"rows": rows}))
}

fn eval_memory(model: &LoadedModel, a: &KvEvalArgs) -> Result<serde_json::Value> {
    let p = policy("snapkv", a.memory_budget)?;
    let mut rows = Vec::new();
    println!(
        "\n### KV bytes per sequence ({p}, prefill in chunks of 512, then 16 decoded tokens)\n"
    );
    println!("| context | full cache | with budget: peak held | ratio | buffers allocated |");
    println!("|---|---|---|---|---|");
    for &ctx in &a.memory_contexts {
        let n = ctx.min(model.config().context_length - 17);
        let vocab = model.config().vocab_size;
        let low = vocab / 20; // skip the low ids where control tokens live
        let prompt: Vec<u32> = (0..n)
            .map(|i| (low + (i * 7919) % (vocab - low)) as u32)
            .collect();
        let req = GenerateRequest {
            prompt,
            sampling: SamplingParams::greedy(),
            max_tokens: 16,
            ignore_eos: true,
            stop: Vec::new(),
            prefill_chunk: 512,
            kv_policy: p.clone(),
            kv_dtype: Default::default(),
        };
        let out = generate(&mut TernBackend::new(model), model, &req, |_| {})?;
        let ratio = out.kv_bytes_full as f64 / out.kv_bytes.max(1) as f64;
        eprintln!(
            "memory ctx {ctx}: {} of {} bytes",
            out.kv_bytes, out.kv_bytes_full
        );
        println!(
            "| {ctx} | {:.1} MB | {:.1} MB | 1/{ratio:.1} | {:.1} MB |",
            out.kv_bytes_full as f64 / 1e6,
            out.kv_bytes as f64 / 1e6,
            out.kv_bytes_allocated as f64 / 1e6
        );
        rows.push(
            json!({"ctx": ctx, "policy": p.to_string(), "kv_bytes": out.kv_bytes,
            "kv_bytes_full": out.kv_bytes_full, "kv_bytes_allocated": out.kv_bytes_allocated}),
        );
    }
    Ok(json!({"rows": rows}))
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &KvEvalArgs) -> Result<()> {
    let model = resolve::load(&a.model.model)?;
    let mut report = serde_json::Map::new();
    for task in &a.tasks {
        let v = match task.as_str() {
            "ppl" => eval_ppl(&model, a)?,
            "passkey" => eval_passkey(&model, a)?,
            "memory" => eval_memory(&model, a)?,
            "ruler" => super::kv_ruler::eval_ruler(&model, a)?,
            other => bail!("unknown task `{other}` (known: ppl, passkey, memory, ruler)"),
        };
        report.insert(task.clone(), v);
    }
    if a.model.json {
        println!("{}", serde_json::Value::Object(report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_survive_the_comma_list() {
        let items: Vec<String> = "snapkv,snapkv:window=32,kernel=5,pool=avg,h2o:,adakv"
            .split(',')
            .map(String::from)
            .collect();
        let names = policy_names(&items);
        assert_eq!(
            names,
            [
                "snapkv",
                "snapkv:window=32,kernel=5,pool=avg",
                "h2o:",
                "adakv"
            ]
        );
        let p = policy(&names[1], 128).unwrap();
        assert_eq!(
            p.to_string(),
            "snapkv:budget=128,window=32,kernel=5,pool=avg,every=128,prefill=true"
        );
        let e = policy("snapkv:budget=64", 128).unwrap_err();
        assert!(format!("{e:#}").contains("given twice"), "{e:#}");
    }
}
