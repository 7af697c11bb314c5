//! HumanEval's code tasks: a function's signature and docstring to complete,
//! graded by its `check(candidate)` assertions, each run as a test of its own
//! so a candidate earns partial credit (online-judge style).

use super::Task;

const CHECK: &str = "def check(candidate):";

/// A task from one HumanEval record: `prompt`, `entry_point` and `test`, with
/// `canonical_solution` (when present) kept as the reference program.
pub fn task(v: &serde_json::Value) -> Result<Task, String> {
    let field = |k: &str| {
        v[k].as_str()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| format!("a HumanEval record needs a `{k}` string"))
    };
    let (prompt, entry, test) = (field("prompt")?, field("entry_point")?, field("test")?);
    let answer = v["canonical_solution"]
        .as_str()
        .map_or_else(String::new, |body| format!("{prompt}{body}"));
    Ok(Task {
        question: format!(
            "Complete this Python function. Reply with the whole function in one \
             Python code block.\n\n```python\n{}\n```",
            prompt.trim_end()
        ),
        answer,
        difficulty: None,
        tests: split_check(test, entry),
        prelude: prompt.to_string(),
        target: None,
        sheet: None,
    })
}

/// `test`'s `check(candidate)` as one test per top-level `assert` of its
/// body, each after the code that precedes `check` (imports, helpers) and with
/// `candidate` bound to `entry`. A body that is anything but assertions (a
/// loop, a helper variable) stays one test: `check(entry)` whole.
pub fn split_check(test: &str, entry: &str) -> Vec<String> {
    let whole = vec![format!("{}\n\ncheck({entry})\n", test.trim_end())];
    let Some(at) = test.find(CHECK) else {
        return whole;
    };
    let before = test[..at].trim_end();
    let mut cases: Vec<String> = Vec::new();
    for line in test[at + CHECK.len()..].lines() {
        let code = line.trim_start();
        if code.is_empty() || code.starts_with('#') {
            continue;
        }
        match line.len() - code.len() {
            4 if code.starts_with("assert") => cases.push(code.to_string()),
            // A statement continued inside brackets.
            n if n > 4 && !cases.is_empty() => {
                let last = cases.last_mut().expect("checked non-empty");
                last.push('\n');
                last.push_str(line);
            }
            _ => return whole,
        }
    }
    if cases.len() < 2 {
        return whole;
    }
    cases
        .iter()
        .map(|case| format!("{before}\ncandidate = {entry}\n{case}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assertions_become_tests_and_anything_else_stays_whole() {
        let test = "METADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1) == 2\n    # a comment\n    assert candidate(\n        3) == 4, \"msg\"\n";
        let cases = split_check(test, "inc");
        assert_eq!(
            cases,
            vec![
                "METADATA = {}\ncandidate = inc\nassert candidate(1) == 2\n".to_string(),
                "METADATA = {}\ncandidate = inc\nassert candidate(\n        3) == 4, \"msg\"\n"
                    .to_string(),
            ]
        );
        let looped = "def check(candidate):\n    for x in range(3):\n        assert candidate(x) == x + 1\n    assert candidate(0) == 1\n";
        assert_eq!(
            split_check(looped, "inc"),
            vec![format!("{}\n\ncheck(inc)\n", looped.trim_end())]
        );
        assert_eq!(split_check("assert inc(1) == 2", "inc").len(), 1);
    }

    #[test]
    fn a_record_becomes_a_code_task() {
        let v = serde_json::json!({
            "task_id": "HumanEval/0", "entry_point": "inc",
            "prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n",
            "canonical_solution": "    return x + 1\n",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n",
        });
        let t = task(&v).unwrap();
        assert!(t.is_code() && t.tests.len() == 2);
        assert!(t.question.contains("```python\ndef inc(x):"));
        assert_eq!(
            t.answer,
            "def inc(x):\n    \"\"\"x + 1\"\"\"\n    return x + 1\n"
        );
        // A bare body completes the prelude's signature.
        assert_eq!(
            t.program("    return x + 1"),
            "def inc(x):\n    \"\"\"x + 1\"\"\"\n    return x + 1\n"
        );
        let e = task(&serde_json::json!({"entry_point": "inc", "prompt": "def inc(x):"}));
        assert!(e.unwrap_err().contains("`test`"));
    }
}
