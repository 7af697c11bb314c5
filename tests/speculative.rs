//! Speculative decoding by prompt lookup on the real SmolLM2: the output is
//! plain decoding's, token for token, greedy and sampled, with stops,
//! logprobs and a grammar-free limit, while drafts were really accepted;
//! under every compressing KV policy too (the cache settles as plain
//! decoding leaves it), and over caches long enough for the vectorized
//! decode. Draft-model
//! speculation likewise, with SmolLM2 drafting for itself (every draft
//! accepted) and two tiny models of one vocabulary (most rejected); a draft
//! of another vocabulary, or `draft` without a draft model, is refused.

use std::sync::Arc;

use tern_runtime::backend::TernBackend;
use tern_runtime::engine::{
    Collected, DraftModel, EngineConfig, EngineHandle, FinishReason, KvUsage, SpecStats,
    Speculative, SubmitError, SubmitRequest,
};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::{LoadedModel, RuntimeError, Setting};

use crate::support::real_model;
use crate::support::tiny::{write_tiny_model, TinySpec};

/// A prompt whose answer copies code it holds, so drafts get accepted.
const CODE: &str = "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n    return subtotal + tax\n";

fn engine() -> EngineHandle {
    let model = LoadedModel::load(&real_model()).unwrap();
    EngineHandle::spawn(Arc::new(model), EngineConfig::default())
}

fn copy_prompt(engine: &EngineHandle) -> Vec<u32> {
    let text = format!("Here is a Python function.\n\n{CODE}\nThe same function again, unchanged:\n\ndef total_price(items, tax_rate):");
    engine.model().tokenizer.encode(&text, true, false).unwrap()
}

fn run(engine: &EngineHandle, mut req: SubmitRequest, spec: Speculative) -> Collected {
    req.speculative = Some(spec);
    engine.submit(req).unwrap().collect_blocking().unwrap()
}

fn stats(c: &Collected) -> SpecStats {
    c.first().speculation.clone().expect("speculation figures")
}

#[test]
fn prompt_lookup_keeps_greedy_and_sampled_output_and_accepts_drafts() {
    let engine = engine();
    let prompt = copy_prompt(&engine);
    let on = Speculative::Ngram { max_draft: 8 };

    // Greedy with logprobs, to the token limit: the model repeats the
    // function, and the drafts copy it.
    let mut greedy = SubmitRequest::new(prompt.clone(), SamplingParams::greedy(), 60);
    greedy.logprobs = true;
    let plain = run(&engine, greedy.clone(), Speculative::Off);
    let fast = run(&engine, greedy.clone(), on);
    let (p, f) = (plain.first(), fast.first());
    assert_eq!(f.tokens, p.tokens, "greedy tokens");
    assert_eq!(f.text, p.text);
    assert_eq!(f.finish_reason, Some(FinishReason::Length), "{:?}", f.text);
    assert_eq!(f.tokens.len(), 60);
    let lp = |c: &tern_runtime::engine::Completion| -> Vec<(u32, f32)> {
        c.logprobs.iter().map(|l| (l.token, l.logprob)).collect()
    };
    assert_eq!(lp(f), lp(p), "logprobs");
    assert!(p.speculation.is_none(), "off sends no figures");
    let s = stats(&fast);
    assert!(s.off.is_none(), "{s:?}");
    assert!(
        s.accepted >= 20 && s.verify_steps + s.accepted <= 60,
        "drafts were accepted: {s:?}"
    );

    // A stop string inside an accepted draft still cuts the text there.
    greedy.stop = vec!["unchanged".into()];
    let plain = run(&engine, greedy.clone(), Speculative::Off);
    let fast = run(&engine, greedy, on);
    assert_eq!(fast.first().text, plain.first().text);
    assert_eq!(fast.first().tokens, plain.first().tokens);
    assert_eq!(fast.first().finish_reason, Some(FinishReason::Stop));
    assert!(stats(&fast).accepted > 0, "{:?}", stats(&fast));

    // Sampled: the same tokens under the same seed, to the token limit.
    let sampling = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: 11,
        ..SamplingParams::default()
    };
    let sampled = SubmitRequest::new(prompt, sampling, 40);
    let plain = run(&engine, sampled.clone(), Speculative::Off);
    let fast = run(&engine, sampled, on);
    assert_eq!(fast.first().tokens, plain.first().tokens, "sampled tokens");
    assert_eq!(fast.first().finish_reason, plain.first().finish_reason);
    assert!(fast.first().tokens.len() <= 40);
    assert!(stats(&fast).accepted > 0, "{:?}", stats(&fast));
}

/// Greedy tokens and logprobs of `req` with and without prompt lookup: the
/// same bits; returns what speculation did.
fn same_as_plain(engine: &EngineHandle, req: SubmitRequest, what: &str) -> (SpecStats, KvUsage) {
    let plain = run(engine, req.clone(), Speculative::Off);
    let mut req = req;
    req.speculative = Some(Speculative::Ngram { max_draft: 8 });
    let fast = engine
        .submit(req)
        .unwrap()
        .collect_blocking()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (p, f) = (plain.first(), fast.first());
    assert_eq!(f.tokens, p.tokens, "{what}: tokens");
    let lp = |c: &tern_runtime::engine::Completion| -> Vec<(u32, u32)> {
        c.logprobs
            .iter()
            .map(|l| (l.token, l.logprob.to_bits()))
            .collect()
    };
    assert_eq!(lp(f), lp(p), "{what}: logprobs, bit for bit");
    assert_eq!(f.kv, p.kv, "{what}: what the cache kept and evicted");
    let s = stats(&fast);
    assert!(s.off.is_none(), "{what}: {s:?}");
    (s, f.kv.clone().expect("kv figures"))
}

/// Under every compressing policy the draft is verified where plain
/// decoding would not have evicted in between, and the cache settles as
/// plain decoding leaves it: the output, its logprobs and the eviction
/// figures are plain decoding's, through several compressions, while drafts
/// are accepted; a streaming window's draft rows skip what the window slid
/// past before them. A policy that scores and evicts every step (h2o's
/// default) verifies nothing beyond the one token, and says so.
#[test]
fn compressing_kv_policies_speculate_and_keep_plain_decodings_output() {
    let engine = engine();
    let prompt = copy_prompt(&engine);
    assert!(prompt.len() > 64, "{} prompt tokens", prompt.len());
    for spec in [
        "snapkv:budget=80,window=8,every=16",
        "h2o:budget=80,recent=8,every=16",
        "rkv:budget=80,window=8,every=16",
        "expected:budget=80,every=16",
        "adakv:budget=80,window=8,every=16",
        "pyramidkv:budget=80,window=8,every=16",
        "keydiff:budget=80,window=8,every=16",
        "streaming:budget=80,sink=4",
    ] {
        let mut req = SubmitRequest::new(prompt.clone(), SamplingParams::greedy(), 60);
        req.logprobs = true;
        req.kv_policy = spec.parse::<KvPolicy>().unwrap();
        let (s, kv) = same_as_plain(&engine, req, spec);
        assert!(s.accepted >= 10, "{spec}: drafts were accepted: {s:?}");
        assert!(
            kv.bytes_final < kv.bytes_full,
            "{spec}: nothing evicted: {kv:?}"
        );
    }
    let mut req = SubmitRequest::new(prompt, SamplingParams::greedy(), 20);
    req.logprobs = true;
    req.kv_policy = "h2o:budget=64,recent=8".parse::<KvPolicy>().unwrap();
    let (s, _) = same_as_plain(&engine, req, "h2o every step");
    assert_eq!(s.drafted, 0, "{s:?}");
    assert!(s.held_by_policy >= 15, "{s:?}");
}

/// Over more than 512 cached entries, where one token's attention takes the
/// vectorized decode, a draft's rows are attended one by one on that same
/// path: logprobs equal plain decoding's to the bit, with a full cache and
/// under policies whose budget is that long (a streaming window's rows
/// skipping what it slid past, in place).
#[test]
fn drafts_over_a_long_cache_keep_plain_decodings_bits() {
    let engine = engine();
    let mut prompt = Vec::new();
    let tok = &engine.model().tokenizer;
    for i in 0..11 {
        let text = format!("Version {i}:\n\n{CODE}\n");
        prompt.extend(tok.encode(&text, i == 0, false).unwrap());
    }
    prompt.extend(copy_prompt(&engine).into_iter().skip(1));
    assert!(prompt.len() > 600, "{} prompt tokens", prompt.len());
    for spec in [
        "full",
        "snapkv:budget=600,window=8,every=16",
        "streaming:budget=600,sink=4",
    ] {
        let mut req = SubmitRequest::new(prompt.clone(), SamplingParams::greedy(), 40);
        req.logprobs = true;
        req.kv_policy = spec.parse::<KvPolicy>().unwrap();
        let (s, _) = same_as_plain(&engine, req, spec);
        assert!(s.accepted >= 10, "{spec}: drafts were accepted: {s:?}");
    }
}

/// SmolLM2 drafting for itself: every greedy draft token is the target's
/// own, so the accept path runs whole drafts; greedy and seeded sampled
/// output stay plain decoding's.
#[test]
fn a_draft_model_keeps_greedy_and_sampled_output() {
    let target = Arc::new(LoadedModel::load(&real_model()).unwrap());
    let draft = Arc::new(LoadedModel::load(&real_model()).unwrap());
    let draft = DraftModel::new(&target, draft).unwrap();
    let backend = Box::new(TernBackend::new(Arc::clone(&target)));
    let engine =
        EngineHandle::spawn_with_draft(target, backend, Some(draft), EngineConfig::default());
    let prompt = copy_prompt(&engine);
    let on = Speculative::Draft { max_draft: 8 };

    let greedy = SubmitRequest::new(prompt.clone(), SamplingParams::greedy(), 40);
    let plain = run(&engine, greedy.clone(), Speculative::Off);
    let fast = run(&engine, greedy, on);
    assert_eq!(fast.first().tokens, plain.first().tokens, "greedy tokens");
    assert_eq!(fast.first().tokens.len(), 40);
    let s = stats(&fast);
    assert!(s.off.is_none(), "{s:?}");
    assert!(
        s.accepted >= 30 && s.accepted == s.drafted,
        "a model drafting for itself is always right: {s:?}"
    );

    let sampling = SamplingParams {
        temperature: 0.9,
        seed: 5,
        ..SamplingParams::default()
    };
    let sampled = SubmitRequest::new(prompt, sampling, 40);
    let plain = run(&engine, sampled.clone(), Speculative::Off);
    let fast = run(&engine, sampled, on);
    assert_eq!(fast.first().tokens, plain.first().tokens, "sampled tokens");
    let s = stats(&fast);
    assert!(s.accepted > 0 && s.drafted > 0, "{s:?}");
}

/// Two tiny Qwen3 models of one vocabulary, the target's weights quantized
/// and the draft's not: the draft is often wrong, so rejections (and the
/// draft cache's rewinds) happen beside accepted drafts, and the output is
/// still the target's own.
#[test]
fn a_disagreeing_draft_model_changes_nothing_but_its_acceptance() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = |name: &str, weight_dtype| {
        let path = dir.path().join(name);
        let spec = TinySpec {
            weight_dtype,
            ..TinySpec::for_architecture("qwen3")
        };
        write_tiny_model(&path, &spec);
        Arc::new(LoadedModel::load(&path).unwrap())
    };
    // The same weights, the draft's unquantized: near-ties go either way.
    let target = tiny("target.gguf", candle_core::quantized::GgmlDType::Q4_0);
    let draft = tiny("draft.gguf", candle_core::quantized::GgmlDType::F32);
    let draft = DraftModel::new(&target, draft).unwrap();
    let backend = Box::new(TernBackend::new(Arc::clone(&target)));
    let engine =
        EngineHandle::spawn_with_draft(target, backend, Some(draft), EngineConfig::default());
    let prompt = engine
        .model()
        .tokenizer
        .encode("hello hello hello", false, false)
        .unwrap();
    let mut all = Vec::new();
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 1.0,
            seed: 3,
            ..SamplingParams::default()
        },
    ] {
        let mut req = SubmitRequest::new(prompt.clone(), sampling, 48);
        req.ignore_eos = true;
        let plain = run(&engine, req.clone(), Speculative::Off);
        let fast = run(&engine, req, Speculative::Draft { max_draft: 4 });
        assert_eq!(fast.first().tokens, plain.first().tokens);
        assert_eq!(fast.first().tokens.len(), 48);
        all.push(stats(&fast));
    }
    // Greedy: most drafts accepted, some rejected (so the draft cache was
    // rewound, or its later drafts would miss); sampled: drafts verified too.
    let greedy = &all[0];
    assert!(
        greedy.accepted >= 20 && greedy.accepted < greedy.drafted,
        "{greedy:?}"
    );
    assert!(all[1].drafted > 0, "{all:?}");
}

/// A draft whose vocabulary has the target's size but one token's text
/// swapped is refused, naming both files and the token; an engine without
/// a draft model refuses `draft` as a bad `speculative`.
#[test]
fn a_draft_model_of_another_vocabulary_or_none_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target_path = dir.path().join("target.gguf");
    write_tiny_model(&target_path, &TinySpec::default());
    let other_path = dir.path().join("swapped.gguf");
    swap_token_texts(&target_path, &other_path, 100, 101);
    let target = Arc::new(LoadedModel::load(&target_path).unwrap());
    let other = Arc::new(LoadedModel::load(&other_path).unwrap());
    assert_eq!(target.tokenizer.vocab_size(), other.tokenizer.vocab_size());
    let e = DraftModel::new(&target, other)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("swapped.gguf") && e.contains("target.gguf") && e.contains("token 100"),
        "{e}"
    );
    let same = Arc::new(LoadedModel::load(&target_path).unwrap());
    assert!(DraftModel::new(&target, same).is_ok());

    let engine = EngineHandle::spawn(target, EngineConfig::default());
    let mut req = SubmitRequest::new(vec![5, 6, 7], SamplingParams::greedy(), 4);
    req.speculative = Some(Speculative::Draft { max_draft: 4 });
    match engine.submit(req) {
        // The runtime names the setting it lacks, not a flag: the server and
        // the CLI add theirs (`--draft-model PATH`).
        Err(SubmitError::Invalid(RuntimeError::Setup {
            setting: Setting::DraftModel,
            error,
        })) => match *error {
            RuntimeError::InvalidParam { param, reason } => {
                assert_eq!(param, "speculative");
                assert!(reason.contains("needs a draft model"), "{reason}");
                assert!(
                    !reason.contains("--"),
                    "a flag in the runtime's error: {reason}"
                );
            }
            e => panic!("expected an invalid `speculative`, got {e:?}"),
        },
        other => panic!("expected a refusal, got {:?}", other.err()),
    }
}

/// Copies the GGUF `src` to `dst` with the texts of tokens `a` and `b`
/// swapped: the same vocabulary size, another vocabulary.
fn swap_token_texts(src: &std::path::Path, dst: &std::path::Path, a: usize, b: usize) {
    use candle_core::quantized::gguf_file::Value;
    let swap = |meta: &mut std::collections::HashMap<String, Value>| match meta
        .get_mut("tokenizer.ggml.tokens")
    {
        Some(Value::Array(tokens)) => tokens.swap(a, b),
        other => panic!("no token list: {other:?}"),
    };
    crate::support::rewrite_gguf_with(src, dst, swap, |_| {});
}

/// Through the binary: `speculative: "draft"` on a server without a draft
/// model is a 400 naming the field (as a bare name and as an object), and a
/// --draft-model of another vocabulary stops `tern generate` with one line
/// naming both files.
#[test]
fn draft_without_a_draft_model_is_a_400_and_a_foreign_draft_a_one_line_error() {
    use crate::support::server::Server;
    use crate::support::{assert_clean_error, tern};
    use serde_json::json;

    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.gguf");
    write_tiny_model(&target, &TinySpec::default());
    let server = Server::start(&target, None, &[]);
    for spec in [json!("draft"), json!({"type": "draft", "max_draft": 3})] {
        let body = json!({
            "model": "target",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "speculative": spec,
        });
        let (status, answer) = server.request("POST", "/v1/chat/completions", Some(&body));
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], "speculative", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("--draft-model"), "{message}");
    }
    drop(server);

    let swapped = dir.path().join("swapped.gguf");
    swap_token_texts(&target, &swapped, 100, 101);
    let (t, s) = (target.to_str().unwrap(), swapped.to_str().unwrap());
    let out = tern(&["generate", "-m", t, "--draft-model", s, "-p", "hi"], None);
    assert_clean_error(&out, "vocabulary");
    let last = String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(
        last.contains("target.gguf") && last.contains("swapped.gguf"),
        "{last}"
    );
    let out = tern(
        &["generate", "-m", t, "--speculative", "draft", "-p", "hi"],
        None,
    );
    assert_clean_error(&out, "--draft-model");
}
