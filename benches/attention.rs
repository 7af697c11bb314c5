//! One decode step's attention for SmolLM2-135M's shape (9 query heads over 3
//! KV heads, head dim 64), at several cache sizes: Tern's in-place kernel over a
//! view of a larger cache buffer vs the same computation as candle tensor ops
//! (matmul, softmax, f16 rounding, matmul). Run: `cargo bench --bench attention`.

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use tern_models::attention::decode_tensors;

const KV: usize = 3;
const GROUP: usize = 3;
const HD: usize = 64;

fn tensor_path(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Tensor {
    let q = q.reshape((KV, GROUP, HD)).unwrap();
    let s = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    let w = candle_nn::ops::softmax_last_dim(&s).unwrap();
    let w = w
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    w.matmul(v).unwrap()
}

fn bench(c: &mut Criterion) {
    let dev = Device::Cpu;
    let scale = 1.0 / (HD as f64).sqrt();
    let mut g = c.benchmark_group("decode_attention");
    for len in [256usize, 1024, 4096] {
        // The cache buffer has spare room, as a live sequence's does.
        let cap = len + len / 4;
        let kb = Tensor::randn(0f32, 1.0, (KV, cap, HD), &dev).unwrap();
        let vb = Tensor::randn(0f32, 1.0, (KV, cap, HD), &dev).unwrap();
        let k = kb.narrow(1, 0, len).unwrap();
        let v = vb.narrow(1, 0, len).unwrap();
        let q = Tensor::randn(0f32, 1.0, (KV * GROUP, 1, HD), &dev).unwrap();
        g.bench_function(format!("in_place/{len}"), |b| {
            b.iter(|| decode_tensors(&q, &k, &v, GROUP, scale as f32, false).unwrap())
        });
        g.bench_function(format!("tensor_ops/{len}"), |b| {
            b.iter(|| tensor_path(&q, &k, &v, scale))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
