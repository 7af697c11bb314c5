//! IQ4_NL against the ggml code llama.cpp runs, called in process:
//! dequantization, the plain buffer's products (`ggml_vec_dot_iq4_nl_q8_0` for
//! one activation row, llamafile's tinyBLAS from two) and the repacked
//! `iq4_nl_8x8_q8_0` gemm and gemv, bit for bit; the IQ4_NL and IQ4_XS
//! quantizers byte for byte; and the learner's dense weights of tiny models
//! llama.cpp quantized to them equal to ggml's dequantization. (IQ4_XS's
//! kernels run with the K-quants' in `kquant.rs`; those models run through
//! Tern and llama.cpp in the root package's `tests/iq4.rs`.)

use std::ffi::c_void;

use tern_models::gguf_types::OwnType;
use tern_models::quant::blocks::{BlockOrder, PackedWeights, WeightFormat, QK};
use tern_models::quant::Kernel;

use crate::support::ggml::{ggml_mul_mat_plain, ggml_quantize, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS};
use crate::support::quantize::{self, LLAMA_FTYPE_MOSTLY_IQ4_NL};
use crate::support::repacked::{ggml_repacked_mul_mat_with, repack_x8, BLOCK_BYTES};
use crate::support::tiny::TinySpec;
use crate::support::tiny_quant::{tiny_iq4, PROJECTIONS};
use crate::support::{bits, kernels, values};

extern "C" {
    fn ggml_gemv_iq4_nl_8x8_q8_0(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: i32,
        nc: i32,
    );
    fn ggml_gemm_iq4_nl_8x8_q8_0(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: i32,
        nc: i32,
    );
}

#[test]
fn iq4_nl_dequantization_matches_ggml_bit_for_bit() {
    let (rows, cols) = (9, 96);
    let raw = ggml_quantize(
        GGML_TYPE_IQ4_NL,
        &values(rows * cols, 5, -1.0, 0.7),
        rows,
        cols,
    );
    let row_bytes = raw.len() / rows;
    let order = BlockOrder::llama_cpp(WeightFormat::Iq4Nl, rows);
    let w = PackedWeights::from_ggml(WeightFormat::Iq4Nl, rows, cols, &raw, order).unwrap();
    for r in 0..rows {
        let want = quantize::ggml_dequantize(
            GGML_TYPE_IQ4_NL as quantize::ggml_type,
            &raw[r * row_bytes..][..row_bytes],
            cols,
        );
        let mut ours = vec![0f32; cols];
        w.dequantize_row(r, &mut ours);
        assert_eq!(bits(&ours), bits(&want), "row {r}");
    }
}

#[test]
fn iq4_nl_plain_products_match_ggml_mul_mat_bit_for_bit() {
    // 13 rows: not repacked. One activation row runs ggml_vec_dot_iq4_nl_q8_0
    // (odd block counts take its last-block path), two or more tinyBLAS.
    for cols in [96, 128, 576] {
        let n = 13;
        let raw = ggml_quantize(GGML_TYPE_IQ4_NL, &values(n * cols, 7, -0.8, 1.0), n, cols);
        let w = PackedWeights::from_ggml(WeightFormat::Iq4Nl, n, cols, &raw, BlockOrder::VecDot)
            .unwrap();
        for rows in [1, 2, 3, 4, 8, 17] {
            let x = values(rows * cols, 11 + rows as u64, -2.0, 2.0);
            let want = ggml_mul_mat_plain(GGML_TYPE_IQ4_NL, &raw, n, cols, &x, rows);
            for k in kernels() {
                let ours = w.matmul(&x, rows, k);
                assert_eq!(
                    bits(&ours),
                    bits(&want),
                    "[{n}, {cols}] x {rows} rows on {k:?}"
                );
            }
        }
        // A single row needs its own order: Q8_0's (tinyBLAS's) differs.
        let x: Vec<f32> = values(cols, 3, -1.0, 1.0)
            .iter()
            .map(|v| v * v * v * 40.0)
            .collect();
        let want = ggml_mul_mat_plain(GGML_TYPE_IQ4_NL, &raw, n, cols, &x, 1);
        let mut twice = x.clone();
        twice.extend_from_slice(&x);
        let pairwise = w.matmul(&twice, 2, Kernel::Scalar);
        let ours = w.matmul(&x, 1, Kernel::Scalar);
        assert_eq!(
            bits(&ours),
            bits(&want),
            "[{n}, {cols}] x 1 heavy-tailed row"
        );
        if cols == 576 {
            assert_ne!(
                bits(&pairwise[..n]),
                bits(&want),
                "tinyBLAS's order matched vec_dot's"
            );
        }
    }
}

#[test]
fn iq4_nl_repacked_products_match_ggml_gemm_and_gemv_bit_for_bit() {
    let (n, cols) = (24, 160);
    let raw = ggml_quantize(GGML_TYPE_IQ4_NL, &values(n * cols, 13, -0.6, 1.0), n, cols);
    assert_eq!(raw.len(), n * cols / QK * BLOCK_BYTES);
    let repacked = repack_x8(&raw, n, cols, 0);
    let w =
        PackedWeights::from_ggml(WeightFormat::Iq4Nl, n, cols, &raw, BlockOrder::Repack).unwrap();
    for rows in [1, 3, 4, 8, 17] {
        let x = values(rows * cols, 17 + rows as u64, -2.0, 2.0);
        let want = ggml_repacked_mul_mat_with(
            ggml_gemm_iq4_nl_8x8_q8_0,
            ggml_gemv_iq4_nl_8x8_q8_0,
            &repacked,
            n,
            cols,
            &x,
            rows,
        );
        for k in kernels() {
            let ours = w.matmul(&x, rows, k);
            assert_eq!(
                bits(&ours),
                bits(&want),
                "repacked [{n}, {cols}] x {rows} rows on {k:?}"
            );
        }
    }
}

#[test]
fn tiny_iq4_learner_weights_are_ggml_dequantized() {
    // The learner (dense f32 weights) holds the values the sampler computes
    // with: ggml's dequantize_row_iq4_nl / _iq4_xs, bit for bit, for every
    // projection and the tied output.
    use tern_models::{GgufFile, LoraTarget, Model, Precision};
    let xs_spec = TinySpec {
        n_embd: 256,
        n_ff: 512,
        ..TinySpec::default()
    };
    for (spec, ftype, own, t) in [
        (
            TinySpec::default(),
            LLAMA_FTYPE_MOSTLY_IQ4_NL,
            OwnType::Iq4Nl,
            GGML_TYPE_IQ4_NL,
        ),
        (
            xs_spec,
            quantize::LLAMA_FTYPE_MOSTLY_IQ4_XS,
            OwnType::Iq4Xs,
            GGML_TYPE_IQ4_XS,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = tiny_iq4(dir.path(), &spec, ftype, own, true);
        let file = GgufFile::open(&path).unwrap();
        let model = Model::load_as(&file, Precision::DenseF32).unwrap();
        let ggml = |name: &str| -> Vec<u32> {
            let w = file.own_tensor(name).unwrap();
            assert_eq!(w.ty, own, "{name}");
            let n = w.dims.iter().product();
            bits(&quantize::ggml_dequantize(
                t as quantize::ggml_type,
                w.data,
                n,
            ))
        };
        let mut checked = 0;
        for layer in 0..model.config().n_layer {
            for target in LoraTarget::ALL {
                let name = format!("blk.{layer}.{}.weight", target.gguf_stem());
                let w = model.dense_projection(layer, target).unwrap();
                let w: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
                assert!(bits(&w) == ggml(&name), "{own:?} {name}");
                checked += 1;
            }
        }
        let out: Vec<f32> = model
            .dense_output()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(bits(&out) == ggml("token_embd.weight"), "{own:?} output");
        eprintln!("{own:?}: {checked} projections and the output equal ggml's");
        assert_eq!(checked, PROJECTIONS);
    }
}

#[test]
fn iq4_quantizers_write_ggml_bytes() {
    // ggml_quantize_chunk without an importance matrix (what llama-quantize
    // runs) against Tern's port, on smooth, heavy-tailed and all-zero blocks.
    use tern_models::quant::quantize::iq4;
    let (rows, cols) = (6, 512);
    let mut x = values(rows * cols, 23, -1.0, 1.0);
    for v in x[cols..2 * cols].iter_mut() {
        *v = *v * *v * *v * 50.0;
    }
    x[2 * cols..2 * cols + 32].fill(0.0);
    x[3 * cols..3 * cols + 256].fill(0.0);
    x[4 * cols + 40..4 * cols + 72].fill(0.0);
    type Quantizer = fn(&[f32], &mut Vec<u8>);
    let cases: [(i32, Quantizer); 2] = [
        (GGML_TYPE_IQ4_NL, iq4::iq4_nl),
        (GGML_TYPE_IQ4_XS, iq4::iq4_xs),
    ];
    for (t, ours) in cases {
        let want = ggml_quantize(t, &x, rows, cols);
        let mut got = Vec::new();
        ours(&x, &mut got);
        assert_eq!(got.len(), want.len(), "type {t}");
        let row_bytes = want.len() / rows;
        for r in 0..rows {
            let (a, b) = (
                &got[r * row_bytes..][..row_bytes],
                &want[r * row_bytes..][..row_bytes],
            );
            let first = a.iter().zip(b).position(|(p, q)| p != q);
            assert_eq!(first, None, "type {t} row {r}: first differing byte");
        }
    }
}
