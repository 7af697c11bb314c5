//! The cost of one compression event: a policy scoring a layer's cache and the
//! cache compacting to the kept entries, for SmolLM2-135M's shape (3 KV heads,
//! head dim 64) at several cache sizes. Run: `cargo bench --bench kv`.

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tern_models::{KvStore, ModelConfig};
use tern_runtime::kv::policy::{select, KvPolicy, ScoreInput};
use tern_runtime::kv::SeqCache;

const KV: usize = 3;
const HD: usize = 64;

fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 10_000) as f32 / 10_000.0
        })
        .collect()
}

fn config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        name: None,
        n_layer: 1,
        n_embd: 576,
        n_head: 9,
        n_kv_head: KV,
        head_dim: HD,
        n_ff: 1536,
        vocab_size: 49152,
        context_length: 8192,
        rope_base: 100_000.0,
        rope_freq_scale: 1.0,
        rms_eps: 1e-5,
        sliding: None,
    }
}

fn scoring(c: &mut Criterion) {
    for n in [1024usize, 4096] {
        let positions: Vec<Vec<u32>> = (0..KV).map(|_| (0..n as u32).collect()).collect();
        let cumulative: Vec<Vec<f32>> = (0..KV).map(|h| noise(n, h as u32 + 1)).collect();
        let recent: Vec<Vec<Vec<f32>>> = (0..KV)
            .map(|h| (0..8).map(|r| noise(n, (h * 8 + r) as u32 + 7)).collect())
            .collect();
        let keys: Vec<Vec<f32>> = (0..KV).map(|h| noise(n * HD, h as u32 + 99)).collect();
        for spec in [
            "streaming:budget=256",
            "h2o:budget=256",
            "snapkv:budget=256",
            "rkv:budget=256",
        ] {
            let policy: KvPolicy = spec.parse().expect("valid spec");
            let input = ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: n,
                positions: &positions,
                cumulative: &cumulative,
                recent_rows: &recent,
                keys: &keys,
                values: &[],
                queries: None,
                head_dim: HD,
            };
            c.bench_function(&format!("select {} C={n}", policy.name()), |b| {
                b.iter(|| select(&policy, &input))
            });
        }
    }
}

fn compress_event(c: &mut Criterion) {
    let cfg = config();
    for n in [1024usize, 4096] {
        let k = Tensor::from_vec(noise(KV * n * HD, 3), (KV, n, HD), &Device::Cpu).expect("k");
        let positions: Vec<u32> = (0..n as u32).collect();
        let weights =
            Tensor::from_vec(noise(KV * 3 * 8 * n, 5), (KV, 3, 8, n), &Device::Cpu).expect("w");
        for spec in ["snapkv:budget=256,every=1", "rkv:budget=256,every=1"] {
            let policy: KvPolicy = spec.parse().expect("valid spec");
            c.bench_function(&format!("score+compact {} C={n}", policy.name()), |b| {
                b.iter_batched(
                    || {
                        let mut cache = SeqCache::with_policy(&cfg, policy.clone());
                        cache.append(0, &k, &k, &positions).expect("append");
                        cache.observe_attention(0, &weights, None).expect("observe");
                        cache
                    },
                    |mut cache| cache.after_attention(0).expect("compress"),
                    BatchSize::LargeInput,
                )
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = scoring, compress_event
}
criterion_main!(benches);
