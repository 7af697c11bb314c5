//! Verifiers: decide, without a model, whether a generation is right.
//!
//! Best-of-N uses them to pick among candidates (`majority` votes on extracted
//! answers, with [`majority_confident`] as the adaptive-width stopping rule;
//! `reward` runs each candidate program against unit tests) and the trainer
//! uses them to turn rollouts into rewards (DESIGN.md §5 and §7). Both reach
//! this module with finished text; it never talks to the engine.
//!
//! - [`answer`]: final-answer extraction (`\boxed{}`, "The answer is",
//!   `####`, last number) and numeric equivalence. Pure.
//! - [`vote`]: majority voting and the Beta-posterior stopping rule. Pure.
//! - [`judge`]: online-judge execution of Python programs against test
//!   snippets, with per-test verdicts and per-program reports.
//! - [`sandbox`]: one test in a fresh `python3` inside a bubblewrap sandbox
//!   (namespaces, a read-only view, resource limits).
//! - [`seccomp`]: the system-call filters the sandbox loads (an allow list).
//! - `cgroup`: a control group per sandboxed process, where the machine allows.
//! - [`gate`]: the process-wide limit on sandboxes alive at once.
//! - [`scaled`]: judging with a test count scaled to the question's
//!   difficulty (more tests where candidates disagree).
//! - [`spreadsheet`]: the spreadsheet judge: a program run on each
//!   test-case workbook, its output compared cell by cell.
//! - [`generated_tests`]: unit tests a model wrote, read out of its replies,
//!   deduplicated and capped (the CodeRM setting). Pure.

pub mod answer;
mod cgroup;
pub mod gate;
pub mod generated_tests;
pub mod judge;
pub mod sandbox;
pub mod scaled;
#[cfg(target_os = "linux")]
mod seccomp;
pub mod spreadsheet;
pub mod vote;

pub use answer::{answers_match, extract_answer, normalize_number};
pub use generated_tests::{matrix_row, normalize_test, parse_tests, pick_tests};
pub use judge::{
    best_by_tests, check, extract_code, judge_many, judge_python, tests_for_difficulty,
    with_prelude, Cancel, CancelOnDrop, JudgeError, JudgeReport, Limits, Verdict,
};
pub use sandbox::isolation;
pub use scaled::{judge_scaled, pattern_disagreement, ScaledJudgement, SCREEN_TESTS};
pub use vote::{majority_confident, majority_posterior, vote, Vote};
