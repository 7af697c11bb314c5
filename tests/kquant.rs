//! Tern's K-quant kernels against the ggml code llama.cpp runs, called in
//! process (the llama.cpp backend links ggml): Q8_K activation quantization,
//! weight dequantization and every product kernel bit for bit, then tiny models
//! quantized by ggml's own quantizer giving teacher-forced logits bit-identical
//! with llama.cpp over 256 positions.
#![cfg(feature = "llama-cpp")]

use std::borrow::Cow;
use std::ffi::c_void;

use candle_core::quantized::{gguf_file, GgmlDType, QStorage, QTensor};
use candle_core::Device;
use tern_models::quant::k::q8k::{quantize_block, quantize_block_x4, Q8KBlock};
use tern_models::quant::k::{KFormat, KWeights, Order, QK_K};
use tern_models::quant::Kernel;

use crate::support::{values, LLAMA_THREADS};

// ggml's C API (ggml.h, ggml-cpu.h, ggml-cpu/repack.h), linked through
// llama-cpp-sys-2.
const GGML_TYPE_Q2_K: i32 = 10;
const GGML_TYPE_Q3_K: i32 = 11;
const GGML_TYPE_Q4_K: i32 = 12;
const GGML_TYPE_Q5_K: i32 = 13;
const GGML_TYPE_Q6_K: i32 = 14;
const GGML_TYPE_Q8_K: i32 = 15;
const GGML_TYPE_IQ4_XS: i32 = 23;
const Q8K_BYTES: usize = 4 + QK_K + 2 * QK_K / 16;

type FromFloat = unsafe extern "C" fn(*const f32, *mut c_void, i64);
type ToFloat = unsafe extern "C" fn(*const c_void, *mut f32, i64);
type VecDot =
    unsafe extern "C" fn(i32, *mut f32, usize, *const c_void, usize, *const c_void, usize, i32);

// Mirrors of ggml's structs: every field is there for the layout.
#[allow(dead_code)]
#[repr(C)]
struct TypeTraitsCpu {
    from_float: Option<FromFloat>,
    vec_dot: Option<VecDot>,
    vec_dot_type: i32,
    nrows: i64,
}

#[allow(dead_code)]
#[repr(C)]
struct TypeTraits {
    type_name: *const std::ffi::c_char,
    blck_size: i64,
    blck_size_interleave: i64,
    type_size: usize,
    is_quantized: bool,
    to_float: Option<ToFloat>,
    from_float_ref: Option<FromFloat>,
}

#[repr(C)]
struct InitParams {
    mem_size: usize,
    mem_buffer: *mut c_void,
    no_alloc: bool,
}

extern "C" {
    fn ggml_init(params: InitParams) -> *mut c_void;
    fn ggml_free(ctx: *mut c_void);
    fn ggml_new_tensor_2d(ctx: *mut c_void, t: i32, ne0: i64, ne1: i64) -> *mut c_void;
    fn ggml_get_data(t: *const c_void) -> *mut c_void;
    fn ggml_mul_mat(ctx: *mut c_void, a: *mut c_void, b: *mut c_void) -> *mut c_void;
    fn ggml_new_graph(ctx: *mut c_void) -> *mut c_void;
    fn ggml_build_forward_expand(g: *mut c_void, t: *mut c_void);
    fn ggml_graph_compute_with_ctx(ctx: *mut c_void, g: *mut c_void, n_threads: i32) -> i32;
    fn ggml_cpu_init();
    fn ggml_get_type_traits_cpu(t: i32) -> *const TypeTraitsCpu;
    fn ggml_get_type_traits(t: i32) -> *const TypeTraits;
    fn ggml_quantize_chunk(
        t: i32,
        src: *const f32,
        dst: *mut c_void,
        start: i64,
        nrows: i64,
        n_per_row: i64,
        imatrix: *const f32,
    ) -> usize;
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

fn cpu_traits(t: i32) -> &'static TypeTraitsCpu {
    // SAFETY: ggml_cpu_init is idempotent; the traits are static tables.
    unsafe {
        ggml_cpu_init();
        &*ggml_get_type_traits_cpu(t)
    }
}

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

/// `rows x cols` f32 quantized by ggml's own quantizer (`ggml_quantize_chunk`).
pub(crate) fn ggml_quantize(t: i32, x: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    // SAFETY: the traits are static; the buffer is sized from them.
    let tt = unsafe {
        ggml_cpu_init();
        &*ggml_get_type_traits(t)
    };
    let row_bytes = cols / tt.blck_size as usize * tt.type_size;
    let mut out = vec![0u8; rows * row_bytes];
    // SAFETY: `x` holds rows * cols f32 and `out` the quantized rows.
    let n = unsafe {
        ggml_quantize_chunk(
            t,
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

/// ggml-cpu's whole MUL_MAT op (weights in a plain buffer, as every K-quant but
/// a repacked Q4_K is): `x` `[rows, cols]` times the `[n, cols]` weight `raw`.
pub(crate) fn ggml_mul_mat_plain(
    t: i32,
    raw: &[u8],
    n: usize,
    cols: usize,
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    let mem = raw.len() + 4 * (x.len() + rows * n) + (64 << 20);
    // SAFETY: a fresh context big enough for three tensors and the graph (the
    // work buffer is allocated by ggml_graph_compute_with_ctx in it); the data
    // copies match the tensors' sizes.
    unsafe {
        ggml_cpu_init();
        let ctx = ggml_init(InitParams {
            mem_size: mem,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        });
        assert!(!ctx.is_null());
        let a = ggml_new_tensor_2d(ctx, t, cols as i64, n as i64);
        let b = ggml_new_tensor_2d(ctx, 0, cols as i64, rows as i64);
        std::ptr::copy_nonoverlapping(raw.as_ptr(), ggml_get_data(a).cast::<u8>(), raw.len());
        std::ptr::copy_nonoverlapping(x.as_ptr(), ggml_get_data(b).cast::<f32>(), x.len());
        let c = ggml_mul_mat(ctx, a, b);
        let g = ggml_new_graph(ctx);
        ggml_build_forward_expand(g, c);
        assert_eq!(ggml_graph_compute_with_ctx(ctx, g, LLAMA_THREADS), 0);
        let out = std::slice::from_raw_parts(ggml_get_data(c).cast::<f32>(), rows * n).to_vec();
        ggml_free(ctx);
        out
    }
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

fn kernels() -> Vec<Kernel> {
    if tern_models::quant::best_kernel() == Kernel::Avx2 {
        vec![Kernel::Avx2, Kernel::Scalar]
    } else {
        vec![Kernel::Scalar]
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

/// Rewrites the GGUF at `path` with each 2-D weight requantized by ggml's own
/// quantizer to the type `pick` names for it (None: kept).
fn requantize(path: &std::path::Path, pick: impl Fn(&str) -> Option<(GgmlDType, i32)>) {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut tensors = Vec::new();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let t = content.tensor(&mut f, name, &Device::Cpu).unwrap();
        let dims = t.shape().dims().to_vec();
        let t = match (pick(name), dims.as_slice()) {
            (Some((dtype, ggml)), &[rows, cols]) => {
                let x: Vec<f32> = t
                    .dequantize(&Device::Cpu)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let raw = ggml_quantize(ggml, &x, rows, cols);
                let storage = QStorage::from_data(Cow::Owned(raw), &Device::Cpu, dtype).unwrap();
                QTensor::new(storage, (rows, cols)).unwrap()
            }
            _ => t,
        };
        tensors.push((name.clone(), t));
    }
    drop(f);
    let meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut out, &meta, &refs).unwrap();
}

/// Teacher-forced logits of `tokens` fed in chunks of `chunks` tokens.
pub(crate) fn forced(
    backend: &mut dyn tern_runtime::backend::Backend,
    tokens: &[u32],
    chunks: &[usize],
    vocab: usize,
) -> Vec<Vec<f32>> {
    use tern_runtime::backend::{LogitsWanted, Row};
    use tern_runtime::kv::policy::KvPolicy;
    let seq = backend
        .new_seq(&KvPolicy::Full, Default::default(), tokens.len())
        .unwrap();
    let mut out = Vec::new();
    let mut start = 0;
    for &len in chunks {
        let rows = [Row {
            seq,
            tokens: &tokens[start..start + len],
            start_pos: start,
            logits: LogitsWanted::All,
        }];
        let flat = backend.forward(&rows).unwrap().pop().flatten().unwrap();
        out.extend(flat.chunks(vocab).map(<[f32]>::to_vec));
        start += len;
    }
    assert_eq!(start, tokens.len());
    backend.free(seq);
    out
}

/// A tiny llama in `dir` with n_embd and n_ff multiples of 256 (K-quant
/// rows), its weights requantized by ggml per `pick`.
fn tiny_kquant_model(
    dir: &std::path::Path,
    pick: impl Fn(&str) -> Option<(GgmlDType, i32)>,
) -> (std::path::PathBuf, crate::support::tiny::TinySpec) {
    let spec = crate::support::tiny::TinySpec {
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        ..Default::default()
    };
    let path = dir.join("tiny-k.gguf");
    crate::support::tiny::write_tiny_model(&path, &spec);
    requantize(&path, pick);
    (path, spec)
}

/// The tiny K-quant model (see [`tiny_kquant_model`]); Tern and llama.cpp
/// teacher-forced over 256 positions. Returns (identical positions, max |diff|, positions).
fn tiny_kquant_agreement(pick: impl Fn(&str) -> Option<(GgmlDType, i32)>) -> (usize, f32, usize) {
    use std::sync::Arc;
    use tern_runtime::backend::{LlamaCppBackend, LlamaCppOptions, TernBackend};
    let dir = tempfile::tempdir().unwrap();
    let (path, spec) = tiny_kquant_model(dir.path(), pick);
    let model = Arc::new(tern_runtime::LoadedModel::load(&path).unwrap());
    let vocab = model.config().vocab_size;
    let n = spec.context_length;
    let tokens: Vec<u32> = (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    // A prefill whose rows are not a multiple of four (llama.cpp's repacked
    // Q4_K runs gemm on 252 rows and gemv on 1), then single and double steps.
    let chunks = [253, 1, 2];
    let mut tern = TernBackend::new(Arc::clone(&model));
    let ours = forced(&mut tern, &tokens, &chunks, vocab);
    let opts = LlamaCppOptions {
        n_ctx: n as u32,
        n_seq_max: 1,
        n_threads: LLAMA_THREADS,
        kv_dtype: Default::default(),
    };
    let mut llama = LlamaCppBackend::load(&path, model.config(), &opts).unwrap();
    let theirs = forced(&mut llama, &tokens, &chunks, vocab);
    let identical = ours.iter().zip(&theirs).filter(|(a, b)| a == b).count();
    let max_diff = ours
        .iter()
        .zip(&theirs)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    (identical, max_diff, n)
}

const Q2K: Option<(GgmlDType, i32)> = Some((GgmlDType::Q2K, GGML_TYPE_Q2_K));
const Q3K: Option<(GgmlDType, i32)> = Some((GgmlDType::Q3K, GGML_TYPE_Q3_K));
const Q4K: Option<(GgmlDType, i32)> = Some((GgmlDType::Q4K, GGML_TYPE_Q4_K));
const Q5K: Option<(GgmlDType, i32)> = Some((GgmlDType::Q5K, GGML_TYPE_Q5_K));
const Q6K: Option<(GgmlDType, i32)> = Some((GgmlDType::Q6K, GGML_TYPE_Q6_K));

/// Q4_K_M's mix: Q6_K for the embedding/output and ffn_down, Q4_K elsewhere.
fn q4_k_m_mix(name: &str) -> Option<(GgmlDType, i32)> {
    if name == "token_embd.weight" || name.ends_with("ffn_down.weight") {
        Q6K
    } else if name.starts_with("blk.") {
        Q4K
    } else {
        None
    }
}

#[test]
fn tiny_q4_k_model_matches_llama_cpp_bit_for_bit() {
    // Every projection Q4_K: rows of 128, 256 and 512 are repacked by llama.cpp;
    // the tied output (263 rows) runs ggml_vec_dot_q4_K_q8_K.
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        (name.starts_with("blk.") || name == "token_embd.weight").then_some(Q4K)?
    });
    eprintln!("Q4_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q6_k_model_matches_llama_cpp_bit_for_bit() {
    let (identical, max_diff, n) = tiny_kquant_agreement(q4_k_m_mix);
    eprintln!("Q6_K + Q4_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q5_k_model_matches_llama_cpp_bit_for_bit() {
    // Q5_K_M's mix: Q6_K for ffn_down, Q5_K elsewhere (the tied output too).
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        if name.ends_with("ffn_down.weight") {
            Q6K
        } else if name.starts_with("blk.") || name == "token_embd.weight" {
            Q5K
        } else {
            None
        }
    });
    eprintln!("Q5_K + Q6_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q2_k_model_matches_llama_cpp_bit_for_bit() {
    // Every projection and the tied output Q2_K: no repack on AVX2, so the
    // 253-row prefill runs ggml's tiled matmul and the 1- and 2-row steps
    // ggml_vec_dot_q2_K_q8_K.
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        (name.starts_with("blk.") || name == "token_embd.weight").then_some(Q2K)?
    });
    eprintln!("Q2_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

#[test]
fn tiny_q3_k_model_matches_llama_cpp_bit_for_bit() {
    // Every projection and the tied output Q3_K (tiled from 8 rows, vec_dot below).
    let (identical, max_diff, n) = tiny_kquant_agreement(|name| {
        (name.starts_with("blk.") || name == "token_embd.weight").then_some(Q3K)?
    });
    eprintln!("Q3_K: {identical}/{n} positions bit-identical, max |diff| {max_diff:e}");
    assert_eq!(identical, n, "max |diff| {max_diff:e}");
}

/// The bits of a tensor's values, row-major.
fn bits(t: &candle_core::Tensor) -> Vec<u32> {
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
                assert!(bits(w) == ggml(&name), "{dtype:?} {name}");
                checked += 1;
            }
        }
        assert!(bits(model.dense_output().unwrap()) == ggml("token_embd.weight"));
        eprintln!("{dtype:?}: {checked} projections and the output equal ggml's");
    }
}

/// What speculative decoding's verify step relies on: on Q4_K_M's mix
/// (Q4_K repacked, Q6_K), a draft of 9 tokens scored in one forward through
/// `forward_alone` gets, token for token, the logits bits of decoding them
/// one at a time; the plain batched forward does not (its gemm and tiled
/// kernels round otherwise), which is why the engine does not use it there.
#[test]
fn tiny_kquant_draft_rows_scored_alone_equal_one_token_steps() {
    use std::sync::Arc;
    use tern_runtime::backend::{Backend, LogitsWanted, Row, TernBackend};
    use tern_runtime::kv::policy::KvPolicy;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = tiny_kquant_model(dir.path(), q4_k_m_mix);
    let model = Arc::new(tern_runtime::LoadedModel::load(&path).unwrap());
    let vocab = model.config().vocab_size;
    let tokens: Vec<u32> = (0..29).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    let (prefix, draft) = tokens.split_at(20);
    let mut tern = TernBackend::new(Arc::clone(&model));
    // Logits of `draft` after `prefix`, the draft fed in `chunks`.
    let mut score = |chunks: &[usize], alone: bool| -> Vec<u32> {
        let seq = tern
            .new_seq(&KvPolicy::Full, Default::default(), 64)
            .unwrap();
        let first = Row {
            seq,
            tokens: prefix,
            start_pos: 0,
            logits: LogitsWanted::None,
        };
        tern.forward(&[first]).unwrap();
        let (mut out, mut at) = (Vec::new(), 0);
        for &n in chunks {
            let rows = [Row {
                seq,
                tokens: &draft[at..at + n],
                start_pos: prefix.len() + at,
                logits: LogitsWanted::All,
            }];
            let l = if alone {
                tern.forward_alone(&rows)
            } else {
                tern.forward(&rows)
            };
            out.extend(
                l.unwrap()
                    .pop()
                    .flatten()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits()),
            );
            at += n;
        }
        tern.free(seq);
        assert_eq!(out.len(), draft.len() * vocab);
        out
    };
    let steps = score(&[1; 9], false);
    assert_eq!(score(&[9], true), steps, "a 9-token draft scored alone");
    assert_eq!(
        score(&[4, 5], true),
        steps,
        "drafts of 4 and 5 scored alone"
    );
    assert_ne!(
        score(&[9], false),
        steps,
        "the batched kernels round otherwise"
    );
}
