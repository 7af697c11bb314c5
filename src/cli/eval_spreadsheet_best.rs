//! `tern eval --task spreadsheet:... --strategy agree@N,oracle@N`: N
//! programs sampled per task (`--temperature`, `--seed`), judged on every
//! test-case workbook, and the scores of the candidate chosen by agreement
//! and of the oracle's, over the same candidates, overall and per
//! operation kind. The evaluation is `tern_solve::eval::spreadsheet_best`.

use std::collections::BTreeMap;

use anyhow::Result;
use tern_solve::eval::spreadsheet_best::{run_best_of, BestOfRecord, BestOfSettings};
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

/// Samples and judges `n` programs per task; `on_record` gets each task's
/// record as it finishes.
pub(super) fn run(
    a: &EvalArgs,
    tasks: &[(usize, SpreadsheetTask)],
    n: usize,
    on_record: &(dyn Fn(&BestOfRecord) + Sync),
) -> Result<Vec<BestOfRecord>> {
    let engine = super::eval::engine(a)?;
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
    };
    let quiet = a.model.json;
    let report = |r: &BestOfRecord| {
        on_record(r);
        if !quiet {
            let each: Vec<String> = r
                .candidates
                .iter()
                .map(|c| format!("{}/{}", c.passed, c.total))
                .collect();
            eprintln!(
                "task {} [{}]: candidates {}; agree #{} {}/{}, oracle #{} {}/{} ({:.1}s)",
                r.task,
                r.kind,
                each.join(" "),
                r.agree + 1,
                r.candidates[r.agree].passed,
                r.candidates[r.agree].total,
                r.oracle + 1,
                r.candidates[r.oracle].passed,
                r.candidates[r.oracle].total,
                r.secs
            );
        }
    };
    Ok(run_best_of(&engine, tasks, &settings, &report)?)
}

/// Which candidate of a record a strategy takes.
type Pick = fn(&BestOfRecord) -> usize;

/// Mean soft score and share solved (hard) of each record's `pick`.
fn scores(records: &[&BestOfRecord], pick: Pick) -> (f64, f64) {
    let n = records.len().max(1) as f64;
    let soft = records.iter().map(|r| r.score(pick(r)).0).sum::<f64>() / n;
    let hard = records.iter().filter(|r| r.score(pick(r)).1).count() as f64 / n;
    (soft, hard)
}

/// The table: each shown strategy's scores overall and per kind.
pub(super) fn print_scores(
    a: &EvalArgs,
    n: usize,
    shown: Shown,
    records: &[BestOfRecord],
) -> Result<()> {
    let mut strategies: Vec<(String, Pick)> = Vec::new();
    if shown.agree {
        strategies.push((format!("agree@{n}"), |r| r.agree));
    }
    if shown.oracle {
        strategies.push((format!("oracle@{n}"), |r| r.oracle));
    }
    let mut groups: BTreeMap<&str, Vec<&BestOfRecord>> = BTreeMap::new();
    groups.insert("all", records.iter().collect());
    for r in records {
        groups.entry(r.kind.as_str()).or_default().push(r);
    }
    if a.model.json {
        let rows: Vec<_> = strategies
            .iter()
            .flat_map(|(name, pick)| {
                groups.iter().map(move |(scope, rs)| {
                    let (soft, hard) = scores(rs, *pick);
                    serde_json::json!({ "strategy": name, "scope": scope,
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
        "{:<12} {:<16} {:>6} {:>7} {:>7}",
        "strategy", "scope", "tasks", "soft", "hard"
    );
    for (name, pick) in &strategies {
        for (scope, rs) in &groups {
            let (soft, hard) = scores(rs, *pick);
            println!(
                "{:<12} {:<16} {:>6} {:>7.3} {:>7.3}",
                name,
                scope,
                rs.len(),
                soft,
                hard
            );
        }
    }
    Ok(())
}
