//! Verifiable tasks: a question and the answer that checks it.
//!
//! The same tasks feed `tern eval` (accuracy of answer strategies) and the
//! trainer (rewards from `verify`), so a task is generated or read once, in one
//! shape. Sources are a built-in generator spec (`arithmetic:count=200,seed=1`)
//! or a JSONL file, gzipped or not: `{"question"|"prompt": ..., "answer": ...}`
//! per line, or code tasks graded by running their tests ([`Task::tests`]):
//! `{"prompt": ..., "tests": [...]}` or HumanEval's records (`prompt`,
//! `entry_point`, `test`).

mod arithmetic;
mod file;
mod held_out;
mod humaneval;
pub mod spreadsheet;
mod story;

pub use arithmetic::{ArithmeticSpec, Op};
pub use file::read_jsonl;
pub use held_out::TrainingSet;
pub use story::StorySpec;

use std::path::Path;

use thiserror::Error;

/// One question with a checkable answer.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Task {
    /// What the model is asked (a user turn).
    pub question: String,
    /// The reference answer, already reduced to what `verify` compares (a
    /// number for arithmetic; GSM8K's `#### X` tail is taken).
    pub answer: String,
    /// Generator difficulty (digits of the operands); `None` for files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<u32>,
    /// Code tasks: Python tests a program must pass, one case each (online
    /// judge style). Empty for answer tasks, which compare `answer`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tests: Vec<String>,
    /// Code tasks: code placed before a candidate's program (the imports and
    /// signature the question shows), so a bare function body runs too.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prelude: String,
    /// A worked response to imitate: SFT trains on it instead of the bare
    /// `The answer is X.` (synthesis data's correct syntheses, see
    /// `eval::synthesis_data`). Files give it as `target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Spreadsheet tasks: the workbooks a program is judged on (solved when
    /// it passes every test case; a rollout's reward is the share it
    /// passes). Built from the family's generator or file, never from a
    /// JSONL line of this type.
    #[serde(skip)]
    pub sheet: Option<std::sync::Arc<spreadsheet::SpreadsheetTask>>,
}

impl Task {
    /// An answer task: `question`, graded by comparing answers with `answer`.
    pub fn answer(question: String, answer: String, difficulty: Option<u32>) -> Self {
        Task {
            question,
            answer,
            difficulty,
            tests: Vec::new(),
            prelude: String::new(),
            target: None,
            sheet: None,
        }
    }

    /// A spreadsheet task as the trainer and `tern eval`'s grading take it:
    /// its prompt (the workbook shown as [`spreadsheet::prompt`] shows it)
    /// as the question, judged on its workbooks.
    pub fn spreadsheet(task: spreadsheet::SpreadsheetTask) -> Self {
        Task {
            question: spreadsheet::prompt(&task, spreadsheet::PromptBudget::default()),
            answer: String::new(),
            difficulty: None,
            tests: Vec::new(),
            prelude: String::new(),
            target: None,
            sheet: Some(std::sync::Arc::new(task)),
        }
    }

    /// Whether the task is graded by running tests rather than by its answer.
    pub fn is_code(&self) -> bool {
        !self.tests.is_empty()
    }

    /// The program judged for a candidate's `code`: the prelude, then the code
    /// (a whole function replaces the prelude's bare signature).
    pub fn program(&self, code: &str) -> String {
        crate::verify::with_prelude(&self.prelude, code)
    }
}

/// Why a task source could not be read.
#[derive(Debug, Error)]
pub enum TaskError {
    /// A built-in spec that does not parse (unknown key, bad value).
    #[error("task spec `{spec}`: {reason}")]
    Spec { spec: String, reason: String },
    /// The file could not be read.
    #[error("reading task file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// One line of a JSONL file is not a task; nothing from the file is used.
    #[error("{path}:{line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    /// The source yielded no tasks at all.
    #[error("task source `{0}` has no tasks")]
    Empty(String),
}

/// Tasks from `source`: a built-in generator spec (`arithmetic[:k=v,...]`, see
/// [`ArithmeticSpec`]; `story[:k=v,...]`, multi-step word problems, see
/// [`StorySpec`]; `spreadsheet[:k=v,...]`, workbook tasks, see
/// [`spreadsheet::load`]) or the path of a JSONL file.
pub fn load(source: &str) -> Result<Vec<Task>, TaskError> {
    let spec_error = |reason| TaskError::Spec {
        spec: source.to_string(),
        reason,
    };
    let tasks = if let Some(rest) = builtin_rest(source, "arithmetic") {
        ArithmeticSpec::parse(rest)
            .and_then(|s| s.generate())
            .map_err(spec_error)?
    } else if spreadsheet::is_spreadsheet(source) {
        spreadsheet::load(source)?
            .into_iter()
            .map(Task::spreadsheet)
            .collect()
    } else if let Some(rest) = builtin_rest(source, "story") {
        StorySpec::parse(rest)
            .and_then(|s| s.generate())
            .map_err(spec_error)?
    } else {
        read_jsonl(Path::new(source))?
    };
    if tasks.is_empty() {
        return Err(TaskError::Empty(source.to_string()));
    }
    Ok(tasks)
}

/// The `k=v` pairs of a generator's options (`count=3,seed=2`), trimmed, in order.
fn options(s: &str) -> Result<Vec<(&str, &str)>, String> {
    s.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| format!("`{kv}` is not key=value"))
        })
        .collect()
}

/// A `+`-separated mix of levels (`difficulty=1+2`), each within `range`;
/// `unit` names what a level counts, for the error.
fn levels(
    k: &str,
    v: &str,
    range: std::ops::RangeInclusive<u32>,
    unit: &str,
) -> Result<Vec<u32>, String> {
    let levels: Vec<u32> = v
        .split('+')
        .map(|d| d.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{k}: `{v}` is not an integer or a mix like 1+2"))?;
    if !levels.iter().all(|d| range.contains(d)) {
        return Err(format!(
            "{k} must be {} to {} ({unit})",
            range.start(),
            range.end()
        ));
    }
    Ok(levels)
}

/// `Some(options)` when `source` names the built-in `name` (`name` or `name:...`).
fn builtin_rest<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    let rest = source.strip_prefix(name)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix(':')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_and_file_sources_are_told_apart() {
        assert_eq!(builtin_rest("arithmetic", "arithmetic"), Some(""));
        assert_eq!(
            builtin_rest("arithmetic:count=3", "arithmetic"),
            Some("count=3")
        );
        assert_eq!(builtin_rest("arithmetic.jsonl", "arithmetic"), None);
        assert_eq!(load("arithmetic:count=3,seed=2").unwrap().len(), 3);
        assert_eq!(load("story:count=4,seed=2,steps=3").unwrap().len(), 4);
        assert!(matches!(load("story:steps=9"), Err(TaskError::Spec { .. })));
        assert!(matches!(
            load("arithmetic:count=0"),
            Err(TaskError::Empty(_))
        ));
        assert!(matches!(
            load("/nonexistent/t.jsonl"),
            Err(TaskError::Io { .. })
        ));
    }
}
