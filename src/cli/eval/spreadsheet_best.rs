//! `tern eval --task spreadsheet:... --strategy agree@N,oracle@N`: N
//! programs sampled per task (`--temperature`, `--seed`), judged on every
//! test-case workbook, and the scores of the candidate chosen by agreement
//! and of the oracle's, over the same candidates, overall and per
//! operation kind; with `rounds@R` beside them, each candidate retries
//! after a crash or a missing answer and the scores are printed after each
//! round. The evaluation is `tern_solve::eval::spreadsheet_best`.

use std::collections::BTreeMap;

use anyhow::Result;
use tern_solve::eval::spreadsheet_best::{run_best_of, BestOfRecord, BestOfSettings, RoundChoice};
use tern_solve::tasks::spreadsheet::{PromptBudget, SpreadsheetTask};
use tern_solve::verify::spreadsheet::workbook_limits;

use super::args::EvalArgs;

/// Which choices the run prints (both are always recorded).
#[derive(Clone, Copy, Debug)]
pub(super) struct Shown {
    /// `agree@N`.
    pub agree: bool,
    /// `oracle@N`.
    pub oracle: bool,
}

/// Samples and judges `n` programs per task, each up to `rounds` rounds;
/// `on_record` gets each task's record as it finishes.
pub(super) fn run(
    a: &EvalArgs,
    tasks: &[(usize, SpreadsheetTask)],
    n: usize,
    rounds: usize,
    on_record: &(dyn Fn(&BestOfRecord) + Sync),
) -> Result<Vec<BestOfRecord>> {
    let engine = super::setup::engine(a)?;
    let settings = BestOfSettings {
        n,
        temperature: a.temperature,
        top_p: 0.95,
        max_tokens: a.max_tokens,
        seed: a.seed,
        kv_policy: a.kv.kv_policy.clone(),
        parallel: a.parallel as usize,
        budget: PromptBudget::default(),
        limits: workbook_limits(),
        rounds,
    };
    let quiet = a.model.json;
    let progress = super::spreadsheet::Progress::new(tasks.len());
    let report = |r: &BestOfRecord| {
        on_record(r);
        if !quiet {
            let each: Vec<String> = r
                .candidates
                .iter()
                .map(|c| {
                    let before: String = c
                        .earlier
                        .iter()
                        .map(|x| format!("{}/{}>", x.passed, x.total))
                        .collect();
                    format!("{before}{}/{}", c.passed, c.total)
                })
                .collect();
            eprintln!(
                "task {} [{}]: candidates {}; agree #{} {}/{}, oracle #{} {}/{} ({:.1}s) {}",
                r.task,
                r.kind,
                each.join(" "),
                r.agree + 1,
                r.candidates[r.agree].passed,
                r.candidates[r.agree].total,
                r.oracle + 1,
                r.candidates[r.oracle].passed,
                r.candidates[r.oracle].total,
                r.secs,
                progress.tick()
            );
        }
    };
    Ok(run_best_of(&engine, tasks, &settings, &report)?)
}

/// Which candidate a strategy takes from a round's choices.
type Pick = fn(&RoundChoice) -> usize;

/// Mean soft score and share solved (hard) of each record's `pick` after
/// `round` rounds.
fn scores(records: &[&BestOfRecord], round: usize, pick: Pick) -> (f64, f64) {
    let n = records.len().max(1) as f64;
    let score = |r: &BestOfRecord| r.score_after(round, pick(&r.choice_after(round)));
    let soft = records.iter().map(|r| score(r).0).sum::<f64>() / n;
    let hard = records.iter().filter(|r| score(r).1).count() as f64 / n;
    (soft, hard)
}

/// The table: each shown strategy's scores overall after each round, and
/// per kind after the last.
pub(super) fn print_scores(
    a: &EvalArgs,
    n: usize,
    rounds: usize,
    shown: Shown,
    records: &[BestOfRecord],
) -> Result<()> {
    let mut strategies: Vec<(String, Pick)> = Vec::new();
    if shown.agree {
        strategies.push((format!("agree@{n}"), |c| c.agree));
    }
    if shown.oracle {
        strategies.push((format!("oracle@{n}"), |c| c.oracle));
    }
    let rounds = rounds.max(1);
    let mut groups: BTreeMap<&str, Vec<&BestOfRecord>> = BTreeMap::new();
    groups.insert("all", records.iter().collect());
    for r in records {
        groups.entry(r.kind.as_str()).or_default().push(r);
    }
    // "all" after every round, then each kind after the last.
    let cells: Vec<(&str, usize, &Vec<&BestOfRecord>)> = (1..=rounds)
        .map(|k| ("all", k, &groups["all"]))
        .chain(
            groups
                .iter()
                .filter(|(scope, _)| **scope != "all")
                .map(|(scope, rs)| (*scope, rounds, rs)),
        )
        .collect();
    if a.model.json {
        let rows: Vec<_> = strategies
            .iter()
            .flat_map(|(name, pick)| {
                cells.iter().map(move |(scope, round, rs)| {
                    let (soft, hard) = scores(rs, *round, *pick);
                    serde_json::json!({ "strategy": name, "scope": scope, "round": round,
                        "tasks": rs.len(), "soft": soft, "hard": hard })
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "tasks": records.len(), "rows": rows })
        );
        return Ok(());
    }
    println!("{} spreadsheet tasks ({})", records.len(), a.task);
    println!(
        "{:<12} {:<16} {:>6} {:>6} {:>7} {:>7}",
        "strategy", "scope", "round", "tasks", "soft", "hard"
    );
    for (name, pick) in &strategies {
        for (scope, round, rs) in &cells {
            let (soft, hard) = scores(rs, *round, *pick);
            println!(
                "{:<12} {:<16} {:>6} {:>6} {:>7.3} {:>7.3}",
                name,
                scope,
                round,
                rs.len(),
                soft,
                hard
            );
        }
    }
    Ok(())
}
