//! Tern's Q4_0 products in the order of ggml-cpu's repacked kernels, against
//! those kernels called in process (the llama.cpp backend links ggml):
//! `ggml_gemm_q4_0_8x8_q8_0` on activation rows in whole groups of four
//! (quantized by `ggml_quantize_mat_q8_0_4x8`) and `ggml_gemv_q4_0_8x8_q8_0` on
//! the rest (quantized by `quantize_row_q8_0`), exactly as ggml-cpu's
//! `forward_mul_mat` splits a product. (A whole model: `formats.rs`.)
#![cfg(feature = "llama-cpp")]

use std::ffi::c_void;

use tern_models::quant::blocks::{BlockOrder, PackedWeights, WeightFormat, QK};
use tern_models::quant::Kernel;

use crate::support::quantize::{GGML_TYPE_Q4_0, GGML_TYPE_Q8_0};
use crate::support::values;

/// Bytes of a ggml `block_q4_0` (f16 `d`, 16 bytes of nibbles).
const Q4_0_BYTES: usize = 18;
/// Bytes of a ggml `block_q4_0x8` (eight `d`, then 128 bytes of quants).
const Q4_0X8_BYTES: usize = 16 + 128;
/// Bytes of a ggml `block_q8_0x4` (four `d`, then 128 bytes of quants).
const Q8_0X4_BYTES: usize = 8 + 128;
/// Bytes of a ggml `block_q8_0`.
const Q8_0_BYTES: usize = 34;

// ggml-cpu's repack kernels (ggml-cpu/repack.h), linked through llama-cpp-sys-2.
extern "C" {
    fn ggml_quantize_mat_q8_0_4x8(x: *const f32, vy: *mut c_void, k: i64);
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
    let mut out = vec![0u8; rows * cols / QK * Q4_0_BYTES];
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

/// ggml-cpu's repack of a 32-value, 18-byte block format (`block_q4_0`,
/// `block_iq4_nl`) into its `x8` blocks with interleave 8, each quant byte XOR
/// `xor` (Q4_0: `0x88`; IQ4_NL: 0, its nibbles are table indices).
pub(crate) fn repack_x8(raw: &[u8], rows: usize, cols: usize, xor: u8) -> Vec<u8> {
    let nb = cols / QK;
    let blk = |r: usize, b: usize| &raw[(r * nb + b) * Q4_0_BYTES..][..Q4_0_BYTES];
    let mut out = Vec::with_capacity(rows / 8 * nb * Q4_0X8_BYTES);
    for g in 0..rows / 8 {
        for b in 0..nb {
            for j in 0..8 {
                out.extend_from_slice(&blk(8 * g + j, b)[..2]);
            }
            for i in 0..16 {
                let (src, off) = (i % 8, (i / 8) * 8);
                out.extend(
                    blk(8 * g + src, b)[2 + off..2 + off + 8]
                        .iter()
                        .map(|q| q ^ xor),
                );
            }
        }
    }
    out
}

/// ggml-cpu's MUL_MAT on a repacked Q4_0 weight (`repacked`, `[n, cols]`) for
/// `x` `[rows, cols]`, as `forward_mul_mat` runs it: the first
/// `rows - rows % 4` rows quantized four at a time and sent to the gemm in one
/// call, the rest quantized by `quantize_row_q8_0` and sent to the gemv one by
/// one.
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

/// A repacked gemm or gemv kernel of ggml-cpu (`ggml_gemm_*_8x8_q8_0`).
pub(crate) type RepackKernel =
    unsafe extern "C" fn(i32, *mut f32, usize, *const c_void, *const c_void, i32, i32);

/// [`ggml_repacked_mul_mat`] with the format's `gemm` and `gemv`.
pub(crate) fn ggml_repacked_mul_mat_with(
    gemm: RepackKernel,
    gemv: RepackKernel,
    repacked: &[u8],
    n: usize,
    cols: usize,
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    let nb = cols / QK;
    let grouped = rows - rows % 4;
    let mut out = vec![0f32; rows * n];
    let mut a = vec![0u8; grouped / 4 * nb * Q8_0X4_BYTES];
    for g in 0..grouped / 4 {
        // SAFETY: four rows of `cols` f32 in, `nb` block_q8_0x4 out.
        unsafe {
            ggml_quantize_mat_q8_0_4x8(
                x[4 * g * cols..].as_ptr(),
                a[g * nb * Q8_0X4_BYTES..].as_mut_ptr().cast(),
                cols as i64,
            )
        };
    }
    if grouped > 0 {
        // SAFETY: the repacked weights (n / 8 groups of nb blocks) against
        // `grouped` quantized rows; `out` holds `grouped` rows of `n`.
        unsafe {
            gemm(
                cols as i32,
                out.as_mut_ptr(),
                n,
                repacked.as_ptr().cast(),
                a.as_ptr().cast(),
                grouped as i32,
                n as i32,
            )
        };
    }
    // SAFETY: static traits; ggml is initialised by `ggml_q4_0`.
    let from_float = unsafe {
        llama_cpp_sys_2::ggml_cpu_init();
        (*llama_cpp_sys_2::ggml_get_type_traits_cpu(GGML_TYPE_Q8_0))
            .from_float
            .expect("q8_0 from_float")
    };
    for r in grouped..rows {
        let mut a = vec![0u8; nb * Q8_0_BYTES];
        // SAFETY: one row of `cols` f32 in, `nb` block_q8_0 out; then the
        // repacked weights against it into row `r` of `out`.
        unsafe {
            from_float(x[r * cols..].as_ptr(), a.as_mut_ptr().cast(), cols as i64);
            gemv(
                cols as i32,
                out[r * n..].as_mut_ptr(),
                n,
                repacked.as_ptr().cast(),
                a.as_ptr().cast(),
                1,
                n as i32,
            )
        };
    }
    out
}

fn kernels() -> Vec<Kernel> {
    if tern_models::quant::best_kernel() == Kernel::Avx2 {
        vec![Kernel::Avx2, Kernel::Scalar]
    } else {
        vec![Kernel::Scalar]
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
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
