//! Best-of-N on the real model through `tern bon`: the JSON report, adaptive
//! width stopping once the answer is settled, the synthesizer's extra pass, and
//! unit-test rewards choosing the candidate that passes most.

use crate::support::{assert_clean_error, last_json, real_model, tern};

fn bon(extra: &[&str]) -> serde_json::Value {
    let model = real_model();
    let mut args = vec!["bon", "-m", model.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = tern(&args, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    last_json(&out)
}

#[test]
fn majority_reports_candidates_answers_and_tokens() {
    let j = bon(&[
        "-p",
        "Tom has 3 apples and buys 5 more. How many apples does he have?",
        "-n",
        "4",
        "--max-tokens",
        "48",
        "--aggregate",
        "majority",
    ]);
    let cands = j["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 4);
    assert_eq!(j["aggregate"], "majority");
    let sum: u64 = cands.iter().map(|c| c["tokens"].as_u64().unwrap()).sum();
    assert_eq!(j["tokens"].as_u64().unwrap(), sum);
    assert!(cands
        .iter()
        .all(|c| !c["text"].as_str().unwrap().is_empty()));
    // The chosen text is one of the candidates and its answer is the vote's.
    let chosen = j["chosen"].as_u64().unwrap() as usize;
    assert_eq!(j["text"], cands[chosen]["text"]);
    if !j["answer"].is_null() {
        let same = cands
            .iter()
            .filter(|c| c["answer"].is_string())
            .filter(|c| c["answer"] == j["answer"])
            .count();
        assert!(same >= 1);
    }
}

#[test]
fn adaptive_width_stops_when_every_candidate_agrees() {
    // Greedy candidates are identical, so the vote is unanimous: with waves of
    // 2 the Beta rule stops after 4 (P = 1 - 2^-5 >= 0.95), saving 4 of 8.
    let j = bon(&[
        "-p",
        "What is 2 + 2? Reply with just the number.",
        "-n",
        "8",
        "--wave",
        "2",
        "--adaptive",
        "--temperature",
        "0",
        "--max-tokens",
        "16",
    ]);
    let cands = j["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 4, "{j}");
    assert_eq!(j["candidates_saved"], 4);
    assert!(!j["answer"].is_null(), "{j}");
}

#[test]
fn synthesize_writes_its_own_answer_after_the_candidates() {
    let j = bon(&[
        "-p",
        "What is 12 + 30?",
        "-n",
        "3",
        "--max-tokens",
        "48",
        "--aggregate",
        "synthesize",
    ]);
    let cands = j["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 3);
    let sum: u64 = cands.iter().map(|c| c["tokens"].as_u64().unwrap()).sum();
    // The synthesis is one more generation on top of the candidates.
    assert!(j["tokens"].as_u64().unwrap() > sum);
    assert!(j["chosen"].is_null());
    assert!(!j["text"].as_str().unwrap().is_empty());
}

#[test]
fn reward_picks_the_candidate_passing_most_tests() {
    let dir = tempfile::tempdir().unwrap();
    let tests = dir.path().join("tests.txt");
    std::fs::write(&tests, "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n").unwrap();
    let j = bon(&[
        "-p",
        "Write a Python function add(a, b) that returns the sum of a and b.",
        "-n",
        "3",
        "--max-tokens",
        "96",
        "--aggregate",
        "reward",
        "--tests",
        tests.to_str().unwrap(),
    ]);
    let cands = j["candidates"].as_array().unwrap();
    let passed: Vec<u64> = cands
        .iter()
        .map(|c| c["passed"].as_u64().unwrap())
        .collect();
    let chosen = j["chosen"].as_u64().unwrap() as usize;
    assert_eq!(passed[chosen], *passed.iter().max().unwrap(), "{passed:?}");
}

#[test]
fn reward_without_tests_is_a_clear_error() {
    let model = real_model();
    let out = tern(
        &[
            "bon",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "x",
            "--aggregate",
            "reward",
        ],
        None,
    );
    assert_clean_error(&out, "needs unit tests");
}

#[test]
fn eval_reports_accuracy_tokens_and_time_per_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("tasks.jsonl");
    std::fs::write(
        &task,
        "{\"question\": \"What is 2 + 2?\", \"answer\": \"#### 4\"}\n{\"prompt\": \"What is 10 - 3?\", \"answer\": 7}\n",
    )
    .unwrap();
    let model = real_model();
    let out = tern(
        &[
            "eval",
            "-m",
            model.to_str().unwrap(),
            "--task",
            task.to_str().unwrap(),
            "--strategy",
            "single,majority@2",
            "--max-tokens",
            "24",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = last_json(&out)["rows"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["strategy"], "single");
    assert_eq!(rows[1]["strategy"], "majority@2");
    for r in &rows {
        assert_eq!(r["tasks"], 2);
        let acc = r["accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc));
        assert!(r["tokens"].as_u64().unwrap() > 0);
        assert!(r["seconds"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(rows[0]["candidates_per_task"], 1.0);
    assert_eq!(rows[1]["candidates_per_task"], 2.0);
    let bad = tern(
        &[
            "eval",
            "-m",
            model.to_str().unwrap(),
            "--task",
            task.to_str().unwrap(),
            "--strategy",
            "vibes",
        ],
        None,
    );
    assert_clean_error(&bad, "unknown strategy");
}
