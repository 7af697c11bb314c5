//! The spreadsheet judge: a candidate's openpyxl program run once per
//! test-case workbook, each run in a fresh sandbox with the workbook copied
//! in as `input.xlsx` and `output.xlsx` read back (`sandbox/files.rs`),
//! and the output's answer range compared cell by cell with the expected
//! cells ([`compare`]). Scores are SpreadsheetBench's: soft (share of test
//! cases solved) and hard (all solved).
//!
//! Each run's answer range is also kept as the program wrote it
//! ([`answers`]), for best-of-N by agreement ([`select`]).
//!
//! Every failure is one failed test case with its reason (an unreadable
//! test-case workbook, no output file, an exception, the time or file-size
//! limit); only the judge itself failing (no sandbox, cancelled) is an error.

mod answers;
mod compare;
mod formula;
mod read;
pub mod select;

pub use answers::{answer_range, AnswerRange};
pub use compare::{compare, TOLERANCE};
pub use read::{answer_cells, read_workbook, MAX_ANSWER_CELLS};

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use serde::Serialize;

use super::sandbox::{sandbox, FileRun};
use super::{JudgeError, Limits, Verdict};
use crate::tasks::spreadsheet::{Case, SpreadsheetTask};

/// A candidate's verdicts on a task's test cases, in case order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkbookReport {
    /// One verdict per test-case workbook.
    pub verdicts: Vec<Verdict>,
    /// What the program wrote into the answer range on each test case
    /// (`None` where it produced nothing there): what best-of-N by
    /// agreement compares ([`select`]).
    #[serde(skip)]
    pub answers: Vec<Option<AnswerRange>>,
}

impl WorkbookReport {
    /// Test cases solved.
    pub fn passed(&self) -> usize {
        self.verdicts.iter().filter(|v| v.passed()).count()
    }

    /// The soft score: the share of test cases solved (0 with none).
    pub fn soft(&self) -> f64 {
        if self.verdicts.is_empty() {
            0.0
        } else {
            self.passed() as f64 / self.verdicts.len() as f64
        }
    }

    /// The hard score: every test case solved.
    pub fn hard(&self) -> bool {
        !self.verdicts.is_empty() && self.passed() == self.verdicts.len()
    }

    /// The first failed case's verdict, for a retry prompt.
    pub fn first_failure(&self) -> Option<(usize, &Verdict)> {
        self.verdicts.iter().enumerate().find(|(_, v)| !v.passed())
    }
}

/// Limits for one spreadsheet run: 20 s (importing openpyxl and loading a
/// workbook take a second or two on a busy machine) and 512 MiB.
pub fn workbook_limits() -> Limits {
    Limits {
        time: Duration::from_secs(20),
        memory_bytes: 512 * 1024 * 1024,
        ..Limits::default()
    }
}

/// Runs `program` on every test case of `task`, cases side by side (one
/// per core).
pub fn judge_workbooks(
    program: &str,
    task: &SpreadsheetTask,
    limits: &Limits,
) -> Result<WorkbookReport, JudgeError> {
    judge_cases(program, &task.cases, limits)
}

/// Runs `program` on every one of `cases`, side by side (one per core).
pub fn judge_cases(
    program: &str,
    cases: &[Case],
    limits: &Limits,
) -> Result<WorkbookReport, JudgeError> {
    if limits.cancel.is_cancelled() {
        return Err(JudgeError::Cancelled);
    }
    let sandbox = sandbox()?;
    let workers = thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(cases.len())
        .max(1);
    let slots: Vec<Mutex<Option<Result<Judged, JudgeError>>>> =
        cases.iter().map(|_| Mutex::new(None)).collect();
    let take = AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = take.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { return };
                let outcome = judge_case(sandbox, program, case, limits);
                let stop = outcome.is_err();
                *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
                if stop {
                    take.store(cases.len(), Ordering::Relaxed);
                }
            });
        }
    });
    // A case left unrun means another one failed to run: that error is the answer.
    let outcomes: Vec<Option<Result<Judged, JudgeError>>> = slots
        .into_iter()
        .map(|s| s.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect();
    let mut verdicts = Vec::with_capacity(cases.len());
    let mut answers = Vec::with_capacity(cases.len());
    let mut missing = false;
    for outcome in outcomes {
        match outcome {
            Some(Ok((v, a))) => {
                verdicts.push(v);
                answers.push(a);
            }
            Some(Err(e)) => return Err(e),
            None => missing = true,
        }
    }
    if missing {
        return Err(JudgeError::Cancelled);
    }
    Ok(WorkbookReport { verdicts, answers })
}

/// `program` run once more on each case's input, in the sandbox as the
/// judge runs it, for the workbooks it writes: each case's `output.xlsx`,
/// or why there is none (an unreadable input, a crash, a timeout, no
/// output). The endpoint returns the chosen program's workbooks this way,
/// rather than keeping every candidate's outputs in memory.
pub fn run_outputs(
    program: &str,
    cases: &[Case],
    limits: &Limits,
) -> Result<Vec<Result<Vec<u8>, String>>, JudgeError> {
    let sandbox = sandbox()?;
    cases
        .iter()
        .map(|case| {
            let input = match case.input.bytes() {
                Ok(bytes) => bytes,
                Err(reason) => return Ok(Err(reason)),
            };
            Ok(match sandbox.run_with_file(program, &input, limits)? {
                FileRun::Output(bytes) => Ok(bytes),
                FileRun::Ended(Verdict::Timeout) => {
                    Err("the program did not finish in time".into())
                }
                FileRun::Ended(Verdict::Crash { stderr }) => Err(stderr),
                FileRun::Ended(Verdict::Fail { reason }) => Err(reason),
                FileRun::Ended(Verdict::Pass) => Err("the program wrote no output.xlsx".into()),
            })
        })
        .collect()
}

/// One test case's verdict and the answer range the program produced.
type Judged = (Verdict, Option<AnswerRange>);

/// One test case: its workbook in, the program run, the output compared
/// and its answer range read.
fn judge_case(
    sandbox: &super::sandbox::Sandbox,
    program: &str,
    case: &Case,
    limits: &Limits,
) -> Result<Judged, JudgeError> {
    let input = match case.input.bytes() {
        Ok(bytes) => bytes,
        Err(reason) => return Ok((Verdict::Fail { reason }, None)),
    };
    Ok(match sandbox.run_with_file(program, &input, limits)? {
        FileRun::Ended(verdict) => (verdict, None),
        FileRun::Output(bytes) => {
            let verdict = match compare(&bytes, &case.expected) {
                Ok(()) => Verdict::Pass,
                Err(reason) => Verdict::Fail { reason },
            };
            // A range left as the input had it is no answer either.
            let before = answer_range(&input, &case.expected);
            let after = answer_range(&bytes, &case.expected).filter(|a| Some(a) != before.as_ref());
            (verdict, after)
        }
    })
}

#[cfg(test)]
mod tests;
