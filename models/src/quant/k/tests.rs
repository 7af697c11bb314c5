//! The K-quant kernels: AVX2 against scalar bit for bit at several batch sizes
//! and in every order, both against an f64 evaluation of the formats' meaning,
//! and the Q8_K quantizers' semantics. (Agreement with ggml's own code, object
//! for object, is checked where llama.cpp is linked: `models/tests/kquant.rs`.)

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::q8k::{quantize_block, quantize_block_x4, Q8KActs, Q8KBlock};
use super::{KFormat, KWeights, Order, QK_K};
use crate::quant::dot::{best_kernel, Kernel};

const ROWS: [usize; 5] = [1, 3, 4, 8, 17];

fn random(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn weights(rng: &mut StdRng, format: KFormat, out: usize, inp: usize, order: Order) -> KWeights {
    let dtype = match format {
        KFormat::Q2K => GgmlDType::Q2K,
        KFormat::Q3K => GgmlDType::Q3K,
        KFormat::Q4K => GgmlDType::Q4K,
        KFormat::Q5K => GgmlDType::Q5K,
        KFormat::Q6K => GgmlDType::Q6K,
        KFormat::Iq4Xs => {
            // candle cannot quantize to IQ4_XS; every byte pattern is a valid
            // block once `d` is a modest f16.
            let data = crate::quant::iq4::tests::random_blocks(rng, out * inp / QK_K, 136);
            return KWeights::from_ggml(format, out, inp, &data, order).expect("weights");
        }
    };
    let w = Tensor::from_vec(random(rng, out * inp, -0.6, 1.0), (out, inp), &Device::Cpu)
        .expect("tensor");
    let q = QTensor::quantize(&w, dtype).expect("quantize");
    KWeights::from_ggml(format, out, inp, &q.data().expect("data"), order).expect("weights")
}

/// Every (format, order) Tern runs.
fn cases() -> Vec<(KFormat, Order)> {
    vec![
        (KFormat::Q2K, Order::VecDot),
        (KFormat::Q3K, Order::VecDot),
        (KFormat::Q4K, Order::VecDot),
        (KFormat::Q4K, Order::Repack),
        (KFormat::Q5K, Order::VecDot),
        (KFormat::Q6K, Order::VecDot),
        (KFormat::Iq4Xs, Order::VecDot),
    ]
}

#[test]
fn kquant_avx2_equals_scalar_bit_for_bit() {
    if best_kernel() != Kernel::Avx2 {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x4b);
    for (format, order) in cases() {
        for (out, inp) in [(40, 256), (67, 768), (300, 512)] {
            let w = weights(&mut rng, format, out, inp, order);
            for rows in ROWS {
                let x = random(&mut rng, rows * inp, -2.0, 2.0);
                let a = w.matmul(&x, rows, Kernel::Avx2);
                let s = w.matmul(&x, rows, Kernel::Scalar);
                assert_eq!(a, s, "{format:?} {order:?} [{out}, {inp}] x {rows} rows");
            }
        }
    }
}

/// The f64 value of `sum_j w_j * x_j` over the dequantized weights and the
/// activations as quantized.
fn reference(w: &KWeights, acts: &Q8KActs, c: usize, r: usize) -> (f64, f64) {
    let mut row = vec![0f32; w.cols];
    w.dequantize_row(c, &mut row);
    let (mut val, mut mag) = (0f64, 0f64);
    for (j, &wv) in row.iter().enumerate() {
        let b = &acts.row(r)[j / QK_K];
        let t = wv as f64 * b.d as f64 * b.qs[j % QK_K] as f64;
        val += t;
        mag += t.abs();
    }
    (val, mag)
}

#[test]
fn kquant_products_match_the_formats_meaning() {
    let mut rng = StdRng::seed_from_u64(0x4c);
    for (format, order) in cases() {
        let (out, inp) = (24, 512);
        let w = weights(&mut rng, format, out, inp, order);
        for rows in [1, 5] {
            let x = random(&mut rng, rows * inp, -2.0, 2.0);
            let y = w.matmul(&x, rows, best_kernel());
            let acts = Q8KActs::quantize(&x, inp, rows, w.grouped_rows(rows));
            for r in 0..rows {
                for c in 0..out {
                    let (want, mag) = reference(&w, &acts, c, r);
                    let got = y[r * out + c] as f64;
                    // Dequantized values are rounded to f32 (and fused) where the
                    // kernel keeps integers, so allow a little more than f32 sums.
                    assert!(
                        (got - want).abs() <= 2e-5 * mag + 1e-6,
                        "{format:?} {order:?} [{r},{c}]: {got} vs {want} (mag {mag})"
                    );
                }
            }
        }
    }
}

#[test]
fn kquant_q8k_quantizers_follow_ggml() {
    let mut rng = StdRng::seed_from_u64(0x4d);
    let mut x = random(&mut rng, QK_K, -3.0, 3.0);
    // The largest magnitude negative and first: the reference's d is positive,
    // quant -127 there; the 4x8 variant also picks positive d (no +amax value).
    x[5] = -4.0;
    let (mut a, mut b) = (Q8KBlock::ZERO, Q8KBlock::ZERO);
    quantize_block(&x, &mut a);
    quantize_block_x4(&x, &mut b);
    assert_eq!(a.qs[5], -127);
    assert_eq!(b.qs[5], -127);
    assert!(a.d > 0.0 && b.d > 0.0);
    // Now +4 appears later too: the reference keeps the first (-4, d > 0), the
    // 4x8 variant turns to d < 0 because a value equals +amax.
    x[200] = 4.0;
    quantize_block(&x, &mut a);
    quantize_block_x4(&x, &mut b);
    assert!(a.d > 0.0 && b.d < 0.0);
    assert_eq!((a.qs[200], b.qs[200]), (127, -127));
    for (bl, qs) in [(&a, &a.qs), (&b, &b.qs)] {
        for (k, s) in bl.bsums.iter().enumerate() {
            assert_eq!(
                *s as i32,
                qs[16 * k..16 * k + 16]
                    .iter()
                    .map(|&q| q as i32)
                    .sum::<i32>()
            );
        }
    }
    // All zero: everything zero.
    quantize_block(&[0.0; QK_K], &mut a);
    assert!(a.d == 0.0 && a.qs.iter().all(|&q| q == 0) && a.bsums.iter().all(|&s| s == 0));
}

#[test]
fn kquant_repack_rows_split_into_gemm_groups_and_gemv_rest() {
    let mut rng = StdRng::seed_from_u64(0x4e);
    let w = weights(&mut rng, KFormat::Q4K, 16, 256, Order::Repack);
    assert_eq!(w.grouped_rows(17), 16);
    assert_eq!(w.grouped_rows(3), 0);
    let v = weights(&mut rng, KFormat::Q4K, 16, 256, Order::VecDot);
    assert_eq!(v.grouped_rows(17), 0);
    assert_eq!(super::llama_cpp_order(KFormat::Q4K, 16), Order::Repack);
    assert_eq!(super::llama_cpp_order(KFormat::Q4K, 12), Order::VecDot);
    assert_eq!(super::llama_cpp_order(KFormat::Q6K, 16), Order::VecDot);
    // A malformed matrix is an error, not a panic.
    assert!(KWeights::from_ggml(KFormat::Q4K, 2, 255, &[0; 288], Order::VecDot).is_err());
    assert!(KWeights::from_ggml(KFormat::Q6K, 2, 256, &[0; 419], Order::VecDot).is_err());
}

#[test]
fn kquant_unsupported_types_are_refused_by_name() {
    use crate::quant::QLinear;
    let mut rng = StdRng::seed_from_u64(0x4f);
    let w = Tensor::from_vec(random(&mut rng, 8 * 256, -1.0, 1.0), (8, 256), &Device::Cpu)
        .expect("tensor");
    // Q8_K and Q8_1 are activation formats; no GGUF ships weights in them.
    for dtype in [GgmlDType::Q8K, GgmlDType::Q8_1] {
        let q = QTensor::quantize(&w, dtype).expect("quantize");
        let err = QLinear::from_qtensor(q).expect_err("no kernel").to_string();
        assert!(err.contains(&format!("{dtype:?}")), "{err}");
    }
    for dtype in [
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        let q = QTensor::quantize(&w, dtype).expect("quantize");
        assert!(QLinear::from_qtensor(q).expect("native").is_native());
    }
}

/// The multi-row kernels (each weight super-block unpacked once per tile of
/// activation rows) give every output exactly what the one-output kernel gives,
/// across tile edges too.
#[test]
fn kquant_row_tiles_equal_one_output_dots() {
    let mut rng = StdRng::seed_from_u64(0x4d);
    for (format, order) in cases() {
        let w = weights(&mut rng, format, 24, 512, order);
        for rows in [1, 5, 8, 31, 32, 33, 70] {
            let x = random(&mut rng, rows * 512, -2.0, 2.0);
            let acts = Q8KActs::quantize(&x, 512, rows, w.grouped_rows(rows));
            for kernel in [Kernel::Scalar, best_kernel()] {
                let y = w.matmul(&x, rows, kernel);
                for r in 0..rows {
                    for c in 0..w.rows {
                        let one = w.dot(kernel, &acts, c, r);
                        assert_eq!(
                            y[r * w.rows + c].to_bits(),
                            one.to_bits(),
                            "{format:?} {order:?} {kernel:?} rows {rows} ({r}, {c})"
                        );
                    }
                }
            }
        }
    }
}

/// The AVX-512 VNNI kernels (Q4_K repacked, Q6_K and IQ4_XS tiled, groups of
/// sixteen activation rows) give the AVX2 kernels' bits, on random weights
/// and on extreme blocks whose integer parts are largest (Q4_K: every quant
/// 15, every scale 63; Q6_K: every quant 63, every scale -128; activations
/// at -128), across the sixteen/eight/four/one row boundaries.
#[test]
fn kquant_avx512_equals_avx2_bit_for_bit() {
    if best_kernel() != Kernel::Avx2 || !crate::quant::dot::avx512_vnni() {
        eprintln!("no AVX-512 VNNI on this CPU (or TERN_AVX512=0): nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x4e);
    let (out, inp) = (24, 768);
    let blocks = out * inp / QK_K;
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let mut q4 = Vec::new();
    let mut q6 = Vec::new();
    for _ in 0..blocks {
        q4.extend_from_slice(&f16(0.01));
        q4.extend_from_slice(&f16(0.002));
        q4.extend_from_slice(&[0xFF; 12 + 128]);
        q6.extend_from_slice(&[0xFF; 128 + 64]);
        q6.extend_from_slice(&[0x80; 16]);
        q6.extend_from_slice(&f16(0.001));
    }
    let cases = [
        (
            "Q4_K random",
            weights(&mut rng, KFormat::Q4K, out, inp, Order::Repack),
        ),
        (
            "Q4_K extreme",
            KWeights::from_ggml(KFormat::Q4K, out, inp, &q4, Order::Repack).expect("q4"),
        ),
        (
            "Q6_K random",
            weights(&mut rng, KFormat::Q6K, out, inp, Order::VecDot),
        ),
        (
            "Q6_K extreme",
            KWeights::from_ggml(KFormat::Q6K, out, inp, &q6, Order::VecDot).expect("q6"),
        ),
        (
            "IQ4_XS random",
            weights(&mut rng, KFormat::Iq4Xs, out, inp, Order::VecDot),
        ),
    ];
    for (name, w) in &cases {
        for rows in [8, 15, 16, 23, 24, 28, 31, 32, 33, 40, 52, 70] {
            let x = if name.ends_with("extreme") {
                vec![-2.0; rows * inp]
            } else {
                random(&mut rng, rows * inp, -2.0, 2.0)
            };
            let wide = w.matmul_with(&x, rows, Kernel::Avx2, true);
            let narrow = w.matmul_with(&x, rows, Kernel::Avx2, false);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&wide), bits(&narrow), "{name}, {rows} rows");
            assert!(wide.iter().all(|v| v.is_finite()), "{name}, {rows} rows");
        }
    }
}

/// The fused gated unit gives, output for output, the bits of the gate and
/// up products run apart and then the activation (SiLU and GELU), across
/// tile edges (264 columns: a last tile of 8) and row counts on both sides
/// of the grouped paths; pairs the kernels do not take alike are declined.
#[test]
fn kquant_fused_glu_equals_the_products_apart() {
    if best_kernel() != Kernel::Avx2 {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x61);
    let (out, inp) = (264, 512);
    let pairs = [
        (KFormat::Q4K, Order::Repack),
        (KFormat::Q5K, Order::VecDot),
        (KFormat::Q6K, Order::VecDot),
        (KFormat::Iq4Xs, Order::VecDot),
    ];
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (format, order) in pairs {
        let gate = weights(&mut rng, format, out, inp, order);
        let up = weights(&mut rng, format, out, inp, order);
        for rows in [1, 3, 4, 8, 17, 33, 300] {
            assert!(gate.fuses_with(&up, rows), "{format:?} x {rows}");
            // Gates past +-10 reach GELU's saturated branches.
            let x = random(&mut rng, rows * inp, -4.0, 4.0);
            let (g, u) = (
                gate.matmul(&x, rows, Kernel::Avx2),
                up.matmul(&x, rows, Kernel::Avx2),
            );
            let silu = gate.matmul_glu(&up, &x, rows, &crate::exact::swiglu_into);
            let gelu = gate.matmul_glu(&up, &x, rows, &crate::exact::geglu_tanh_into);
            let name = format!("{format:?} {order:?} x {rows} rows");
            assert_eq!(
                bits(&silu.expect("fused")),
                bits(&crate::exact::swiglu(&g, &u)),
                "{name}"
            );
            assert_eq!(
                bits(&gelu.expect("fused")),
                bits(&crate::exact::geglu_tanh(&g, &u)),
                "{name}"
            );
        }
    }
    let q4 = weights(&mut rng, KFormat::Q4K, out, inp, Order::Repack);
    let q6 = weights(&mut rng, KFormat::Q6K, out, inp, Order::VecDot);
    let q2 = weights(&mut rng, KFormat::Q2K, out, inp, Order::VecDot);
    let x = random(&mut rng, 4 * inp, -2.0, 2.0);
    assert!(q4
        .matmul_glu(&q6, &x, 4, &crate::exact::swiglu_into)
        .is_none());
    assert!(q2
        .matmul_glu(&q2, &x, 4, &crate::exact::swiglu_into)
        .is_none());
}

/// Inside `alone::scope` every format and order gives each activation row
/// its one-row bits, in the plain product and in the fused gated unit.
#[test]
fn kquant_alone_rows_get_their_one_row_bits() {
    let mut rng = StdRng::seed_from_u64(0x62);
    let (out, inp) = (64, 512);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (format, order) in cases() {
        let w = weights(&mut rng, format, out, inp, order);
        let up = weights(&mut rng, format, out, inp, order);
        for rows in [2, 3, 4, 5, 6, 7, 8, 9, 16, 17] {
            let x = random(&mut rng, rows * inp, -2.0, 2.0);
            let one = |r: usize| &x[r * inp..(r + 1) * inp];
            let name = format!("{format:?} {order:?} x {rows} rows");
            let alone: Vec<f32> = (0..rows)
                .flat_map(|r| w.matmul(one(r), 1, best_kernel()))
                .collect();
            let scoped = crate::quant::alone::scope(|| w.matmul(&x, rows, best_kernel()));
            assert_eq!(bits(&scoped), bits(&alone), "{name}");
            let glu = |x: &[f32], n: usize| w.matmul_glu(&up, x, n, &crate::exact::swiglu_into);
            if let Some(fused) = crate::quant::alone::scope(|| glu(&x, rows)) {
                let alone: Vec<f32> = (0..rows)
                    .flat_map(|r| glu(one(r), 1).expect("fuses at one row"))
                    .collect();
                assert_eq!(bits(&fused), bits(&alone), "{name}, fused");
            }
        }
    }
}
