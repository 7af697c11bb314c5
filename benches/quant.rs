//! Criterion benchmarks of Tern's quantized linear layer (`tern_models::quant::QLinear`)
//! against candle's `QMatMul` on SmolLM2-135M's shapes: a decode-step MLP projection
//! (Q4_1, 1 row), the tied Q8_0 output projection (1 row), and a prefill chunk
//! (Q4_1, 64 rows), 8-row batched decode steps of both, the K-quants (Q2_K,
//! Q3_K, Q4_K, Q5_K and Q6_K at 1, 8, 64 and 512 rows) on Gemma 3 270M's
//! ffn_down shape, Q4_0 in llama.cpp's repacked order against the plain
//! one (1, 8, 16, 64, 512 rows), and IQ4_NL (SmolLM2's MLP shape, repacked order) and
//! IQ4_XS (Gemma's ffn_down shape), which candle cannot run.

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
    if rows >= 64 {
        g.sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
    }
    g.bench_function(BenchmarkId::new("tern", ""), |b| {
        b.iter(|| ours.forward(&x).expect("forward"))
    });
    g.bench_function(BenchmarkId::new("candle", ""), |b| {
        b.iter(|| theirs.forward(&x).expect("forward"))
    });
    g.finish();
}

/// Q4_0 on SmolLM2's MLP shape in both orders Tern has: llama.cpp's repacked
/// gemm/gemv order (what a row count divisible by 8 gets) and the plain
/// vec_dot order.
fn bench_q4_0_orders(c: &mut Criterion, rows: usize, out: usize, inp: usize) {
    use tern_models::quant::blocks::{BlockOrder, PackedWeights, WeightFormat};
    let w = Tensor::from_vec(values(out * inp, 1), (out, inp), &Device::Cpu).expect("weight");
    let raw = QTensor::quantize(&w, GgmlDType::Q4_0)
        .expect("quantize")
        .data()
        .expect("data")
        .to_vec();
    let x = values(rows * inp, 2);
    let kernel = tern_models::quant::best_kernel();
    let mut g = c.benchmark_group(format!("q4_0 {rows}x{inp} * {out}x{inp}"));
    if rows >= 64 {
        g.sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
    }
    for (name, order) in [
        ("repack", BlockOrder::Repack),
        ("vec_dot", BlockOrder::VecDot),
    ] {
        let pw = PackedWeights::from_ggml(WeightFormat::Q4_0, out, inp, &raw, order).expect("pack");
        g.bench_function(BenchmarkId::new(name, ""), |b| {
            b.iter(|| pw.matmul(&x, rows, kernel))
        });
    }
    g.finish();
}

/// An IQ4 weight quantized by Tern's port of ggml's quantizer, on Tern's
/// kernels alone (candle has no such types).
fn bench_iq4(
    c: &mut Criterion,
    own: tern_models::gguf_types::OwnType,
    rows: usize,
    out: usize,
    inp: usize,
) {
    use tern_models::gguf_types::OwnType;
    use tern_models::quant::quantize::iq4;
    let w = values(out * inp, 1);
    let mut raw = Vec::new();
    match own {
        OwnType::Iq4Nl => iq4::iq4_nl(&w, &mut raw),
        OwnType::Iq4Xs => iq4::iq4_xs(&w, &mut raw),
    }
    let ours = QLinear::from_own(own, out, inp, &raw).expect("qlinear");
    let x = Tensor::from_vec(values(rows * inp, 2), (rows, inp), &Device::Cpu).expect("x");
    let name = format!("{} {rows}x{inp} * {out}x{inp}", own.name().to_lowercase());
    let mut g = c.benchmark_group(name);
    if rows >= 64 {
        g.sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
    }
    g.bench_function(BenchmarkId::new("tern", ""), |b| {
        b.iter(|| ours.forward(&x).expect("forward"))
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    for rows in [1, 4, 8, 16, 64, 512] {
        bench_q4_0_orders(c, rows, 1536, 576);
    }
    bench_case(c, "q4_1 1x576 * 1536x576", GgmlDType::Q4_1, 1, 1536, 576);
    bench_case(c, "q8_0 1x576 * 49152x576", GgmlDType::Q8_0, 1, 49152, 576);
    bench_case(c, "q4_1 8x576 * 1536x576", GgmlDType::Q4_1, 8, 1536, 576);
    bench_case(c, "q8_0 8x576 * 49152x576", GgmlDType::Q8_0, 8, 49152, 576);
    bench_case(c, "q4_1 64x576 * 1536x576", GgmlDType::Q4_1, 64, 1536, 576);
    // K-quants on Gemma 3 270M's ffn_down shape (n_ff 2048 -> 640).
    for (fmt, dtype) in [
        ("q2_k", GgmlDType::Q2K),
        ("q3_k", GgmlDType::Q3K),
        ("q4_k", GgmlDType::Q4K),
        ("q5_k", GgmlDType::Q5K),
        ("q6_k", GgmlDType::Q6K),
    ] {
        for rows in [1, 8, 64, 512] {
            let name = format!("{fmt} {rows}x2048 * 640x2048");
            bench_case(c, &name, dtype, rows, 640, 2048);
        }
    }
    for rows in [1, 8, 64] {
        bench_iq4(c, tern_models::gguf_types::OwnType::Iq4Nl, rows, 1536, 576);
    }
    for rows in [1, 8, 64, 512] {
        bench_iq4(c, tern_models::gguf_types::OwnType::Iq4Xs, rows, 640, 2048);
    }
}

criterion_group!(quant, benches);
criterion_main!(quant);
