//! Best-of-N judged by unit tests the served model writes: `aggregate:
//! "reward"` without `tests` (`generate_tests` of them, default 8), the pass
//! matrix in the `tern` object, and the refusals (no
//! `--allow-code-execution`, a count out of range, both `tests` and
//! `generate_tests`).

use serde_json::{json, Value};

use crate::support::{config, post, ready, ready_with, tiny::TinySpec, MODEL};

const CHAT: &str = "/v1/chat/completions";

/// The tiny model's end-of-sequence id: biased up, the candidates are empty
/// programs (the test writer samples without the bias).
const EOS: u32 = 2;

fn reward(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a Python function add(a, b)."}],
        "max_tokens": 6,
        "best_of": 3,
        "aggregate": "reward",
        "seed": 7,
        "logit_bias": {EOS.to_string(): 100},
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn generated_tests_choose_and_come_back_with_their_pass_matrix() {
    let mut cfg = config();
    cfg.allow_code_execution = true;
    // The request for tests wraps the problem in ~400 tiny-model tokens.
    let s = ready_with(
        cfg,
        TinySpec {
            context_length: 1024,
            ..TinySpec::default()
        },
    );
    let r = post(&s.app, CHAT, &reward(json!({"generate_tests": 4}))).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let v = r.json();
    let tern = &v["tern"];
    assert_eq!(tern["aggregate"], "reward", "{v}");
    let g = &tern["generated_tests"];
    // One reply per test asked for, each opened as the writer's turn is.
    let replies = g["replies"].as_array().expect("replies");
    assert_eq!(replies.len(), 4, "{v}");
    assert!(replies
        .iter()
        .all(|r| r.as_str().unwrap().starts_with("```python\nassert")));
    let tests = g["tests"].as_array().expect("tests");
    assert!(tests.len() <= 4, "{v}");
    assert_eq!(tern["tests_run"].as_u64(), Some(tests.len() as u64), "{v}");
    // A matrix row per candidate, a letter per kept test; each candidate's
    // `passed` is its row's P count, and the chosen one has the most.
    let matrix: Vec<&str> = g["matrix"]
        .as_array()
        .expect("matrix")
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(matrix.len(), 3, "{v}");
    let candidates = tern["candidates"].as_array().unwrap();
    let passes = |row: &str| row.chars().filter(|&c| c == 'P').count() as u64;
    for (row, c) in matrix.iter().zip(candidates) {
        assert_eq!(row.len(), tests.len(), "{v}");
        assert!(row.chars().all(|c| "PFTE".contains(c)), "{v}");
        assert_eq!(c["passed"].as_u64(), Some(passes(row)), "{v}");
    }
    let chosen = tern["chosen"].as_u64().expect("chosen") as usize;
    assert_eq!(
        passes(matrix[chosen]),
        matrix.iter().map(|r| passes(r)).max().unwrap(),
        "{v}"
    );
    assert_eq!(
        v["choices"][0]["message"]["content"],
        candidates[chosen]["text"]
    );
    // The writer's tokens are billed with the candidates'.
    let spent = tern["tokens_spent"].as_u64().unwrap();
    let candidate_tokens: u64 = candidates
        .iter()
        .map(|c| c["tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        spent,
        candidate_tokens + g["tokens"].as_u64().unwrap(),
        "{v}"
    );
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(spent));

    // Without `generate_tests` the model writes the default 8.
    let r = post(&s.app, CHAT, &reward(json!({}))).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let v = r.json();
    assert_eq!(
        v["tern"]["generated_tests"]["replies"]
            .as_array()
            .map(Vec::len),
        Some(8),
        "{v}"
    );

    // Client-written tests still judge alone: no generated tests.
    let r = post(
        &s.app,
        CHAT,
        &reward(json!({"tests": ["assert 1 + 1 == 2"]})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    let v = r.json();
    assert!(v["tern"]["generated_tests"].is_null(), "{v}");
    assert_eq!(v["tern"]["tests_run"].as_u64(), Some(1), "{v}");

    for (extra, param) in [
        (json!({"generate_tests": 0}), "generate_tests"),
        (json!({"generate_tests": 65}), "generate_tests"),
        (
            json!({"generate_tests": 2, "tests": ["assert True"]}),
            "generate_tests",
        ),
        (
            json!({"generate_tests": 2, "aggregate": "majority"}),
            "generate_tests",
        ),
    ] {
        let r = post(&s.app, CHAT, &reward(extra.clone())).await;
        let e = r.assert_error(400, Some(param));
        assert_eq!(e["type"], "invalid_request_error", "{extra}");
    }
}

#[tokio::test]
async fn generated_tests_are_refused_without_code_execution() {
    let s = ready(config());
    for (extra, param) in [
        (json!({}), "aggregate"),
        (json!({"generate_tests": 4}), "aggregate"),
        (json!({"tests": ["assert True"]}), "tests"),
    ] {
        let r = post(&s.app, CHAT, &reward(extra.clone())).await;
        let e = r.assert_error(403, Some(param));
        assert_eq!(e["code"], "code_execution_disabled", "{extra}");
        assert_eq!(e["type"], "invalid_request_error", "{extra}");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains("--allow-code-execution"), "{message}");
    }
}
