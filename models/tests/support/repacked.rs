//! ggml-cpu's repacked 32-value block formats (`block_q4_0x8`,
//! `block_iq4_nlx8`, ggml-cpu/repack.h): the repack itself, and a MUL_MAT
//! run on repacked weights exactly as ggml-cpu's `forward_mul_mat` splits it
//! between its gemm and gemv kernels.

use std::ffi::c_void;

use llama_cpp_sys_2::GGML_TYPE_Q8_0;
use tern_models::quant::blocks::QK;

/// Bytes of a ggml `block_q4_0` or `block_iq4_nl` (f16 `d`, 16 bytes of
/// nibbles).
pub const BLOCK_BYTES: usize = 18;
/// Bytes of a ggml `block_q4_0x8` (eight `d`, then 128 bytes of quants).
const X8_BYTES: usize = 16 + 128;
/// Bytes of a ggml `block_q8_0x4` (four `d`, then 128 bytes of quants).
const Q8_0X4_BYTES: usize = 8 + 128;
/// Bytes of a ggml `block_q8_0`.
const Q8_0_BYTES: usize = 34;

extern "C" {
    fn ggml_quantize_mat_q8_0_4x8(x: *const f32, vy: *mut c_void, k: i64);
}

/// ggml-cpu's repack of a 32-value, 18-byte block format (`block_q4_0`,
/// `block_iq4_nl`) into its `x8` blocks with interleave 8, each quant byte XOR
/// `xor` (Q4_0: `0x88`; IQ4_NL: 0, its nibbles are table indices).
pub fn repack_x8(raw: &[u8], rows: usize, cols: usize, xor: u8) -> Vec<u8> {
    let nb = cols / QK;
    let blk = |r: usize, b: usize| &raw[(r * nb + b) * BLOCK_BYTES..][..BLOCK_BYTES];
    let mut out = Vec::with_capacity(rows / 8 * nb * X8_BYTES);
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

/// A repacked gemm or gemv kernel of ggml-cpu (`ggml_gemm_*_8x8_q8_0`).
pub type RepackKernel =
    unsafe extern "C" fn(i32, *mut f32, usize, *const c_void, *const c_void, i32, i32);

/// ggml-cpu's MUL_MAT on a repacked weight (`repacked`, `[n, cols]`) for
/// `x` `[rows, cols]`, as `forward_mul_mat` runs it with the format's `gemm`
/// and `gemv`: the first `rows - rows % 4` rows quantized four at a time and
/// sent to the gemm in one call, the rest quantized by `quantize_row_q8_0`
/// and sent to the gemv one by one.
pub fn ggml_repacked_mul_mat_with(
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
    // SAFETY: static traits; ggml is initialised first.
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
