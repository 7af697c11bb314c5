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
fn a_synthesis_without_an_answer_is_made_to_state_one() {
    // Four tokens leave the synthesis no room for the answer line it is
    // asked for, and a question without digits gives it no number to copy:
    // the answer suffix is appended and the synthesizer writes one sentence.
    let j = bon(&[
        "-p",
        "Sara has seven pencils and gives away three. How many pencils does she have left?",
        "-n",
        "3",
        "--max-tokens",
        "4",
        "--aggregate",
        "synthesize",
    ]);
    assert_eq!(j["forced_answer"], true, "{j}");
    let text = j["text"].as_str().unwrap();
    let (head, tail) = text
        .split_once("\n\nThe final answer is")
        .unwrap_or_else(|| panic!("no forced answer in {text:?}"));
    assert!(!head.contains("answer is"), "{text:?}");
    assert!(
        !tail.contains('\n') || tail.trim_start().is_empty(),
        "{text:?}"
    );
    let cands: u64 = j["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tokens"].as_u64().unwrap())
        .sum();
    // Candidates, the synthesis and the forced sentence are all billed.
    assert!(j["tokens"].as_u64().unwrap() > cands + 1, "{j}");
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
    assert_clean_error(&out, "give --tests FILE");
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
    let rows = eval_rows(
        &task,
        &["--strategy", "single,majority@2", "--max-tokens", "24"],
    );
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
    let bad = eval_out(&task, &["--strategy", "vibes"]);
    assert_clean_error(&bad, "unknown strategy");
}

/// One greedy candidate under adaptive length, as `tern bon --json` reports it.
fn length_run(prompt: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["-p", prompt, "-n", "1", "--temperature", "0"];
    args.extend_from_slice(extra);
    let j = bon(&args);
    let c = &j["candidates"][0];
    assert!(c["length"].is_object(), "{j}");
    j
}

#[test]
fn adaptive_length_stops_early_once_the_probes_agree() {
    // An easy question the model explains at length: the answer is settled
    // long before the explanation ends, so three agreeing probes stop it.
    let j = length_run(
        "What is 2 + 2? Explain your answer in detail.",
        &[
            "--reasoning-effort",
            "auto",
            "--probe-every",
            "16",
            "--max-tokens",
            "400",
        ],
    );
    let l = &j["candidates"][0]["length"];
    assert_eq!(l["stopped_early"], true, "{j}");
    let probes = l["probes"].as_array().unwrap();
    assert!(probes.len() >= 3);
    let last: Vec<&serde_json::Value> = probes[probes.len() - 3..]
        .iter()
        .map(|p| &p["answer"])
        .collect();
    assert!(last.iter().all(|a| *a == last[0] && a.is_string()), "{l}");
    let reasoning = l["reasoning_tokens"].as_u64().unwrap();
    assert_eq!(reasoning, probes.last().unwrap()["at"].as_u64().unwrap());
    assert_eq!(l["cap"], 400 - 48);
    assert_eq!(l["tokens_saved"].as_u64().unwrap(), 352 - reasoning);
    // The answer is written after the forced suffix, and it is the probes' answer.
    let text = j["text"].as_str().unwrap();
    assert!(text.contains("The final answer is"), "{text}");
    assert_eq!(j["answer"], *last[0]);
    // Every generated token is counted: the completion plus its probes.
    let spent =
        j["candidates"][0]["tokens"].as_u64().unwrap() + l["probe_tokens"].as_u64().unwrap();
    assert_eq!(j["tokens"].as_u64().unwrap(), spent);
}

#[test]
fn an_early_stop_answers_with_the_settling_probes_answer() {
    // Sampled reasoning (T = 0.8, seed 1): the answer after an early stop is
    // decoded greedily from where the settling probe was taken, so its
    // words are that probe's (up to the end of its sentence) and the
    // reported answer is the probe's, as Dynasor-CoT reuses it.
    let j = bon(&[
        "-p",
        "What is 2 + 2? Explain your answer in detail.",
        "-n",
        "1",
        "--temperature",
        "0.8",
        "--seed",
        "1",
        "--reasoning-effort",
        "auto",
        "--probe-every",
        "16",
        "--max-tokens",
        "400",
    ]);
    let l = &j["candidates"][0]["length"];
    assert_eq!(l["stopped_early"], true, "{j}");
    let last = l["probes"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(j["answer"], last["answer"], "{j}");
    assert_eq!(j["candidates"][0]["answer"], last["answer"], "{j}");
    assert!(
        l["answer_tokens"].as_u64().unwrap() <= last["tokens"].as_u64().unwrap(),
        "{l}"
    );
    assert!(
        j["text"].as_str().unwrap().contains("The final answer is"),
        "{j}"
    );
}

#[test]
fn thinking_budget_caps_the_reasoning_and_forces_the_answer() {
    let j = length_run(
        "Tell me a long story about a dragon who loves books.",
        &["--thinking-budget", "32", "--max-tokens", "400"],
    );
    let l = &j["candidates"][0]["length"];
    assert_eq!(l["hit_cap"], true, "{j}");
    assert_eq!(l["reasoning_tokens"], 32);
    assert_eq!(l["probes"].as_array().unwrap().len(), 0);
    let answer = l["answer_tokens"].as_u64().unwrap();
    assert!((1..=48).contains(&answer), "{l}");
    assert_eq!(j["candidates"][0]["tokens"].as_u64().unwrap(), 32 + answer);
    assert!(j["text"].as_str().unwrap().contains("The final answer is"));
}

#[test]
fn forced_answer_ends_with_its_sentence() {
    // Forced mid-explanation, the model states its answer and would go on
    // explaining to the 48-token answer limit; the answer phase ends with
    // the answer's sentence instead.
    let j = length_run(
        "What is 2 + 2? Explain your answer in detail.",
        &["--thinking-budget", "40", "--max-tokens", "400"],
    );
    let l = &j["candidates"][0]["length"];
    assert_eq!(l["hit_cap"], true, "{j}");
    let text = j["text"].as_str().unwrap();
    let after = text.split("The final answer is").nth(1).unwrap();
    assert!(!after.trim().is_empty(), "{text:?}");
    assert!(
        !after.contains('\n') && !after.contains(". "),
        "the answer goes on past its sentence: {after:?}"
    );
    assert!(l["answer_tokens"].as_u64().unwrap() < 48, "{l}");
    assert_eq!(j["answer"], "4", "{j}");
}

#[test]
fn bad_reasoning_flags_are_clear_errors() {
    let model = real_model();
    let m = model.to_str().unwrap();
    let out = tern(
        &["bon", "-m", m, "-p", "x", "--reasoning-effort", "extreme"],
        None,
    );
    assert_clean_error(&out, "reasoning_effort");
    let out = tern(&["bon", "-m", m, "-p", "x", "--thinking-budget", "0"], None);
    assert_clean_error(&out, "thinking_budget_tokens");
    let out = tern(
        &[
            "bon",
            "-m",
            m,
            "-p",
            "x",
            "--aggregate",
            "synthesize",
            "--synthesizer-model",
            "/nonexistent/synth.gguf",
        ],
        None,
    );
    assert_clean_error(&out, "--synthesizer-model");
    let out = tern(
        &["eval", "-m", m, "--task", "arithmetic", "--limit", "0"],
        None,
    );
    assert_clean_error(&out, "--limit 0");
}

#[test]
fn a_second_model_writes_the_synthesis() {
    // The same weights loaded a second time as their own engine: the run
    // works end to end, and with greedy candidates and a greedy synthesis it
    // matches the one-engine run exactly.
    let model = real_model();
    let m = model.to_str().unwrap();
    let args = [
        "-p",
        "What is 12 + 30?",
        "-n",
        "2",
        "--temperature",
        "0",
        "--max-tokens",
        "32",
        "--aggregate",
        "synthesize",
    ];
    let one = bon(&args);
    let mut with = args.to_vec();
    with.extend_from_slice(&["--synthesizer-model", m]);
    let two = bon(&with);
    assert_eq!(one["text"], two["text"]);
    assert_eq!(one["tokens"], two["tokens"]);
}

#[test]
fn eval_runs_the_adaptive_length_strategy() {
    let model = real_model();
    let out = tern(
        &[
            "eval",
            "-m",
            model.to_str().unwrap(),
            "--task",
            "arithmetic:count=2,seed=3,difficulty=1,ops=add",
            "--strategy",
            "length@auto,length@16",
            "--probe-every",
            "16",
            "--max-tokens",
            "120",
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
    assert_eq!(rows[0]["strategy"], "length@auto");
    assert_eq!(rows[1]["strategy"], "length@16");
    // A bare cap has no probes; auto has them unless every answer was short.
    assert_eq!(rows[1]["probes_per_task"], 0.0);
    for r in &rows {
        assert_eq!(r["tasks"], 2);
        assert_eq!(r["candidates_per_task"], 1.0);
        assert!(r["tokens"].as_u64().unwrap() > 0);
    }
    let bad = tern(
        &[
            "eval",
            "-m",
            model.to_str().unwrap(),
            "--task",
            "arithmetic:count=1,seed=1",
            "--strategy",
            "length@extreme",
        ],
        None,
    );
    assert_clean_error(&bad, "reasoning_effort");
}

/// `tern eval` on the real model over `task`.
fn eval_out(task: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let model = real_model();
    let mut args = vec![
        "eval",
        "-m",
        model.to_str().unwrap(),
        "--task",
        task.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    tern(&args, None)
}

/// `tern eval --json` rows, by strategy.
fn eval_rows(task: &std::path::Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let out = eval_out(task, &[extra, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    last_json(&out)["rows"].as_array().unwrap().clone()
}

#[test]
fn eval_shared_samples_equal_separate_runs_and_records_resume() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("tasks.jsonl");
    std::fs::write(
        &task,
        "{\"question\": \"What is 2 + 2? Reply with just the number.\", \"answer\": 4}\n\
         {\"question\": \"What is 5 + 1? Reply with just the number.\", \"answer\": 6}\n",
    )
    .unwrap();
    let key = |r: &serde_json::Value| {
        (
            r["correct"].clone(),
            r["tokens"].clone(),
            r["candidates_per_task"].clone(),
        )
    };
    // Majority and adaptive from one set of 8 samples, against each run alone.
    // Greedy candidates agree, so adaptive stops after 4: the shared run must
    // report that prefix, not all 8.
    let greedy = ["--max-tokens", "16", "--temperature", "0"];
    let run = |extra: &[&str]| eval_rows(&task, &[&greedy[..], extra].concat());
    // Waves of 3 see 3 agreeing votes (P = 15/16, not enough), then 6; one
    // at a time at confidence 0.9, 3 agreeing votes are enough.
    let ways = [
        "majority@8",
        "adaptive@8",
        "adaptive@8:wave=3",
        "adaptive@8:wave=1:confidence=0.9",
    ];
    let shared = run(&["--strategy", &ways.join(",")]);
    assert_eq!(shared[0]["shared_samples"], true);
    for (i, s) in ways.iter().enumerate() {
        let alone = run(&["--strategy", s]);
        assert_eq!(alone[0]["shared_samples"], false);
        assert_eq!(key(&alone[0]), key(&shared[i]), "{s}");
    }
    assert_eq!(shared[1]["candidates_per_task"], 4.0);
    assert_eq!(shared[2]["candidates_per_task"], 6.0);
    assert_eq!(shared[3]["candidates_per_task"], 3.0);
    // Records: the first task, then both; the second run only adds the second
    // task's records, and its table equals the one-shot run's.
    let rec = dir.path().join("records.jsonl");
    let rec_s = rec.to_str().unwrap();
    let args = ["--strategy", "majority@8,adaptive@8", "--records", rec_s];
    run(&[&args[..], &["--limit", "1"]].concat());
    let lines = |p: &std::path::Path| std::fs::read_to_string(p).unwrap().lines().count();
    assert_eq!(lines(&rec), 2);
    let resumed = run(&args);
    assert_eq!(lines(&rec), 4);
    for (a, b) in resumed.iter().zip(&shared) {
        assert_eq!(key(a), key(b));
    }
    // --report reads the same table back without running anything.
    let reported = run(&[&args[..], &["--report"]].concat());
    for (a, b) in reported.iter().zip(&shared) {
        assert_eq!(key(a), key(b));
    }
    // --offset skips tasks but keeps their numbering and seeds.
    let second = run(&["--strategy", "majority@8", "--offset", "1"]);
    assert_eq!(second[0]["tasks"], 1);
    // --parallel runs tasks side by side in the engine's batches; each keeps
    // its own seeds, so sampled candidates and verdicts are those of one task
    // at a time.
    let sampled = [
        "--max-tokens",
        "16",
        "--temperature",
        "0.9",
        "--strategy",
        "majority@4,synthesize@4",
    ];
    let one = eval_rows(&task, &[&sampled[..], &["--parallel", "1"]].concat());
    let two = eval_rows(&task, &[&sampled[..], &["--parallel", "2"]].concat());
    assert_eq!(one.len(), 2);
    for (a, b) in one.iter().zip(&two) {
        assert_eq!(key(a), key(b));
    }
    // A records file that is not one is refused with its line.
    std::fs::write(&rec, "{\"strategy\": \"majority@8\"}\n").unwrap();
    let bad = eval_out(&task, &["--records", rec_s]);
    assert_clean_error(&bad, "records.jsonl:1");
}

#[test]
fn eval_report_sets_each_strategy_against_the_first_task_by_task() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("tasks.jsonl");
    let q = |a: u32| format!("{{\"question\": \"What is {a} + 0?\", \"answer\": {a}}}\n");
    std::fs::write(&task, (1..=4).map(q).collect::<String>()).unwrap();
    // Majority right on tasks 0-1, synthesize on 0 and 2-3: it wins two
    // tasks and loses one against majority. Adaptive width agrees with
    // majority and settled its vote after 4 samples on task 1.
    let right = [
        ("majority@8", [true, true, false, false]),
        ("synthesize@8", [true, false, true, true]),
        ("adaptive@8", [true, true, false, false]),
    ];
    let mut lines = String::new();
    for (strategy, oks) in right {
        for (t, ok) in oks.iter().enumerate() {
            let used = if strategy == "adaptive@8" && t == 1 {
                4
            } else {
                8
            };
            lines += &serde_json::json!({
                "strategy": strategy, "task": t, "ok": ok, "answer": "1", "want": "1",
                "tokens": 10, "candidates": used, "probes": 0, "stopped_early": 0,
                "tokens_saved": 0, "seconds": 1.0, "shared": true
            })
            .to_string();
            lines.push('\n');
        }
    }
    let rec = dir.path().join("records.jsonl");
    std::fs::write(&rec, lines).unwrap();
    let args = [
        "--strategy",
        "majority@8,synthesize@8,adaptive@8",
        "--records",
        rec.to_str().unwrap(),
        "--report",
    ];
    let rows = eval_rows(&task, &args);
    assert!(rows[0].get("vs_first").is_none());
    // Only the adaptive strategy's fewer samples count as a width stop.
    let stops: Vec<_> = rows.iter().map(|r| r["width_stops"].as_u64()).collect();
    assert_eq!(stops, vec![Some(0), Some(0), Some(1)]);
    assert_eq!(rows[2]["candidates_per_task"], 7.0);
    let h = &rows[1]["vs_first"];
    assert_eq!(h["baseline"], "majority@8");
    assert_eq!(
        (h["wins"].as_u64(), h["losses"].as_u64()),
        (Some(2), Some(1))
    );
    let out = eval_out(&task, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("synthesize@8 vs majority@8: right where it is wrong on 2 task(s), wrong where it is right on 1"),
        "{text}"
    );
}

#[test]
fn eval_grades_code_tasks_by_running_their_tests() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("code.jsonl");
    let record = |tests: &str| {
        serde_json::json!({
            "task_id": "t", "entry_point": "add",
            "prompt": "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n",
            "test": format!("def check(candidate):\n{tests}"),
        })
        .to_string()
    };
    // The same function twice: tests it passes, then tests no sum passes.
    let right = record("    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n");
    let wrong = record("    assert candidate(2, 3) == 6\n    assert candidate(1, 1) == 3\n");
    std::fs::write(&task, format!("{right}\n{wrong}\n")).unwrap();
    let records = dir.path().join("records.jsonl");
    let rows = eval_rows(
        &task,
        &[
            "--strategy",
            "single,reward@3",
            "--max-tokens",
            "96",
            "--records",
            records.to_str().unwrap(),
        ],
    );
    assert_eq!(
        (rows[0]["correct"].clone(), rows[1]["correct"].clone()),
        (1.into(), 1.into())
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for r in &lines {
        let want = if r["task"] == 0 {
            "2/2 tests"
        } else {
            "0/2 tests"
        };
        assert_eq!(r["answer"], want, "{r}");
        assert_eq!(r["want"], "2 tests");
    }
    // Votes and syntheses need answers; unit-test rewards need tests.
    let out = eval_out(&task, &["--strategy", "majority@4"]);
    assert_clean_error(&out, "code tasks graded by tests");
    let out = eval_out(
        std::path::Path::new("arithmetic:count=2"),
        &["--strategy", "reward@4"],
    );
    assert_clean_error(&out, "needs code tasks");
}

#[test]
fn eval_compares_named_synthesizers_over_the_same_candidates() {
    // The served model loaded again under a name: over the very same
    // candidates its syntheses equal the default synthesizer's (same
    // weights, greedy synthesis), so the two rows agree on every count; the
    // head-to-head against the first row carries McNemar's p.
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("tasks.jsonl");
    std::fs::write(
        &task,
        "{\"question\": \"What is 2 + 2?\", \"answer\": 4}\n\
         {\"question\": \"What is 5 + 1?\", \"answer\": 6}\n",
    )
    .unwrap();
    let model = real_model();
    let named = format!("again={}", model.to_str().unwrap());
    let rows = eval_rows(
        &task,
        &[
            "--max-tokens",
            "24",
            "--temperature",
            "0.9",
            "--strategy",
            "majority@3,synthesize@3,synthesize@3:with=again",
            "--synthesizer",
            &named,
        ],
    );
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[2]["strategy"], "synthesize@3:with=again");
    assert_eq!(rows[2]["shared_samples"], true);
    for k in ["correct", "tokens", "candidates_per_task"] {
        assert_eq!(rows[1][k], rows[2][k], "{k}");
    }
    let h = &rows[2]["vs_first"];
    let p = h["mcnemar_p"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&p), "{h}");
    if h["wins"] == 0 && h["losses"] == 0 {
        assert_eq!(p, 1.0);
    }
    // A name no strategy uses, a strategy naming no synthesizer, and a
    // malformed flag are refused before anything runs.
    let m = model.to_str().unwrap();
    let unused = eval_out(
        &task,
        &["--strategy", "majority@2", "--synthesizer", &named],
    );
    assert_clean_error(&unused, "no strategy uses it");
    let missing = eval_out(&task, &["--strategy", "synthesize@2:with=nobody"]);
    assert_clean_error(&missing, "--synthesizer nobody=MODEL");
    let bare = eval_out(
        &task,
        &["--strategy", "synthesize@2:with=x", "--synthesizer", m],
    );
    assert_clean_error(&bare, "NAME=MODEL");
    let opt = eval_out(&task, &["--strategy", "majority@2:with=x"]);
    assert_clean_error(&opt, "majority@2:with=x");
}

/// The SFT-only control's strategy: `single:with=NAME` has the named model
/// answer alone, greedily, with no candidates: the same answers as a run
/// with that model as `--model` (here Qwen2.5-Coder-0.5B beside SmolLM2).
#[test]
fn a_named_model_answers_alone_as_its_own_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let task = dir.path().join("tasks.jsonl");
    std::fs::write(
        &task,
        "{\"question\": \"What is 2 + 2?\", \"answer\": 4}\n\
         {\"question\": \"What is 5 + 1?\", \"answer\": 6}\n",
    )
    .unwrap();
    let other = crate::qwen::qwen("qwen2.5-coder-0.5b-instruct");
    let named = format!("control={}", other.to_str().unwrap());
    let rows = eval_rows(
        &task,
        &[
            "--max-tokens",
            "24",
            "--strategy",
            "single,single:with=control",
            "--synthesizer",
            &named,
        ],
    );
    assert_eq!(rows[1]["strategy"], "single:with=control");
    let alone = tern(
        &[
            "eval",
            "-m",
            other.to_str().unwrap(),
            "--task",
            task.to_str().unwrap(),
            "--max-tokens",
            "24",
            "--strategy",
            "single",
            "--json",
        ],
        None,
    );
    assert!(
        alone.status.success(),
        "{}",
        String::from_utf8_lossy(&alone.stderr)
    );
    let alone = &last_json(&alone)["rows"][0];
    for k in ["correct", "tokens", "candidates_per_task"] {
        assert_eq!(rows[1][k], alone[k], "{k}");
    }
    // The two models write different answers: the row is not SmolLM2's.
    assert_ne!(rows[0]["tokens"], rows[1]["tokens"]);
}

#[test]
fn synth_data_builds_resumable_training_tasks_from_sampled_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("synth.jsonl");
    let model = real_model();
    let run = |limit: &str| {
        let o = tern(
            &[
                "synth-data",
                "-m",
                model.to_str().unwrap(),
                "--task",
                "arithmetic:count=20,seed=5,difficulty=1,ops=add",
                "--limit",
                limit,
                "--n",
                "3",
                "--k",
                "2",
                "--max-tokens",
                "24",
                "--keep",
                "all",
                "--parallel",
                "2",
                "--out",
                out.to_str().unwrap(),
                "--json",
            ],
            None,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        last_json(&o)
    };
    assert_eq!(run("2")["tasks"], 2);
    // A second run with a larger limit builds only the new task.
    assert_eq!(run("3")["tasks"], 1);
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for (i, e) in lines.iter().enumerate() {
        // Written in task order, each one the synthesis prompt over its 3
        // candidates with the source's answer.
        assert_eq!(e["source"], i);
        let q = e["question"].as_str().unwrap();
        assert!(q.starts_with("You are checking other people's work"), "{q}");
        assert!(
            q.contains("Solution 3:") && !q.contains("Solution 4:"),
            "{q}"
        );
        let (right, n) = (
            e["candidates_right"].as_u64().unwrap(),
            e["n"].as_u64().unwrap(),
        );
        assert!(right <= n);
        if e["majority_right"] == true {
            assert!(right > 0);
        }
        // A target exactly when some synthesis was right, and it states the answer.
        let synth_right = e["syntheses_right"].as_u64().unwrap();
        assert_eq!(e.get("target").is_some(), synth_right > 0, "{e}");
        if let Some(t) = e["target"].as_str() {
            assert!(t.contains(e["answer"].as_str().unwrap()), "{t}");
        }
    }
    // The file is a task file: SFT trains on it (on the tasks with a
    // `target` when some have one).
    let run_dir = dir.path().join("run");
    let o = tern(
        &[
            "train",
            "-m",
            model.to_str().unwrap(),
            "--task",
            out.to_str().unwrap(),
            "--algorithm",
            "sft",
            "--steps",
            "1",
            "--prompts-per-step",
            "2",
            "--out",
            run_dir.to_str().unwrap(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A file where only some tasks have a worked target: SFT trains the
    // others on their answer line and says so, unless told worked-only.
    let mixed = dir.path().join("mixed.jsonl");
    std::fs::write(
        &mixed,
        "{\"question\":\"What is 2 + 3?\",\"answer\":\"5\",\"target\":\"2 + 3 = 5. The answer is 5.\"}\n\
         {\"question\":\"What is 4 + 4?\",\"answer\":\"8\"}\n",
    )
    .unwrap();
    let sft = |extra: &[&str], out: &str| {
        let run = dir.path().join(out);
        let mut args = vec![
            "train",
            "-m",
            model.to_str().unwrap(),
            "--task",
            mixed.to_str().unwrap(),
            "--algorithm",
            "sft",
            "--steps",
            "1",
            "--prompts-per-step",
            "1",
            "--out",
            run.to_str().unwrap(),
        ];
        args.extend(extra);
        let o = tern(&args, None);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let bare = sft(&[], "bare");
    assert!(
        bare.contains("1 of 2 tasks have a worked target; the other 1 train on their answer line"),
        "{bare}"
    );
    let worked = sft(&["--sft-worked-only"], "worked");
    assert!(
        worked.contains("training on the 1 of 2 tasks with a worked target"),
        "{worked}"
    );
    let both = tern(&["train", "--sft-worked-only", "--sft-bare-answers"], None);
    assert_clean_error(&both, "cannot be used with");
    // Code tasks have no answer to synthesize.
    let bad = tern(
        &[
            "synth-data",
            "-m",
            model.to_str().unwrap(),
            "--task",
            "../shared/data/HumanEval.jsonl.gz",
            "--limit",
            "1",
            "--out",
            dir.path().join("x.jsonl").to_str().unwrap(),
        ],
        None,
    );
    assert_clean_error(&bad, "code task");
}

#[test]
fn eval_splits_its_table_by_task_difficulty() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("records.jsonl");
    let model = real_model();
    let run = |task: &str| {
        tern(
            &[
                "eval",
                "-m",
                model.to_str().unwrap(),
                "--task",
                task,
                "--limit",
                "6",
                "--max-tokens",
                "16",
                "--strategy",
                "majority@3,adaptive@3:wave=1",
                "--records",
                rec.to_str().unwrap(),
                "--by-difficulty",
                "--json",
            ],
            None,
        )
    };
    let out = run("arithmetic:count=6,seed=3,difficulty=1+2,ops=add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let levels = last_json(&out)["by_difficulty"].as_array().unwrap().clone();
    let ds: Vec<u64> = levels
        .iter()
        .map(|l| l["difficulty"].as_u64().unwrap())
        .collect();
    assert_eq!(ds, [1, 2], "{levels:?}");
    // The buckets partition the tasks, and each has both strategies' rows.
    let tasks: u64 = levels
        .iter()
        .map(|l| l["rows"][0]["tasks"].as_u64().unwrap())
        .sum();
    assert_eq!(tasks, 6);
    for l in &levels {
        let rows = l["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1]["strategy"], "adaptive@3:wave=1");
    }
    // Tasks without a difficulty cannot be split.
    let file = dir.path().join("plain.jsonl");
    std::fs::write(&file, "{\"question\": \"What is 2 + 2?\", \"answer\": 4}\n").unwrap();
    std::fs::remove_file(&rec).unwrap();
    assert_clean_error(&run(file.to_str().unwrap()), "carry no difficulty");
}

/// Best-of-N on code with no tests given: the default model writes 4 unit
/// tests, every candidate runs against every one in the sandbox, and the
/// chosen candidate is printed beside the tests and the pass matrix.
#[test]
fn reward_with_generated_tests_prints_the_pass_matrix_and_the_choice() {
    let entry = tern_hub::lookup(tern_hub::DEFAULT_MODEL).expect("in the catalog");
    let dir = std::env::var_os("TERN_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::support::repo_root().join("models/cache"));
    let model = dir.join(entry.file_name);
    assert!(
        model.is_file(),
        "{} missing at {}: run `cargo run --release -- pull` (the test script does this)",
        tern_hub::DEFAULT_MODEL,
        model.display()
    );
    let out = tern(
        &[
            "bon",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "Write a Python function add(a, b) that returns the sum of a and b.",
            "-n",
            "3",
            "--max-tokens",
            "96",
            "--aggregate",
            "reward",
            "--generate-tests",
            "4",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The user-visible result: the chosen candidate's text on stdout.
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "{stderr}"
    );
    let kept: usize = stderr
        .lines()
        .find(|l| l.contains("generated tests kept from 4 replies"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no test summary: {stderr}"));
    assert!((1..=4).contains(&kept), "{kept} tests kept: {stderr}");
    // One matrix row per candidate, one letter per kept test; the chosen
    // row (`*`) passes the most.
    let rows: Vec<(bool, String)> = stderr
        .lines()
        .filter(|l| l.contains(" candidate ") && l.trim_end().ends_with(&format!("/{kept}")))
        .map(|l| {
            let row = l
                .split(':')
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            (l.starts_with('*'), row.to_string())
        })
        .collect();
    assert_eq!(rows.len(), 3, "{stderr}");
    let passes = |r: &str| r.chars().filter(|&c| c == 'P').count();
    for (_, row) in &rows {
        assert_eq!(row.len(), kept, "{stderr}");
        assert!(row.chars().all(|c| "PFTE".contains(c)), "{stderr}");
    }
    let best = rows.iter().map(|(_, r)| passes(r)).max().unwrap();
    let chosen: Vec<&(bool, String)> = rows.iter().filter(|(c, _)| *c).collect();
    assert_eq!(chosen.len(), 1, "{stderr}");
    assert_eq!(passes(&chosen[0].1), best, "{stderr}");
}
