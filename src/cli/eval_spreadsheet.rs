//! `tern eval --task spreadsheet:...` (or a `.spreadsheet.jsonl` file): each
//! task's program written greedily and judged on its test-case workbooks;
//! `--strategy rounds@R` lets the model retry after a failure, up to R
//! rounds. Prints soft and hard scores after each round and per operation
//! kind; `--records` appends one JSON line per task. The evaluation is
//! `tern_solve::eval::spreadsheet`; this file reads the flags and prints.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use tern_solve::eval::spreadsheet::{run_spreadsheet, SheetRecord, SheetSettings};
use tern_solve::tasks::spreadsheet::{self, PromptBudget};
use tern_solve::verify::spreadsheet::workbook_limits;

use super::args::EvalArgs;

/// Most rounds `rounds@R` takes.
const MAX_ROUNDS: usize = 10;

/// Rounds from the one strategy a spreadsheet run takes: `single` or `rounds@R`.
fn rounds_of(strategies: &[String]) -> Result<usize> {
    let [s] = strategies else {
        bail!(
            "spreadsheet tasks take one strategy: --strategy single or --strategy rounds@R \
             (R = 1 to {MAX_ROUNDS}), got {}",
            strategies.join(",")
        );
    };
    if s == "single" {
        return Ok(1);
    }
    match s.strip_prefix("rounds@").map(str::parse::<usize>) {
        Some(Ok(r)) if (1..=MAX_ROUNDS).contains(&r) => Ok(r),
        _ => bail!(
            "spreadsheet strategy `{s}`: use single or rounds@R with R from 1 to {MAX_ROUNDS}"
        ),
    }
}

/// Runs the spreadsheet evaluation with the parsed `tern eval` flags.
pub fn run(a: &EvalArgs) -> Result<()> {
    let rounds = rounds_of(&a.strategy)?;
    super::eval::check_limit(a)?;
    let all = spreadsheet::load(&a.task)?;
    if a.offset > 0 && a.offset >= all.len() {
        bail!(
            "--offset {} skips every task: {} has {}",
            a.offset,
            a.task,
            all.len()
        );
    }
    let tasks: Vec<_> = all
        .into_iter()
        .enumerate()
        .skip(a.offset)
        .take(a.limit)
        .collect();
    tern_solve::verify::check().context("spreadsheet tasks run the candidates' programs")?;
    let sink = super::eval::records_sink(a)?.map(Mutex::new);
    let engine = super::eval::engine(a)?;
    let settings = SheetSettings {
        rounds,
        max_tokens: a.max_tokens,
        seed: a.seed,
        kv_policy: a.kv.kv_policy.clone(),
        parallel: a.parallel as usize,
        budget: PromptBudget::default(),
        limits: workbook_limits(),
    };
    let written: Mutex<Option<std::io::Error>> = Mutex::new(None);
    let on_record = |r: &SheetRecord| {
        if let Some(f) = &sink {
            let line = serde_json::to_string(r).map_err(std::io::Error::other);
            let mut f = f.lock().expect("records file");
            if let Err(e) = line
                .and_then(|l| writeln!(f, "{l}"))
                .and_then(|()| f.flush())
            {
                written.lock().expect("error slot").get_or_insert(e);
            }
        }
        if !a.model.json {
            let scores: Vec<String> = r
                .rounds
                .iter()
                .map(|x| format!("{}/{}", x.passed, x.total))
                .collect();
            eprintln!(
                "task {} [{}]: {} ({:.1}s)",
                r.task,
                r.kind,
                scores.join(" -> "),
                r.secs
            );
        }
    };
    let records = run_spreadsheet(&engine, &tasks, &settings, &on_record)?;
    if let Some(e) = written.into_inner().expect("error slot") {
        return Err(anyhow::Error::new(e).context("appending a record"));
    }
    print_scores(a, rounds, &records)
}

/// Mean soft score and share solved (hard) of `records` after `round`.
fn scores(records: &[&SheetRecord], round: usize) -> (f64, f64) {
    let n = records.len().max(1) as f64;
    let soft = records.iter().map(|r| r.after(round).0).sum::<f64>() / n;
    let hard = records.iter().filter(|r| r.after(round).1).count() as f64 / n;
    (soft, hard)
}

fn print_scores(a: &EvalArgs, rounds: usize, records: &[SheetRecord]) -> Result<()> {
    let all: Vec<&SheetRecord> = records.iter().collect();
    let mut kinds: BTreeMap<&str, Vec<&SheetRecord>> = BTreeMap::new();
    for r in records {
        kinds.entry(r.kind.as_str()).or_default().push(r);
    }
    if a.model.json {
        let by_round: Vec<_> = (1..=rounds)
            .map(|k| {
                let (soft, hard) = scores(&all, k);
                serde_json::json!({ "round": k, "soft": soft, "hard": hard })
            })
            .collect();
        let by_kind: Vec<_> = kinds
            .iter()
            .map(|(kind, rs)| {
                let (soft, hard) = scores(rs, rounds);
                serde_json::json!({ "kind": kind, "tasks": rs.len(), "soft": soft, "hard": hard })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "tasks": records.len(), "rounds": by_round, "kinds": by_kind })
        );
        return Ok(());
    }
    println!("{} spreadsheet tasks ({})", records.len(), a.task);
    println!(
        "{:<16} {:>6} {:>7} {:>7}",
        "after round", "tasks", "soft", "hard"
    );
    for k in 1..=rounds {
        let (soft, hard) = scores(&all, k);
        println!("{:<16} {:>6} {:>7.3} {:>7.3}", k, records.len(), soft, hard);
    }
    println!("{:<16} {:>6} {:>7} {:>7}", "kind", "tasks", "soft", "hard");
    for (kind, rs) in &kinds {
        let (soft, hard) = scores(rs, rounds);
        println!("{:<16} {:>6} {:>7.3} {:>7.3}", kind, rs.len(), soft, hard);
    }
    Ok(())
}
