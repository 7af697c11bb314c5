//! One strategy's verdict on one task, and the records file (`.jsonl`, one
//! record a line) a long evaluation resumes from.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::reasoning::{BonResult, GeneratedTests};
use crate::tasks::Task;
use crate::verify;

use super::{EvalError, Strategy};

/// One strategy's result on one task: a line of the records file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// The strategy's label.
    pub strategy: String,
    /// The task's index in the whole file.
    pub task: usize,
    /// Whether the task was solved.
    pub ok: bool,
    /// The answer given (code tasks: `passed/total tests`).
    pub answer: Option<String>,
    /// The answer wanted (code tasks: `total tests`).
    pub want: String,
    /// Tokens generated.
    pub tokens: usize,
    /// Candidates sampled.
    pub candidates: usize,
    /// Adaptive length's answer probes.
    pub probes: usize,
    /// Candidates whose probes stopped the reasoning early.
    pub stopped_early: usize,
    /// Reasoning tokens those early stops saved.
    pub tokens_saved: usize,
    /// Wall time of the run that produced it (a shared sample set's whole time).
    pub seconds: f64,
    /// Produced from candidates shared with the other strategies of its group.
    pub shared: bool,
    /// `reward@N:tests=K` only: everything needed to recompute any table
    /// over this task (another K, a random or an oracle choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_tests: Option<GeneratedRecord>,
}

/// One task's run of best-of-N judged by tests a model wrote: the candidates,
/// the tests, the pass matrix, the choice, and every candidate's verdict on
/// the task's own (hidden) tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GeneratedRecord {
    /// The tests, the writer's replies, the pass matrix (a row per candidate,
    /// a letter per test: `P` pass, `F` fail, `T` timeout, `E` error), the
    /// writer's tokens and the generation and sandbox seconds.
    #[serde(flatten)]
    pub run: GeneratedTests,
    /// Every candidate's full text, in seed order.
    pub candidates: Vec<String>,
    /// Index of the chosen candidate (most generated tests passed, ties to
    /// the most shared pattern, then the earliest).
    pub chosen: usize,
    /// Every candidate on the task's own tests, in the matrix's letters: the
    /// hidden verdict of each (a candidate is right when its row is all `P`;
    /// the record's `ok` is the chosen one's).
    pub hidden: Vec<String>,
}

/// Records by (strategy label, task index).
pub type Records = HashMap<(String, usize), Record>;

/// A response graded against its task.
#[derive(Debug, Clone, PartialEq)]
pub struct Grade {
    /// Solved: the right answer, or a program passing every test.
    pub ok: bool,
    /// What it answered (code tasks: `passed/total tests`).
    pub answer: Option<String>,
    /// What was wanted (code tasks: `total tests`).
    pub want: String,
}

/// Grades a response: a code task runs the program in `text` against every
/// test (solved when all pass, as HumanEval's pass@1 counts); an answer task
/// compares the extracted `answer` with the task's; a spreadsheet task runs
/// the program on every test-case workbook (solved when all pass,
/// SpreadsheetBench's hard score).
pub fn judge(task: &Task, text: &str, answer: Option<&str>) -> Result<Grade, EvalError> {
    if let Some(sheet) = &task.sheet {
        let r = verify::spreadsheet::judge_workbooks(
            &verify::extract_code(text),
            sheet,
            &verify::spreadsheet::workbook_limits(),
        )
        .map_err(EvalError::Judge)?;
        return Ok(Grade {
            ok: r.hard(),
            answer: Some(format!("{}/{} test cases", r.passed(), r.verdicts.len())),
            want: format!("{} test cases", r.verdicts.len()),
        });
    }
    if task.is_code() {
        let program = task.program(&verify::extract_code(text));
        let r = verify::judge_python(&program, &task.tests, &verify::Limits::default())
            .map_err(EvalError::Judge)?;
        // A code task has tests, so `total` is never 0 here.
        return Ok(Grade {
            ok: r.total > 0 && r.passed == r.total,
            answer: Some(format!("{}/{} tests", r.passed, r.total)),
            want: format!("{} tests", r.total),
        });
    }
    Ok(Grade {
        ok: answer.is_some_and(|got| verify::answers_match(got, &task.answer)),
        answer: answer.map(str::to_string),
        want: task.answer.clone(),
    })
}

impl Record {
    /// Strategy `s`'s result `res` on task `i`, graded; `secs` is the wall
    /// time of the run that produced it, `shared` whether its candidates
    /// were shared with other strategies.
    pub fn new(
        s: &Strategy,
        i: usize,
        task: &Task,
        res: &BonResult,
        secs: f64,
        shared: bool,
    ) -> Result<Record, EvalError> {
        let (grade, generated_tests) = match (&res.generated_tests, res.chosen) {
            (Some(run), Some(chosen)) if task.is_code() => {
                let (grade, record) = judge_every_candidate(task, res, run, chosen)?;
                (grade, Some(record))
            }
            _ => (judge(task, &res.text, res.answer.as_deref())?, None),
        };
        let lengths = res.candidates.iter().filter_map(|c| c.length.as_ref());
        Ok(Record {
            strategy: s.label.clone(),
            task: i,
            ok: grade.ok,
            answer: grade.answer,
            want: grade.want,
            tokens: res.tokens,
            candidates: res.candidates.len(),
            probes: lengths.clone().map(|l| l.probes.len()).sum(),
            stopped_early: lengths.clone().filter(|l| l.stopped_early).count(),
            tokens_saved: lengths.map(|l| l.tokens_saved).sum(),
            seconds: secs,
            shared,
            generated_tests,
        })
    }
}

/// The hidden verdict of every candidate of a generated-tests run (one
/// sandbox pass over all of them), the chosen one's as the grade.
fn judge_every_candidate(
    task: &Task,
    res: &BonResult,
    run: &GeneratedTests,
    chosen: usize,
) -> Result<(Grade, GeneratedRecord), EvalError> {
    let programs: Vec<String> = res
        .candidates
        .iter()
        .map(|c| task.program(&verify::extract_code(&c.text)))
        .collect();
    let reports = verify::judge_many(&programs, &task.tests, &verify::Limits::default())
        .map_err(EvalError::Judge)?;
    let r = &reports[chosen];
    let grade = Grade {
        ok: r.total > 0 && r.passed == r.total,
        answer: Some(format!("{}/{} tests", r.passed, r.total)),
        want: format!("{} tests", r.total),
    };
    let record = GeneratedRecord {
        run: run.clone(),
        candidates: res.candidates.iter().map(|c| c.text.clone()).collect(),
        chosen,
        hidden: reports.iter().map(verify::matrix_row).collect(),
    };
    Ok((grade, record))
}

impl Record {
    /// A one-candidate record of a response the caller generated itself
    /// (the trainer's held-out rollouts), graded by [`judge`].
    pub fn single(s: &Strategy, i: usize, grade: Grade, tokens: usize, secs: f64) -> Record {
        Record {
            strategy: s.label.clone(),
            task: i,
            ok: grade.ok,
            answer: grade.answer,
            want: grade.want,
            tokens,
            candidates: 1,
            probes: 0,
            stopped_early: 0,
            tokens_saved: 0,
            seconds: secs,
            shared: false,
            generated_tests: None,
        }
    }
}

/// The records already in `path` (none if it does not exist).
pub fn load_records(path: &Path) -> Result<Records, EvalError> {
    let mut out = HashMap::new();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => {
            return Err(EvalError::ReadRecords {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line).map_err(|source| EvalError::NotARecord {
            path: path.to_path_buf(),
            line: n + 1,
            source,
        })?;
        out.insert((r.strategy.clone(), r.task), r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_graded_by_value() {
        let task = Task::answer("2 + 2?".into(), "4".into(), None);
        let g = judge(&task, "The answer is 4", Some("4")).unwrap();
        assert!(g.ok && g.want == "4");
        assert!(!judge(&task, "no idea", None).unwrap().ok);
    }

    #[test]
    fn a_records_file_that_is_not_one_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        assert!(load_records(&p).unwrap().is_empty());
        std::fs::write(&p, "\n{\"strategy\": \"single\"}\n").unwrap();
        match load_records(&p) {
            Err(EvalError::NotARecord { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
