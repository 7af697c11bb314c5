//! Going on past the model's context under a KV policy (`overflow`): the
//! cache is compressed and re-numbered when the next tokens would pass the
//! last position, so a prompt several contexts long is read and an answer
//! may outgrow the context; a request that fits is read whole.

use std::sync::Arc;

use tern_runtime::engine::{
    EngineConfig, EngineHandle, Event, FinishReason, KvUsage, SubmitError, SubmitRequest,
};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use crate::support::tiny::{load_tiny_spec, TinySpec};

fn tiny(context_length: usize) -> (tempfile::TempDir, LoadedModel) {
    load_tiny_spec(&TinySpec {
        context_length,
        ..TinySpec::default()
    })
}

fn prompt(len: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 13 + 5) % 250 + 3) as u32).collect()
}

fn policy(spec: &str) -> KvPolicy {
    spec.parse().expect("policy spec")
}

fn request(prompt_len: usize, max_tokens: usize) -> SubmitRequest {
    let mut req = SubmitRequest::new(
        prompt(prompt_len),
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        max_tokens,
    );
    req.ignore_eos = true;
    req.logprobs = true;
    req.kv_dtype = KvDtype::F32;
    req
}

struct Answer {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: FinishReason,
    kv: KvUsage,
}

fn run(model: LoadedModel, req: SubmitRequest) -> Answer {
    let engine = EngineHandle::spawn(
        Arc::new(model),
        EngineConfig {
            kv_memory: 64 << 20,
            prefill_chunk: 16,
            step_tokens: 40,
            ..EngineConfig::default()
        },
    );
    let mut s = engine.submit(req).expect("admitted");
    let (mut tokens, mut logprobs, mut done) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = s.blocking_recv() {
        match ev {
            Event::Token { token, logprob, .. } => {
                tokens.push(token);
                logprobs.push(logprob.expect("logprobs asked for").logprob);
            }
            Event::Done {
                finish_reason, kv, ..
            } => done = Some((finish_reason, kv)),
            Event::Error(e) => panic!("engine error: {e}"),
            _ => {}
        }
    }
    let (finish, kv) = done.expect("the completion ends with Done");
    Answer {
        tokens,
        logprobs,
        finish,
        kv,
    }
}

#[test]
fn a_window_renumbered_past_the_context_answers_as_one_that_never_had_to() {
    // A plain sliding window (no sinks) keeps a contiguous run, so
    // re-numbering moves every kept key by the same amount: RoPE attention
    // sees only distances, and the answer must be the one a model with a
    // long enough context gives, where positions simply run on.
    let spec = "streaming:budget=24,sink=0";
    let mut req = request(40, 120);
    req.kv_policy = policy(spec);
    let (_a, long) = tiny(4096);
    let plain = run(long, req.clone());
    let (_b, short) = tiny(64);
    req.overflow = Some(policy(spec));
    let shifted = run(short, req);
    assert_eq!(plain.kv.shifts, 0);
    // 160 positions through a 64-token context, 40 freed at a time.
    assert!(shifted.kv.shifts >= 3, "shifts: {}", shifted.kv.shifts);
    assert_eq!(shifted.finish, FinishReason::Length);
    // Up to the first re-numbering (position 64, answer token 24) the two
    // are the same computation; after it, each key has been turned by its
    // change of position instead of rotated afresh from a table row, and
    // the table's angles round differently at other positions, so the
    // numbers agree to rounding: the same tokens for the next steps, and
    // log-probabilities within 0.01 on the first. A key left unturned (or
    // turned the wrong way) changes the very next token.
    let first = 64 - 40;
    assert_eq!(shifted.tokens[..first], plain.tokens[..first]);
    assert_eq!(shifted.logprobs[..first], plain.logprobs[..first]);
    assert_eq!(
        shifted.tokens[first..first + 8],
        plain.tokens[first..first + 8]
    );
    let drift = (shifted.logprobs[first + 1] - plain.logprobs[first + 1]).abs();
    assert!(drift < 0.01, "log-probability drift {drift}");
}

#[test]
fn a_prompt_four_contexts_long_is_read_and_the_answer_outgrows_the_context_too() {
    let (_d, model) = tiny(64);
    let overflow = policy("snapkv:budget=24,window=8");
    // Without an overflow policy: refused with the numbers.
    let engine = EngineHandle::spawn(Arc::new(model), EngineConfig::default());
    match engine.submit(request(256, 100)) {
        Err(SubmitError::Invalid(e)) => assert!(e.to_string().contains("64"), "{e}"),
        other => panic!("expected a context error, got {:?}", other.map(|_| ())),
    }
    // A policy that keeps the whole context, or a share of a growing
    // conversation, cannot make room: refused by name.
    for bad in [
        "snapkv:budget=64,window=8",
        "snapkv:budget=50%,min_budget=16,window=8",
    ] {
        let mut req = request(256, 100);
        req.overflow = Some(policy(bad));
        match engine.submit(req) {
            Err(SubmitError::Invalid(e)) => {
                assert!(e.to_string().contains("context_overflow"), "{e}")
            }
            other => panic!("{bad}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
    drop(engine);
    let (_d, model) = tiny(64);
    let mut req = request(256, 100);
    req.overflow = Some(overflow);
    let answer = run(model, req);
    assert_eq!(answer.tokens.len(), 100);
    assert_eq!(answer.finish, FinishReason::Length);
    // 356 positions through a 64-token context, at most 40 freed at a time.
    assert!(answer.kv.shifts >= 8, "shifts: {}", answer.kv.shifts);
    assert!(answer.kv.entries_final <= 64, "{}", answer.kv.entries_final);
    assert!(answer.logprobs.iter().all(|l| l.is_finite()));
}

#[test]
fn a_request_that_fits_is_read_whole_under_a_waiting_overflow_policy() {
    // The policy evicts only when the context is full: an answer that fits
    // is the full cache's, token for token.
    let (_a, a) = tiny(64);
    let (_b, b) = tiny(64);
    let plain = run(a, request(30, 20));
    let mut req = request(30, 20);
    req.overflow = Some(policy("snapkv:budget=24,window=8"));
    let waiting = run(b, req);
    assert_eq!(waiting.kv.shifts, 0);
    assert_eq!(waiting.tokens, plain.tokens);
    assert_eq!(waiting.logprobs, plain.logprobs);
}
