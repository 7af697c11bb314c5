//! Best-of-N on spreadsheet tasks (`tern eval --strategy agree@N,oracle@N`
//! and `tern bon --spreadsheet`): N programs sampled at a temperature from
//! the same prompt, each judged on every test-case workbook, then one chosen
//! two ways over the very same candidates: by the agreement of their
//! outputs on the test-case workbooks, which needs no hidden answer and so
//! is a real strategy, and by the oracle (the candidate the reference
//! comparison scores best), the ceiling any selection among these N could
//! reach. The rules are in `verify::spreadsheet::select`.
//!
//! With rounds (`rounds@R` beside `agree@N`), each candidate is its own
//! conversation: a candidate whose program crashed, ran out of time or left
//! no answer on a test case is shown that (never a hidden answer, so the
//! choice by agreement stays blind) and writes its program again, up to R
//! rounds; both choices are made again after every round.

use std::thread;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;

use super::spreadsheet::{each_task, feedback, RoundResult};
use super::EvalError;
use crate::reasoning::{best_of_n, Aggregate, BonRequest};
use crate::tasks::spreadsheet::{prompt, Case, PromptBudget, SpreadsheetTask};
use crate::verify::spreadsheet::select::{by_agreement, by_oracle, supports};
use crate::verify::spreadsheet::{judge_cases, WorkbookReport};
use crate::verify::{extract_code, Limits, Verdict};

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
    /// Rounds per candidate (1 = single-round; see the module docs).
    pub rounds: usize,
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
    /// Its rounds before the last one, in order (empty when it wrote one
    /// program); the fields above are its last round's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<RoundResult>,
}

impl CandidateRecord {
    /// Its (passed, total) after `round` rounds (1-based): a candidate that
    /// stopped earlier keeps its last program.
    pub fn after(&self, round: usize) -> (usize, usize) {
        match self.earlier.get(round.max(1) - 1) {
            Some(r) => (r.passed, r.total),
            None => (self.passed, self.total),
        }
    }
}

/// The two choices after one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundChoice {
    /// The candidate chosen by agreement.
    pub agree: usize,
    /// The candidate the oracle chooses.
    pub oracle: usize,
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
    /// With rounds: both choices after each round, round 1 first (the last
    /// is `agree`/`oracle`); empty for a single-round run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_round: Vec<RoundChoice>,
}

impl BestOfRecord {
    /// The (soft, hard) score of candidate `chosen`.
    pub fn score(&self, chosen: usize) -> (f64, bool) {
        self.score_after(usize::MAX, chosen)
    }

    /// The (soft, hard) score of candidate `chosen` after `round` rounds.
    pub fn score_after(&self, round: usize, chosen: usize) -> (f64, bool) {
        match self.candidates.get(chosen).map(|c| c.after(round)) {
            Some((passed, total)) if total > 0 => (passed as f64 / total as f64, passed == total),
            _ => (0.0, false),
        }
    }

    /// Both choices after `round` rounds (1-based; past the last round, the
    /// last choices).
    pub fn choice_after(&self, round: usize) -> RoundChoice {
        let last = RoundChoice {
            agree: self.agree,
            oracle: self.oracle,
        };
        match round.checked_sub(1) {
            Some(k) if k < self.by_round.len() => self.by_round[k],
            _ => last,
        }
    }
}

/// One candidate: its conversation so far, its last reply, and its judged
/// programs, one per round.
pub struct Trajectory {
    messages: Vec<ChatMessage>,
    /// Its last reply, whole.
    pub reply: String,
    /// Its programs as judged, one per round.
    pub rounds: Vec<Judged>,
}

/// A program as the judge saw it.
pub struct Judged {
    /// The program (the reply's last ```python block).
    pub program: String,
    /// Tokens its reply took.
    pub tokens: usize,
    /// Its verdicts and answer ranges, one per test case.
    pub report: WorkbookReport,
}

impl Trajectory {
    /// Its last round.
    pub fn last(&self) -> &Judged {
        self.rounds.last().expect("a trajectory has a round")
    }
}

/// Every candidate of a best-of-N run with rounds, and both choices after
/// each round (the last is the run's).
pub struct BestOfRun {
    /// The candidates, in seed order.
    pub candidates: Vec<Trajectory>,
    /// The choices after each round, round 1 first.
    pub by_round: Vec<RoundChoice>,
}

/// `n` replies to `messages` sampled at the settings' temperature, reply
/// `c` seeded `seed + c`: (text, tokens) in seed order.
fn sample(
    engine: &EngineHandle,
    messages: Vec<ChatMessage>,
    n: usize,
    settings: &BestOfSettings,
    seed: u64,
) -> Result<Vec<(String, usize)>, EvalError> {
    let req = BonRequest {
        messages,
        n,
        sampling: SamplingParams {
            temperature: settings.temperature,
            top_p: settings.top_p,
            seed,
            ..SamplingParams::default()
        },
        max_tokens: settings.max_tokens,
        aggregate: Aggregate::Majority,
        adaptive: false,
        wave: n,
        confidence: 0.95,
        kv_policy: settings.kv_policy.clone(),
        tests: Vec::new(),
        prelude: String::new(),
        length: None,
        cancel: settings.limits.cancel.clone(),
    };
    let res = best_of_n(engine, &req)?;
    Ok(res
        .candidates
        .into_iter()
        .map(|c| (c.text, c.tokens))
        .collect())
}

fn judge(reply: &str, tokens: usize, cases: &[Case], limits: &Limits) -> Result<Judged, EvalError> {
    let program = extract_code(reply);
    let report = judge_cases(&program, cases, limits).map_err(EvalError::Judge)?;
    Ok(Judged {
        program,
        tokens,
        report,
    })
}

/// What a candidate may be told after a round without any hidden answer:
/// the first test case on which its program crashed, ran out of time, or
/// left no answer (no output.xlsx, or the answer range empty or as the
/// input had it). `None` when it answered every test case, which is all a
/// run without the reference answers can see.
pub fn blind_feedback(report: &WorkbookReport) -> Option<String> {
    let mut found = None;
    for (k, v) in report.verdicts.iter().enumerate() {
        match v {
            Verdict::Crash { .. } | Verdict::Timeout => return Some(feedback(k, v)),
            _ if !answered(report, k) => {
                found.get_or_insert(k);
            }
            _ => {}
        }
    }
    found.map(|k| {
        format!(
            "test case {}: the program ran, but output.xlsx was missing or the answer \
             range was left empty or as the input had it",
            k + 1
        )
    })
}

/// Whether the program wrote an answer range on case `k` (what a run
/// without reference answers sees; a verdict against a client's workbook,
/// which has no expected values, would mean nothing).
fn answered(report: &WorkbookReport, k: usize) -> bool {
    matches!(report.answers.get(k), Some(Some(_)))
}

/// The next user turn after a round with `feedback`: says nothing a run
/// without the reference answers could not see.
fn blind_retry_prompt(report: &WorkbookReport, feedback: &str) -> String {
    let bad = report
        .verdicts
        .iter()
        .enumerate()
        .filter(|&(k, v)| {
            matches!(v, Verdict::Crash { .. } | Verdict::Timeout) || !answered(report, k)
        })
        .count();
    format!(
        "Your program did not produce an answer on {bad} of {} test-case workbooks. On \
         {feedback}\nFix the program and answer with the whole corrected program in one \
         ```python block.",
        report.verdicts.len()
    )
}

/// Both choices over the candidates' last programs.
fn choose(trajectories: &[Trajectory]) -> RoundChoice {
    let reports: Vec<WorkbookReport> = trajectories
        .iter()
        .map(|t| t.last().report.clone())
        .collect();
    RoundChoice {
        agree: by_agreement(&reports).unwrap_or(0),
        oracle: by_oracle(&reports).unwrap_or(0),
    }
}

/// Best-of-N on task number `i` (its seeds: `settings.seed + 1000 i`, then
/// candidate `c` of round `r` (0-based) `+ r n + c`): N programs, each
/// judged on every test case, retried as the module docs say up to
/// `settings.rounds` rounds, and the record of both choices.
pub fn best_of_task(
    engine: &EngineHandle,
    i: usize,
    task: &SpreadsheetTask,
    settings: &BestOfSettings,
) -> Result<BestOfRecord, EvalError> {
    let start = Instant::now();
    let seed = settings.seed.wrapping_add(i as u64 * 1000);
    let opening = vec![ChatMessage::new(
        "user",
        prompt(task, settings.budget).as_str(),
    )];
    let run = best_of_cases(engine, opening, &task.cases, settings, seed)?;
    Ok(record_of(
        i,
        task.kind.name(),
        run,
        start.elapsed().as_secs_f64(),
    ))
}

/// Best-of-N from the conversation `opening` over `cases` (candidate `c`
/// of round `r`, 0-based, seeded `seed + r n + c`): the candidates sampled,
/// each judged on every case and retried as the module docs say, up to
/// `settings.rounds` rounds. What [`best_of_task`] and the endpoint share.
pub fn best_of_cases(
    engine: &EngineHandle,
    opening: Vec<ChatMessage>,
    cases: &[Case],
    settings: &BestOfSettings,
    seed: u64,
) -> Result<BestOfRun, EvalError> {
    let mut trajectories = sample(engine, opening.clone(), settings.n, settings, seed)?
        .into_iter()
        .map(|(reply, tokens)| {
            let first = judge(&reply, tokens, cases, &settings.limits)?;
            Ok(Trajectory {
                messages: opening.clone(),
                reply,
                rounds: vec![first],
            })
        })
        .collect::<Result<Vec<_>, EvalError>>()?;
    let mut by_round = vec![choose(&trajectories)];
    for round in 1..settings.rounds.max(1) {
        let retries: Vec<(usize, Vec<ChatMessage>)> = trajectories
            .iter()
            .enumerate()
            .filter_map(|(c, t)| {
                let last = &t.last().report;
                let feedback = blind_feedback(last)?;
                let mut messages = t.messages.clone();
                messages.push(ChatMessage::new("assistant", t.reply.as_str()));
                messages.push(ChatMessage::new(
                    "user",
                    blind_retry_prompt(last, &feedback).as_str(),
                ));
                Some((c, messages))
            })
            .collect();
        if retries.is_empty() {
            break;
        }
        // Side by side, so the engine batches the retries.
        let stride = (round * settings.n) as u64;
        let outcomes: Vec<Result<(String, Judged), EvalError>> = thread::scope(|scope| {
            let handles: Vec<_> = retries
                .iter()
                .map(|(c, messages)| {
                    let seed = seed.wrapping_add(stride + *c as u64);
                    scope.spawn(move || {
                        let (reply, tokens) = sample(engine, messages.clone(), 1, settings, seed)?
                            .pop()
                            .unwrap_or_default();
                        let judged = judge(&reply, tokens, cases, &settings.limits)?;
                        Ok((reply, judged))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a retry's thread"))
                .collect()
        });
        for ((c, messages), outcome) in retries.into_iter().zip(outcomes) {
            let (reply, judged) = outcome?;
            let t = &mut trajectories[c];
            t.messages = messages;
            t.reply = reply;
            t.rounds.push(judged);
        }
        by_round.push(choose(&trajectories));
    }
    Ok(BestOfRun {
        candidates: trajectories,
        by_round,
    })
}

/// A round as the record keeps it.
fn round_result(j: &Judged) -> RoundResult {
    RoundResult {
        passed: j.report.passed(),
        total: j.report.verdicts.len(),
        failure: j.report.first_failure().map(|(k, v)| feedback(k, v)),
        tokens: j.tokens,
    }
}

/// The record of judged candidates: each one's scores and agreement (over
/// the last programs), and the choices.
fn record_of(task: usize, kind: &str, run: BestOfRun, secs: f64) -> BestOfRecord {
    let BestOfRun {
        candidates: trajectories,
        by_round,
    } = run;
    let reports: Vec<WorkbookReport> = trajectories
        .iter()
        .map(|t| t.last().report.clone())
        .collect();
    let support = supports(&reports);
    let last = *by_round.last().expect("round 1 is chosen");
    let candidates = trajectories
        .into_iter()
        .zip(support)
        .map(|(mut t, s)| {
            let final_round = t.rounds.pop().expect("a trajectory has a round");
            let earlier = t.rounds.iter().map(round_result).collect();
            CandidateRecord {
                passed: final_round.report.passed(),
                total: final_round.report.verdicts.len(),
                agreements: s.agreements,
                answered: s.answered,
                failure: final_round
                    .report
                    .first_failure()
                    .map(|(k, v)| feedback(k, v)),
                tokens: final_round.tokens,
                program: final_round.program,
                earlier,
            }
        })
        .collect();
    BestOfRecord {
        task,
        kind: kind.to_string(),
        candidates,
        agree: last.agree,
        oracle: last.oracle,
        secs,
        by_round: if by_round.len() > 1 {
            by_round
        } else {
            Vec::new()
        },
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
        best_of_task(engine, i, task, settings)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(verdicts: Vec<Verdict>, answers: Vec<Option<&str>>) -> WorkbookReport {
        WorkbookReport {
            verdicts,
            answers: answers
                .into_iter()
                .map(|a| a.map(|t| vec![t.to_string()]))
                .collect(),
        }
    }

    fn wrong(reason: &str) -> Verdict {
        Verdict::Fail {
            reason: reason.into(),
        }
    }

    #[test]
    fn a_retry_is_told_what_ran_wrong_and_never_a_hidden_answer() {
        // Passed, answered wrongly, crashed: only the crash is visible.
        let r = report(
            vec![
                Verdict::Pass,
                wrong("B7: expected 42, got 41"),
                Verdict::Crash {
                    stderr: "KeyError: 'Qty'".into(),
                },
            ],
            vec![Some("n:1"), Some("n:41"), None],
        );
        let said = blind_feedback(&r).unwrap();
        assert!(
            said.starts_with("test case 3:") && said.contains("KeyError"),
            "{said}"
        );
        let prompt = blind_retry_prompt(&r, &said);
        assert!(prompt.contains("1 of 3"), "{prompt}");
        assert!(
            !prompt.contains("42") && !prompt.contains("solved"),
            "{prompt}"
        );
        // No answer (no output, or the range left empty): told so, without the reason.
        let r = report(
            vec![
                wrong("B7: expected 42, got nothing"),
                wrong("B7: expected 43"),
            ],
            vec![None, Some("n:7")],
        );
        let said = blind_feedback(&r).unwrap();
        assert!(
            said.starts_with("test case 1:") && !said.contains("42"),
            "{said}"
        );
        // A timeout anywhere comes before a missing answer.
        let r = report(vec![wrong("x"), Verdict::Timeout], vec![None, None]);
        assert_eq!(
            blind_feedback(&r).unwrap(),
            "test case 2: the program did not finish in time"
        );
        // Every case answered, right or wrong: nothing a blind run can say.
        let r = report(
            vec![Verdict::Pass, wrong("B7: expected 42, got 41")],
            vec![Some("n:1"), Some("n:41")],
        );
        assert_eq!(blind_feedback(&r), None);
    }

    fn candidate(passed: usize, earlier: &[usize]) -> CandidateRecord {
        CandidateRecord {
            passed,
            total: 4,
            agreements: 0,
            answered: 4,
            failure: None,
            tokens: 1,
            program: String::new(),
            earlier: earlier
                .iter()
                .map(|&p| RoundResult {
                    passed: p,
                    total: 4,
                    failure: None,
                    tokens: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn scores_after_a_round_use_that_rounds_programs_and_choices() {
        let record = BestOfRecord {
            task: 0,
            kind: "lookup".into(),
            // Candidate 0 went 0 -> 2 -> 4; candidate 1 stopped after 3 of 4.
            candidates: vec![candidate(4, &[0, 2]), candidate(3, &[])],
            agree: 0,
            oracle: 0,
            secs: 0.0,
            by_round: vec![
                RoundChoice {
                    agree: 0,
                    oracle: 1,
                },
                RoundChoice {
                    agree: 1,
                    oracle: 1,
                },
                RoundChoice {
                    agree: 0,
                    oracle: 0,
                },
            ],
        };
        let agree_after = |k| record.score_after(k, record.choice_after(k).agree);
        assert_eq!(agree_after(1), (0.0, false));
        assert_eq!(agree_after(2), (0.75, false));
        assert_eq!(agree_after(3), (1.0, true));
        assert_eq!(agree_after(9), (1.0, true));
        assert_eq!(record.score_after(2, 0), (0.5, false));
        assert_eq!(record.score(1), (0.75, false));
        // A single-round record (no by_round) answers every round with its choice.
        let single = BestOfRecord {
            by_round: Vec::new(),
            agree: 1,
            ..record.clone()
        };
        assert_eq!(single.choice_after(1).agree, 1);
        assert_eq!(single.choice_after(3).agree, 1);
        // Records written before rounds existed still load.
        let old = r#"{"task":3,"kind":"dates","candidates":[{"passed":1,"total":4,
            "agreements":0,"answered":2,"tokens":9,"program":"x"}],"agree":0,"oracle":0,"secs":1.0}"#;
        let old: BestOfRecord = serde_json::from_str(old).unwrap();
        assert_eq!(old.score_after(2, 0), (0.25, false));
    }
}
