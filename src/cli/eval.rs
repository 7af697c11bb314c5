//! `tern eval`: accuracy, tokens spent and wall time of answer strategies
//! (single sample, majority@N, synthesize@N, adaptive width, adaptive length)
//! on a JSONL task file or a built-in generator,
//! each line `{"question"|"prompt": ..., "answer": ...}` (GSM8K's `#### X`
//! answers work as they are).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::reasoning::{best_of_n_with, Aggregate, BonRequest, Effort, LengthPolicy};
use tern_runtime::sampler::SamplingParams;
use tern_runtime::tasks::{self, Task};
use tern_runtime::verify;

use super::args::EvalArgs;
use super::resolve;

/// One way to answer.
#[derive(Clone, Debug)]
struct Strategy {
    label: String,
    n: usize,
    aggregate: Aggregate,
    adaptive: bool,
    length: Option<LengthPolicy>,
}

/// `length@EFFORT`: one greedy sample under adaptive length, EFFORT an effort
/// name or a bare token cap.
fn parse_length(s: &str, effort: &str, probe_every: usize) -> Result<Strategy> {
    let policy = match effort.parse::<usize>() {
        Ok(cap) => LengthPolicy::new(None, Some(cap), probe_every)?,
        Err(_) => {
            let e: Effort = effort
                .parse()
                .map_err(|e: String| anyhow::anyhow!("strategy `{s}`: {e}"))?;
            LengthPolicy::new(Some(e), None, probe_every)?
        }
    };
    Ok(Strategy {
        label: s.to_string(),
        n: 1,
        aggregate: Aggregate::Majority,
        adaptive: false,
        length: policy,
    })
}

fn parse_strategy(s: &str, probe_every: usize) -> Result<Strategy> {
    if let Some(effort) = s.strip_prefix("length@") {
        return parse_length(s, effort, probe_every);
    }
    let (name, n) = match s.split_once('@') {
        Some((name, n)) => (
            name,
            n.parse::<usize>()
                .with_context(|| format!("strategy `{s}`: `{n}` is not a count"))?,
        ),
        None => (s, 8),
    };
    let (n, aggregate, adaptive) = match name {
        "single" => (1, Aggregate::Majority, false),
        "majority" => (n, Aggregate::Majority, false),
        "synthesize" => (n, Aggregate::Synthesize, false),
        "adaptive" => (n, Aggregate::Majority, true),
        other => bail!(
            "unknown strategy `{other}`: use single, majority@N, synthesize@N, adaptive[@N] or length@EFFORT"
        ),
    };
    if n == 0 || n > tern_runtime::engine::MAX_N {
        bail!("strategy `{s}`: N must be between 1 and 16");
    }
    Ok(Strategy {
        label: s.to_string(),
        n,
        aggregate,
        adaptive,
        length: None,
    })
}

fn read_tasks(source: &str, limit: usize) -> Result<Vec<Task>> {
    let mut tasks = tasks::load(source)?;
    tasks.truncate(limit);
    Ok(tasks)
}

/// One strategy's results.
#[derive(Debug, Serialize)]
struct Row {
    strategy: String,
    tasks: usize,
    correct: usize,
    accuracy: f64,
    tokens: usize,
    tokens_per_task: f64,
    candidates_per_task: f64,
    /// Adaptive length: answer probes per task, tasks whose probes stopped
    /// the reasoning early, reasoning tokens those early stops saved.
    probes_per_task: f64,
    stopped_early: usize,
    tokens_saved: usize,
    seconds: f64,
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &EvalArgs) -> Result<()> {
    let strategies: Vec<Strategy> = a
        .strategy
        .iter()
        .map(|s| parse_strategy(s, a.probe_every))
        .collect::<Result<_>>()?;
    let tasks = read_tasks(&a.task, a.limit)?;
    let model = resolve::load(&a.model.model)?;
    let engine = EngineHandle::spawn(Arc::new(model), EngineConfig::default());
    let synthesizer = resolve::synthesizer(a.synthesizer_model.as_deref())?;
    let synthesizer = synthesizer.as_ref().unwrap_or(&engine);
    let mut rows = Vec::new();
    for s in &strategies {
        let t = Instant::now();
        let (mut correct, mut tokens, mut used) = (0, 0, 0);
        let (mut probes, mut early, mut saved) = (0, 0, 0);
        for (i, task) in tasks.iter().enumerate() {
            let req = BonRequest {
                messages: vec![ChatMessage::new("user", task.question.as_str())],
                n: s.n,
                sampling: SamplingParams {
                    temperature: if s.n == 1 { 0.0 } else { a.temperature },
                    top_p: 0.95,
                    seed: a.seed.wrapping_add(i as u64 * 1000),
                    ..SamplingParams::default()
                },
                max_tokens: a.max_tokens,
                aggregate: s.aggregate,
                adaptive: s.adaptive,
                wave: 2,
                kv_policy: a.kv.kv_policy.clone(),
                tests: Vec::new(),
                length: s.length.clone(),
            };
            let res = best_of_n_with(&engine, synthesizer, &req)?;
            let ok = res
                .answer
                .as_deref()
                .is_some_and(|got| verify::answers_match(got, &task.answer));
            correct += ok as usize;
            tokens += res.tokens;
            used += res.candidates.len();
            for l in res.candidates.iter().filter_map(|c| c.length.as_ref()) {
                probes += l.probes.len();
                early += l.stopped_early as usize;
                saved += l.tokens_saved;
            }
            if !a.model.json {
                eprintln!(
                    "{:<14} task {:>3}/{}: {} (got {}, want {})",
                    s.label,
                    i + 1,
                    tasks.len(),
                    if ok { "ok " } else { "no " },
                    res.answer.as_deref().unwrap_or("-"),
                    task.answer
                );
            }
        }
        let n = tasks.len() as f64;
        rows.push(Row {
            strategy: s.label.clone(),
            tasks: tasks.len(),
            correct,
            accuracy: correct as f64 / n,
            tokens,
            tokens_per_task: tokens as f64 / n,
            candidates_per_task: used as f64 / n,
            probes_per_task: probes as f64 / n,
            stopped_early: early,
            tokens_saved: saved,
            seconds: t.elapsed().as_secs_f64(),
        });
    }
    if a.model.json {
        println!("{}", serde_json::json!({ "task": a.task, "rows": rows }));
        return Ok(());
    }
    println!(
        "{:<16} {:>6} {:>9} {:>12} {:>12} {:>11} {:>6} {:>7} {:>9}",
        "strategy",
        "tasks",
        "accuracy",
        "tokens/task",
        "samples/task",
        "probes/task",
        "early",
        "saved",
        "seconds"
    );
    for r in &rows {
        println!(
            "{:<16} {:>6} {:>8.1}% {:>12.1} {:>12.2} {:>11.2} {:>6} {:>7} {:>9.1}",
            r.strategy,
            r.tasks,
            100.0 * r.accuracy,
            r.tokens_per_task,
            r.candidates_per_task,
            r.probes_per_task,
            r.stopped_early,
            r.tokens_saved,
            r.seconds
        );
    }
    Ok(())
}
