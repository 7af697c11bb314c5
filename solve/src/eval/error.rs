//! Why an evaluation could not run; the caller words flag names around them.

use std::path::PathBuf;

use crate::reasoning::ReasoningError;
use crate::tasks::TaskError;
use crate::verify::JudgeError;
use tern_runtime::RuntimeError;

/// An evaluation's failure.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A strategy spec that does not parse.
    #[error("strategy `{spec}`: {reason}")]
    Strategy {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A strategy's count that is not a number.
    #[error("strategy `{spec}`: `{count}` is not a count")]
    NotACount {
        /// The spec as given.
        spec: String,
        /// The text where the count should be.
        count: String,
        /// The parse failure.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A strategy name that does not exist.
    #[error(
        "unknown strategy `{0}`: use single, majority@N, synthesize@N, adaptive[@N], reward@N[:tests=K] (code tasks) or length@EFFORT"
    )]
    UnknownStrategy(String),
    /// A strategy that compares answers asked of code tasks.
    #[error("strategy `{0}` compares answers, but these are code tasks graded by tests: use single or reward@N")]
    NeedsAnswers(String),
    /// `synthesize@N:with=NAME` names no loaded synthesizer.
    #[error("strategy `{strategy}`: no synthesizer named `{name}` is loaded")]
    UnknownSynthesizer {
        /// The strategy's label.
        strategy: String,
        /// The name it asked for.
        name: String,
    },
    /// Synthesis data asked of code tasks (their answers are test results).
    #[error("synthesis data needs answer tasks; task {0} is a code task graded by tests")]
    SynthesisOfCode(usize),
    /// A strategy that runs unit tests asked of answer tasks.
    #[error("strategy `{0}` scores candidates by unit tests: it needs code tasks (HumanEval-style records)")]
    NeedsCode(String),
    /// The first task asked for is past the end of the task set.
    #[error("offset {offset} skips every task: {tasks} has {len}")]
    OffsetPastEnd {
        /// The offset asked for.
        offset: usize,
        /// The task source.
        tasks: String,
        /// How many tasks it has.
        len: usize,
    },
    /// A records file that cannot be read.
    #[error("reading {}", path.display())]
    ReadRecords {
        /// The file.
        path: PathBuf,
        /// The read failure.
        #[source]
        source: std::io::Error,
    },
    /// A line of a records file that is not a record.
    #[error("{}:{line}: not a record", path.display())]
    NotARecord {
        /// The file.
        path: PathBuf,
        /// Its 1-based line number.
        line: usize,
        /// The parse failure.
        #[source]
        source: serde_json::Error,
    },
    /// Writing a record failed.
    #[error("appending a record")]
    AppendRecord(#[source] std::io::Error),
    /// No task has a record for every strategy, so there is nothing to report.
    #[error("no task in range has a record for every strategy asked for")]
    NoCompleteTask,
    /// A code task's program could not be judged.
    #[error("judging a code task")]
    Judge(#[source] JudgeError),
    /// The task set could not be loaded.
    #[error(transparent)]
    Tasks(#[from] TaskError),
    /// A strategy's settings are out of range.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Answering a task failed.
    #[error(transparent)]
    Reasoning(#[from] ReasoningError),
}
