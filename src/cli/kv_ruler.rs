//! `tern kv-eval --tasks ruler`: the RULER-style synthetic suite
//! (`tern_runtime::kv::ruler`) under each KV policy at each fraction of the
//! prompt's entries removed. Prints a table in kvpress's leaderboard shape
//! (policies by fraction removed, cells the average score over tasks) and
//! writes one JSON record per sample and setting, from which docs tables are
//! recomputed (scripts/kv_table.py).

use std::io::Write;

use anyhow::{Context, Result};
use serde_json::json;
use tern_runtime::backend::TernBackend;
use tern_runtime::generate::{generate_each, generate_each_query_agnostic, GenerateRequest};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::ruler::{self, RulerSample, RulerTask};
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use super::args::KvEvalArgs;
use super::kv_eval::policy;

/// Per-layer budget that removes `removed` percent of `prompt_tokens` entries.
fn budget(prompt_tokens: usize, removed: u32) -> usize {
    (prompt_tokens * (100 - removed as usize)).div_ceil(100)
}

/// One setting of the table: a policy at a removed percentage (0 for full).
struct Setting {
    name: String,
    removed: u32,
}

/// Scores per (setting, task) for one length, in sample order.
type Cells = std::collections::HashMap<(usize, RulerTask), Vec<f64>>;

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        f64::NAN
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Greedy answers to `sample` under each of `policies`: the prompt is read
/// once, in one chunk, for all of them (`generate_each`; each answer equals
/// the policy's answer alone, tests/kv_tee.rs), so score-based policies
/// compress the whole prompt once, seeing the question's queries, as in the
/// passkey task. With `agnostic` only the context before the question is
/// read together and compressed; each cache is then frozen and reads the
/// question on its own (`generate_each_query_agnostic`).
fn answers(
    model: &LoadedModel,
    sample: &RulerSample,
    policies: &[KvPolicy],
    dtype: tern_runtime::kv::KvDtype,
    agnostic: bool,
) -> Result<Vec<tern_runtime::generate::GenerateOutput>> {
    let req = GenerateRequest {
        prefill_chunk: sample.tokens.len(),
        prompt: sample.tokens.clone(),
        sampling: SamplingParams::greedy(),
        max_tokens: sample.max_new_tokens,
        ignore_eos: false,
        stop: Vec::new(),
        kv_policy: KvPolicy::Full,
        kv_dtype: dtype,
    };
    let mut backend = TernBackend::new(model);
    Ok(if agnostic {
        generate_each_query_agnostic(&mut backend, model, &req, policies, sample.context_tokens)?
    } else {
        generate_each(&mut backend, model, &req, policies)?
    })
}

/// Average over tasks of each task's mean score, for one setting.
fn task_average(cells: &Cells, setting: usize, tasks: &[RulerTask]) -> f64 {
    let means: Vec<f64> = tasks
        .iter()
        .filter_map(|t| cells.get(&(setting, *t)).map(|v| mean(v)))
        .collect();
    mean(&means)
}

fn print_tables(length: usize, a: &KvEvalArgs, settings: &[Setting], cells: &Cells) {
    println!(
        "\n### RULER at {length} tokens, query-{} ({} sample(s) per task; score 0-100, average over {})\n",
        if a.query_agnostic { "agnostic" } else { "aware" },
        a.ruler_samples,
        a.ruler_tasks
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let header: Vec<String> = a.removed.iter().map(|r| format!("{r}%")).collect();
    println!("| policy | 0% | {} |", header.join(" | "));
    println!("|---|---|{}", "---|".repeat(a.removed.len()));
    println!(
        "| full | {:.1} |{}",
        task_average(cells, 0, &a.ruler_tasks),
        " - |".repeat(a.removed.len())
    );
    for name in a.policies.iter().filter(|n| *n != "full") {
        let row: Vec<String> = a
            .removed
            .iter()
            .map(|r| {
                let i = settings
                    .iter()
                    .position(|s| &s.name == name && s.removed == *r)
                    .unwrap_or(usize::MAX);
                format!("{:.1}", task_average(cells, i, &a.ruler_tasks))
            })
            .collect();
        println!("| {name} | - | {} |", row.join(" | "));
    }
    println!("\nPer task:\n");
    let names: Vec<&str> = a.ruler_tasks.iter().map(|t| t.name()).collect();
    println!("| policy | removed | {} |", names.join(" | "));
    println!("|---|---|{}", "---|".repeat(names.len()));
    for (i, s) in settings.iter().enumerate() {
        let row: Vec<String> = a
            .ruler_tasks
            .iter()
            .map(|t| format!("{:.1}", mean(cells.get(&(i, *t)).map_or(&[][..], |v| v))))
            .collect();
        println!("| {} | {}% | {} |", s.name, s.removed, row.join(" | "));
    }
}

/// Runs the suite; returns every record (also written to `--out`).
pub fn eval_ruler(model: &LoadedModel, a: &KvEvalArgs) -> Result<serde_json::Value> {
    let mut out_file = match &a.out {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => None,
    };
    let model_name = std::path::Path::new(&a.model.model)
        .file_name()
        .map_or(a.model.model.clone(), |f| f.to_string_lossy().into_owned());
    let mut settings = vec![Setting {
        name: "full".into(),
        removed: 0,
    }];
    for name in a.policies.iter().filter(|n| *n != "full") {
        // Fail on an unknown name before any sample runs.
        policy(name, 1024)?;
        for &removed in &a.removed {
            settings.push(Setting {
                name: name.clone(),
                removed,
            });
        }
    }
    let mut rows = Vec::new();
    for &length in &a.ruler_lengths {
        let mut cells = Cells::new();
        for &task in &a.ruler_tasks {
            for i in 0..a.ruler_samples {
                let seed = ruler::sample_seed(a.seed, task, length, i);
                let sample = ruler::build(&model.tokenizer, task, length, seed)
                    .with_context(|| format!("ruler {task} at {length} tokens"))?;
                let n = sample.tokens.len();
                // What a policy compresses: the whole prompt, or only the
                // context before the question.
                let compressed = if a.query_agnostic {
                    sample.context_tokens
                } else {
                    n
                };
                let mut policies = Vec::with_capacity(settings.len());
                let mut budgets = Vec::with_capacity(settings.len());
                for s in &settings {
                    if s.removed == 0 {
                        policies.push(KvPolicy::Full);
                        budgets.push(n);
                    } else {
                        let b = budget(compressed, s.removed);
                        policies.push(policy(&s.name, b)?);
                        budgets.push(b);
                    }
                }
                let outs = answers(model, &sample, &policies, a.kv_dtype, a.query_agnostic)?;
                for (si, ((s, p), out)) in settings.iter().zip(&policies).zip(outs).enumerate() {
                    let b = budgets[si];
                    let score = ruler::score(&sample.expected, &out.text);
                    eprintln!(
                        "ruler {task} {length} #{i} {p} (-{}%): {score:.0} (decode {:.1}s)",
                        s.removed, out.decode_secs
                    );
                    cells.entry((si, task)).or_default().push(score);
                    let rec = json!({
                        "suite": "ruler", "model": model_name, "task": task.name(),
                        "length": length, "sample": i, "seed": seed, "prompt_tokens": n,
                        "policy": p.to_string(), "name": s.name, "removed": s.removed,
                        "budget": b, "kv_dtype": a.kv_dtype, "expected": sample.expected,
                        "answer": out.text, "score": score, "kv_bytes": out.kv_bytes,
                        "kv_bytes_full": out.kv_bytes_full,
                        "seconds": out.prefill_secs + out.decode_secs,
                        "prefill_secs": out.prefill_secs, "decode_secs": out.decode_secs,
                        "shared_prefill": true,
                        "query": if a.query_agnostic { "agnostic" } else { "aware" },
                        "context_tokens": sample.context_tokens,
                    });
                    if let Some(f) = out_file.as_mut() {
                        writeln!(f, "{rec}")?;
                        f.flush()?;
                    }
                    rows.push(rec);
                }
            }
        }
        print_tables(length, a, &settings, &cells);
    }
    Ok(json!({"rows": rows}))
}

#[cfg(test)]
mod tests {
    use super::budget;

    #[test]
    fn budget_rounds_kept_entries_up() {
        assert_eq!(budget(4000, 50), 2000);
        assert_eq!(budget(4001, 50), 2001);
        assert_eq!(budget(10, 90), 1);
        assert_eq!(budget(3, 99), 1);
    }
}
