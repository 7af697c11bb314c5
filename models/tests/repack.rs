//! Tern's Q4_0 products in the order of ggml-cpu's repacked kernels, against
//! those kernels called in process (the llama.cpp backend links ggml):
//! `ggml_gemm_q4_0_8x8_q8_0` on activation rows in whole groups of four
//! (quantized by `ggml_quantize_mat_q8_0_4x8`) and `ggml_gemv_q4_0_8x8_q8_0` on
//! the rest (quantized by `quantize_row_q8_0`), exactly as ggml-cpu's
//! `forward_mul_mat` splits a product. (A whole model: the root package's
//! `tests/formats.rs`.)

use std::ffi::c_void;

use tern_models::quant::blocks::{BlockOrder, PackedWeights, WeightFormat, QK};
use tern_models::quant::Kernel;

use crate::support::quantize::GGML_TYPE_Q4_0;
use crate::support::repacked::{ggml_repacked_mul_mat_with, repack_x8, BLOCK_BYTES};
use crate::support::{bits, kernels, values};

// ggml-cpu's Q4_0 repack kernels (ggml-cpu/repack.h), linked through llama-cpp-sys-2.
extern "C" {
    fn ggml_gemv_q4_0_8x8_q8_0(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: i32,
        nc: i32,
    );
    fn ggml_gemm_q4_0_8x8_q8_0(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: i32,
        nc: i32,
    );
}

/// `rows x cols` f32 quantized to Q4_0 by ggml's own quantizer.
fn ggml_q4_0(x: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols / QK * BLOCK_BYTES];
    // SAFETY: `x` holds rows * cols f32 and `out` their Q4_0 blocks.
    let n = unsafe {
        llama_cpp_sys_2::ggml_cpu_init();
        llama_cpp_sys_2::ggml_quantize_chunk(
            GGML_TYPE_Q4_0,
            x.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            cols as i64,
            std::ptr::null(),
        )
    };
    assert_eq!(n, out.len());
    out
}

/// ggml-cpu's `repack_q4_0_to_q4_0_8_bl` with interleave 8: per group of eight
/// rows and block, the eight `d`, then 8 quant bytes at a time from rows 0..8
/// in turn, each nibble XOR 8 (two's-complement `q - 8`).
fn repack_q4_0x8(raw: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    repack_x8(raw, rows, cols, 0x88)
}

/// ggml-cpu's MUL_MAT on a repacked Q4_0 weight (`repacked`, `[n, cols]`) for
/// `x` `[rows, cols]` (see [`ggml_repacked_mul_mat_with`]).
fn ggml_repacked_mul_mat(
    repacked: &[u8],
    n: usize,
    cols: usize,
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    ggml_repacked_mul_mat_with(
        ggml_gemm_q4_0_8x8_q8_0,
        ggml_gemv_q4_0_8x8_q8_0,
        repacked,
        n,
        cols,
        x,
        rows,
    )
}

#[test]
fn q4_0_repacked_products_match_ggml_gemm_and_gemv_bit_for_bit() {
    // 24 and 40 weight rows (three and five groups of eight); 17 activation
    // rows take the gemm's 16-row tile once and the gemv once; from 4 rows
    // on Tern runs its tiled kernel (4 activation rows a tile: 33 leaves one).
    for (n, cols) in [(24, 576), (40, 64)] {
        let raw = ggml_q4_0(&values(n * cols, 13, -0.6, 1.0), n, cols);
        let repacked = repack_q4_0x8(&raw, n, cols);
        let order = BlockOrder::llama_cpp(WeightFormat::Q4_0, n);
        assert_eq!(order, BlockOrder::Repack);
        let w = PackedWeights::from_ggml(WeightFormat::Q4_0, n, cols, &raw, order).unwrap();
        let plain = PackedWeights::from_ggml(WeightFormat::Q4_0, n, cols, &raw, BlockOrder::VecDot)
            .unwrap();
        let mut plain_differs = false;
        for rows in [1, 3, 4, 8, 17, 33] {
            // Heavy tails, so that rounding differences show.
            let x: Vec<f32> = values(rows * cols, 17 + rows as u64, -1.0, 1.0)
                .iter()
                .map(|v| v * v * v * 30.0)
                .collect();
            let want = ggml_repacked_mul_mat(&repacked, n, cols, &x, rows);
            for k in kernels() {
                let ours = w.matmul(&x, rows, k);
                assert_eq!(
                    bits(&ours),
                    bits(&want),
                    "Q4_0 repacked [{n}, {cols}] x {rows} rows on {k:?}"
                );
            }
            plain_differs |= bits(&plain.matmul(&x, rows, Kernel::Scalar)) != bits(&want);
        }
        // The plain (vec_dot) order would not do: it differs somewhere.
        assert!(
            plain_differs,
            "[{n}, {cols}]: the two orders never differed"
        );
    }
}
