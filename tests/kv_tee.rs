//! One prompt read once into many caches (`TernBackend::prefill_each`,
//! `generate_each`): each policy's answer equals the answer it gives alone
//! with the prompt in one chunk, token for token and log-probability for
//! log-probability, so a policy sweep can share the prompt's forward pass.

use std::sync::Arc;

use tern_kveval::generate::{generate, GenerateOutput, GenerateRequest};
use tern_kveval::generate_each::{generate_each, generate_each_query_agnostic};
use tern_runtime::backend::TernBackend;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use crate::support::real_model;
use crate::support::tiny::{write_tiny_model, TinySpec};

fn policies(specs: &[&str]) -> Vec<KvPolicy> {
    specs.iter().map(|s| s.parse().unwrap()).collect()
}

/// Each policy alone, the prompt in one chunk, then all of them through one
/// shared prefill: the outputs must agree exactly.
fn alone_and_shared(
    model: &Arc<LoadedModel>,
    req: &GenerateRequest,
    ps: &[KvPolicy],
) -> (Vec<GenerateOutput>, Vec<GenerateOutput>) {
    let mut backend = TernBackend::new(Arc::clone(model));
    let alone: Vec<GenerateOutput> = ps
        .iter()
        .map(|p| {
            let one = GenerateRequest {
                kv_policy: p.clone(),
                prefill_chunk: req.prompt.len(),
                ..req.clone()
            };
            generate(&mut backend, model, &one, |_| {}).unwrap()
        })
        .collect();
    let shared = generate_each(&mut backend, model, req, ps).unwrap();
    (alone, shared)
}

fn assert_same(ps: &[KvPolicy], alone: &[GenerateOutput], shared: &[GenerateOutput]) {
    assert_eq!(alone.len(), shared.len());
    for ((p, a), s) in ps.iter().zip(alone).zip(shared) {
        assert_eq!(a.token_ids, s.token_ids, "{p}: tokens differ");
        let bits = |o: &GenerateOutput| -> Vec<u32> {
            o.logprobs.iter().map(|l| l.logprob.to_bits()).collect()
        };
        assert_eq!(bits(a), bits(s), "{p}: log-probabilities differ");
        assert_eq!(a.kv_bytes, s.kv_bytes, "{p}: peak KV bytes differ");
        assert_eq!(a.kv_bytes_full, s.kv_bytes_full, "{p}");
    }
}

/// The tiny random-weight llama with a 512-token context.
fn tiny_model() -> Arc<LoadedModel> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(
        &path,
        &TinySpec {
            context_length: 512,
            ..TinySpec::default()
        },
    );
    Arc::new(LoadedModel::load(&path).unwrap())
}

#[test]
fn a_shared_prefill_gives_each_policy_its_own_answer_on_the_tiny_model() {
    let model = tiny_model();
    let vocab = model.config().vocab_size;
    let prompt: Vec<u32> = (0..200).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    // Sampled at temperature 1: any difference in the logits shows in the
    // log-probabilities, and soon in the tokens.
    let req = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..SamplingParams::default()
        },
        max_tokens: 48,
        ignore_eos: true,
        stop: Vec::new(),
        prefill_chunk: 64,
        kv_policy: KvPolicy::Full,
        kv_dtype: KvDtype::F32,
    };
    let ps = policies(&[
        "full",
        "streaming:budget=32",
        "h2o:budget=40",
        "snapkv:budget=40,every=8",
        "pyramidkv:budget=40,every=8",
        "rkv:budget=40,every=8",
        "adakv:budget=40,every=8",
        "keydiff:budget=40,every=8",
        "expected:budget=40,every=8",
    ]);
    let (alone, shared) = alone_and_shared(&model, &req, &ps);
    assert_same(&ps, &alone, &shared);
    // The policies do differ from one another (a sweep that could not tell
    // them apart would pass the check above trivially).
    let distinct: std::collections::BTreeSet<_> = shared.iter().map(|o| &o.token_ids).collect();
    assert!(
        distinct.len() >= 3,
        "only {} distinct answers",
        distinct.len()
    );
    // Members of different storage types cannot share a forward.
    let mut backend = TernBackend::new(Arc::clone(&model));
    let err = backend
        .prefill_each(&req.prompt, &[], KvDtype::F32)
        .unwrap_err();
    assert!(err.to_string().contains("at least one"), "{err}");
}

#[test]
fn a_shared_prefill_gives_each_policy_its_own_answer_on_smollm2_with_a_quantized_cache() {
    let model = Arc::new(LoadedModel::load(&real_model()).unwrap());
    let text = std::fs::read_to_string(crate::support::reference("gpl-3.txt")).unwrap();
    let mut prompt = model.tokenizer.encode(&text, false, false).unwrap();
    prompt.truncate(300);
    let req = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: 3,
            ..SamplingParams::default()
        },
        max_tokens: 12,
        ignore_eos: true,
        stop: Vec::new(),
        prefill_chunk: 300,
        kv_policy: KvPolicy::Full,
        kv_dtype: KvDtype::Q8_0,
    };
    let ps = policies(&[
        "full",
        "snapkv:budget=64,every=4",
        "h2o:budget=64",
        "adakv:budget=64,every=4",
        "expected:budget=64,every=4",
        "keydiff:budget=64,every=4",
        "rkv:budget=64,every=4",
    ]);
    let (alone, shared) = alone_and_shared(&model, &req, &ps);
    assert_same(&ps, &alone, &shared);
}

#[test]
fn a_query_agnostic_run_compresses_the_context_only_and_keeps_the_question_and_answer() {
    let model = tiny_model();
    let vocab = model.config().vocab_size;
    let prompt: Vec<u32> = (0..200).map(|i| ((i * 53 + 5) % vocab) as u32).collect();
    let context = 120;
    let req = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: 1.0,
            seed: 11,
            ..SamplingParams::default()
        },
        max_tokens: 48,
        ignore_eos: true,
        stop: Vec::new(),
        prefill_chunk: context,
        kv_policy: KvPolicy::Full,
        kv_dtype: KvDtype::F32,
    };
    let ps = policies(&[
        "full",
        "streaming:budget=32",
        "h2o:budget=40",
        "snapkv:budget=40,every=8",
        "keydiff:budget=40,every=8",
    ]);
    let mut backend = TernBackend::new(Arc::clone(&model));
    let outs = generate_each_query_agnostic(&mut backend, &model, &req, &ps, context).unwrap();
    // The full cache reads context then question as two chunks, exactly.
    let alone = generate(&mut backend, &model, &req, |_| {}).unwrap();
    assert_same(&ps[..1], &[alone], &outs[..1]);
    // Each policy pruned the 120 context entries to its budget once; the 80
    // question tokens and 47 forwarded answer tokens were all kept after.
    let seen = 200 + 47;
    for (p, o) in ps.iter().zip(&outs).skip(1) {
        let budget = p.budget().unwrap();
        let held = budget + 80 + 47;
        assert_eq!(o.kv_bytes * seen, o.kv_bytes_full * held, "{p}");
        assert_ne!(
            o.token_ids, outs[0].token_ids,
            "{p}: pruning changed nothing"
        );
    }
    // The context must be a proper, non-empty prefix.
    for bad in [0, 200, 201] {
        let err = generate_each_query_agnostic(&mut backend, &model, &req, &ps, bad).unwrap_err();
        assert!(err.to_string().contains("context"), "{err}");
    }
}
