//! Evaluation of spreadsheet tasks (`tern eval --task spreadsheet:...`):
//! one greedy program per task, judged on every test-case workbook, and,
//! with `rounds@R`, SpreadsheetBench's multi-round setting: after a failed
//! round the model sees what went wrong on the first failed test case (the
//! error's tail, or the first differing cells) and writes the program again,
//! up to R rounds. One record per task keeps every round's score, so the
//! single-round score is round 1 of the same run.
//!
//! Separate from [`super::run`] because the family is judged on workbooks,
//! not by answers or unit tests; the sampling goes through the same
//! best-of-N entry point (n = 1, greedy).

use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;

use super::EvalError;
use crate::reasoning::{best_of_n, Aggregate, BonRequest};
use crate::tasks::spreadsheet::{prompt, PromptBudget, SpreadsheetTask};
use crate::verify::spreadsheet::{judge_workbooks, WorkbookReport};
use crate::verify::{extract_code, Limits, Verdict};

/// Most characters of an error shown to the model in a retry.
const FEEDBACK_CHARS: usize = 800;

/// How a spreadsheet evaluation runs.
#[derive(Clone, Debug)]
pub struct SheetSettings {
    /// Rounds at most (1 = single-round).
    pub rounds: usize,
    /// Most tokens per program.
    pub max_tokens: usize,
    /// Seed (greedy decoding does not use it, but the request carries it).
    pub seed: u64,
    /// The KV policy the programs are written under.
    pub kv_policy: KvPolicy,
    /// Tasks in flight at once.
    pub parallel: usize,
    /// How much of the workbook the prompt shows.
    pub budget: PromptBudget,
    /// Limits of each test-case run.
    pub limits: Limits,
}

/// One round of one task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundResult {
    /// Test cases solved.
    pub passed: usize,
    /// Test cases.
    pub total: usize,
    /// The first failed case's verdict, in a line or a few (none when all passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Tokens the program took.
    pub tokens: usize,
}

/// A task's record: its rounds in order (fewer than R when one solved it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SheetRecord {
    /// The task's number in its source.
    pub task: usize,
    /// Its operation kind's name.
    pub kind: String,
    /// Every round run.
    pub rounds: Vec<RoundResult>,
    /// The last program written.
    pub program: String,
    /// Wall seconds for the task (generation and judging).
    pub secs: f64,
}

impl SheetRecord {
    /// The (soft, hard) score after `round` rounds (1-based): a task solved
    /// earlier keeps its score.
    pub fn after(&self, round: usize) -> (f64, bool) {
        let Some(r) = self
            .rounds
            .get(round.min(self.rounds.len()).saturating_sub(1))
        else {
            return (0.0, false);
        };
        let soft = if r.total == 0 {
            0.0
        } else {
            r.passed as f64 / r.total as f64
        };
        (soft, r.total > 0 && r.passed == r.total)
    }
}

/// Runs every task, calling `on_record` as each finishes; returns the
/// records in task order.
pub fn run_spreadsheet(
    engine: &EngineHandle,
    tasks: &[(usize, SpreadsheetTask)],
    settings: &SheetSettings,
    on_record: &(dyn Fn(&SheetRecord) + Sync),
) -> Result<Vec<SheetRecord>, EvalError> {
    each_task(tasks, settings.parallel, on_record, |i, task| {
        one_task(engine, i, task, settings)
    })
}

/// Runs every task's reference program through the judge exactly as a
/// candidate's program runs (no model): the check that a correct solution
/// passes every test case, so a failing reference is a generator bug (its
/// expected cells, computed in Rust, and its program disagree). One record
/// per task with one round; `program` is left empty (the generator gives it
/// back from the spec).
pub fn run_references(
    tasks: &[(usize, SpreadsheetTask)],
    parallel: usize,
    limits: &Limits,
    on_record: &(dyn Fn(&SheetRecord) + Sync),
) -> Result<Vec<SheetRecord>, EvalError> {
    each_task(tasks, parallel, on_record, |i, task| {
        let start = Instant::now();
        let report = judge_workbooks(&task.reference, task, limits).map_err(EvalError::Judge)?;
        Ok(SheetRecord {
            task: i,
            kind: task.kind.name().to_string(),
            rounds: vec![RoundResult {
                passed: report.passed(),
                total: report.verdicts.len(),
                failure: report.first_failure().map(|(k, v)| feedback(k, v)),
                tokens: 0,
            }],
            program: String::new(),
            secs: start.elapsed().as_secs_f64(),
        })
    })
}

/// `work` on every task, `parallel` at once, `on_record` as each ends; the
/// records in task order.
pub(super) fn each_task<R: Clone + Send>(
    tasks: &[(usize, SpreadsheetTask)],
    parallel: usize,
    on_record: &(dyn Fn(&R) + Sync),
    work: impl Fn(usize, &SpreadsheetTask) -> Result<R, EvalError> + Sync,
) -> Result<Vec<R>, EvalError> {
    let out: Mutex<Vec<Option<R>>> = Mutex::new(vec![None; tasks.len()]);
    super::pool::for_each(tasks, parallel, |k, (i, task)| {
        let record = work(*i, task)?;
        on_record(&record);
        out.lock().expect("records")[k] = Some(record);
        Ok::<(), EvalError>(())
    })?;
    Ok(out
        .into_inner()
        .expect("records")
        .into_iter()
        .flatten()
        .collect())
}

fn one_task(
    engine: &EngineHandle,
    i: usize,
    task: &SpreadsheetTask,
    settings: &SheetSettings,
) -> Result<SheetRecord, EvalError> {
    let start = Instant::now();
    let mut messages = vec![ChatMessage::new(
        "user",
        prompt(task, settings.budget).as_str(),
    )];
    let mut rounds = Vec::new();
    let mut program = String::new();
    for _ in 0..settings.rounds.max(1) {
        let req = BonRequest {
            messages: messages.clone(),
            n: 1,
            sampling: SamplingParams {
                temperature: 0.0,
                seed: settings.seed.wrapping_add(i as u64 * 1000),
                ..SamplingParams::default()
            },
            max_tokens: settings.max_tokens,
            aggregate: Aggregate::Majority,
            adaptive: false,
            wave: 1,
            confidence: 0.95,
            kv_policy: settings.kv_policy.clone(),
            tests: Vec::new(),
            prelude: String::new(),
            length: None,
            cancel: Default::default(),
        };
        let res = best_of_n(engine, &req)?;
        let reply = res
            .candidates
            .first()
            .map(|c| c.text.clone())
            .unwrap_or_default();
        program = extract_code(&reply);
        let report = judge_workbooks(&program, task, &settings.limits).map_err(EvalError::Judge)?;
        let failure = report.first_failure().map(|(k, v)| feedback(k, v));
        rounds.push(RoundResult {
            passed: report.passed(),
            total: report.verdicts.len(),
            failure: failure.clone(),
            tokens: res.tokens,
        });
        let Some(failure) = failure.filter(|_| !report.hard()) else {
            break;
        };
        messages.push(ChatMessage::new("assistant", reply.as_str()));
        messages.push(ChatMessage::new(
            "user",
            retry_prompt(&report, &failure).as_str(),
        ));
    }
    Ok(SheetRecord {
        task: i,
        kind: task.kind.name().to_string(),
        rounds,
        program,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// What the model is told about a failed test case: the error's last
/// lines, or the first cells that differ.
pub(super) fn feedback(case: usize, verdict: &Verdict) -> String {
    let text = match verdict {
        Verdict::Pass => String::new(),
        Verdict::Fail { reason } => reason.clone(),
        Verdict::Timeout => "the program did not finish in time".into(),
        Verdict::Crash { stderr } => {
            let t = stderr.trim();
            let cut = t.len().saturating_sub(FEEDBACK_CHARS);
            let cut = (cut..=t.len())
                .find(|&c| t.is_char_boundary(c))
                .unwrap_or(t.len());
            format!("it stopped with an error:\n{}", &t[cut..])
        }
    };
    format!("test case {}: {text}", case + 1)
}

fn retry_prompt(report: &WorkbookReport, failure: &str) -> String {
    format!(
        "Your program solved {} of {} test-case workbooks. On {failure}\nFix the program and \
         answer with the whole corrected program in one ```python block.",
        report.passed(),
        report.verdicts.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::spreadsheet::workbook_limits;

    #[test]
    fn references_run_through_the_judge_and_a_broken_one_is_reported() {
        let tasks = crate::tasks::spreadsheet::load("spreadsheet:count=2,seed=7").unwrap();
        let mut tasks: Vec<(usize, SpreadsheetTask)> = tasks.into_iter().enumerate().collect();
        // A generator bug: task 1's reference saves before writing anything.
        tasks[1].1.reference =
            "import openpyxl\nopenpyxl.load_workbook('input.xlsx').save('output.xlsx')\n".into();
        let seen = Mutex::new(Vec::new());
        let records = run_references(&tasks, 2, &workbook_limits(), &|r| {
            seen.lock().unwrap().push(r.task)
        })
        .unwrap();
        assert_eq!(records.iter().map(|r| r.task).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(seen.into_inner().unwrap().len(), 2);
        assert_eq!(records[0].after(1), (1.0, true));
        assert_eq!(records[1].after(1), (0.0, false));
        let failure = records[1].rounds[0].failure.as_deref().unwrap();
        assert!(failure.starts_with("test case 1: "), "{failure}");
    }

    #[test]
    fn a_task_solved_early_keeps_its_score_in_later_rounds() {
        let round = |passed| RoundResult {
            passed,
            total: 4,
            failure: None,
            tokens: 10,
        };
        let r = SheetRecord {
            task: 0,
            kind: "lookup".into(),
            rounds: vec![round(1), round(4)],
            program: String::new(),
            secs: 0.0,
        };
        assert_eq!(r.after(1), (0.25, false));
        assert_eq!(r.after(2), (1.0, true));
        assert_eq!(r.after(3), (1.0, true));
        let crash = feedback(
            0,
            &Verdict::Crash {
                stderr: format!("{}KeyError: 'Qty'", "x".repeat(2000)),
            },
        );
        assert!(crash.starts_with("test case 1: it stopped") && crash.ends_with("KeyError: 'Qty'"));
        assert!(crash.len() < FEEDBACK_CHARS + 100);
    }
}
