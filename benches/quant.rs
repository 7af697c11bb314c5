//! Criterion benchmarks of Tern's quantized linear layer (`tern_models::quant::QLinear`)
//! against candle's `QMatMul` on SmolLM2-135M's shapes: a decode-step MLP projection
//! (Q4_1, 1 row), the tied Q8_0 output projection (1 row), and a prefill chunk
//! (Q4_1, 64 rows), 8-row batched decode steps of both, and the K-quants (Q4_K at
//! 1, 8 and 64 rows, Q5_K and Q6_K at 1) on Gemma 3 270M's ffn_down shape.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tern_models::quant::QLinear;

/// Deterministic pseudo-random values in [-1, 1) (no RNG dependency needed).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn bench_case(
    c: &mut Criterion,
    name: &str,
    dtype: GgmlDType,
    rows: usize,
    out: usize,
    inp: usize,
) {
    let w = Tensor::from_vec(values(out * inp, 1), (out, inp), &Device::Cpu).expect("weight");
    let qw = Arc::new(QTensor::quantize(&w, dtype).expect("quantize"));
    let ours = QLinear::from_arc(qw.clone()).expect("qlinear");
    let theirs = QMatMul::from_arc(qw).expect("qmatmul");
    let x = Tensor::from_vec(values(rows * inp, 2), (rows, inp), &Device::Cpu).expect("x");
    let mut g = c.benchmark_group(name);
    g.bench_function(BenchmarkId::new("tern", ""), |b| {
        b.iter(|| ours.forward(&x).expect("forward"))
    });
    g.bench_function(BenchmarkId::new("candle", ""), |b| {
        b.iter(|| theirs.forward(&x).expect("forward"))
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_case(c, "q4_1 1x576 * 1536x576", GgmlDType::Q4_1, 1, 1536, 576);
    bench_case(c, "q8_0 1x576 * 49152x576", GgmlDType::Q8_0, 1, 49152, 576);
    bench_case(c, "q4_1 8x576 * 1536x576", GgmlDType::Q4_1, 8, 1536, 576);
    bench_case(c, "q8_0 8x576 * 49152x576", GgmlDType::Q8_0, 8, 49152, 576);
    bench_case(c, "q4_1 64x576 * 1536x576", GgmlDType::Q4_1, 64, 1536, 576);
    // K-quants on Gemma 3 270M's ffn_down shape (n_ff 2048 -> 640).
    bench_case(c, "q4_k 1x2048 * 640x2048", GgmlDType::Q4K, 1, 640, 2048);
    bench_case(c, "q4_k 8x2048 * 640x2048", GgmlDType::Q4K, 8, 640, 2048);
    bench_case(c, "q4_k 64x2048 * 640x2048", GgmlDType::Q4K, 64, 640, 2048);
    bench_case(c, "q6_k 1x2048 * 640x2048", GgmlDType::Q6K, 1, 640, 2048);
    bench_case(c, "q5_k 1x2048 * 640x2048", GgmlDType::Q5K, 1, 640, 2048);
}

criterion_group!(quant, benches);
criterion_main!(quant);
