//! The real model against llama.cpp's reference outputs in ../shared:
//! chat template rendering, greedy tokens, perplexity, and the JSON reports.

use tern_models::{GgufFile, LogitsWanted, SeqBatch};
use tern_runtime::chat::{ChatMessage, ChatTemplate};
use tern_runtime::kv::SeqCache;
use tern_runtime::LoadedModel;

use crate::support::{greedy_refs, last_json, real_model, reference, tern};

#[test]
fn chat_template_renders_like_llama_cpp() {
    let file = GgufFile::open(&real_model()).unwrap();
    let src = file.str("tokenizer.chat_template").unwrap();
    let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
    for r in greedy_refs() {
        let user = r["user"].as_str().unwrap();
        let got = t.render(&[ChatMessage::new("user", user)], true).unwrap();
        assert_eq!(got, r["rendered_prompt"].as_str().unwrap());
    }
}

#[test]
fn greedy_generation_matches_llama_cpp() {
    let model = real_model();
    let model = model.to_str().unwrap();
    let refs = greedy_refs();
    let mut matched = 0;
    let mut report = Vec::new();
    for r in &refs {
        let user = r["user"].as_str().unwrap();
        let out = tern(
            &[
                "generate",
                "-m",
                model,
                "--chat",
                "-p",
                user,
                "--temperature",
                "0",
                "-n",
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
        let j = last_json(&out);
        let text = j["text"].as_str().unwrap();
        let want = r["completion"].as_str().unwrap();
        let ok = want.starts_with(text) && !text.is_empty();
        matched += ok as usize;
        report.push(format!("{ok}: {text:?} vs {want:?}"));
    }
    assert!(
        matched >= 4,
        "only {matched}/5 greedy prefixes match:\n{}",
        report.join("\n")
    );
}

#[test]
fn perplexity_within_one_percent_of_llama_cpp() {
    let readme = std::fs::read_to_string(reference("README.md")).unwrap();
    let want: f64 = readme
        .split("PPL = ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.trim_matches('*').parse().ok())
        .expect("reference PPL in README.md");
    let gpl = reference("gpl-3.txt");
    let model = real_model();
    let out = tern(
        &[
            "perplexity",
            "-m",
            model.to_str().unwrap(),
            "-f",
            gpl.to_str().unwrap(),
            "--ctx",
            "512",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = last_json(&out);
    let got = j["perplexity"].as_f64().unwrap();
    assert_eq!(j["chunks"], 14, "llama.cpp scores 14 windows of 512");
    assert!(j["tokens"].as_u64().unwrap() > 0 && j["seconds"].as_f64().unwrap() > 0.0);
    let rel = (got - want).abs() / want;
    assert!(
        rel < 0.01,
        "perplexity {got} vs llama.cpp {want}: {:.2}% apart",
        rel * 100.0
    );
}

#[test]
fn generate_json_reports_what_users_need() {
    let model = real_model();
    let out = tern(
        &[
            "generate",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "The sea is",
            "-n",
            "12",
            "--ignore-eos",
            "--temperature",
            "0.8",
            "--seed",
            "3",
            "--top-logprobs",
            "2",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = last_json(&out);
    assert_eq!(j["completion_tokens"], 12);
    assert_eq!(j["finish_reason"], "length");
    assert_eq!(j["token_ids"].as_array().unwrap().len(), 12);
    assert!(j["prompt_tokens"].as_u64().unwrap() >= 3);
    assert!(j["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(j["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(j["peak_rss_bytes"].as_u64().unwrap() > 0);
    let lp = j["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 12);
    for l in lp {
        assert!(l["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(l["top_logprobs"].as_array().unwrap().len(), 2);
    }
    // Same seed, same text; the text decodes the ids.
    let again = last_json(&tern(
        &[
            "generate",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "The sea is",
            "-n",
            "12",
            "--ignore-eos",
            "--temperature",
            "0.8",
            "--seed",
            "3",
            "--json",
        ],
        None,
    ));
    assert_eq!(again["token_ids"], j["token_ids"]);
    assert_eq!(again["text"], j["text"]);
}

#[test]
fn chat_session_answers_and_resets() {
    let model = real_model();
    let out = tern(
        &[
            "chat",
            "-m",
            model.to_str().unwrap(),
            "--temperature",
            "0",
            "-n",
            "16",
        ],
        Some("What is the capital of France?\n/reset\nSay hello.\n\n"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().filter(|l| !l.trim().is_empty()).count() >= 2,
        "{stdout}"
    );
}

/// Teacher-forced fidelity: with llama.cpp's greedy tokens forced, each of them
/// is our top choice or within `margin` nats of it. This is what "the same
/// model" means token by token; exact greedy agreement additionally depends on
/// near-ties this small model has many of (see the greedy test's report).
#[test]
fn llama_cpp_greedy_tokens_are_our_top_choice_up_to_near_ties() {
    let model = LoadedModel::load(&real_model()).unwrap();
    let mut worst: f32 = 0.0;
    let mut report = Vec::new();
    for r in greedy_refs() {
        let prompt = model
            .tokenizer
            .encode(r["rendered_prompt"].as_str().unwrap(), true, true)
            .unwrap();
        let mut forced = model
            .tokenizer
            .encode(r["completion"].as_str().unwrap(), false, false)
            .unwrap();
        forced.truncate(24);
        let mut all = prompt.clone();
        all.extend(&forced[..forced.len() - 1]);
        let mut cache = SeqCache::new(model.config());
        let mut b = [SeqBatch {
            tokens: &all,
            start_pos: 0,
            cache: &mut cache,
            logits: LogitsWanted::All,
        }];
        let logits = model.arch.forward(&mut b).unwrap().pop().flatten().unwrap();
        let rows: Vec<Vec<f32>> = logits.to_vec2().unwrap();
        for (i, &tok) in forced.iter().enumerate() {
            let row = &rows[prompt.len() - 1 + i];
            let best = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let gap = best - row[tok as usize];
            if gap > worst {
                worst = gap;
            }
            if gap > 0.0 {
                report.push(format!("{:?} token {i}: {gap:.4}", r["user"]));
            }
        }
    }
    assert!(
        worst < 0.1,
        "llama.cpp's token trails our best by {worst} nats: {report:?}"
    );
}
