//! Tests of [`super::QLinear`] against an independent scalar reference of ggml's
//! arithmetic, against candle's `QMatMul`, and of the AVX2 kernels against the
//! portable ones. Seeded random data; sizes small enough to run in well under a
//! second in release.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::blocks::{QuantizedActs, QK};
use super::dot::{self, Kernel};
use super::QLinear;

const DTYPES: [GgmlDType; 5] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q8_0,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
];
const ROWS: [usize; 5] = [1, 3, 4, 8, 17];
const IN_DIMS: [usize; 3] = [64, 576, 1536];
/// 67: odd, exercises every tile remainder; 300: enough work for the pool at 1 row.
const OUT_DIMS: [usize; 2] = [67, 300];

fn random(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn weight(rng: &mut StdRng, dtype: GgmlDType, out: usize, inp: usize) -> QTensor {
    // An offset so Q4_1's `m` matters.
    let w = Tensor::from_vec(random(rng, out * inp, -0.7, 1.0), (out, inp), &Device::Cpu)
        .expect("tensor");
    QTensor::quantize(&w, dtype).expect("quantize")
}

/// ggml's x86 activation quantization, written out independently of `blocks`:
/// per block `(quants, d as f16, s as f16)`.
fn ggml_quantize(x: &[f32]) -> Vec<([i32; QK], f64, f64)> {
    x.chunks_exact(QK)
        .map(|b| {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
            let mut q = [0i32; QK];
            for (q, v) in q.iter_mut().zip(b) {
                *q = (v * id).round_ties_even() as i32;
            }
            let sum: i32 = q.iter().sum();
            let dh = f16::from_f32(d).to_f32() as f64;
            let sh = f16::from_f32(d * sum as f32).to_f32() as f64;
            (q, dh, sh)
        })
        .collect()
}

/// The ggml block dot in f64 from the raw ggml bytes: per block
/// `d_w d_x sum(q_w q_x)` (+ `m_w s_x` for Q4_1). Returns `(value, sum of |terms|)`.
fn reference(
    dtype: GgmlDType,
    raw: &[u8],
    row: usize,
    inp: usize,
    x: &[([i32; QK], f64, f64)],
) -> (f64, f64) {
    let nb = inp / QK;
    let bb = match dtype {
        GgmlDType::Q4_0 => 18,
        GgmlDType::Q4_1 => 20,
        GgmlDType::Q5_0 => 22,
        GgmlDType::Q5_1 => 24,
        _ => 34,
    };
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32() as f64;
    let (mut val, mut mag) = (0.0, 0.0);
    for (b, (qx, dx, sx)) in x.iter().enumerate().take(nb) {
        let blk = &raw[(row * nb + b) * bb..(row * nb + b + 1) * bb];
        let dw = h(blk, 0);
        let qw: Vec<i32> = match dtype {
            GgmlDType::Q8_0 => blk[2..].iter().map(|&v| v as i8 as i32).collect(),
            // ggml's block_q5: d, (m,) the fifth bits as a little-endian u32, then
            // the low nibbles as Q4's.
            GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
                let at = if dtype == GgmlDType::Q5_1 { 4 } else { 2 };
                let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                let qs = &blk[at + 4..];
                let off = if dtype == GgmlDType::Q5_0 { 16 } else { 0 };
                (0..QK)
                    .map(|j| {
                        let lo = if j < 16 {
                            qs[j] & 0x0F
                        } else {
                            qs[j - 16] >> 4
                        } as u32;
                        (lo | ((qh >> j) & 1) << 4) as i32 - off
                    })
                    .collect()
            }
            _ => {
                let qs = if dtype == GgmlDType::Q4_1 {
                    &blk[4..]
                } else {
                    &blk[2..]
                };
                let off = if dtype == GgmlDType::Q4_0 { 8 } else { 0 };
                let lo = qs.iter().map(|&v| (v & 0x0F) as i32 - off);
                let hi = qs.iter().map(|&v| (v >> 4) as i32 - off);
                lo.chain(hi).collect()
            }
        };
        let sumi: i32 = qw.iter().zip(qx).map(|(a, b)| a * b).sum();
        let t = dw * dx * sumi as f64;
        val += t;
        mag += t.abs();
        if matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q5_1) {
            let t = h(blk, 2) * sx;
            val += t;
            mag += t.abs();
        }
    }
    (val, mag)
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

#[test]
fn quant_matches_reference_candle_and_scalar() {
    let mut rng = StdRng::seed_from_u64(0x7e27);
    let kernels: Vec<Kernel> = if dot::best_kernel() == Kernel::Avx2 {
        vec![Kernel::Avx2, Kernel::Scalar]
    } else {
        vec![Kernel::Scalar]
    };
    let (mut worst_ref, mut worst_candle) = (0.0f64, 0.0f64);
    for dtype in DTYPES {
        for &inp in &IN_DIMS {
            for &out in &OUT_DIMS {
                let qw = Arc::new(weight(&mut rng, dtype, out, inp));
                let raw = qw.data().expect("data").to_vec();
                let lin = QLinear::from_arc(qw.clone()).expect("qlinear");
                assert!(lin.is_native());
                assert_eq!(
                    (lin.out_dim(), lin.in_dim(), lin.dtype()),
                    (out, inp, super::WeightType::Ggml(dtype))
                );
                let mm = QMatMul::from_arc(qw).expect("qmatmul");
                for &rows in &ROWS {
                    let xv = random(&mut rng, rows * inp, -2.0, 2.0);
                    let x = Tensor::from_vec(xv.clone(), (rows, inp), &Device::Cpu).expect("x");
                    let mut outs = Vec::new();
                    for &k in &kernels {
                        let y = lin.forward_with(&x, k).expect("forward");
                        assert_eq!(y.dims(), &[rows, out]);
                        outs.push(
                            y.flatten_all()
                                .expect("flat")
                                .to_vec1::<f32>()
                                .expect("vec"),
                        );
                    }
                    let y = &outs[0];
                    // (c) AVX2 vs scalar: the same operations in the same order, so the
                    // same bits (stronger than the 1e-5 relative the design requires).
                    for other in &outs[1..] {
                        assert_eq!(
                            y, other,
                            "{dtype:?} rows={rows} in={inp} out={out}: avx2 != scalar"
                        );
                    }
                    // (a) independent f64 reference of ggml's formula: only f32
                    // accumulation rounding may differ, bounded by 1e-5 of the sum of the
                    // terms' magnitudes.
                    for r in 0..rows {
                        let xq = ggml_quantize(&xv[r * inp..(r + 1) * inp]);
                        for c in 0..out {
                            let (want, mag) = reference(dtype, &raw, c, inp, &xq);
                            let err = (y[r * out + c] as f64 - want).abs();
                            assert!(
                                err <= 1e-5 * mag + 1e-6,
                                "{dtype:?} rows={rows} in={inp} out={out} [{r},{c}]: {} vs {want} (mag {mag})",
                                y[r * out + c]
                            );
                            worst_ref = worst_ref.max(err / (mag + 1e-12));
                        }
                    }
                    // (b) candle's QMatMul (its own activation quantization): max abs
                    // difference below 1e-3 of the output's max magnitude.
                    let want = mm
                        .forward(&x)
                        .expect("candle")
                        .flatten_all()
                        .expect("flat")
                        .to_vec1::<f32>()
                        .expect("vec");
                    let diff = y
                        .iter()
                        .zip(&want)
                        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                    let rel = (diff / max_abs(&want)) as f64;
                    assert!(
                        rel < 1e-3,
                        "{dtype:?} rows={rows} in={inp} out={out}: vs candle {rel}"
                    );
                    worst_candle = worst_candle.max(rel);
                }
            }
        }
    }
    eprintln!("worst error vs reference (of term magnitude): {worst_ref:.3e}; vs candle (of max |y|): {worst_candle:.3e}");
}

/// Q4_0 in llama.cpp's repacked order (weights with a row count divisible by
/// 8): AVX2 equal to scalar bit for bit at every tile shape, within f32
/// rounding of the f64 reference, and not the plain order's bits.
#[test]
fn quant_q4_0_repacked_order_avx2_matches_scalar_bitwise() {
    use super::blocks::{BlockOrder, PackedWeights, WeightFormat};
    let mut rng = StdRng::seed_from_u64(0x40);
    let mut orders_differ = false;
    for &inp in &IN_DIMS {
        // 8 and 296 (= 37 groups of 8): both repacked by llama.cpp.
        for out in [8, 296] {
            let qw = weight(&mut rng, GgmlDType::Q4_0, out, inp);
            let raw = qw.data().expect("data").to_vec();
            let order = BlockOrder::llama_cpp(WeightFormat::Q4_0, out);
            assert_eq!(order, BlockOrder::Repack);
            let w =
                PackedWeights::from_ggml(WeightFormat::Q4_0, out, inp, &raw, order).expect("pack");
            let plain =
                PackedWeights::from_ggml(WeightFormat::Q4_0, out, inp, &raw, BlockOrder::VecDot)
                    .expect("pack");
            // 16 and more: the tiled kernel (`dot::tiles`).
            for &rows in ROWS.iter().chain(&[16, 33]) {
                let x = random(&mut rng, rows * inp, -2.0, 2.0);
                let y = w.matmul(&x, rows, Kernel::Scalar);
                if dot::best_kernel() == Kernel::Avx2 {
                    let a = w.matmul(&x, rows, Kernel::Avx2);
                    assert_eq!(a, y, "rows={rows} in={inp} out={out}: avx2 != scalar");
                }
                orders_differ |= plain.matmul(&x, rows, Kernel::Scalar) != y;
                for r in 0..rows {
                    let xq = ggml_quantize(&x[r * inp..(r + 1) * inp]);
                    for c in 0..out {
                        let (want, mag) = reference(GgmlDType::Q4_0, &raw, c, inp, &xq);
                        let err = (y[r * out + c] as f64 - want).abs();
                        assert!(
                            err <= 1e-5 * mag + 1e-6,
                            "rows={rows} in={inp} out={out} [{r},{c}]: {} vs {want}",
                            y[r * out + c]
                        );
                    }
                }
            }
        }
    }
    assert!(
        orders_differ,
        "the repacked and plain orders never differed"
    );
}

#[test]
fn quant_activation_quantization_avx2_matches_reference_bitwise() {
    let mut rng = StdRng::seed_from_u64(7);
    let cols = 4 * QK;
    // Random values, an all-zero block, and exact ties (amax 127: id = 1).
    let mut x = random(&mut rng, cols, -3.0, 3.0);
    x[QK..2 * QK].fill(0.0);
    for (i, v) in x[2 * QK..3 * QK].iter_mut().enumerate() {
        *v = i as f32 - 15.5;
    }
    x[2 * QK] = 127.0;
    for with_sums in [false, true] {
        let mut a = QuantizedActs::zeroed(1, 4, with_sums);
        let mut b = QuantizedActs::zeroed(1, 4, with_sums);
        super::blocks::quantize_rows_ref(&x, cols, 0..1, &mut a);
        if dot::best_kernel() == Kernel::Avx2 {
            dot::quantize_rows(Kernel::Avx2, &x, cols, 0..1, &mut b);
            for i in 0..4 {
                assert_eq!(a.qs[i].0, b.qs[i].0, "block {i}");
            }
            assert_eq!(a.d, b.d);
            assert_eq!(a.s, b.s);
        }
        // Ties round to even: 127 * 1 - ... -15.5 + 1 = -14.5 -> -14, -0.5 -> 0, 0.5 -> 0, 1.5 -> 2.
        let t = &a.qs[2].0;
        assert_eq!((t[1], t[15], t[16], t[17]), (-14, 0, 0, 2));
        assert_eq!(a.d[1], 0.0);
        assert!(a.qs[1].0.iter().all(|&q| q == 0));
    }
}

#[test]
fn quant_flattens_leading_dims_and_falls_back() {
    let mut rng = StdRng::seed_from_u64(11);
    let (out, inp) = (40, 96);
    let lin = QLinear::from_qtensor(weight(&mut rng, GgmlDType::Q4_1, out, inp)).expect("q");
    let x = Tensor::from_vec(
        random(&mut rng, 2 * 3 * inp, -1.0, 1.0),
        (2, 3, inp),
        &Device::Cpu,
    )
    .expect("x");
    let y3 = lin.forward(&x).expect("3d");
    assert_eq!(y3.dims(), &[2, 3, out]);
    let y2 = lin.forward(&x.reshape((6, inp)).expect("r")).expect("2d");
    assert_eq!(
        y3.flatten_all().expect("f").to_vec1::<f32>().expect("v"),
        y2.flatten_all().expect("f").to_vec1::<f32>().expect("v")
    );
    assert!(lin
        .forward(&Tensor::zeros((1, inp + 1), candle_core::DType::F32, &Device::Cpu).expect("z"))
        .is_err());

    // F32 weights are not native: candle's QMatMul runs them, same API.
    let w = Tensor::from_vec(
        random(&mut rng, out * inp, -1.0, 1.0),
        (out, inp),
        &Device::Cpu,
    )
    .expect("w");
    let lin = QLinear::from_qtensor(QTensor::quantize(&w, GgmlDType::F32).expect("q")).expect("l");
    assert!(!lin.is_native());
    let got = lin.forward(&x.reshape((6, inp)).expect("r")).expect("fwd");
    let want = x
        .reshape((6, inp))
        .expect("r")
        .matmul(&w.t().expect("t"))
        .expect("mm");
    let diff = (got - want)
        .expect("d")
        .abs()
        .expect("a")
        .max_all()
        .expect("m")
        .to_scalar::<f32>()
        .expect("s");
    assert!(diff < 1e-4, "{diff}");
}

#[test]
fn quant_concurrent_callers_agree() {
    let mut rng = StdRng::seed_from_u64(13);
    let (out, inp) = (512, 576);
    let lin = QLinear::from_qtensor(weight(&mut rng, GgmlDType::Q8_0, out, inp)).expect("q");
    let x =
        Tensor::from_vec(random(&mut rng, 5 * inp, -1.0, 1.0), (5, inp), &Device::Cpu).expect("x");
    let want = lin
        .forward(&x)
        .expect("f")
        .flatten_all()
        .expect("f")
        .to_vec1::<f32>()
        .expect("v");
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    let got = lin
                        .forward(&x)
                        .expect("f")
                        .flatten_all()
                        .expect("f")
                        .to_vec1::<f32>()
                        .expect("v");
                    assert_eq!(got, want);
                }
            });
        }
    });
}

/// F16 and BF16: the AVX2 dot equals the scalar one bit for bit in both of
/// llama.cpp's orders, at lengths with and without short last groups, and both
/// stay within f32 rounding of an f64 sum of the same products.
#[test]
fn quant_half_dot_avx2_matches_scalar_bitwise() {
    use super::float::{dot, dot_ref, HalfFormat, Order};
    let mut rng = StdRng::seed_from_u64(17);
    for format in [HalfFormat::F16, HalfFormat::BF16] {
        for n in [1, 7, 8, 31, 32, 33, 64, 100, 576] {
            let w: Vec<u16> = random(&mut rng, n, -1.0, 1.0)
                .into_iter()
                .map(|v| format.round(v))
                .collect();
            let x: Vec<u16> = random(&mut rng, n, -2.0, 2.0)
                .into_iter()
                .map(|v| format.round(v))
                .collect();
            let (mut exact, mut mag) = (0f64, 0f64);
            for (&a, &b) in w.iter().zip(&x) {
                let t = format.to_f32(a) as f64 * format.to_f32(b) as f64;
                exact += t;
                mag += t.abs();
            }
            for order in [Order::TinyBlas, Order::VecDot] {
                let s = dot_ref(format, order, &w, &x);
                assert!(
                    (s as f64 - exact).abs() <= 1e-6 * mag + 1e-7,
                    "{format:?} {order:?} n={n}: {s} vs {exact}"
                );
                if dot::best_kernel() == Kernel::Avx2 {
                    let a = dot(Kernel::Avx2, format, order, &w, &x);
                    assert_eq!(
                        a.to_bits(),
                        s.to_bits(),
                        "{format:?} {order:?} n={n}: avx2 {a} vs scalar {s}"
                    );
                }
            }
        }
    }
}

/// F16 and BF16 layers: native, AVX2 equal to scalar bit for bit at every tile
/// shape (1, 3, 4, 8, 17 rows; 67 weight rows take the vec_dot order, 300 take
/// tinyBLAS's from two rows on), close to candle's f32 product, and the
/// embedding rows exact.
#[test]
fn quant_half_layers_match_scalar_and_candle() {
    let mut rng = StdRng::seed_from_u64(19);
    for dtype in [GgmlDType::F16, GgmlDType::BF16] {
        for &inp in &[64, 100, 576] {
            for &out in &OUT_DIMS {
                let wv = random(&mut rng, out * inp, -1.0, 1.0);
                let w = Tensor::from_vec(wv, (out, inp), &Device::Cpu).expect("w");
                let qw = QTensor::quantize(&w, dtype).expect("quantize");
                let wd = qw.dequantize(&Device::Cpu).expect("deq");
                let lin = QLinear::from_qtensor(qw).expect("qlinear");
                assert!(lin.is_native(), "{dtype:?}");
                let ids = [0u32, (out - 1) as u32, 5];
                let rows = lin.rows(&ids).expect("rows");
                for (i, &id) in ids.iter().enumerate() {
                    let got = rows.get(i).expect("r").to_vec1::<f32>().expect("v");
                    let want = wd.get(id as usize).expect("r").to_vec1::<f32>().expect("v");
                    assert_eq!(got, want, "{dtype:?} row {id}");
                }
                for &r in &ROWS {
                    let xv = random(&mut rng, r * inp, -2.0, 2.0);
                    let x = Tensor::from_vec(xv, (r, inp), &Device::Cpu).expect("x");
                    let flat = |t: Tensor| {
                        t.flatten_all()
                            .expect("flat")
                            .to_vec1::<f32>()
                            .expect("vec")
                    };
                    let scalar = flat(lin.forward_with(&x, Kernel::Scalar).expect("fwd"));
                    if dot::best_kernel() == Kernel::Avx2 {
                        let avx = flat(lin.forward_with(&x, Kernel::Avx2).expect("fwd"));
                        assert_eq!(avx, scalar, "{dtype:?} rows={r} in={inp} out={out}");
                    }
                    let want = flat(x.matmul(&wd.t().expect("t")).expect("mm"));
                    let diff = scalar
                        .iter()
                        .zip(&want)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    // The activations are rounded to the weight's type first.
                    let tol = if dtype == GgmlDType::F16 { 2e-3 } else { 2e-2 };
                    assert!(diff <= tol * max_abs(&want), "{dtype:?} rows={r}: {diff}");
                }
            }
        }
    }
}

/// The learner's backward through a frozen quantized projection: `g W` from
/// blocks dequantized a tile at a time equals `g` times the whole weight
/// dequantized to f32, for every format a GGUF projection may hold.
#[test]
fn quant_backward_input_equals_the_dequantized_weights_gradient() {
    use super::WeightType;
    use crate::gguf_types::OwnType;
    let mut rng = StdRng::seed_from_u64(41);
    let types = [
        WeightType::Ggml(GgmlDType::Q4_0),
        WeightType::Ggml(GgmlDType::Q4_1),
        WeightType::Ggml(GgmlDType::Q5_0),
        WeightType::Ggml(GgmlDType::Q5_1),
        WeightType::Ggml(GgmlDType::Q8_0),
        WeightType::Ggml(GgmlDType::Q2K),
        WeightType::Ggml(GgmlDType::Q3K),
        WeightType::Ggml(GgmlDType::Q4K),
        WeightType::Ggml(GgmlDType::Q5K),
        WeightType::Ggml(GgmlDType::Q6K),
        WeightType::Ggml(GgmlDType::F16),
        WeightType::Ggml(GgmlDType::BF16),
        WeightType::Own(OwnType::Iq4Nl),
        WeightType::Own(OwnType::Iq4Xs),
    ];
    // 300 output rows: more than one tile of the backward.
    let (out, inp, rows) = (300, 512, 7);
    for t in types {
        let w = random(&mut rng, out * inp, -0.7, 1.0);
        let lin = match t {
            WeightType::Own(own) => {
                let bytes = super::quantize::quantize_to(t, &w).expect("quantize");
                QLinear::from_own(own, out, inp, &bytes).expect("own")
            }
            WeightType::Ggml(dtype) => {
                let wt = Tensor::from_vec(w, (out, inp), &Device::Cpu).expect("w");
                QLinear::from_qtensor(QTensor::quantize(&wt, dtype).expect("quantize"))
                    .expect("linear")
            }
        };
        let g = Tensor::from_vec(
            random(&mut rng, rows * out, -1.0, 1.0),
            (rows, out),
            &Device::Cpu,
        )
        .expect("g");
        let ours: Vec<f32> = lin
            .backward_input(&g)
            .expect("backward")
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let dense = lin.to_dense().expect("dense");
        let want: Vec<f32> = g
            .matmul(&dense)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale = max_abs(&want);
        assert!(scale > 0.0, "{t:?}");
        for (a, b) in ours.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{t:?}: {a} vs {b} (scale {scale})"
            );
        }
    }
}

/// The tiled Q4_0 kernel (repacked order, `dot::tiles`, from 16 activation
/// rows) over the column ranges the pool hands out: starting mid-tile, ending
/// mid-group, with 1-3 activation rows left over. Every column in range
/// equals the scalar kernel's bits, and no column outside it is written.
#[test]
fn quant_q4_0_tiles_match_scalar_bitwise_over_any_column_range() {
    use super::blocks::{BlockOrder, PackedWeights, WeightFormat};
    if dot::best_kernel() != Kernel::Avx2 {
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x41);
    for &inp in &IN_DIMS {
        let out = 296;
        let qw = weight(&mut rng, GgmlDType::Q4_0, out, inp);
        let raw = qw.data().expect("data").to_vec();
        let w = PackedWeights::from_ggml(WeightFormat::Q4_0, out, inp, &raw, BlockOrder::Repack)
            .expect("pack");
        for rows in [16, 19, 34, 64] {
            let x = random(&mut rng, rows * inp, -2.0, 2.0);
            let mut acts = QuantizedActs::zeroed(rows, inp / QK, false);
            dot::quantize_rows(Kernel::Avx2, &x, inp, 0..rows, &mut acts);
            for cols in [0..out, 4..out, 4..150, 8..13, 292..296] {
                let run = |kernel: Kernel| {
                    let mut y = vec![f32::NAN; rows * out];
                    let ptr = dot::OutPtr {
                        ptr: y.as_mut_ptr(),
                        stride: out,
                    };
                    // SAFETY: `y` holds rows * out floats and outlives the call.
                    unsafe { dot::gemm_range(kernel, &w, &acts, cols.clone(), ptr) };
                    y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                };
                let (a, s) = (run(Kernel::Avx2), run(Kernel::Scalar));
                assert_eq!(a, s, "rows={rows} in={inp} cols={cols:?}");
                for r in 0..rows {
                    for c in 0..out {
                        let written = !f32::from_bits(a[r * out + c]).is_nan();
                        assert_eq!(written, cols.contains(&c), "[{r},{c}] cols={cols:?}");
                    }
                }
            }
        }
    }
}

/// The AVX-512 VNNI kernels for the signed-byte formats (Q8_0, Q5_0 and
/// IQ4_NL in Q8_0's order, IQ4_NL repacked; sixteen activation rows at a
/// time, the rest by the AVX2 kernel) equals the scalar kernel bit for bit, on random weights
/// and on Q8_0 blocks at the byte range's edge (-128 everywhere), over
/// column ranges that split the weight groups unevenly.
#[test]
fn quant_avx512_signed_bytes_match_scalar_bitwise() {
    use super::blocks::{BlockOrder, PackedWeights, WeightFormat};
    if dot::best_kernel() != Kernel::Avx2 || !dot::avx512_vnni() {
        eprintln!("no AVX-512 VNNI on this CPU (or TERN_AVX512=0): nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x41);
    let (out, inp) = (48, 576);
    let mut cases = Vec::new();
    for (dtype, format) in [
        (GgmlDType::Q8_0, WeightFormat::Q8_0),
        (GgmlDType::Q5_0, WeightFormat::Q5_0),
    ] {
        let raw = weight(&mut rng, dtype, out, inp)
            .data()
            .expect("data")
            .to_vec();
        cases.push((format!("{dtype:?}"), format, raw));
    }
    let nl = super::iq4::tests::random_blocks(&mut rng, out * inp / QK, 18);
    cases.push(("IQ4_NL".into(), WeightFormat::Iq4Nl, nl.clone()));
    cases.push(("IQ4_NL repacked".into(), WeightFormat::Iq4Nl, nl));
    let mut edge = Vec::new();
    for _ in 0..out * inp / QK {
        edge.extend_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        edge.extend_from_slice(&[0x80; QK]);
    }
    cases.push(("Q8_0 at -128".into(), WeightFormat::Q8_0, edge));
    for (name, format, raw) in &cases {
        let order = if name.ends_with("repacked") {
            BlockOrder::Repack
        } else {
            BlockOrder::VecDot
        };
        let w = PackedWeights::from_ggml(*format, out, inp, raw, order).expect("pack");
        for rows in [16, 17, 20, 24, 31, 32, 33, 40, 70] {
            let x = random(&mut rng, rows * inp, -2.0, 2.0);
            let mut acts = super::blocks::QuantizedActs::zeroed(rows, inp / QK, false);
            dot::quantize_rows(Kernel::Avx2, &x, inp, 0..rows, &mut acts);
            let wide = dot::wide_acts(Kernel::Avx2, &w, &acts);
            assert!(wide.is_some(), "{name}: the wide kernel applies");
            for cols in [0..out, 4..28, 8..44, 44..48] {
                let mut got = vec![0f32; rows * out];
                let mut want = vec![0f32; rows * out];
                let at = |v: &mut Vec<f32>| dot::OutPtr {
                    ptr: v.as_mut_ptr(),
                    stride: out,
                };
                // SAFETY: both buffers hold `rows * out` f32, this thread alone.
                unsafe {
                    dot::gemm_range_with(
                        Kernel::Avx2,
                        &w,
                        &acts,
                        wide.as_ref(),
                        cols.clone(),
                        at(&mut got),
                    );
                    dot::gemm_range(Kernel::Scalar, &w, &acts, cols.clone(), at(&mut want));
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{name}, {rows} rows, columns {cols:?}"
                );
                assert!(got.iter().all(|v| v.is_finite()), "{name}, {rows} rows");
            }
        }
    }
}

/// Inside `alone::scope` each activation row of a product gets exactly the
/// bits of that row's one-row product, for every weight type Tern runs on
/// its own kernels, across the row counts where llama.cpp's order changes
/// (Q4_K repacked from 4 rows, the tiled K-quant matmul from 8, tinyBLAS
/// for F16/BF16 from 2, the AVX-512 groups from 16); outside it, some types
/// do differ (what the scope is for).
#[test]
fn quant_alone_rows_get_their_one_row_bits() {
    let mut rng = StdRng::seed_from_u64(77);
    let (out, inp) = (64, 512);
    let mut differ_outside = Vec::new();
    let mut layers: Vec<(String, QLinear)> = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::F16,
        GgmlDType::BF16,
    ]
    .into_iter()
    .map(|dtype| {
        let lin = QLinear::from_qtensor(weight(&mut rng, dtype, out, inp)).expect("q");
        (format!("{dtype:?}"), lin)
    })
    .collect();
    // IQ4_NL repacked (rows a multiple of 8) and not (60 rows).
    for n in [out, 60] {
        let data = super::iq4::tests::random_blocks(&mut rng, n * inp / QK, 18);
        let lin = QLinear::from_own(crate::gguf_types::OwnType::Iq4Nl, n, inp, &data).expect("iq4");
        layers.push((format!("IQ4_NL x {n}"), lin));
    }
    for (dtype, lin) in &layers {
        assert!(lin.is_native(), "{dtype}");
        for rows in [2, 3, 4, 5, 8, 9, 16, 17] {
            let x = random(&mut rng, rows * inp, -1.0, 1.0);
            let all = |x: Vec<f32>, n: usize| {
                let t = Tensor::from_vec(x, (n, inp), &Device::Cpu).expect("x");
                let y = lin.forward(&t).expect("forward");
                let y = y.flatten_all().expect("f").to_vec1::<f32>().expect("v");
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let alone: Vec<u32> = (0..rows)
                .flat_map(|r| all(x[r * inp..(r + 1) * inp].to_vec(), 1))
                .collect();
            let scoped = super::alone::scope(|| all(x.clone(), rows));
            assert_eq!(scoped, alone, "{dtype} x {rows} rows in scope");
            assert!(!super::alone::active());
            if all(x.clone(), rows) != alone {
                differ_outside.push(format!("{dtype} x {rows}"));
            }
        }
    }
    for case in ["Q4K x 4", "Q6K x 8", "F16 x 2", "IQ4_NL x 60 x 2"] {
        assert!(
            differ_outside.iter().any(|d| d == case),
            "{differ_outside:?}"
        );
    }
}
