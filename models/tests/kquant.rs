//! Tern's K-quant kernels against the ggml code llama.cpp runs, called in
//! process: Q8_K activation quantization, weight dequantization and every
//! product kernel bit for bit, and the learner's dense weights of tiny models
//! quantized by ggml equal to ggml's dequantization. (Those models run
//! through Tern and llama.cpp, logits compared: the root package's
//! `tests/kquant.rs`.)

use std::ffi::c_void;

use tern_models::quant::k::q8k::{quantize_block, quantize_block_x4, Q8KBlock};
use tern_models::quant::k::{KFormat, KWeights, Order, QK_K};
use tern_models::quant::Kernel;

use crate::support::ggml::{
    cpu_traits, ggml_get_type_traits, ggml_mul_mat_plain, ggml_quantize, GGML_TYPE_IQ4_XS,
    GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K,
};
use crate::support::tiny_quant::{tiny_kquant_model, Q2K, Q3K};
use crate::support::{kernels, values};

/// Bytes of a ggml `block_q8_K`.
const Q8K_BYTES: usize = 4 + QK_K + 2 * QK_K / 16;

// ggml-cpu's Q8_K and Q4_K repack kernels (ggml-cpu/repack.h), linked
// through llama-cpp-sys-2.
extern "C" {
    fn ggml_quantize_mat_q8_K_4x8(x: *const f32, vy: *mut c_void, k: i64);
    fn ggml_gemv_q4_K_8x8_q8_K(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: i32,
        nc: i32,
    );
    fn ggml_gemm_q4_K_8x8_q8_K(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        vy: *const c_void,
        nr: i32,
        nc: i32,
    );
}

/// ggml's type id of `f`.
fn ggml_format(f: KFormat) -> i32 {
    match f {
        KFormat::Q2K => GGML_TYPE_Q2_K,
        KFormat::Q3K => GGML_TYPE_Q3_K,
        KFormat::Q4K => GGML_TYPE_Q4_K,
        KFormat::Q5K => GGML_TYPE_Q5_K,
        KFormat::Q6K => GGML_TYPE_Q6_K,
        KFormat::Iq4Xs => GGML_TYPE_IQ4_XS,
    }
}

/// Every super-block format Tern runs (the K-quants and IQ4_XS).
const ALL: [KFormat; 6] = [
    KFormat::Q2K,
    KFormat::Q3K,
    KFormat::Q4K,
    KFormat::Q5K,
    KFormat::Q6K,
    KFormat::Iq4Xs,
];

/// ggml's Q8_K quantization of one row (`quantize_row_q8_K`, the from_float
/// ggml-cpu's mul_mat uses).
fn ggml_q8k(x: &[f32]) -> Vec<u8> {
    let f = cpu_traits(GGML_TYPE_Q8_K)
        .from_float
        .expect("q8_K from_float");
    let mut out = vec![0u8; x.len() / QK_K * Q8K_BYTES];
    // SAFETY: sizes as ggml's block_q8_K.
    unsafe { f(x.as_ptr(), out.as_mut_ptr().cast(), x.len() as i64) };
    out
}

/// A ggml block_q8_K as Tern's block.
fn q8k_block(b: &[u8]) -> Q8KBlock {
    let mut out = Q8KBlock::ZERO;
    out.d = f32::from_le_bytes(b[0..4].try_into().unwrap());
    for (q, &v) in out.qs.iter_mut().zip(&b[4..4 + QK_K]) {
        *q = v as i8;
    }
    for (k, s) in out.bsums.iter_mut().enumerate() {
        let i = 4 + QK_K + 2 * k;
        *s = i16::from_le_bytes([b[i], b[i + 1]]);
    }
    out
}

#[test]
fn kquant_q8k_quantizers_match_ggml_bit_for_bit() {
    let cols = 4 * QK_K;
    let mut x = values(4 * cols, 3, -3.0, 3.0);
    // Magnitude ties of both signs (the two quantizers pick d's sign
    // differently) and a zero block.
    x[10] = -5.0;
    x[100] = 5.0;
    x[QK_K + 7] = 4.0;
    x[2 * QK_K..3 * QK_K].fill(0.0);
    // Row by row: quantize_row_q8_K.
    let theirs = ggml_q8k(&x);
    for (i, b) in theirs.chunks_exact(Q8K_BYTES).enumerate() {
        let want = q8k_block(b);
        let mut ours = Q8KBlock::ZERO;
        quantize_block(&x[i * QK_K..(i + 1) * QK_K], &mut ours);
        assert_eq!(ours.d.to_bits(), want.d.to_bits(), "block {i} d");
        assert_eq!(ours.qs, want.qs, "block {i} quants");
        if want.d != 0.0 {
            // ggml leaves an all-zero block's sums unwritten.
            assert_eq!(ours.bsums, want.bsums, "block {i} sums");
        }
    }
    // Four rows at a time: ggml_quantize_mat_q8_K_4x8 (d[4], then quants
    // interleaved 8 at a time: qs[32 j + 8 r + e] is row r's value 8 j + e).
    let nb = cols / QK_K;
    let mut packed = vec![0u8; nb * (16 + 4 * QK_K + 4 * 2 * QK_K / 16)];
    // SAFETY: 4 rows of `cols`, `nb` block_q8_Kx4.
    unsafe { ggml_quantize_mat_q8_K_4x8(x.as_ptr(), packed.as_mut_ptr().cast(), cols as i64) };
    let bx4 = packed.len() / nb;
    for b in 0..nb {
        let blk = &packed[b * bx4..(b + 1) * bx4];
        for r in 0..4 {
            let mut ours = Q8KBlock::ZERO;
            quantize_block_x4(
                &x[r * cols + b * QK_K..r * cols + (b + 1) * QK_K],
                &mut ours,
            );
            let d = f32::from_le_bytes(blk[4 * r..4 * r + 4].try_into().unwrap());
            assert_eq!(ours.d.to_bits(), d.to_bits(), "x4 block {b} row {r} d");
            for j in 0..QK_K {
                let q = blk[16 + 32 * (j / 8) + 8 * r + j % 8] as i8;
                assert_eq!(ours.qs[j], q, "x4 block {b} row {r} value {j}");
            }
        }
    }
}

#[test]
fn kquant_dequantization_matches_ggml_bit_for_bit() {
    for format in ALL {
        let (rows, cols) = (9, 3 * QK_K);
        let t = ggml_format(format);
        let raw = ggml_quantize(t, &values(rows * cols, 5, -1.0, 0.7), rows, cols);
        let w = KWeights::from_ggml(format, rows, cols, &raw, Order::VecDot).unwrap();
        // SAFETY: static traits.
        let to_float = unsafe { (*ggml_get_type_traits(t)).to_float.expect("to_float") };
        let row_bytes = raw.len() / rows;
        for r in 0..rows {
            let mut want = vec![0f32; cols];
            // SAFETY: one row of blocks in, `cols` f32 out.
            unsafe {
                to_float(
                    raw[r * row_bytes..].as_ptr().cast(),
                    want.as_mut_ptr(),
                    cols as i64,
                )
            };
            let mut ours = vec![0f32; cols];
            w.dequantize_row(r, &mut ours);
            let same = ours
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{format:?} row {r}: dequantization differs from ggml's"
            );
        }
    }
}

#[test]
fn kquant_plain_products_match_ggml_mul_mat_bit_for_bit() {
    // ggml-cpu's MUL_MAT on weights in a plain buffer: ggml_vec_dot_*_q8_K below
    // 8 activation rows, its tiled K-quant matmul from 8 on.
    for format in ALL {
        let t = ggml_format(format);
        for (n, cols) in [(13, 768), (40, 2 * QK_K)] {
            let raw = ggml_quantize(t, &values(n * cols, 7, -0.8, 1.0), n, cols);
            let w = KWeights::from_ggml(format, n, cols, &raw, Order::VecDot).unwrap();
            for rows in [1, 3, 4, 7, 8, 17, 40] {
                let x = values(rows * cols, 11 + rows as u64, -2.0, 2.0);
                let want = ggml_mul_mat_plain(t, &raw, n, cols, &x, rows);
                for k in kernels() {
                    let ours = w.matmul(&x, rows, k);
                    let same = ours
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} [{n}, {cols}] x {rows} rows on {k:?}");
                }
                if rows >= 17 {
                    // The tiled order is needed: vec_dot's, row by row, differs.
                    let vec_dot: Vec<f32> = x
                        .chunks_exact(cols)
                        .flat_map(|xr| w.matmul(xr, 1, Kernel::Scalar))
                        .collect();
                    let differs = vec_dot
                        .iter()
                        .zip(&want)
                        .any(|(a, b)| a.to_bits() != b.to_bits());
                    assert!(differs, "{format:?} x {rows} rows: vec_dot order matched");
                }
            }
        }
    }
}

#[test]
fn kquant_vec_dot_matches_ggml_bit_for_bit() {
    // ggml_vec_dot_*_q8_K itself, on heavy-tailed activations.
    for format in ALL {
        let t = ggml_format(format);
        let vec_dot = cpu_traits(t).vec_dot.expect("vec_dot");
        let (n, cols) = (24, 3 * QK_K);
        let raw = ggml_quantize(t, &values(n * cols, 7, -0.8, 1.0), n, cols);
        let w = KWeights::from_ggml(format, n, cols, &raw, Order::VecDot).unwrap();
        let row_bytes = raw.len() / n;
        for rows in [1, 3, 4, 7] {
            let x: Vec<f32> = values(rows * cols, 19 + rows as u64, -1.0, 1.0)
                .iter()
                .map(|v| v * v * v * 30.0)
                .collect();
            let mut want = vec![0f32; rows * n];
            for r in 0..rows {
                let a = ggml_q8k(&x[r * cols..(r + 1) * cols]);
                for c in 0..n {
                    // SAFETY: one weight row and one activation row of `cols`.
                    unsafe {
                        vec_dot(
                            cols as i32,
                            &mut want[r * n + c],
                            0,
                            raw[c * row_bytes..].as_ptr().cast(),
                            0,
                            a.as_ptr().cast(),
                            0,
                            1,
                        )
                    };
                }
            }
            for k in kernels() {
                let ours = w.matmul(&x, rows, k);
                let same = ours
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format:?} [{n}, {cols}] x {rows} rows on {k:?}");
            }
        }
    }
}

/// ggml-cpu's `make_block_q4_Kx8`: eight Q4_K rows' super-block `b` interleaved
/// (d[8], dmin[8], per sub-block the eight rows' scale and minimum packed in 12
/// bytes, quants 8 bytes at a time row by row).
fn q4k_x8(raw: &[u8], row_bytes: usize, g: usize, b: usize) -> Vec<u8> {
    use tern_models::quant::k::q4k::{scales_mins, BLOCK_BYTES};
    let blk = |j: usize| &raw[(8 * g + j) * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
    let mut out = vec![0u8; 16 + 16 + 96 + 1024];
    for j in 0..8 {
        out[2 * j..2 * j + 2].copy_from_slice(&blk(j)[0..2]);
        out[16 + 2 * j..18 + 2 * j].copy_from_slice(&blk(j)[2..4]);
    }
    let sm: Vec<([u8; 8], [u8; 8])> = (0..8).map(|j| scales_mins(&blk(j)[4..16])).collect();
    for k in 0..8 {
        let s: Vec<u8> = (0..8).map(|j| sm[j].0[k]).collect();
        let m: Vec<u8> = (0..8).map(|j| sm[j].1[k]).collect();
        let o = &mut out[32 + 12 * k..32 + 12 * k + 12];
        for i in 0..4 {
            o[i] = (s[i] & 63) + ((s[i + 4] & 48) << 2);
            o[i + 4] = (m[i] & 63) + ((m[i + 4] & 48) << 2);
            o[i + 8] = (s[i + 4] & 15) + ((m[i + 4] & 15) << 4);
        }
    }
    for i in 0..128 {
        let (src, off) = (i % 8, (i / 8) * 8);
        out[128 + 8 * i..128 + 8 * i + 8].copy_from_slice(&blk(src)[16 + off..16 + off + 8]);
    }
    out
}

#[test]
fn kquant_q4k_repacked_gemm_and_gemv_match_ggml_bit_for_bit() {
    let (n, cols) = (24, 3 * QK_K);
    let nb = cols / QK_K;
    let raw = ggml_quantize(GGML_TYPE_Q4_K, &values(n * cols, 13, -0.6, 1.0), n, cols);
    let row_bytes = raw.len() / n;
    let w = KWeights::from_ggml(KFormat::Q4K, n, cols, &raw, Order::Repack).unwrap();
    let mut repacked = Vec::new();
    for g in 0..n / 8 {
        for b in 0..nb {
            repacked.extend(q4k_x8(&raw, row_bytes, g, b));
        }
    }
    for rows in [1, 3, 4, 8, 17] {
        let x = values(rows * cols, 17 + rows as u64, -2.0, 2.0);
        let grouped = rows - rows % 4;
        let mut want = vec![0f32; rows * n];
        let bx4 = 16 + 4 * QK_K + 4 * 2 * QK_K / 16;
        for r0 in (0..grouped).step_by(4) {
            let mut a = vec![0u8; nb * bx4];
            // SAFETY: four rows of `cols` in, `nb` block_q8_Kx4 out; then the
            // repacked weights (n / 8 groups of nb blocks) against them.
            unsafe {
                ggml_quantize_mat_q8_K_4x8(
                    x[r0 * cols..].as_ptr(),
                    a.as_mut_ptr().cast(),
                    cols as i64,
                );
                ggml_gemm_q4_K_8x8_q8_K(
                    cols as i32,
                    want[r0 * n..].as_mut_ptr(),
                    n,
                    repacked.as_ptr().cast(),
                    a.as_ptr().cast(),
                    4,
                    n as i32,
                );
            }
        }
        for r in grouped..rows {
            let a = ggml_q8k(&x[r * cols..(r + 1) * cols]);
            // SAFETY: the repacked weights against one block_q8_K row.
            unsafe {
                ggml_gemv_q4_K_8x8_q8_K(
                    cols as i32,
                    want[r * n..].as_mut_ptr(),
                    n,
                    repacked.as_ptr().cast(),
                    a.as_ptr().cast(),
                    1,
                    n as i32,
                )
            };
        }
        for k in kernels() {
            let ours = w.matmul(&x, rows, k);
            let same = ours
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "Q4_K repacked [{n}, {cols}] x {rows} rows on {k:?}");
        }
        // The plain vec_dot order would not do: it differs somewhere.
        let plain = KWeights::from_ggml(KFormat::Q4K, n, cols, &raw, Order::VecDot).unwrap();
        if rows == 17 {
            assert_ne!(plain.matmul(&x, rows, Kernel::Scalar), want);
        }
    }
}

/// The bits of a tensor's values, row-major.
fn tensor_bits(t: &candle_core::Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn tiny_q2_k_and_q3_k_learner_weights_are_ggml_dequantized() {
    // The learner (dense f32 weights) must hold the values the sampler computes
    // with: ggml's dequantize_row_q2_K / _q3_K, bit for bit, for every
    // projection and the tied output.
    use tern_models::{GgufFile, LoraTarget, Model, Precision};
    for (dtype, t) in [Q2K, Q3K].map(Option::unwrap) {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = tiny_kquant_model(dir.path(), |name| {
            (name.starts_with("blk.") || name == "token_embd.weight").then_some(Some((dtype, t)))?
        });
        let file = GgufFile::open(&path).unwrap();
        let model = Model::load_as(&file, Precision::DenseF32).unwrap();
        // SAFETY: static traits.
        let to_float = unsafe { (*ggml_get_type_traits(t)).to_float.expect("to_float") };
        let ggml = |name: &str| -> Vec<u32> {
            let q = file.tensor(name).unwrap();
            assert_eq!(q.dtype(), dtype, "{name}");
            let raw = q.data().unwrap();
            let mut out = vec![0f32; q.shape().elem_count()];
            // SAFETY: the tensor's blocks in, its element count of f32 out.
            unsafe { to_float(raw.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
            out.iter().map(|x| x.to_bits()).collect()
        };
        let mut checked = 0;
        for layer in 0..model.config().n_layer {
            for target in LoraTarget::ALL {
                let name = format!("blk.{layer}.{}.weight", target.gguf_stem());
                let w = model.dense_projection(layer, target).unwrap();
                assert!(tensor_bits(w) == ggml(&name), "{dtype:?} {name}");
                checked += 1;
            }
        }
        assert!(tensor_bits(model.dense_output().unwrap()) == ggml("token_embd.weight"));
        eprintln!("{dtype:?}: {checked} projections and the output equal ggml's");
    }
}
