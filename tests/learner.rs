//! The learner on the sampler's own kernels: a dense rollout's recorded
//! log-probabilities are the learner's pi_old bit for bit (real model, with
//! and without trained adapters), and recomputing blocks in the backward
//! pass gives the gradients that keeping their activations gives.

use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineConfig, EngineHandle, SubmitRequest};
use tern_runtime::sampler::SamplingParams;
use tern_runtime::LoadedModel;
use tern_trainer::learner::{Learner, Sample};

use crate::support::tiny::{write_tiny_model, TinySpec};
use crate::support::{real_gemma, real_model};

/// Gives every adapter's `B` small seeded values, so the adapters change
/// the model (a fresh adapter's `B` is zero).
fn perturb(learner: &Learner, seed: u64) {
    let mut s = seed | 1;
    for (name, var) in learner.params() {
        if !name.ends_with("lora_b") {
            continue;
        }
        let n = var.elem_count();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
            })
            .collect();
        let t = Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap();
        var.set(&t).unwrap();
    }
}

/// Samples eight 80-token completions at temperature 1 and checks each
/// token's recorded log-probability against the learner's score of the
/// whole batch (prompt shared, responses teacher-forced in one pass).
fn rollouts_equal_scores(engine: &EngineHandle, learner: &Learner, prompt: &[u32], seed: u64) {
    let sampling = SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let mut req = SubmitRequest::new(prompt.to_vec(), sampling, 80);
    req.n = 8;
    req.logprobs = true;
    let done = engine
        .submit(req)
        .unwrap()
        .collect_blocking()
        .unwrap()
        .into_completions();
    let samples: Vec<Sample> = done
        .iter()
        .map(|c| Sample::new(prompt.to_vec(), c.tokens.clone()))
        .collect();
    let scored = learner.score(&samples, 8, false).unwrap();
    let (mut tokens, mut longest) = (0, 0);
    for (i, (c, s)) in done.iter().zip(&scored).enumerate() {
        assert_eq!(c.logprobs.len(), s.len());
        for (j, (rec, lp)) in c.logprobs.iter().zip(s).enumerate() {
            assert_eq!(
                rec.logprob as f64, *lp,
                "completion {i} token {j}: sampler {} vs learner {lp}",
                rec.logprob
            );
        }
        tokens += s.len();
        longest = longest.max(s.len());
    }
    // Responses past 64 tokens are where one teacher-forced pass would take
    // the other attention kernel: they must be in the test.
    assert!(longest > 64, "longest response {longest}");
    assert!(tokens > 200, "{tokens} tokens");
}

#[test]
fn real_model_dense_rollouts_are_the_learners_pi_old_bit_for_bit() {
    let model = Arc::new(LoadedModel::load(&real_model()).unwrap());
    let engine = EngineHandle::spawn(model.clone(), EngineConfig::default());
    let all = tern_models::LoraTarget::parse_list("all").unwrap();
    let mut learner = Learner::with_model(model.clone(), &all, 8, 16.0, 1).unwrap();
    learner.set_prompt_chunk(engine.config().prompt_chunk());
    let msgs = ChatMessage::turn(None, "Tell me a short story about a fox and a river.");
    let prompt = model.chat_prompt(&msgs, ContentTokens::Special).unwrap();
    rollouts_equal_scores(&engine, &learner, &prompt, 3);
    // Trained adapters: the engine serves them, the learner scores with them.
    perturb(&learner, 9);
    engine
        .set_adapters(1, learner.adapters_snapshot().unwrap())
        .unwrap();
    rollouts_equal_scores(&engine, &learner, &prompt, 4);
}

/// Gemma 3's Q4_K_M runs on llama.cpp's repacked K-quant kernels, whose
/// order for a batch's leftover rows differs from the grouped rows': the
/// learner's one pass and the sampler's prefill and decode batches group
/// rows differently, so scores differ by that rounding only. A wrong mask,
/// position, kernel plan or adapter would move them by far more.
#[test]
fn real_gemma3_learner_scores_within_kernel_rounding_of_the_sampler() {
    let model = Arc::new(LoadedModel::load(&real_gemma()).unwrap());
    let engine = EngineHandle::spawn(model.clone(), EngineConfig::default());
    let all = tern_models::LoraTarget::parse_list("all").unwrap();
    let learner = Learner::with_model(model.clone(), &all, 8, 16.0, 1).unwrap();
    let prompt = model
        .tokenizer
        .encode("Question: What is 7 + 5?\nAnswer:", true, true)
        .unwrap();
    let sampling = SamplingParams {
        temperature: 1.0,
        seed: 3,
        ..SamplingParams::default()
    };
    let mut req = SubmitRequest::new(prompt.clone(), sampling, 40);
    req.n = 8;
    req.logprobs = true;
    let done = engine
        .submit(req)
        .unwrap()
        .collect_blocking()
        .unwrap()
        .into_completions();
    let samples: Vec<Sample> = done
        .iter()
        .map(|c| Sample::new(prompt.clone(), c.tokens.clone()))
        .collect();
    let scored = learner.score(&samples, 8, false).unwrap();
    let (mut n, mut sum, mut worst) = (0usize, 0f64, 0f64);
    for (c, s) in done.iter().zip(&scored) {
        for (rec, lp) in c.logprobs.iter().zip(s) {
            let d = (rec.logprob as f64 - lp).abs();
            n += 1;
            sum += d;
            worst = worst.max(d);
        }
    }
    let mean = sum / n as f64;
    eprintln!("gemma3 q4_k_m: {n} tokens, mean |d log p| {mean:.5}, worst {worst:.5}");
    assert!(n > 100, "{n} tokens");
    assert!(worst < 0.5 && mean < 0.05, "mean {mean}, worst {worst}");
}

#[test]
fn recomputed_blocks_give_the_stored_activations_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, &TinySpec::default());
    let all = tern_models::LoraTarget::parse_list("all").unwrap();
    let learner = Learner::load(Path::new(&path), &all, 4, 8.0, 3).unwrap();
    perturb(&learner, 5);
    let prompt: Vec<u32> = (0..21).map(|i| (i * 31 % 200 + 5) as u32).collect();
    let resp = |n: usize, k: u32| (0..n as u32).map(|i| i * k % 200 + 4).collect::<Vec<_>>();
    let samples = vec![
        Sample::new(prompt.clone(), resp(9, 3)),
        Sample::new(prompt.clone(), resp(70, 7)),
        Sample::new(prompt[..5].to_vec(), resp(4, 11)),
    ];
    let grads = |learner: &Learner| {
        let (g, out) = learner
            .accumulate(
                &samples,
                8,
                |i, j, lp| (lp, 1.0 + (i + j) as f64 / 10.0),
                || {},
            )
            .unwrap();
        (g, out.logprobs)
    };
    let (stored, lp_stored) = grads(&learner);
    learner.set_recompute(true);
    assert!(learner.recomputes());
    let (recomputed, lp_re) = grads(&learner);
    assert_eq!(lp_stored, lp_re, "the forward is the same either way");
    let mut reached = 0;
    for (a, b) in stored.iter().zip(&recomputed) {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.flatten_all().unwrap().to_vec1().unwrap(),
            b.flatten_all().unwrap().to_vec1().unwrap(),
        );
        reached += a.iter().any(|&x| x != 0.0) as usize;
        assert_eq!(a, b, "a parameter's gradient differs");
    }
    assert!(reached > 0, "the loss reached no parameter");
}
