//! Spreadsheet best-of-N end to end with a real model (SmolLM2-135M): the
//! `tern bon --spreadsheet` command a user runs, with rounds, and `tern
//! eval`'s best-of-N over the same task giving the very same candidates.
//! The model is too small to solve a task; what is checked is the plumbing a
//! user relies on: every candidate judged on every test-case workbook, a
//! crashed program written again in round 2, the choice printed, and the
//! two commands agreeing.

use tern_solve::tasks::spreadsheet;

use crate::support::{last_json, real_model, tern};

const SOURCE: &str = "spreadsheet:count=3,seed=7";

#[test]
fn bon_judges_every_candidate_retries_crashes_and_matches_eval() {
    let model = real_model();
    let model = model.to_str().unwrap();
    let task = &spreadsheet::load(SOURCE).unwrap()[1];
    let cases = task.cases.len();
    assert!(cases >= 3);
    let common = ["-m", model, "--max-tokens", "64", "--seed", "5"];
    let mut bon = vec![
        "bon",
        "--spreadsheet",
        SOURCE,
        "--sheet-task",
        "1",
        "-n",
        "3",
    ];
    bon.extend(["--rounds", "2", "--json"]);
    bon.extend(common);
    let out = tern(&bon, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let record = last_json(&out);
    let candidates = record["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 3);
    for c in candidates {
        assert_eq!(c["total"], cases, "{c}");
        for r in c["earlier"].as_array().into_iter().flatten() {
            assert_eq!(r["total"], cases, "{r}");
        }
    }
    // SmolLM2's 64-token programs do not run: each is shown its error and
    // writes again, and both choices are kept for both rounds.
    let retried = candidates
        .iter()
        .filter(|c| c["earlier"].is_array())
        .count();
    assert!(retried > 0, "no candidate retried: {record}");
    assert_eq!(
        record["by_round"].as_array().map(Vec::len),
        Some(2),
        "{record}"
    );
    assert_eq!(record["chosen"], record["agree"]);

    // tern eval's best-of-N on the same task: the same candidates, rounds
    // and choices (task 1 is seeded alike in both commands).
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("bo.jsonl");
    let mut eval = vec![
        "eval",
        "--task",
        SOURCE,
        "--strategy",
        "agree@3,oracle@3,rounds@2",
    ];
    eval.extend(["--offset", "1", "--limit", "1", "--json", "--records"]);
    eval.push(records.to_str().unwrap());
    eval.extend(common);
    let out = tern(&eval, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = last_json(&out);
    let rounds: Vec<_> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["scope"] == "all" && r["strategy"] == "agree@3")
        .map(|r| r["round"].as_u64().unwrap())
        .collect();
    assert_eq!(rounds, [1, 2], "{table}");
    let line = std::fs::read_to_string(&records).unwrap();
    let mut from_eval: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    let mut from_bon = record.clone();
    for v in [&mut from_eval, &mut from_bon] {
        let o = v.as_object_mut().unwrap();
        o.remove("secs");
        o.remove("chosen");
    }
    assert_eq!(from_eval, from_bon);
}

/// A long spreadsheet run stops and resumes: given the same `--records`
/// file, `tern eval` runs only the tasks it lacks and counts the others in
/// its table; `--report` runs nothing; a file from another kind of run is
/// refused by name. (The reference programs: no model, a second a task.)
#[test]
fn a_spreadsheet_run_resumes_from_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("ref.jsonl");
    let file = records.to_str().unwrap();
    let eval = |limit: &str, extra: &[&str]| {
        let mut args = vec!["eval", "--task", SOURCE, "--strategy", "reference"];
        args.extend(["--limit", limit, "--records", file]);
        args.extend(extra);
        tern(&args, None)
    };
    let lines = || std::fs::read_to_string(&records).unwrap().lines().count();
    let out = eval("2", &["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(last_json(&out)["tasks"], 2);
    assert_eq!(lines(), 2);

    let out = eval("3", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("2 of 3 tasks already have a record"), "{err}");
    assert!(!err.contains("task 0 ") && err.contains("task 2 "), "{err}");
    assert!(
        err.contains("(1/1)"),
        "progress over the tasks this run ran: {err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("3 spreadsheet tasks"));
    assert_eq!(lines(), 3, "only the missing task was appended");

    let out = eval("3", &["--report", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(last_json(&out)["tasks"], 3);
    assert_eq!(lines(), 3);

    let out = tern(
        &["eval", "--task", SOURCE, "--strategy", "agree@2,oracle@2"]
            .into_iter()
            .chain(["--records", file, "-m", "none.gguf"])
            .collect::<Vec<_>>(),
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("line 1: not a record of this run"), "{err}");
    assert_eq!(lines(), 3);
}
