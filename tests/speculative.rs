//! Speculative decoding by prompt lookup on the real SmolLM2: the output is
//! plain decoding's, token for token, greedy and sampled, with stops,
//! logprobs and a grammar-free limit, while drafts were really accepted; a
//! compressing KV policy turns it off with its reason.

use std::sync::Arc;

use tern_runtime::engine::{
    Collected, EngineConfig, EngineHandle, FinishReason, SpecStats, Speculative, SubmitRequest,
};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;

use crate::support::real_model;

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

#[test]
fn a_compressing_kv_policy_turns_speculation_off_with_its_reason() {
    let engine = engine();
    let prompt = copy_prompt(&engine);
    let mut req = SubmitRequest::new(prompt, SamplingParams::greedy(), 12);
    req.kv_policy = "streaming:budget=64,sink=4".parse::<KvPolicy>().unwrap();
    let plain = run(&engine, req.clone(), Speculative::Off);
    let asked = run(&engine, req, Speculative::Ngram { max_draft: 8 });
    assert_eq!(asked.first().tokens, plain.first().tokens);
    let s = stats(&asked);
    assert_eq!((s.drafted, s.accepted), (0, 0));
    let why = s.off.expect("a reason");
    assert!(why.contains("streaming") && why.contains("evicts"), "{why}");
}
