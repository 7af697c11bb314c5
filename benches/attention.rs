//! One decode step's attention for SmolLM2-135M's shape (9 query heads over 3
//! KV heads, head dim 64), at several cache sizes: Tern's in-place kernel over a
//! view of a larger cache buffer vs the same computation as candle tensor ops
//! (matmul, softmax, f16 rounding, matmul); and llama.cpp's two flash kernels
//! as `flash` repeats them (one token and a 32-row chunk take the per-key f16
//! kernel, a 512-row prefill the tiled f32 one). Run:
//! `cargo bench --bench attention -- --noplot`.

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use tern_models::attention::decode_tensors;
use tern_models::flash::attend_tensors;

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
            b.iter(|| {
                decode_tensors(
                    &q,
                    &k,
                    &v,
                    tern_models::KvDtype::F32,
                    GROUP,
                    scale as f32,
                    false,
                    None,
                )
                .unwrap()
            })
        });
        g.bench_function(format!("tensor_ops/{len}"), |b| {
            b.iter(|| tensor_path(&q, &k, &v, scale))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("flash_attention");
    g.sample_size(10);
    for (rows, len) in [
        (1usize, 256usize),
        (1, 511),
        (32, 512),
        (512, 512),
        (512, 1536),
    ] {
        let k = Tensor::randn(0f32, 1.0, (KV, len, HD), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (KV, len, HD), &dev).unwrap();
        let q = Tensor::randn(0f32, 1.0, (KV * GROUP, rows, HD), &dev).unwrap();
        // The new rows are the cache's last `rows` positions.
        let k_pos: Vec<u32> = (0..len as u32).collect();
        let heads: Vec<&[u32]> = (0..KV).map(|_| k_pos.as_slice()).collect();
        let q_pos = &k_pos[len - rows..];
        g.bench_function(format!("rows{rows}/cache{len}"), |b| {
            b.iter(|| attend_tensors(&q, q_pos, &k, &v, &heads, None, scale as f32, false).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
