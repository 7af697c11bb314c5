//! IQ4_NL in every order llama.cpp runs it: AVX2 against scalar bit for bit,
//! the single-row order against its definition, and all against an f64
//! evaluation of the format's meaning. (IQ4_XS runs in `k::tests` with the
//! other super-block formats; agreement with ggml's own code is checked where
//! llama.cpp is linked: `models/tests/kquant.rs` and `iq4.rs`.)

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gguf_types::OwnType;
use crate::quant::blocks::{BlockOrder, PackedWeights, WeightFormat, QK};
use crate::quant::dot::{best_kernel, Kernel};
use crate::quant::QLinear;

/// `n` blocks of `bytes` random bytes each, every block's leading f16 `d` a
/// modest positive or negative scale.
pub(crate) fn random_blocks(rng: &mut StdRng, n: usize, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; n * bytes];
    rng.fill(out.as_mut_slice());
    for b in out.chunks_exact_mut(bytes) {
        let d = half::f16::from_f32(rng.gen_range(-0.02f32..0.02));
        b[..2].copy_from_slice(&d.to_le_bytes());
    }
    out
}

const ROWS: [usize; 5] = [1, 3, 4, 8, 17];

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
}

/// Shapes covering both orders (rows % 8) and odd and even block counts
/// (the single-row order treats a last unpaired block on its own).
const SHAPES: [(usize, usize); 4] = [(40, 96), (67, 128), (16, 32), (9, 320)];

#[test]
fn iq4_nl_avx2_equals_scalar_bit_for_bit() {
    if best_kernel() != Kernel::Avx2 {
        eprintln!("no AVX2 on this CPU: nothing to compare");
        return;
    }
    let mut rng = StdRng::seed_from_u64(0x1a4);
    for (out, inp) in SHAPES {
        let data = random_blocks(&mut rng, out * inp / QK, 18);
        let w = QLinear::from_own(OwnType::Iq4Nl, out, inp, &data).unwrap();
        for rows in ROWS {
            let x = random(&mut rng, rows * inp);
            let xt =
                candle_core::Tensor::from_vec(x, (rows, inp), &candle_core::Device::Cpu).unwrap();
            let a = w.forward_with(&xt, Kernel::Avx2).unwrap();
            let s = w.forward_with(&xt, Kernel::Scalar).unwrap();
            let (a, s) = (
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                s.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&s), "[{out}, {inp}] x {rows} rows");
        }
    }
}

#[test]
fn iq4_nl_orders_follow_llama_cpp_and_the_values_are_the_formats() {
    let mut rng = StdRng::seed_from_u64(0x1a5);
    for (out, inp) in SHAPES {
        let data = random_blocks(&mut rng, out * inp / QK, 18);
        let order = BlockOrder::llama_cpp(WeightFormat::Iq4Nl, out);
        assert_eq!(order == BlockOrder::Repack, out % 8 == 0);
        let w = PackedWeights::from_ggml(WeightFormat::Iq4Nl, out, inp, &data, order).unwrap();
        // Dequantization is ggml's `d * kvalues[q]`, read from the raw bytes.
        let mut row = vec![0f32; inp];
        for r in 0..out {
            w.dequantize_row(r, &mut row);
            let raw = &data[r * inp / QK * 18..(r + 1) * inp / QK * 18];
            let mut want = vec![0f32; inp];
            for (blk, o) in raw.chunks_exact(18).zip(want.chunks_exact_mut(QK)) {
                super::nl::dequantize_block(blk, o);
            }
            assert_eq!(row, want);
        }
        let lin = QLinear::from_own(OwnType::Iq4Nl, out, inp, &data).unwrap();
        let dense = lin.to_dense().unwrap().to_vec2::<f32>().unwrap();
        for rows in ROWS {
            let x = random(&mut rng, rows * inp);
            let xt =
                candle_core::Tensor::from_vec(x.clone(), (rows, inp), &candle_core::Device::Cpu)
                    .unwrap();
            let y = lin.forward(&xt).unwrap().to_vec2::<f32>().unwrap();
            for r in 0..rows {
                for c in 0..out {
                    let xr = &x[r * inp..(r + 1) * inp];
                    let (want, mag) =
                        dense[c]
                            .iter()
                            .zip(xr)
                            .fold((0f64, 0f64), |(s, m), (&w, &x)| {
                                (s + w as f64 * x as f64, m + (w as f64 * x as f64).abs())
                            });
                    // Activations are quantized to 8 bits: a small relative error.
                    let err = (y[r][c] as f64 - want).abs();
                    assert!(
                        err <= 0.02 * mag + 1e-4,
                        "[{out}, {inp}] x {rows}: {} vs {want}",
                        y[r][c]
                    );
                }
            }
        }
    }
}

#[test]
fn iq4_nl_single_row_order_pairs_blocks_and_adds_the_last_alone() {
    // Three blocks, lanes all 1: blocks 0 and 1 each in their own accumulator,
    // block 2 added with one fused multiply-add after the horizontal sum.
    let dd = [1.0f32, 2.0, 0.5];
    let lanes = [[1i32; 8], [1; 8], [3; 8]];
    assert_eq!(super::nl::vec_dot_order(&dd, &lanes), 8.0 + 16.0 + 12.0);
}
