//! Where a run's rewards come from: the task itself (its answer, or the
//! tests it carries), or unit tests a model writes for it (the CodeRM
//! setting, issue 60): code tasks without hidden tests still train.
//!
//! `generated_tests:K`: for each group of rollouts, the test writer (the
//! policy itself, or `test_model`) writes K test replies for the task's
//! problem (its prelude, else its question), sampled as `tern eval`'s
//! `reward@N:tests=K` samples them (`tern_solve::reasoning::test_requests`,
//! reply `j` seeded from the group's seed), asked for while the rollouts are
//! sampled; every rollout's program runs against every test picked, and its
//! reward is the share it passes. Each group's tests and pass matrix go to
//! the run's `tests.jsonl`.
//!
//! Ties and dead tests: rollouts passing the same number of tests earn the
//! same reward (GRPO's group-relative advantage then ranks them equal). A
//! test every rollout fails (a wrong or malformed test, most often) or every
//! rollout passes shifts every reward of the group alike, and the
//! group-normalized advantages ignore a shift, so it carries no signal and
//! does no harm. No test parsed at all gives every rollout 0: a group with
//! no signal, skipped by the learner. The task's own tests (if any) are not
//! used for the reward; held-out evaluation still grades by them.

use std::fmt;
use std::str::FromStr;

use tern_runtime::engine::EngineHandle;
use tern_solve::reasoning::{self, TestSpec, MAX_GENERATED_TESTS};
use tern_solve::tasks::Task;
use tern_solve::verify;

use crate::error::{Result, TrainError};
use crate::rollout::Rollout;

/// A run's reward source; written `task` or `generated_tests:K`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reward {
    /// The task's answer (answer tasks) or its own tests (code tasks).
    #[default]
    Task,
    /// K unit tests a model writes per group; reward = share passed.
    GeneratedTests(usize),
}

impl FromStr for Reward {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().split_once(':') {
            None if s.trim() == "task" => Ok(Reward::Task),
            Some(("generated_tests", k)) => k
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|k| (1..=MAX_GENERATED_TESTS).contains(k))
                .map(Reward::GeneratedTests)
                .ok_or_else(|| {
                    format!(
                        "reward generated_tests:K needs K from 1 to {MAX_GENERATED_TESTS}, got `{k}`"
                    )
                }),
            _ => Err(format!(
                "unknown reward `{s}` (task, or generated_tests:K for tests a model writes)"
            )),
        }
    }
}

impl fmt::Display for Reward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reward::Task => f.write_str("task"),
            Reward::GeneratedTests(k) => write!(f, "generated_tests:{k}"),
        }
    }
}

impl serde::Serialize for Reward {
    /// As its spec string.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Reward {
    /// From its spec string.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The model that writes a run's tests and how many per group.
pub struct TestWriter<'a> {
    /// Its engine (the rollout engine itself, or `test_model`'s).
    pub engine: &'a EngineHandle,
    /// Test replies per group (K).
    pub k: usize,
    /// Most tokens per reply.
    pub max_tokens: usize,
    /// The replies' temperature.
    pub temperature: f32,
}

impl TestWriter<'_> {
    /// How its replies are sampled: K of them, at the run's token cap and
    /// temperature, with `tern eval`'s nucleus (0.95).
    pub fn spec(&self) -> TestSpec {
        TestSpec {
            k: self.k,
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: 0.95,
        }
    }
}

/// The tests a model wrote for one group and how each of its rollouts did
/// on them: a group's line of `tests.jsonl`, from which its rewards can be
/// recomputed.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GroupTests {
    /// The tests kept, in the order they were picked (at most K).
    pub tests: Vec<String>,
    /// Per rollout, one letter per test (`P` pass, `F` fail, `T` timeout,
    /// `E` error); a rollout's reward is its share of `P`.
    pub matrix: Vec<String>,
    /// Tokens the writer generated for them.
    pub writer_tokens: usize,
}

/// A line of a run's `tests.jsonl`: one group's tests and pass matrix.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TestsLine {
    /// The step (1-based, as `metrics.jsonl` counts them).
    pub step: usize,
    /// The task's index in the run's training tasks.
    pub task: usize,
    /// The tests, the matrix and the writer's tokens.
    #[serde(flatten)]
    pub tests: GroupTests,
}

/// What the tests are written for: the task's prelude (signature and
/// docstring), else its question.
pub fn problem(task: &Task) -> &str {
    if task.prelude.trim().is_empty() {
        task.question.as_str()
    } else {
        task.prelude.as_str()
    }
}

/// Sets each rollout's reward to the share of `tests` its program passes
/// (0 for all when `tests` is empty); returns the pass matrix, one row per
/// rollout.
pub fn score_by_tests(
    rollouts: &mut [Rollout],
    task: &Task,
    tests: &[String],
) -> Result<Vec<String>> {
    let programs = programs(rollouts, task);
    let reports = verify::judge_many(&programs, tests, &verify::Limits::default())
        .map_err(|e| TrainError::Rollout(format!("running generated tests: {e}")))?;
    for (r, report) in rollouts.iter_mut().zip(&reports) {
        r.reward = report.pass_rate();
    }
    Ok(reports.iter().map(verify::matrix_row).collect())
}

/// Sets the rewards of one group from a writer's `replies` (tests read out
/// of them and at most `k` picked, as `tern eval` picks them).
pub fn score_by_replies(
    rollouts: &mut [Rollout],
    task: &Task,
    replies: &[String],
    writer_tokens: usize,
    k: usize,
) -> Result<GroupTests> {
    let tests = reasoning::tests_from_replies(replies, k);
    let matrix = score_by_tests(rollouts, task, &tests)?;
    Ok(GroupTests {
        tests,
        matrix,
        writer_tokens,
    })
}

/// Sets the rewards of one group from tests `writer` writes now for `task`
/// (replies seeded from `seed`, the group's own). The local rollout path
/// asks for the tests while it samples ([`crate::rollout::rollout`]); this
/// is for rollouts that arrive already sampled (a fleet's).
pub fn score_by_generated_tests(
    rollouts: &mut [Rollout],
    task: &Task,
    writer: &TestWriter<'_>,
    seed: u64,
) -> Result<GroupTests> {
    let failed = |e: reasoning::TestGenError| TrainError::Rollout(e.to_string());
    let reqs = reasoning::test_requests(writer.engine.model(), problem(task), seed, &writer.spec())
        .map_err(failed)?;
    let streams = writer
        .engine
        .submit_all(reqs)
        .map_err(|e| failed(reasoning::TestGenError::Submit(e)))?;
    let (replies, tokens) = reasoning::collect_replies(streams).map_err(failed)?;
    score_by_replies(rollouts, task, &replies, tokens, writer.k)
}

/// Each rollout's program as the task's judge runs it.
fn programs(rollouts: &[Rollout], task: &Task) -> Vec<String> {
    rollouts
        .iter()
        .map(|r| task.program(&verify::extract_code(&r.text)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(code: &str) -> Rollout {
        Rollout {
            text: format!("```python\n{code}\n```"),
            reward: -1.0,
            ..Rollout::default()
        }
    }

    #[test]
    fn reward_specs_parse_and_print() {
        assert_eq!("task".parse::<Reward>(), Ok(Reward::Task));
        assert_eq!(
            "generated_tests:8".parse::<Reward>(),
            Ok(Reward::GeneratedTests(8))
        );
        assert_eq!(Reward::GeneratedTests(4).to_string(), "generated_tests:4");
        for bad in [
            "generated_tests:0",
            "generated_tests:65",
            "generated_tests:x",
            "tests",
            "",
        ] {
            let e = bad.parse::<Reward>().unwrap_err();
            assert!(
                e.contains("generated_tests") || e.contains("unknown reward"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_rollout_passing_more_generated_tests_earns_more() {
        // A task without tests of its own: only the generated ones judge.
        let task = Task {
            question: "Write add(a, b).".into(),
            answer: String::new(),
            difficulty: None,
            tests: Vec::new(),
            prelude: "def add(a, b):\n    \"\"\"The sum of a and b.\"\"\"\n".into(),
            target: None,
            sheet: None,
        };
        let tests: Vec<String> = [
            "assert add(1, 2) == 3",
            "assert add(0, 0) == 0",
            "assert add(-1, 1) == 0",
            // A wrong test: every rollout fails it, the ranking is unchanged.
            "assert add(2, 2) == 5",
        ]
        .map(String::from)
        .to_vec();
        let mut group = vec![
            rollout("def add(a, b):\n    return a + b"),
            rollout("def add(a, b):\n    return a * b"),
            rollout("def add(a, b):\n    return 0"),
            rollout("def add(a, b):\n    raise ValueError(a)"),
        ];
        let matrix = score_by_tests(&mut group, &task, &tests).unwrap();
        assert_eq!(matrix, vec!["PPPF", "FPFF", "FPPF", "EEEE"]);
        let rewards: Vec<f64> = group.iter().map(|r| r.reward).collect();
        // a + b passes 3 of 4; a * b only add(0, 0); 0 passes two; a crash none.
        assert_eq!(rewards, vec![0.75, 0.25, 0.5, 0.0]);
        // No test at all: no signal.
        score_by_tests(&mut group, &task, &[]).unwrap();
        assert!(group.iter().all(|r| r.reward == 0.0));
    }
}
