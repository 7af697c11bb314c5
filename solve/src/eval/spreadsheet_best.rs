//! Best-of-N on spreadsheet tasks (`tern eval --strategy agree@N,oracle@N`
//! and `tern bon --spreadsheet`): N programs sampled at a temperature from
//! the same prompt, each judged on every test-case workbook, then one chosen
//! two ways over the very same candidates: by the agreement of their
//! outputs on the test-case workbooks, which needs no hidden answer and so
//! is a real strategy, and by the oracle (the candidate the reference
//! comparison scores best), the ceiling any selection among these N could
//! reach. The rules are in `verify::spreadsheet::select`.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;

use super::spreadsheet::{each_task, feedback};
use super::EvalError;
use crate::reasoning::{best_of_n, Aggregate, BonRequest};
use crate::tasks::spreadsheet::{prompt, PromptBudget, SpreadsheetTask};
use crate::verify::spreadsheet::select::{by_agreement, by_oracle, supports};
use crate::verify::spreadsheet::{judge_workbooks, WorkbookReport};
use crate::verify::{extract_code, Limits};

/// How best-of-N samples and judges.
#[derive(Clone, Debug)]
pub struct BestOfSettings {
    /// Programs sampled per task.
    pub n: usize,
    /// Their temperature.
    pub temperature: f32,
    /// Their nucleus sampling (1 = off).
    pub top_p: f32,
    /// Most tokens per program.
    pub max_tokens: usize,
    /// Base seed: task i's candidate c uses seed + 1000 i + c.
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

/// One sampled program, judged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateRecord {
    /// Test cases it solved (the reference comparison).
    pub passed: usize,
    /// Test cases.
    pub total: usize,
    /// (other candidate, test case) pairs with its answer range.
    pub agreements: usize,
    /// Test cases on which it produced an answer range.
    pub answered: usize,
    /// Its first failed case, in a line or a few.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Tokens it took.
    pub tokens: usize,
    /// The program.
    pub program: String,
}

/// A task's best-of-N record: every candidate and both choices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BestOfRecord {
    /// The task's number in its source.
    pub task: usize,
    /// Its operation kind's name.
    pub kind: String,
    /// Every candidate, in seed order.
    pub candidates: Vec<CandidateRecord>,
    /// The candidate chosen by agreement.
    pub agree: usize,
    /// The candidate the oracle chooses.
    pub oracle: usize,
    /// Wall seconds for the task (sampling and judging).
    pub secs: f64,
}

impl BestOfRecord {
    /// The (soft, hard) score of candidate `chosen`.
    pub fn score(&self, chosen: usize) -> (f64, bool) {
        match self.candidates.get(chosen) {
            Some(c) if c.total > 0 => (c.passed as f64 / c.total as f64, c.passed == c.total),
            _ => (0.0, false),
        }
    }
}

/// N programs for `task`, each judged on every test case: the programs,
/// their token counts and their reports, in seed order.
pub fn sample_and_judge(
    engine: &EngineHandle,
    task: &SpreadsheetTask,
    settings: &BestOfSettings,
    seed: u64,
) -> Result<Vec<(String, usize, WorkbookReport)>, EvalError> {
    let req = BonRequest {
        messages: vec![ChatMessage::new(
            "user",
            prompt(task, settings.budget).as_str(),
        )],
        n: settings.n,
        sampling: SamplingParams {
            temperature: settings.temperature,
            top_p: settings.top_p,
            seed,
            ..SamplingParams::default()
        },
        max_tokens: settings.max_tokens,
        aggregate: Aggregate::Majority,
        adaptive: false,
        wave: settings.n,
        confidence: 0.95,
        kv_policy: settings.kv_policy.clone(),
        tests: Vec::new(),
        prelude: String::new(),
        length: None,
        cancel: Default::default(),
    };
    let res = best_of_n(engine, &req)?;
    res.candidates
        .iter()
        .map(|c| {
            let program = extract_code(&c.text);
            let report =
                judge_workbooks(&program, task, &settings.limits).map_err(EvalError::Judge)?;
            Ok((program, c.tokens, report))
        })
        .collect()
}

/// The record of judged candidates: each one's scores and agreement, and
/// the two choices.
pub fn record_of(
    task: usize,
    kind: &str,
    judged: Vec<(String, usize, WorkbookReport)>,
    secs: f64,
) -> BestOfRecord {
    let reports: Vec<WorkbookReport> = judged.iter().map(|(_, _, r)| r.clone()).collect();
    let support = supports(&reports);
    let candidates = judged
        .into_iter()
        .zip(support)
        .map(|((program, tokens, report), s)| CandidateRecord {
            passed: report.passed(),
            total: report.verdicts.len(),
            agreements: s.agreements,
            answered: s.answered,
            failure: report.first_failure().map(|(k, v)| feedback(k, v)),
            tokens,
            program,
        })
        .collect();
    BestOfRecord {
        task,
        kind: kind.to_string(),
        candidates,
        agree: by_agreement(&reports).unwrap_or(0),
        oracle: by_oracle(&reports).unwrap_or(0),
        secs,
    }
}

/// Best-of-N on every task, calling `on_record` as each finishes; the
/// records in task order.
pub fn run_best_of(
    engine: &EngineHandle,
    tasks: &[(usize, SpreadsheetTask)],
    settings: &BestOfSettings,
    on_record: &(dyn Fn(&BestOfRecord) + Sync),
) -> Result<Vec<BestOfRecord>, EvalError> {
    each_task(tasks, settings.parallel, on_record, |i, task| {
        let start = Instant::now();
        let seed = settings.seed.wrapping_add(i as u64 * 1000);
        let judged = sample_and_judge(engine, task, settings, seed)?;
        Ok(record_of(
            i,
            task.kind.name(),
            judged,
            start.elapsed().as_secs_f64(),
        ))
    })
}
