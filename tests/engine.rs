//! The continuous-batching engine on the tiny model: batched requests give the
//! same tokens as one request alone, `n` children follow their seeds, dropping
//! a stream cancels it, the queue and the KV budget hold, bad requests fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tern_kveval::generate::{generate, GenerateRequest};
use tern_runtime::backend::TernBackend;
use tern_runtime::engine::FinishReason;
use tern_runtime::engine::{
    ConvergenceRule, EngineConfig, EngineHandle, Event, ProbeSpec, SubmitError, SubmitRequest,
    ThinkSpec,
};
use tern_runtime::kv::KvDtype;
use tern_runtime::sampler::SamplingParams;

use crate::support::tiny::{load_tiny, load_tiny_spec, TinySpec};
use crate::support::values;

fn prompt(seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7 + seed * 31) % 250 + 3) as u32)
        .collect()
}

fn sampling(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed,
        ..SamplingParams::default()
    }
}

/// Tokens and finish reason of each completion, in index order.
fn collect(mut s: tern_runtime::engine::RequestStream) -> Vec<(Vec<u32>, FinishReason)> {
    let mut out: Vec<(Vec<u32>, Option<FinishReason>)> = Vec::new();
    while let Some(ev) = s.blocking_recv() {
        match ev {
            Event::Token { index, token, .. } => {
                if out.len() <= index {
                    out.resize(index + 1, (Vec::new(), None));
                }
                out[index].0.push(token);
            }
            Event::Done {
                index,
                finish_reason,
                completion_tokens,
                ..
            } => {
                assert_eq!(out[index].0.len(), completion_tokens);
                out[index].1 = Some(finish_reason);
            }
            Event::Error(e) => panic!("engine error: {e}"),
            Event::Prefilled { .. }
            | Event::Probe { .. }
            | Event::Concluded { .. }
            | Event::Speculated { .. } => {}
        }
    }
    out.into_iter()
        .map(|(t, f)| (t, f.expect("every completion ends with Done")))
        .collect()
}

fn alone(model: &tern_runtime::LoadedModel, req: &SubmitRequest) -> Vec<u32> {
    alone_in_chunks(model, req, 16)
}

/// As [`alone`], reading the prompt `chunk` tokens at a time.
fn alone_in_chunks(
    model: &tern_runtime::LoadedModel,
    req: &SubmitRequest,
    chunk: usize,
) -> Vec<u32> {
    let g = GenerateRequest {
        prompt: req.prompt.clone(),
        sampling: req.sampling.clone(),
        max_tokens: req.max_tokens,
        ignore_eos: req.ignore_eos,
        stop: Vec::new(),
        prefill_chunk: chunk,
        kv_policy: req.kv_policy.clone(),
        kv_dtype: Default::default(),
    };
    generate(&mut TernBackend::new(model), model, &g, |_| {})
        .unwrap()
        .token_ids
}

fn small_config() -> EngineConfig {
    EngineConfig {
        kv_memory: 64 << 20,
        prefill_chunk: 16,
        step_tokens: 40,
        ..EngineConfig::default()
    }
}

#[test]
fn concurrent_requests_match_each_request_alone() {
    let (_d, model) = load_tiny();
    let reqs: Vec<SubmitRequest> = (0..5)
        .map(|i| {
            let mut r = SubmitRequest::new(prompt(i, 10 + 9 * i), sampling(0.8, i as u64), 12);
            r.ignore_eos = true;
            if i % 2 == 1 {
                r.kv_policy = "streaming:budget=24,sink=4".parse().unwrap();
            }
            r
        })
        .collect();
    let expected: Vec<Vec<u32>> = reqs.iter().map(|r| alone(&model, r)).collect();
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    for (i, s) in streams.into_iter().enumerate() {
        let got = collect(s);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, expected[i], "request {i}");
        assert_eq!(got[0].1, FinishReason::Length);
    }
    // Several requests really shared forwards: fewer steps than tokens.
    let m = engine.metrics().snapshot();
    assert_eq!(m.generated_tokens, 60);
    assert!(m.steps < 60, "steps {}", m.steps);
    assert_eq!(m.finished, 5);
}

/// A prompt is read in the same chunks whatever else the step carries: a
/// compressing policy evicts between chunks, so a chunk cut short by a busy
/// step would change the answer. A long full-cache prompt keeps every step
/// busy while a compressed request arrives.
#[test]
fn a_compressed_prompt_answers_the_same_under_load() {
    let (_d, model) = load_tiny();
    let mut busy = SubmitRequest::new(prompt(7, 200), sampling(0.8, 1), 4);
    busy.ignore_eos = true;
    let mut req = SubmitRequest::new(prompt(3, 37), sampling(0.8, 3), 12);
    req.ignore_eos = true;
    req.kv_policy = "streaming:budget=24,sink=4".parse().unwrap();
    let expected = [alone(&model, &busy), alone(&model, &req)];
    // The busy prompt takes 16 of each step's 22 tokens; a cut chunk would be 6.
    let config = EngineConfig {
        step_tokens: 22,
        ..small_config()
    };
    let engine = EngineHandle::spawn(Arc::new(model), config);
    let first = engine.submit(busy).unwrap();
    let second = engine.submit(req).unwrap();
    assert_eq!(collect(first)[0].0, expected[0], "the busy request");
    assert_eq!(collect(second)[0].0, expected[1], "the compressed request");
}

#[test]
fn n_children_share_the_prompt_and_follow_their_seeds() {
    let (_d, model) = load_tiny();
    let mut req = SubmitRequest::new(prompt(3, 20), sampling(1.0, 40), 10);
    req.ignore_eos = true;
    let expected: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let mut one = req.clone();
            one.sampling.seed = 40 + i;
            alone(&model, &one)
        })
        .collect();
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    req.n = 3;
    let got = collect(engine.submit(req).unwrap());
    let tokens: Vec<Vec<u32>> = got.into_iter().map(|(t, _)| t).collect();
    assert_eq!(tokens, expected);
    assert_ne!(tokens[0], tokens[1], "different seeds should differ");
    // The prompt was prefilled once, not three times.
    assert_eq!(engine.metrics().snapshot().prompt_tokens, 20);
}

fn wait_for(engine: &EngineHandle, what: &str, ok: impl Fn(&EngineHandle) -> bool) {
    let t = Instant::now();
    while !ok(engine) {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn dropping_the_stream_cancels_and_frees_the_sequence() {
    // A long context, so the request is still generating when the drop is
    // seen even on a loaded machine (a 256-token one can finish first).
    let (_d, model) = load_tiny_spec(&TinySpec {
        context_length: 8192,
        ..TinySpec::default()
    });
    let ctx = model.config().context_length;
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let mut req = SubmitRequest::new(prompt(1, 8), sampling(1.0, 1), ctx - 8);
    req.ignore_eos = true;
    req.kv_dtype = KvDtype::F32;
    let mut s = engine.submit(req).unwrap();
    let mut tokens = 0;
    while tokens < 3 {
        if let Some(Event::Token { .. }) = s.blocking_recv() {
            tokens += 1;
        }
    }
    // While it runs, its KV bytes are reported under its policy and storage
    // type (the /metrics series `tern_kv_bytes_in_use{policy,dtype}`).
    wait_for(&engine, "KV series", |e| {
        let m = e.metrics().snapshot();
        let key = ("full".to_string(), "f32".to_string());
        m.by_policy.get(&key).is_some_and(|p| p.bytes_in_use > 0)
    });
    drop(s);
    wait_for(&engine, "cancel", |e| {
        let m = e.metrics().snapshot();
        m.cancelled == 1 && m.running == 0 && m.kv_reserved == 0
    });
    let m = engine.metrics().snapshot();
    assert!(m.generated_tokens < (ctx - 8) as u64);
    assert!(m.by_policy.values().all(|p| p.bytes_in_use == 0));
}

#[test]
fn admission_waits_for_kv_memory_and_the_queue_is_bounded() {
    // A asks for almost the whole of a long context, so it is still running
    // when B and C arrive even on a loaded machine (a 200-token request can
    // finish before the test submits C); it is cancelled, never completed.
    let (_d, model) = load_tiny_spec(&TinySpec {
        context_length: 8192,
        ..TinySpec::default()
    });
    let ctx = model.config().context_length;
    let reservation = |r: &SubmitRequest| {
        tern_runtime::kv::SeqCache::reservation_bytes(
            model.config(),
            &r.kv_policy,
            r.kv_dtype,
            r.prompt.len(),
            r.max_tokens,
            16,
        )
    };
    let mut long = SubmitRequest::new(prompt(2, 8), sampling(1.0, 2), ctx - 8);
    long.ignore_eos = true;
    let mut short = long.clone();
    short.max_tokens = 200;
    let (big, small) = (reservation(&long), reservation(&short));
    let engine = EngineHandle::spawn(
        Arc::new(model),
        EngineConfig {
            kv_memory: big + small / 2,
            max_queue: 1,
            ..small_config()
        },
    );
    assert_eq!(engine.reservation(&long), big);
    let mut a = engine.submit(long.clone()).unwrap();
    assert!(matches!(a.blocking_recv(), Some(Event::Prefilled { .. })));
    // A is running and holds the memory: B waits, C finds the queue full.
    let b = engine.submit(short.clone()).unwrap();
    match engine.submit(short.clone()) {
        Err(SubmitError::QueueFull {
            waiting: 1,
            limit: 1,
        }) => {}
        other => panic!("expected QueueFull, got {:?}", other.map(|s| s.id)),
    }
    let m = engine.metrics().snapshot();
    assert_eq!((m.running, m.kv_reserved as usize), (1, big));
    // B runs once A is gone.
    drop(a);
    assert_eq!(collect(b)[0].0.len(), 200);
    // A request that could never fit is refused up front.
    let mut huge = long.clone();
    huge.n = 2;
    assert!(matches!(
        engine.submit(huge),
        Err(SubmitError::TooLarge { .. })
    ));
}

#[test]
fn invalid_requests_are_refused_with_the_reason() {
    let (_d, model) = load_tiny();
    let ctx = model.config().context_length;
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let base = SubmitRequest::new(prompt(0, 10), SamplingParams::greedy(), 5);
    let err = |r: SubmitRequest| match engine.submit(r) {
        Err(SubmitError::Invalid(e)) => e.to_string(),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("accepted"),
    };
    let mut r = base.clone();
    r.n = 0;
    assert!(err(r).contains("`n`"));
    let mut r = base.clone();
    r.max_tokens = 0;
    assert!(err(r).contains("max_tokens"));
    let mut r = base.clone();
    r.max_tokens = ctx;
    let msg = err(r);
    assert!(
        msg.contains(&ctx.to_string()) && msg.contains("10 in the prompt"),
        "{msg}"
    );
    let mut r = base.clone();
    r.prompt.clear();
    assert!(err(r).contains("empty"));
    let mut r = base.clone();
    r.sampling.temperature = -1.0;
    assert!(err(r).contains("temperature"));
    // The engine still serves after refusing.
    assert_eq!(collect(engine.submit(base).unwrap())[0].0.len(), 5);
}

/// Text and finish reason of a single-completion request.
fn text_of(mut s: tern_runtime::engine::RequestStream) -> (String, Option<FinishReason>) {
    let (mut text, mut finish) = (String::new(), None);
    while let Some(ev) = s.blocking_recv() {
        match ev {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { finish_reason, .. } => finish = Some(finish_reason),
            _ => {}
        }
    }
    (text, finish)
}

#[test]
fn json_object_constraint_gives_one_object() {
    let (_d, model) = load_tiny();
    let grammar = model
        .grammar(&tern_runtime::constraint::Constraint::JsonObject)
        .unwrap();
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    for seed in 0..4 {
        let mut req = SubmitRequest::new(prompt(seed, 6), sampling(1.0, seed as u64), 60);
        req.constraint = Some(grammar.clone());
        let (text, finish) = text_of(engine.submit(req).unwrap());
        assert!(text.starts_with('{'), "{text:?}");
        if finish == Some(FinishReason::Stop) {
            let v: serde_json::Value = serde_json::from_str(&text).expect("complete JSON");
            assert!(v.is_object());
        }
    }
}

#[test]
fn a_json_schema_holds_on_every_sample_of_a_random_model() {
    let (_d, model) = load_tiny();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}
        },
        "required": ["answer", "n", "tags"],
        "additionalProperties": false
    });
    let grammar = model
        .grammar(&tern_runtime::constraint::Constraint::JsonSchema(schema))
        .unwrap();
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    for seed in 0..6 {
        let mut req = SubmitRequest::new(prompt(seed, 6), sampling(1.0, seed as u64), 60);
        req.constraint = Some(grammar.clone());
        let (text, finish) = text_of(engine.submit(req).unwrap());
        // A random model never chooses to write this: every token was forced
        // into the schema, and the bounded schema ends well within 60 tokens.
        assert_eq!(finish, Some(FinishReason::Stop), "{text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("complete JSON");
        assert!(
            ["yes", "no"].contains(&v["answer"].as_str().unwrap()),
            "{text}"
        );
        assert!(v["n"].as_u64().unwrap() <= 99, "{text}");
        let tags = v["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 2 && tags.iter().all(|t| t.is_boolean()),
            "{text}"
        );
        assert_eq!(v.as_object().unwrap().len(), 3, "{text}");
    }
}

#[test]
fn a_schema_the_engine_cannot_enforce_is_refused_by_name() {
    let (_d, model) = load_tiny();
    let bad = serde_json::json!({"type": "object", "properties": {"a": {"type": "strin"}}});
    let e = model
        .grammar(&tern_runtime::constraint::Constraint::JsonSchema(bad))
        .unwrap_err()
        .to_string();
    assert!(e.contains("strin"), "{e}");
    let e = model
        .grammar(&tern_runtime::constraint::Constraint::Lark(
            "start: undefined_rule".into(),
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("undefined_rule"), "{e}");
}

/// Every event of one single-completion request, in order.
fn events(mut s: tern_runtime::engine::RequestStream) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(ev) = s.blocking_recv() {
        out.push(ev);
    }
    out
}

/// The sampled token ids among `evs`, in order.
fn sampled(evs: &[Event]) -> Vec<u32> {
    evs.iter()
        .filter_map(|e| match e {
            Event::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect()
}

fn think_request(rule: ConvergenceRule) -> SubmitRequest {
    let mut req = SubmitRequest::new(prompt(5, 12), SamplingParams::greedy(), 40);
    req.ignore_eos = true;
    req.think = Some(ThinkSpec {
        budget: 12,
        answer_suffix: vec![9, 10, 11],
        answer_tokens: 5,
        answer_stop: Vec::new(),
        probe: Some(ProbeSpec {
            every: 4,
            max_tokens: 3,
            stop: Vec::new(),
            rule,
        }),
        closes_with: None,
    });
    req
}

/// Greedy tokens after `prefix`, `n` of them, from a plain run.
fn greedy_after(model: &tern_runtime::LoadedModel, prefix: Vec<u32>, n: usize) -> Vec<u32> {
    let mut r = SubmitRequest::new(prefix, SamplingParams::greedy(), n);
    r.ignore_eos = true;
    alone(model, &r)
}

#[test]
fn think_budget_forces_the_suffix_and_probes_leave_the_reasoning_unchanged() {
    let (_d, model) = load_tiny();
    let req = think_request(ConvergenceRule::new(|_| false));
    let suffix = vec![9, 10, 11];
    let reasoning = greedy_after(&model, req.prompt.clone(), 12);
    let answer = greedy_after(&model, [&req.prompt[..], &reasoning, &suffix].concat(), 5);
    let probe_at_4 = greedy_after(
        &model,
        [&req.prompt[..], &reasoning[..4], &suffix].concat(),
        3,
    );
    let probe_text = model.tokenizer.decode(&probe_at_4, false);
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let evs = events(engine.submit(req).unwrap());
    let tokens = sampled(&evs);
    // The paused parent continues exactly as if it had never been probed,
    // and the forced suffix reaches its cache before the answer.
    assert_eq!(tokens, [reasoning, answer].concat());
    let probes: Vec<(usize, &str, usize)> = evs
        .iter()
        .filter_map(|e| match e {
            Event::Probe {
                at, text, tokens, ..
            } => Some((*at, text.as_str(), *tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(probes.len(), 2, "probes at 4 and 8, none at the budget");
    assert_eq!((probes[0].0, probes[1].0), (4, 8));
    assert_eq!((probes[0].1, probes[0].2), (probe_text.as_str(), 3));
    let concluded: Vec<_> = evs
        .iter()
        .filter(|e| matches!(e, Event::Concluded { .. }))
        .collect();
    assert!(matches!(
        concluded[..],
        [Event::Concluded {
            at: 12,
            early: false,
            ..
        }]
    ));
    assert!(matches!(
        evs.last(),
        Some(Event::Done {
            completion_tokens: 17,
            finish_reason: FinishReason::Length,
            ..
        })
    ));
}

#[test]
fn a_settled_probe_concludes_where_it_was_taken() {
    let (_d, model) = load_tiny();
    let req = think_request(ConvergenceRule::new(|p| p.len() >= 2));
    let suffix = vec![9, 10, 11];
    let reasoning = greedy_after(&model, req.prompt.clone(), 8);
    // An early stop answers as the settling probe did: greedily, within the
    // probe's 3 tokens (not the answer's 5), so its answer is the probe's.
    let answer = greedy_after(&model, [&req.prompt[..], &reasoning, &suffix].concat(), 3);
    let answer_text = model.tokenizer.decode(&answer, false);
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let evs = events(engine.submit(req).unwrap());
    let tokens = sampled(&evs);
    assert_eq!(tokens, [reasoning, answer].concat());
    let last_probe = evs.iter().rev().find_map(|e| match e {
        Event::Probe { at: 8, text, .. } => Some(text.clone()),
        _ => None,
    });
    assert_eq!(last_probe.as_deref(), Some(answer_text.as_str()));
    assert!(evs.iter().any(|e| matches!(
        e,
        Event::Concluded {
            at: 8,
            early: true,
            ..
        }
    )));
    // Probe forks are freed: the engine holds no sequence afterwards.
    wait_for(&engine, "idle", |e| e.metrics().snapshot().sequences == 0);
}

#[test]
fn a_prompt_sharing_a_cached_prefix_prefills_only_the_rest() {
    let (_d, model) = load_tiny();
    let base = prompt(4, 30);
    let mut longer = base[..24].to_vec();
    longer.extend(prompt(9, 8));
    let mk = |p: Vec<u32>, policy: &str| {
        let mut r = SubmitRequest::new(p, sampling(0.8, 5), 10);
        r.ignore_eos = true;
        r.kv_policy = policy.parse().unwrap();
        r
    };
    let (a, b) = (mk(base.clone(), "full"), mk(longer, "full"));
    let streaming = mk(base, "streaming:budget=24,sink=4");
    let want: Vec<Vec<u32>> = [&a, &b, &streaming]
        .iter()
        .map(|r| alone(&model, r))
        .collect();
    let engine = EngineHandle::spawn(
        Arc::new(model),
        EngineConfig {
            prefix_cache: 4,
            ..small_config()
        },
    );
    let run = |r: &SubmitRequest| collect(engine.submit(r.clone()).unwrap())[0].0.clone();
    // Each answer is the one a cold run gives, token for token.
    assert_eq!(run(&a), want[0]);
    assert_eq!(run(&b), want[1]);
    assert_eq!(run(&a), want[0]);
    assert_eq!(run(&streaming), want[2]);
    let m = engine.metrics().snapshot();
    // `b` reused the 24 tokens it shares with `a`; the repeat of `a` all but
    // its last token; the compressing policy nothing.
    assert_eq!(m.prompt_tokens_cached, 24 + 29);
    assert_eq!(m.prompt_tokens, 30 + 8 + 1 + 30);
    // The cached prefixes hold KV, counted in the reservation while idle.
    wait_for(&engine, "idle", |e| e.metrics().snapshot().running == 0);
    assert!(engine.metrics().snapshot().kv_reserved > 0);
}

#[test]
fn long_prompts_reuse_only_what_keeps_their_attention_kernel() {
    // From 64 new rows attention takes llama.cpp's tiled kernel; a reused
    // prefix must leave the rest of a long prompt at 64 rows or more, so that
    // the answer is the cold one bit for bit.
    let (_d, model) = load_tiny();
    let base = prompt(5, 100);
    let mut longer = base[..90].to_vec();
    longer.extend(prompt(11, 20));
    let reqs: Vec<SubmitRequest> = [base.clone(), longer, base]
        .into_iter()
        .map(|p| {
            let mut r = SubmitRequest::new(p, sampling(0.0, 1), 8);
            r.ignore_eos = true;
            r.logprobs = true;
            r
        })
        .collect();
    // Each token with its log-probability's bits: any change of kernel shows.
    let run = |e: &EngineHandle, r: &SubmitRequest| {
        let mut s = e.submit(r.clone()).unwrap();
        let mut out = Vec::new();
        while let Some(ev) = s.blocking_recv() {
            match ev {
                Event::Token { token, logprob, .. } => {
                    out.push((token, logprob.expect("asked for").logprob.to_bits()))
                }
                Event::Error(e) => panic!("engine error: {e}"),
                _ => {}
            }
        }
        assert_eq!(out.len(), 8);
        out
    };
    let config = |prefix_cache| EngineConfig {
        kv_memory: 64 << 20,
        prefix_cache,
        ..EngineConfig::default()
    };
    let model = Arc::new(model);
    let cold = EngineHandle::spawn(Arc::clone(&model), config(0));
    let warm = EngineHandle::spawn(model, config(4));
    for r in &reqs {
        assert_eq!(run(&warm, r), run(&cold, r));
    }
    // 110 tokens sharing 90: 46 reused, 64 prefilled; 100 sharing 99: 36 reused.
    assert_eq!(warm.metrics().snapshot().prompt_tokens_cached, 46 + 36);
    assert_eq!(cold.metrics().snapshot().prompt_tokens_cached, 0);
}

/// Decode rows alone can fill a step; a waiting prompt still gets a whole
/// chunk every step, so it is never starved and answers as it does alone.
#[test]
fn a_prompt_progresses_when_decoding_fills_every_step() {
    let (_d, model) = load_tiny();
    let reqs: Vec<SubmitRequest> = (0..6)
        .map(|i| {
            let mut r = SubmitRequest::new(prompt(i, 3), sampling(0.8, i as u64), 40);
            r.ignore_eos = true;
            r
        })
        .collect();
    let mut late = SubmitRequest::new(prompt(9, 30), sampling(0.8, 9), 8);
    late.ignore_eos = true;
    late.kv_policy = "streaming:budget=12,sink=2".parse().unwrap();
    // The engine reads prompts in chunks of at most a step (here 4 tokens).
    let mut expected: Vec<Vec<u32>> = reqs.iter().map(|r| alone(&model, r)).collect();
    expected.push(alone_in_chunks(&model, &late, 4));
    let config = EngineConfig {
        step_tokens: 4,
        ..small_config()
    };
    let engine = EngineHandle::spawn(Arc::new(model), config);
    let mut streams: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r).unwrap())
        .collect();
    streams.push(engine.submit(late).unwrap());
    for (i, s) in streams.into_iter().enumerate() {
        assert_eq!(collect(s)[0].0, expected[i], "request {i}");
    }
}

/// The text of a one-completion request, as streamed.
fn streamed_text(engine: &EngineHandle, req: SubmitRequest) -> String {
    let mut s = engine.submit(req).expect("submitted");
    let mut text = String::new();
    while let Some(ev) = s.blocking_recv() {
        match ev {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Error(e) => panic!("engine error: {e}"),
            _ => {}
        }
    }
    text
}

#[test]
fn stops_after_content_pass_the_opening_and_cut_the_rest() {
    let (_d, model) = load_tiny();
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let req = || {
        let mut r = SubmitRequest::new(prompt(3, 12), SamplingParams::greedy(), 32);
        r.ignore_eos = true;
        r
    };
    let full = streamed_text(&engine, req());
    // The first character of content as the stop string: a plain stop cuts
    // there, before any content; armed after content, it passes that first
    // piece and cuts at a later occurrence (or never).
    let stop: String = full
        .trim_start()
        .chars()
        .next()
        .expect("the greedy text has content")
        .to_string();
    let mut plain = req();
    plain.stop = vec![stop.clone()];
    let plain = streamed_text(&engine, plain);
    let mut deferred = req();
    deferred.stop_after_content = vec![stop.clone()];
    let deferred = streamed_text(&engine, deferred);
    assert!(plain.trim().is_empty(), "plain stop {stop:?}: {plain:?}");
    assert!(!deferred.trim().is_empty(), "{deferred:?} of {full:?}");
    assert!(full.starts_with(&deferred), "{deferred:?} of {full:?}");
    // (The tiny model's greedy text repeats its first character, so the
    // armed stop does cut it.)
    assert!(
        deferred.len() < full.len() && full[deferred.len()..].starts_with(&stop),
        "cut at {stop:?}: {deferred:?} of {full:?}"
    );
}

/// Adapters of rank 2 on every projection of the tiny model, from `seed`.
fn adapters(model: &tern_runtime::LoadedModel, seed: u64) -> Arc<tern_models::LoraSet> {
    use tern_models::{LoraAdapter, LoraTarget};
    let c = model.config();
    let dev = candle_core::Device::Cpu;
    let mut set = tern_models::LoraSet::default();
    for layer in 0..c.n_layer {
        for (k, target) in LoraTarget::ALL.into_iter().enumerate() {
            let (out, inp) = target.shape(c);
            let s = seed * 1000 + (layer * 10 + k) as u64;
            let a = candle_core::Tensor::from_vec(values(2 * inp, s, -0.5, 0.5), (2, inp), &dev);
            let b =
                candle_core::Tensor::from_vec(values(out * 2, s + 500, -0.5, 0.5), (out, 2), &dev);
            set.adapters.insert(
                (layer, target),
                LoraAdapter {
                    a: a.unwrap(),
                    b: b.unwrap(),
                    scale: 2.0,
                },
            );
        }
    }
    Arc::new(set)
}

/// Requests under different LoRA adapters (a server's per-request
/// adapters, addressed as `model`) share the engine's steps: each step runs
/// one forward per adapter set, and every request's tokens equal those of
/// the same request run alone under its adapters.
#[test]
fn requests_under_different_adapters_match_each_alone() {
    let (_d, model) = load_tiny();
    let sets = [None, Some(adapters(&model, 1)), Some(adapters(&model, 2))];
    let reqs: Vec<SubmitRequest> = sets
        .iter()
        .map(|set| {
            let mut r = SubmitRequest::new(prompt(3, 20), sampling(0.0, 7), 12);
            r.ignore_eos = true;
            r.adapters = set.clone();
            r
        })
        .collect();
    let expected: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            model.arch.set_adapters(r.adapters.clone());
            let tokens = alone(&model, r);
            model.arch.set_adapters(None);
            tokens
        })
        .collect();
    // The adapters change the answer, so the check below can fail.
    assert_ne!(expected[0], expected[1]);
    assert_ne!(expected[1], expected[2]);
    let engine = EngineHandle::spawn(Arc::new(model), small_config());
    let streams = engine.submit_all(reqs).unwrap();
    for (i, s) in streams.into_iter().enumerate() {
        assert_eq!(collect(s)[0].0, expected[i], "request {i}");
    }
    // They were batched together: fewer steps than tokens.
    let m = engine.metrics().snapshot();
    assert!(m.steps < 36, "steps {}", m.steps);
}

/// DRY's breakers are built once per list and shared by the requests that
/// send the same list (llama-server's default, every request): the second
/// request's breakers are the first's, a different list gets its own.
#[test]
fn dry_breakers_are_kept_for_the_list_requests_repeat() {
    let (_d, model) = load_tiny();
    let defaults = SamplingParams::default().dry_sequence_breakers;
    let first = model.dry_breakers(&defaults);
    assert!(Arc::ptr_eq(&first, &model.dry_breakers(&defaults)));
    let other = model.dry_breakers(&["\n".to_string()]);
    assert!(!Arc::ptr_eq(&first, &other));
    assert!(Arc::ptr_eq(
        &other,
        &model.dry_breakers(&["\n".to_string()])
    ));
}
