//! `tern eval`: accuracy, tokens spent and wall time of answer strategies
//! (single sample, majority@N, synthesize@N, adaptive width, adaptive length)
//! on a JSONL task file or a built-in generator,
//! each line `{"question"|"prompt": ..., "answer": ...}` (GSM8K's `#### X`
//! answers work as they are). The evaluation itself is
//! `tern_solve::eval`; this file reads the flags, words errors with them
//! and prints.

use anyhow::{bail, Context, Result};
use tern_runtime::engine::EngineHandle;
use tern_solve::eval::{self, EvalError, Event, Records, Settings, Strategy, Totals};

mod args;
mod setup;
mod spreadsheet;
mod spreadsheet_best;

use crate::cli::resolve;
pub use args::EvalArgs;
use setup::{check_limit, engine, records_sink};

/// An evaluation error as the command line says it: with the flag it is
/// about where there is one.
fn worded(e: EvalError) -> anyhow::Error {
    match e {
        EvalError::OffsetPastEnd { offset, tasks, len } => {
            anyhow::anyhow!("--offset {offset} skips every task: {tasks} has {len}")
        }
        EvalError::NotARecord { path, line, source } => {
            anyhow::Error::new(source).context(format!(
                "{}:{line}: not a record written by `tern eval --records`",
                path.display()
            ))
        }
        e => e.into(),
    }
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &EvalArgs) -> Result<()> {
    if tern_solve::tasks::spreadsheet::is_spreadsheet(&a.task) {
        return spreadsheet::run(a);
    }
    let strategies: Vec<Strategy> = a
        .strategy
        .iter()
        .map(|s| Strategy::parse(s, a.probe_every))
        .collect::<Result<_, _>>()?;
    check_limit(a)?;
    let tasks = eval::read_tasks(&a.task, a.offset, a.limit).map_err(worded)?;
    eval::check_fit(&strategies, &tasks)?;
    if a.test_model.is_some() && strategies.iter().all(|s| s.tests.is_none()) {
        bail!("--test-model writes the tests of reward@N:tests=K: no strategy asks for them");
    }
    let done = match &a.records {
        Some(p) => eval::load_records(p).map_err(worded)?,
        None => Records::new(),
    };
    if a.report {
        let numbers: Vec<usize> = tasks.iter().map(|(i, _)| *i).collect();
        let (complete, totals) = eval::totals_from_records(&numbers, &strategies, &done)?;
        if !a.model.json {
            println!(
                "{complete} of {} tasks in range have a record for every strategy",
                tasks.len()
            );
        }
        print_report(a, &strategies, &totals, complete)?;
        return by_difficulty(a, &strategies, &tasks);
    }
    let mut sink = records_sink(a)?;
    let engine = engine(a)?;
    let synthesizer = resolve::synthesizer(a.synthesizer_model.as_deref())?;
    let synthesizer = synthesizer.as_ref().unwrap_or(&engine);
    let named = named_synthesizers(&a.synthesizer, &strategies)?;
    let tester = resolve::tester(a.test_model.as_deref())?;
    let tester = tester.as_ref().unwrap_or(&engine);
    let settings = Settings {
        temperature: a.temperature,
        seed: a.seed,
        max_tokens: a.max_tokens,
        kv_policy: a.kv.kv_policy.clone(),
        parallel: a.parallel as usize,
    };
    let on_event = |ev: Event<'_>| {
        if a.model.json {
            return;
        }
        match ev {
            Event::Resuming {
                complete,
                total,
                pending,
            } => eprintln!(
                "{complete} of {total} tasks already have every record; running the other {pending}"
            ),
            Event::Task {
                task,
                finished,
                total,
                records,
                eta_secs,
            } => {
                let left = eta_secs
                    .map(|s| format!(", ~{} left", human_secs(s)))
                    .unwrap_or_default();
                for (j, (k, r)) in records.iter().enumerate() {
                    eprintln!(
                        "{:<14} task {:>4} ({}/{}): {} (got {}, want {}){}",
                        strategies[*k].label,
                        task + 1,
                        finished,
                        total,
                        if r.ok { "ok " } else { "no " },
                        r.answer.as_deref().unwrap_or("-"),
                        r.want,
                        if j + 1 == records.len() {
                            left.as_str()
                        } else {
                            ""
                        }
                    );
                }
            }
        }
    };
    let plan = eval::Plan {
        tasks: &tasks,
        strategies: &strategies,
        settings: &settings,
        done: &done,
    };
    let engines = eval::Engines {
        engine: &engine,
        synthesizer,
        named: &named,
        tester,
    };
    let sink = sink.as_mut().map(|f| f as &mut (dyn std::io::Write + Send));
    let totals = eval::run(&plan, engines, sink, &on_event)?;
    print_report(a, &strategies, &totals, tasks.len())?;
    by_difficulty(a, &strategies, &tasks)
}

/// With `--by-difficulty`: the table again for each task difficulty, from
/// the records file (so a resumed run's earlier records count too).
fn by_difficulty(
    a: &EvalArgs,
    strategies: &[Strategy],
    tasks: &[(usize, tern_solve::tasks::Task)],
) -> Result<()> {
    let Some(path) = a.records.as_ref().filter(|_| a.by_difficulty) else {
        return Ok(());
    };
    let done = eval::load_records(path).map_err(worded)?;
    let mut levels: Vec<u32> = tasks.iter().filter_map(|(_, t)| t.difficulty).collect();
    levels.sort_unstable();
    levels.dedup();
    if levels.is_empty() {
        bail!("--by-difficulty: these tasks carry no difficulty (generated tasks do; files may give `difficulty`)");
    }
    let mut json = Vec::new();
    for d in levels {
        let numbers: Vec<usize> = tasks
            .iter()
            .filter(|(_, t)| t.difficulty == Some(d))
            .map(|(i, _)| *i)
            .collect();
        let Ok((complete, totals)) = eval::totals_from_records(&numbers, strategies, &done) else {
            continue;
        };
        if a.model.json {
            json.push(serde_json::json!({
                "difficulty": d,
                "rows": eval::rows(strategies, &totals, complete),
            }));
        } else {
            println!("\ndifficulty {d} ({complete} tasks with every record)");
            print_report(a, strategies, &totals, complete)?;
        }
    }
    if a.model.json {
        println!("{}", serde_json::json!({ "by_difficulty": json }));
    }
    Ok(())
}

/// The engines of `--synthesizer NAME=MODEL`, each loaded once; every
/// `synthesize@N:with=NAME` (and `single:with=NAME`, a named model answering
/// alone) must name one of them, and every one must be used.
fn named_synthesizers(
    specs: &[String],
    strategies: &[Strategy],
) -> Result<Vec<(String, EngineHandle)>> {
    let mut named: Vec<(String, EngineHandle)> = Vec::new();
    for spec in specs {
        let Some((name, model)) = spec
            .split_once('=')
            .filter(|(n, m)| !n.is_empty() && !m.is_empty())
        else {
            bail!("--synthesizer {spec}: give NAME=MODEL (a path or registry name)");
        };
        if named.iter().any(|(n, _)| n == name) {
            bail!("--synthesizer {spec}: the name `{name}` is given twice");
        }
        if !strategies
            .iter()
            .any(|s| s.synthesizer.as_deref() == Some(name))
        {
            bail!("--synthesizer {spec}: no strategy uses it (add synthesize@N:with={name} or single:with={name} to --strategy)");
        }
        let engine = resolve::synthesizer(Some(model))
            .with_context(|| format!("--synthesizer {spec}"))?
            .expect("a model was given");
        named.push((name.to_string(), engine));
    }
    for s in strategies {
        if let Some(name) = &s.synthesizer {
            if !named.iter().any(|(n, _)| n == name) {
                bail!(
                    "strategy {}: no --synthesizer {name}=MODEL was given",
                    s.label
                );
            }
        }
    }
    Ok(named)
}

/// `secs` as `2h05m`, `4m10s` or `35s`.
fn human_secs(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// Prints the table (or with `--json` one object) of `totals` over `tasks` tasks.
fn print_report(
    a: &EvalArgs,
    strategies: &[Strategy],
    totals: &[Totals],
    tasks: usize,
) -> Result<()> {
    let rows = eval::rows(strategies, totals, tasks);
    if a.model.json {
        println!("{}", serde_json::json!({ "task": a.task, "rows": rows }));
        return Ok(());
    }
    // The label column fits the longest label (`synthesize@8:with=trained`).
    let w = rows
        .iter()
        .map(|r| r.strategy.len())
        .max()
        .unwrap_or(0)
        .max(16);
    println!(
        "{:<w$} {:>6} {:>9} {:>12} {:>12} {:>10} {:>11} {:>8} {:>7} {:>9}",
        "strategy",
        "tasks",
        "accuracy",
        "tokens/task",
        "samples/task",
        "width-stop",
        "probes/task",
        "len-stop",
        "saved",
        "seconds"
    );
    for r in &rows {
        println!(
            "{:<w$} {:>6} {:>8.1}% {:>12.1} {:>12.2} {:>10} {:>11.2} {:>8} {:>7} {:>9.1}",
            r.strategy,
            r.tasks,
            100.0 * r.accuracy,
            r.tokens_per_task,
            r.candidates_per_task,
            r.width_stops,
            r.probes_per_task,
            r.stopped_early,
            r.tokens_saved,
            r.seconds
        );
    }
    for r in &rows {
        if let Some(h) = &r.vs_first {
            println!(
                "{} vs {}: right where it is wrong on {} task(s), wrong where it is right on {} (McNemar exact p = {:.3})",
                r.strategy, h.baseline, h.wins, h.losses, h.mcnemar_p
            );
        }
    }
    let shared: Vec<&str> = rows
        .iter()
        .filter(|r| r.shared_samples)
        .map(|r| r.strategy.as_str())
        .collect();
    if !shared.is_empty() {
        println!(
            "({} sampled one set of candidates per task and scored it each its own way; \
             their seconds are that set's time, tokens what each would spend alone)",
            shared.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::human_secs;

    #[test]
    fn time_left_reads_at_a_glance() {
        assert_eq!(human_secs(35.4), "35s");
        assert_eq!(human_secs(250.0), "4m10s");
        assert_eq!(human_secs(7500.0), "2h05m");
        assert_eq!(human_secs(-3.0), "0s");
    }
}
