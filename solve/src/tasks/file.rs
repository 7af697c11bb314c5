//! JSONL task files, gzipped or not: one `{"question"|"prompt": ..., "answer": ...}`
//! per line, a code task `{"prompt": ..., "tests": [...]}`, a code problem
//! without tests `{"prompt": ..., "prelude": "def f(...):\n    \"\"\"...\"\"\""}`
//! (no answer: only tests a model writes can judge it, `tern train --reward
//! generated_tests:K`), or a HumanEval record (see [`super::humaneval`]).

use std::io::Read;
use std::path::Path;

use super::{humaneval, Task, TaskError};
use crate::verify;

/// Every task in the file at `path`. The whole file is checked before anything
/// is returned: one malformed line is an error naming its line number, so no
/// caller ever trains or scores on part of a broken file. Blank lines are
/// skipped; GSM8K's `... #### 18` answers are reduced to `18`. A gzip file
/// (HumanEval's `.jsonl.gz`) is read through its decompression.
pub fn read_jsonl(path: &Path) -> Result<Vec<Task>, TaskError> {
    let shown = path.display().to_string();
    let io = |source| TaskError::Io {
        path: shown.clone(),
        source,
    };
    let bytes = std::fs::read(path).map_err(io)?;
    let text = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut text)
            .map_err(io)?;
        text
    } else {
        String::from_utf8(bytes)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?
    };
    let mut tasks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| TaskError::Line {
            path: shown.clone(),
            line: i + 1,
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
        if v.get("entry_point").is_some() {
            tasks.push(humaneval::task(&v).map_err(bad)?);
            continue;
        }
        let question = v["question"]
            .as_str()
            .or_else(|| v["prompt"].as_str())
            .filter(|q| !q.trim().is_empty())
            .ok_or_else(|| bad("no `question` or `prompt` string".into()))?;
        if let Some(tests) = v.get("tests") {
            tasks.push(code_task(question, tests, &v).map_err(bad)?);
            continue;
        }
        let prelude = v["prelude"].as_str().filter(|p| !p.trim().is_empty());
        if let (serde_json::Value::Null, Some(prelude)) = (&v["answer"], prelude) {
            // A code problem with no tests and no answer.
            let mut task = Task::answer(question.to_string(), String::new(), None);
            task.prelude = prelude.to_string();
            tasks.push(task);
            continue;
        }
        let raw = match &v["answer"] {
            serde_json::Value::String(s) if !s.trim().is_empty() => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return Err(bad("no `answer` (a string or a number)".into())),
        };
        let answer = verify::extract_answer(&raw).unwrap_or(raw);
        let difficulty = v["difficulty"].as_u64().map(|d| d as u32);
        let mut task = Task::answer(question.to_string(), answer, difficulty);
        task.target = match &v["target"] {
            serde_json::Value::Null => None,
            serde_json::Value::String(t) if !t.trim().is_empty() => Some(t.clone()),
            _ => return Err(bad("`target` must be a non-empty string".into())),
        };
        tasks.push(task);
    }
    Ok(tasks)
}

/// A `{"prompt", "tests"}` code task: `tests` are Python snippets run after
/// the candidate's program (optionally after a `prelude` of code); `answer`,
/// when given, is a reference program.
fn code_task(
    question: &str,
    tests: &serde_json::Value,
    v: &serde_json::Value,
) -> Result<Task, String> {
    let tests: Vec<String> = tests
        .as_array()
        .and_then(|a| a.iter().map(|t| t.as_str().map(str::to_string)).collect())
        .filter(|t: &Vec<String>| !t.is_empty())
        .ok_or("`tests` must be a non-empty list of Python snippets")?;
    Ok(Task {
        question: question.to_string(),
        answer: v["answer"].as_str().unwrap_or_default().to_string(),
        difficulty: v["difficulty"].as_u64().map(|d| d as u32),
        tests,
        prelude: v["prelude"].as_str().unwrap_or_default().to_string(),
        target: None,
        sheet: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_problem_without_tests_keeps_its_prelude_and_no_answer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("open.jsonl");
        std::fs::write(
            &p,
            "{\"prompt\": \"Write add.\", \"prelude\": \"def add(a, b):\\n    pass\"}\n",
        )
        .unwrap();
        let t = &read_jsonl(&p).unwrap()[0];
        assert_eq!((t.answer.as_str(), t.tests.len()), ("", 0));
        assert_eq!(t.prelude, "def add(a, b):\n    pass");
        // Without a prelude it is still an answer task missing its answer.
        std::fs::write(&p, "{\"prompt\": \"Write add.\"}\n").unwrap();
        let e = read_jsonl(&p).unwrap_err().to_string();
        assert!(e.contains("no `answer`"), "{e}");
    }

    #[test]
    fn reads_gsm8k_style_and_names_the_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.jsonl");
        std::fs::write(
            &good,
            "{\"question\": \"Q1?\", \"answer\": \"3 + 4 = 7\\n#### 7\"}\n\n{\"prompt\": \"Q2?\", \"answer\": 12}\n",
        )
        .unwrap();
        let t = read_jsonl(&good).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].answer.as_str(), t[1].answer.as_str()), ("7", "12"));

        let bad = dir.path().join("bad.jsonl");
        std::fs::write(
            &bad,
            "{\"question\": \"Q1?\", \"answer\": 1}\n{\"question\": \"Q2?\"}\n{oops\n",
        )
        .unwrap();
        let e = read_jsonl(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.jsonl:2:") && e.contains("answer"), "{e}");
    }

    #[test]
    fn prompt_and_tests_lines_are_code_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("code.jsonl");
        std::fs::write(
            &file,
            "{\"prompt\": \"Write add(a, b).\", \"tests\": [\"assert add(1, 2) == 3\", \"assert add(0, 0) == 0\"]}\n",
        )
        .unwrap();
        let t = read_jsonl(&file).unwrap();
        assert!(t[0].is_code() && t[0].tests.len() == 2 && t[0].prelude.is_empty());
        for bad in ["[]", "\"assert 1\"", "[1]"] {
            std::fs::write(&file, format!("{{\"prompt\": \"p\", \"tests\": {bad}}}\n")).unwrap();
            let e = read_jsonl(&file).unwrap_err().to_string();
            assert!(
                e.contains("code.jsonl:1:") && e.contains("non-empty list"),
                "{e}"
            );
        }
    }
}
