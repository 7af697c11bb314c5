//! The RULER-style suite: prompts sized in the real model's tokens, the same
//! for a seed, holding their answers exactly as the scorer looks for them; and
//! `tern kv-eval --tasks ruler` end to end on SmolLM2.

use std::collections::HashMap;

use tern_kveval::ruler::{self, RulerTask};
use tern_models::GgufFile;
use tern_runtime::tokenizer::Tokenizer;

use crate::support::{assert_clean_error, real_model, tern};

fn real_tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(&real_model()).unwrap()).unwrap()
}

#[test]
fn ruler_samples_are_the_same_for_a_seed_and_differ_across_seeds() {
    let tok = real_tokenizer();
    for task in RulerTask::ALL {
        let a = ruler::build(&tok, task, 1024, 7).unwrap();
        let b = ruler::build(&tok, task, 1024, 7).unwrap();
        let c = ruler::build(&tok, task, 1024, 8).unwrap();
        assert_eq!(a, b, "{task}");
        assert_ne!(a.tokens, c.tokens, "{task}");
        assert_ne!(a.expected, c.expected, "{task}");
    }
    assert_ne!(
        ruler::sample_seed(1, RulerTask::Vt, 4096, 0),
        ruler::sample_seed(1, RulerTask::Vt, 4096, 1)
    );
}

#[test]
fn ruler_prompts_fill_the_requested_length() {
    let tok = real_tokenizer();
    for length in [1024, 3000] {
        for task in RulerTask::ALL {
            let s = ruler::build(&tok, task, length, 3).unwrap();
            let total = s.tokens.len() + s.max_new_tokens;
            assert!(
                total <= length && total + 8 >= length,
                "{task} at {length}: {} prompt + {} answer tokens",
                s.tokens.len(),
                s.max_new_tokens
            );
        }
    }
}

/// Entries of the last numbered list in `text` ("1. word 2. word ...").
fn last_list(text: &str) -> Vec<String> {
    let list = text
        .rsplit("Memorize the ones that appear most often.\n")
        .next()
        .unwrap();
    let list = list.split('\n').next().unwrap();
    list.split_whitespace()
        .filter(|w| !w.ends_with('.'))
        .map(str::to_string)
        .collect()
}

#[test]
fn ruler_answers_sit_in_the_prompt_as_the_scorer_expects() {
    let tok = real_tokenizer();
    for task in RulerTask::ALL {
        let s = ruler::build(&tok, task, 2048, 11).unwrap();
        let text = tok.decode(&s.tokens, false);
        match task {
            RulerTask::NiahSingle | RulerTask::NiahMultikey | RulerTask::NiahMultivalue => {
                let key = text
                    .rsplit("mentioned in the provided text is")
                    .nth(1)
                    .or_else(|| text.rsplit("mentioned in the provided text are").nth(1))
                    .and_then(|q| q.rsplit(" for ").next())
                    .unwrap()
                    .to_string();
                let key = key.trim().to_string();
                for v in &s.expected {
                    let needle = format!("special magic numbers for {key} is: {v}.");
                    assert_eq!(text.matches(&needle).count(), 1, "{task}: {needle}");
                }
                let needles = text.matches("One of the special magic numbers").count();
                let want = if task == RulerTask::NiahSingle { 1 } else { 4 };
                assert_eq!(needles, want, "{task}");
                assert_eq!(
                    s.expected.len(),
                    if task == RulerTask::NiahMultivalue {
                        4
                    } else {
                        1
                    }
                );
            }
            RulerTask::Vt => {
                assert_eq!(s.expected.len(), 5);
                let value = text
                    .rsplit("are assigned the value ")
                    .next()
                    .unwrap()
                    .split(',')
                    .next()
                    .unwrap();
                assert!(text.contains(&format!("VAR {} = {value}.", s.expected[0])));
                for w in s.expected.windows(2) {
                    assert!(
                        text.contains(&format!("VAR {} = VAR {}.", w[1], w[0])),
                        "{w:?}"
                    );
                }
            }
            RulerTask::Cwe => {
                let mut counts: HashMap<String, usize> = HashMap::new();
                for w in last_list(&text) {
                    *counts.entry(w).or_default() += 1;
                }
                let mut ranked: Vec<(&String, &usize)> = counts.iter().collect();
                ranked.sort_by(|a, b| b.1.cmp(a.1));
                let mut top: Vec<String> =
                    ranked[..10].iter().map(|(w, _)| w.to_string()).collect();
                let mut want = s.expected.clone();
                top.sort();
                want.sort();
                assert_eq!(top, want);
                assert!(ranked[10].1 < ranked[9].1, "the ten must stand out");
            }
        }
        // The scorer credits the expected strings and nothing else.
        assert_eq!(
            ruler::score(&s.expected, &s.expected.join(", ")),
            100.0,
            "{task}"
        );
        assert_eq!(ruler::score(&s.expected, " I do not know."), 0.0, "{task}");
    }
}

#[test]
fn ruler_prompts_split_where_the_question_begins() {
    let tok = real_tokenizer();
    for task in RulerTask::ALL {
        let s = ruler::build(&tok, task, 1024, 5).unwrap();
        assert!(
            s.context_tokens > 900 && s.context_tokens + 20 < s.tokens.len(),
            "{task}: {} of {}",
            s.context_tokens,
            s.tokens.len()
        );
        let context = tok.decode(&s.tokens[..s.context_tokens], false);
        let question = tok.decode(&s.tokens[s.context_tokens..], false);
        let asks = match task {
            RulerTask::NiahSingle | RulerTask::NiahMultikey | RulerTask::NiahMultivalue => {
                "mentioned in the provided text?"
            }
            RulerTask::Vt => "Find all variables that are assigned the value",
            RulerTask::Cwe => "most common words in the above list?",
        };
        assert!(question.contains(asks), "{task}: {question}");
        assert!(
            question.trim_start().starts_with("What")
                || question.trim_start().starts_with("Question:"),
            "{task}: {question}"
        );
        // What must be retrieved is in the context; vt and cwe's worked
        // examples carry a question of their own, the context ends before
        // the last one.
        assert_eq!(
            context.matches(asks).count(),
            usize::from(matches!(task, RulerTask::Vt | RulerTask::Cwe)),
            "{task}"
        );
        if matches!(
            task,
            RulerTask::NiahSingle | RulerTask::NiahMultikey | RulerTask::NiahMultivalue
        ) {
            for v in &s.expected {
                assert!(context.contains(v.as_str()), "{task}: {v}");
            }
        }
    }
}

#[test]
fn unknown_ruler_task_names_are_one_line_errors() {
    assert!("niah_single".parse::<RulerTask>().is_ok());
    let e = "niah_double".parse::<RulerTask>().unwrap_err();
    assert!(e.to_string().contains("niah_double"));
}

/// The JSON records `--out` wrote, one per line.
fn read_records(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ruler_args<'a>(path: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--threads", "2", "kv-eval", "-m", path, "--tasks", "ruler"];
    v.extend_from_slice(extra);
    v
}

#[test]
fn kv_eval_ruler_bad_flags_are_one_line_errors() {
    let model = real_model();
    let path = model.to_str().unwrap();
    let out = tern(
        &ruler_args(path, &["--ruler-tasks", "niah_single,niah_double"]),
        None,
    );
    assert_clean_error(&out, "--ruler-tasks");
    assert!(String::from_utf8_lossy(&out.stderr).contains("niah_double"));
    for bad in ["0", "100", "50,120"] {
        let out = tern(&ruler_args(path, &["--removed", bad]), None);
        assert_clean_error(&out, "--removed");
    }
    // A length too short for a task's instructions names the length.
    let out = tern(
        &ruler_args(
            path,
            &[
                "--ruler-tasks",
                "cwe",
                "--ruler-lengths",
                "256",
                "--policies",
                "full",
            ],
        ),
        None,
    );
    assert_clean_error(&out, "256 tokens");
}

#[test]
fn kv_eval_ruler_writes_one_record_per_sample_and_setting() {
    let model = real_model();
    let path = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("ruler.jsonl");
    let out = tern(
        &ruler_args(
            path,
            &[
                "--ruler-lengths",
                "512",
                "--ruler-tasks",
                "niah_single,vt",
                "--ruler-samples",
                "1",
                "--policies",
                "snapkv",
                "--removed",
                "50",
                "--out",
                records.to_str().unwrap(),
            ],
        ),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| policy | 0% | 50% |"), "{stdout}");
    assert!(stdout.contains("| snapkv | - | "), "{stdout}");
    let rows = read_records(&records);
    // Two tasks, one sample, full plus snapkv at 50% removed.
    assert_eq!(rows.len(), 4);
    for r in &rows {
        let n = r["prompt_tokens"].as_u64().unwrap();
        assert!(n > 400 && n <= 512, "{r}");
        let score = r["score"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&score), "{r}");
        assert_eq!(r["kv_dtype"], "f16");
        assert_eq!(r["length"], 512);
        if r["name"] == "full" {
            assert_eq!(r["removed"], 0);
            assert_eq!(r["policy"], "full");
        } else {
            assert_eq!(r["removed"], 50);
            assert_eq!(r["budget"].as_u64().unwrap(), n.div_ceil(2));
            assert!(r["policy"].as_str().unwrap().starts_with("snapkv:budget="));
            assert!(r["kv_bytes"].as_u64().unwrap() < r["kv_bytes_full"].as_u64().unwrap());
        }
    }
    // With the whole cache the model finds the single needle at 512 tokens.
    let full_niah = rows
        .iter()
        .find(|r| r["task"] == "niah_single" && r["name"] == "full")
        .unwrap();
    assert_eq!(full_niah["score"], 100.0, "{full_niah}");
}

#[test]
fn kv_eval_ruler_query_agnostic_compresses_the_context_before_the_question() {
    let model = real_model();
    let path = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("ruler.jsonl");
    let out = tern(
        &ruler_args(
            path,
            &[
                "--ruler-lengths",
                "512",
                "--ruler-tasks",
                "niah_single",
                "--ruler-samples",
                "1",
                "--policies",
                "snapkv,h2o",
                "--removed",
                "50",
                "--query-agnostic",
                "--out",
                records.to_str().unwrap(),
            ],
        ),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("query-agnostic"), "{stdout}");
    let rows = read_records(&records);
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r["query"], "agnostic", "{r}");
        let n = r["prompt_tokens"].as_u64().unwrap();
        let c = r["context_tokens"].as_u64().unwrap();
        assert!(c > 400 && c + 20 < n, "{r}");
        if r["name"] == "full" {
            // The whole cache still finds the needle with the prompt read in
            // two pieces.
            assert_eq!(r["score"], 100.0, "{r}");
            continue;
        }
        // Half the context is pruned once; the question and answer are kept.
        assert_eq!(r["budget"].as_u64().unwrap(), c.div_ceil(2), "{r}");
        let full = r["kv_bytes_full"].as_u64().unwrap();
        let held = r["kv_bytes"].as_u64().unwrap();
        assert!(held < full && held * 2 > full, "{r}");
    }
}
