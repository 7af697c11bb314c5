//! The rest of a decode step: the sampler over SmolLM2's 49,152 logits
//! (greedy, and temperature + top-p + repetition penalty as a chat request
//! samples), and one whole decode step of the real model through Tern's
//! backend at context depths 0 and 1024 (skipped with a note when the model
//! has not been pulled: `tern pull`). Run: `cargo bench --bench step -- --noplot`.

use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use tern_runtime::backend::{Backend, LogitsWanted, Row, TernBackend};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::{Sampler, SamplingParams};
use tern_runtime::LoadedModel;

const VOCAB: usize = 49_152;
const MODEL: &str = "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

fn logits(seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..VOCAB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 20_000) as f32 / 1_000.0 - 10.0
        })
        .collect()
}

fn sampler(c: &mut Criterion) {
    let l = logits(3);
    let history: Vec<u32> = (0..256).map(|i| (i * 97) % VOCAB as u32).collect();
    let mut g = c.benchmark_group("sampler");
    let mut greedy = Sampler::new(SamplingParams::greedy());
    g.bench_function("greedy", |b| b.iter(|| greedy.sample(&l, &history)));
    let mut chat = Sampler::new(SamplingParams {
        temperature: 0.7,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: 1,
        ..SamplingParams::default()
    });
    g.bench_function("temperature_top_p_penalty", |b| {
        b.iter(|| chat.sample(&l, &history))
    });
    g.finish();
}

fn decode_step(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    if !path.exists() {
        eprintln!(
            "decode_step skipped: {} not found (run `tern pull`)",
            path.display()
        );
        return;
    }
    let model = Arc::new(LoadedModel::load(&path).expect("load the real model"));
    let mut backend = TernBackend::new(model);
    let mut g = c.benchmark_group("decode_step");
    g.sample_size(20);
    for depth in [0usize, 1024] {
        let prompt: Vec<u32> = (0..depth.max(1) as u32)
            .map(|i| 1000 + (i * 31) % 40_000)
            .collect();
        let seq = backend
            .new_seq(&KvPolicy::Full, Default::default(), prompt.len() + 4096)
            .expect("a sequence");
        backend
            .forward(&[Row {
                seq,
                tokens: &prompt,
                start_pos: 0,
                logits: LogitsWanted::Last,
            }])
            .expect("prefill");
        backend.finish_prefill(seq).expect("prefill done");
        let mut pos = prompt.len();
        g.bench_function(format!("depth_{depth}"), |b| {
            b.iter(|| {
                let tok = [2000u32];
                let out = backend
                    .forward(&[Row {
                        seq,
                        tokens: &tok,
                        start_pos: pos,
                        logits: LogitsWanted::Last,
                    }])
                    .expect("decode");
                pos += 1;
                out
            })
        });
        backend.free(seq);
    }
    g.finish();
}

/// One decode step of `n` sequences in one ragged forward (what the engine runs
/// with `n` requests in flight), each sequence 64 tokens deep, against the same
/// step for one sequence: the batching gain is `n * t(1) / t(n)`.
fn batched_decode_step(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    if !path.exists() {
        eprintln!("batched_decode_step skipped: {} not found", path.display());
        return;
    }
    let model = Arc::new(LoadedModel::load(&path).expect("load the real model"));
    let mut backend = TernBackend::new(model);
    let mut g = c.benchmark_group("batched_decode_step");
    g.sample_size(20);
    for n in [1usize, 8] {
        let mut seqs = Vec::new();
        for s in 0..n {
            let prompt: Vec<u32> = (0..64u32)
                .map(|i| 1000 + (i * 31 + s as u32 * 7) % 40_000)
                .collect();
            let seq = backend
                .new_seq(&KvPolicy::Full, Default::default(), 4096)
                .expect("a sequence");
            backend
                .forward(&[Row {
                    seq,
                    tokens: &prompt,
                    start_pos: 0,
                    logits: LogitsWanted::Last,
                }])
                .expect("prefill");
            backend.finish_prefill(seq).expect("prefill done");
            seqs.push(seq);
        }
        let mut pos = 64;
        let tok = [2000u32];
        g.bench_function(format!("seqs_{n}"), |b| {
            b.iter(|| {
                let rows: Vec<Row> = seqs
                    .iter()
                    .map(|&seq| Row {
                        seq,
                        tokens: &tok,
                        start_pos: pos,
                        logits: LogitsWanted::Last,
                    })
                    .collect();
                let out = backend.forward(&rows).expect("decode");
                pos += 1;
                out
            })
        });
        for s in seqs {
            backend.free(s);
        }
    }
    g.finish();
}

criterion_group!(benches, sampler, decode_step, batched_decode_step);
criterion_main!(benches);
