//! `tern bon --spreadsheet SOURCE [--sheet-task K] [--select agree|oracle]
//! [--rounds R]`: best-of-N on one spreadsheet task. The N programs are
//! sampled from the task's prompt (seeded as `tern eval` seeds task K),
//! each judged on every test-case workbook, retried after a crash or a
//! missing answer up to R rounds, and one is chosen by the agreement of
//! their outputs or by the oracle (`tern_solve::eval::spreadsheet_best`);
//! the chosen program goes to stdout, each candidate's scores to stderr.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_solve::eval::spreadsheet_best::{best_of_task, BestOfSettings};
use tern_solve::tasks::spreadsheet::{self, PromptBudget};
use tern_solve::verify::spreadsheet::workbook_limits;

use super::args::{BonArgs, SheetSelect};
use crate::cli::resolve;

/// Runs best-of-N on task `--sheet-task` of `source`.
pub fn run(a: &BonArgs, source: &str) -> Result<()> {
    if !spreadsheet::is_spreadsheet(source) {
        bail!(
            "--spreadsheet {source}: give a spreadsheet spec (spreadsheet:count=N,seed=S) \
             or a .spreadsheet.jsonl file"
        );
    }
    if a.n < 2 || a.n > 16 {
        bail!("--candidates must be between 2 and 16, got {}", a.n);
    }
    let rounds = a.rounds.unwrap_or(1);
    if !(1..=10).contains(&rounds) {
        bail!("--rounds must be between 1 and 10, got {rounds}");
    }
    let mut tasks = spreadsheet::load(source)?;
    let index = a.sheet_task.unwrap_or(0);
    let select = a.select.unwrap_or(SheetSelect::Agree);
    if index >= tasks.len() {
        bail!(
            "--sheet-task {index}: {source} has {} tasks (0 to {})",
            tasks.len(),
            tasks.len() - 1
        );
    }
    let task = tasks.swap_remove(index);
    tern_solve::verify::check().context("spreadsheet tasks run the candidates' programs")?;
    let model = resolve::load(&a.model.model)?;
    let engine = EngineHandle::spawn(Arc::new(model), EngineConfig::default());
    let settings = BestOfSettings {
        n: a.n,
        temperature: a.temperature,
        top_p: a.top_p,
        max_tokens: a.max_tokens,
        seed: a.seed,
        kv_policy: a.kv.kv_policy.clone(),
        parallel: 1,
        budget: PromptBudget::default(),
        limits: workbook_limits(),
        rounds,
    };
    let record = best_of_task(&engine, index, &task, &settings)?;
    let chosen = match select {
        SheetSelect::Agree => record.agree,
        SheetSelect::Oracle => record.oracle,
    };
    if a.model.json {
        let mut v = serde_json::to_value(&record)?;
        v["chosen"] = serde_json::json!(chosen);
        println!("{v}");
        return Ok(());
    }
    for (i, c) in record.candidates.iter().enumerate() {
        let mark = if i == chosen { "*" } else { " " };
        let before: String = c
            .earlier
            .iter()
            .map(|r| format!("{}/{} -> ", r.passed, r.total))
            .collect();
        eprintln!(
            "{mark} candidate {:>2}: {before}{}/{} test cases, answers on {}, {} agreements ({} tokens)",
            i + 1,
            c.passed,
            c.total,
            c.answered,
            c.agreements,
            c.tokens
        );
    }
    println!("{}", record.candidates[chosen].program.trim());
    let (soft, hard) = record.score(chosen);
    eprintln!(
        "[{:?}: candidate {} solves {:.0}% of the test cases{}; {} candidates, {:.1} s]",
        select,
        chosen + 1,
        soft * 100.0,
        if hard { " (all)" } else { "" },
        record.candidates.len(),
        record.secs
    );
    Ok(())
}
