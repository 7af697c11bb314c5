//! Tern's quantizer against llama.cpp's, called in process: ggml's
//! reference quantizers row for row, then whole tiny models (llama and Gemma 3)
//! and the real SmolLM2 quantized by both, tensor types and bytes compared
//! tensor by tensor. (A Tern-quantized file run by Tern and llama.cpp, and
//! `tern quantize`'s CLI: the root package's `tests/quantize.rs`.)

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use tern_models::{quantize_gguf, QuantType};

use crate::support::quantize::{self as lq, llama_ftype};
use crate::support::tiny::{write_tiny_model, TinySpec};
use crate::support::tiny_quant::wide;

extern "C" {
    fn ggml_quantize_chunk(
        t: i32,
        src: *const f32,
        dst: *mut c_void,
        start: i64,
        nrows: i64,
        n_per_row: i64,
        imatrix: *const f32,
    ) -> usize;
    fn ggml_row_size(t: i32, ne: i64) -> usize;
}

/// `(Tern's dtype, ggml's type id)` of every type Tern writes.
const TYPES: [(GgmlDType, i32); 10] = [
    (GgmlDType::F16, 1),
    (GgmlDType::BF16, 30),
    (GgmlDType::Q4_0, 2),
    (GgmlDType::Q4_1, 3),
    (GgmlDType::Q5_0, 6),
    (GgmlDType::Q5_1, 7),
    (GgmlDType::Q8_0, 8),
    (GgmlDType::Q4K, 12),
    (GgmlDType::Q5K, 13),
    (GgmlDType::Q6K, 14),
];

/// `rows x cols` values quantized by ggml (`ggml_quantize_chunk`, no imatrix).
fn ggml_bytes(t: i32, x: &[f32], cols: usize) -> Vec<u8> {
    let rows = x.len() / cols;
    // SAFETY: the output is sized by ggml's own row size; `x` holds rows * cols.
    unsafe {
        let mut out = vec![0u8; rows * ggml_row_size(t, cols as i64)];
        let n = ggml_quantize_chunk(
            t,
            x.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            cols as i64,
            std::ptr::null(),
        );
        assert_eq!(n, out.len());
        out
    }
}

/// Seeded test rows of several shapes of distribution: uniform, heavy-tailed
/// (cubes), with outliers, all positive, with zero and constant blocks, and
/// tiny magnitudes.
fn test_rows(seed: u64, cols: usize) -> Vec<Vec<f32>> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let uniform: Vec<f32> = (0..cols).map(|_| next() * 0.8).collect();
    let cubes: Vec<f32> = (0..cols).map(|_| next().powi(3) * 3.0).collect();
    let outliers: Vec<f32> = (0..cols)
        .map(|i| {
            if i % 97 == 5 {
                next() * 40.0
            } else {
                next() * 0.05
            }
        })
        .collect();
    let positive: Vec<f32> = (0..cols).map(|_| next().abs() + 0.25).collect();
    let blocks: Vec<f32> = (0..cols)
        .map(|i| match (i / 32) % 4 {
            0 => 0.0,
            1 => 0.375,
            _ => next(),
        })
        .collect();
    let tiny: Vec<f32> = (0..cols).map(|_| next() * 1e-6).collect();
    vec![uniform, cubes, outliers, positive, blocks, tiny]
}

/// Tern's quantizers equal ggml's byte for byte, every type, on rows built
/// to reach the quantizers' branches (zero blocks, a scale search that moves
/// the minimum, outliers, all-positive blocks).
#[test]
fn quantizers_equal_ggml_byte_for_byte() {
    let cols = 1024;
    for seed in 1..=40u64 {
        for (k, row) in test_rows(seed, cols).into_iter().enumerate() {
            for (dtype, id) in TYPES {
                let want = ggml_bytes(id, &row, cols);
                let got = tern_models::quant::quantize::quantize(dtype, &row).unwrap();
                assert!(
                    got == want,
                    "{dtype:?}, seed {seed}, row kind {k}: first differing byte {:?}",
                    got.iter().zip(&want).position(|(a, b)| a != b)
                );
            }
        }
    }
}

/// Every tensor of a GGUF: its type's name and data bytes (read by Tern,
/// whose reader also takes the IQ4 types candle's lacks).
fn tensors(path: &Path) -> BTreeMap<String, (String, Vec<u8>)> {
    let file = tern_models::GgufFile::open(path).unwrap();
    let mut out = BTreeMap::new();
    for name in file.tensor_names() {
        let v = match file.own_tensor(name) {
            Some(t) => (t.ty.name().to_string(), t.data.to_vec()),
            None => {
                let t = file.tensor(name).unwrap();
                (format!("{:?}", t.dtype()), t.data().unwrap().to_vec())
            }
        };
        out.insert(name.to_string(), v);
    }
    out
}

/// Asserts the two files hold the same tensors with the same types and bytes;
/// returns how many tensors of each type there are.
fn assert_same_tensors(ours: &Path, theirs: &Path, what: &str) -> BTreeMap<String, usize> {
    let (a, b) = (tensors(ours), tensors(theirs));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}: tensor names"
    );
    let mut counts = BTreeMap::new();
    for (name, (ta, da)) in &a {
        let (tb, db) = &b[name];
        assert_eq!(ta, tb, "{what}: type of {name}");
        assert!(
            da == db,
            "{what}: bytes of {name} ({ta:?}) differ from byte {:?}",
            da.iter().zip(db).position(|(x, y)| x != y)
        );
        *counts.entry(ta.clone()).or_default() += 1;
    }
    counts
}

fn ftype_of(q: QuantType) -> llama_ftype {
    match q {
        QuantType::Q4_0 => lq::LLAMA_FTYPE_MOSTLY_Q4_0,
        QuantType::Q4_1 => lq::LLAMA_FTYPE_MOSTLY_Q4_1,
        QuantType::Q5_0 => lq::LLAMA_FTYPE_MOSTLY_Q5_0,
        QuantType::Q5_1 => lq::LLAMA_FTYPE_MOSTLY_Q5_1,
        QuantType::Q8_0 => lq::LLAMA_FTYPE_MOSTLY_Q8_0,
        QuantType::F16 => lq::LLAMA_FTYPE_MOSTLY_F16,
        QuantType::BF16 => lq::LLAMA_FTYPE_MOSTLY_BF16,
        QuantType::Q4KM => lq::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        QuantType::Q4KS => lq::LLAMA_FTYPE_MOSTLY_Q4_K_S,
        QuantType::Q5KM => lq::LLAMA_FTYPE_MOSTLY_Q5_K_M,
        QuantType::Q6K => lq::LLAMA_FTYPE_MOSTLY_Q6_K,
        QuantType::Iq4Nl => lq::LLAMA_FTYPE_MOSTLY_IQ4_NL,
        QuantType::Iq4Xs => lq::LLAMA_FTYPE_MOSTLY_IQ4_XS,
    }
}

/// llama and Gemma 3 tiny models (F32) quantized by Tern and by llama.cpp to
/// every type: the same type and the same bytes for every tensor. Eight
/// llama layers so that `use_more_bits` picks some layers and not others.
#[test]
fn tiny_models_quantize_like_llama_quantize() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, layers) in [("llama", 8), ("gemma3", 6)] {
        let src = dir.path().join(format!("{arch}-f32.gguf"));
        write_tiny_model(&src, &wide(arch, layers));
        for q in QuantType::ALL {
            let ours = dir.path().join(format!("{arch}-{q}-tern.gguf"));
            let theirs = dir.path().join(format!("{arch}-{q}-llama.gguf"));
            quantize_gguf(&src, &ours, q, &mut |_, _, _| {}).unwrap();
            lq::quantize_gguf(&src, &theirs, ftype_of(q));
            let counts = assert_same_tensors(&ours, &theirs, &format!("{arch} {q}"));
            eprintln!("{arch} {q}: equal, tensors by type {counts:?}");
            let file = tern_models::GgufFile::open(&ours).unwrap();
            assert_eq!(file.u32("general.file_type").unwrap(), q.file_type());
        }
    }
}

/// An already-quantized source (the tiny model's Q8_0) requantized to
/// q4_k_m and q4_1: Tern dequantizes as ggml does, so the bytes still match
/// llama.cpp's with --allow-requantize.
#[test]
fn requantized_tiny_model_matches_llama_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q8_0.gguf");
    write_tiny_model(
        &src,
        &TinySpec {
            weight_dtype: GgmlDType::Q8_0,
            ..wide("llama", 2)
        },
    );
    for q in [QuantType::Q4KM, QuantType::Q4_1] {
        let ours = dir.path().join(format!("{q}-tern.gguf"));
        let theirs = dir.path().join(format!("{q}-llama.gguf"));
        quantize_gguf(&src, &ours, q, &mut |_, _, _| {}).unwrap();
        lq::requantize_gguf(&src, &theirs, ftype_of(q));
        assert_same_tensors(&ours, &theirs, &format!("requantized {q}"));
    }
}

/// The real SmolLM2 (Q4_1) requantized to q4_k_m by Tern and by llama.cpp:
/// the same type and bytes for every tensor. With `TERN_QUANTIZE_KEEP=DIR`
/// both files are kept there (`tern.gguf`, `llama.gguf`) for perplexity runs
/// (records/smollm2-q4_k_m-perplexity.jsonl).
#[test]
fn real_smollm2_q4_k_m_equals_llama_quantize() {
    let Some(src) = crate::support::real_model("real_smollm2_q4_k_m_equals_llama_quantize") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("tern.gguf");
    let theirs = dir.path().join("llama.gguf");
    quantize_gguf(&src, &ours, QuantType::Q4KM, &mut |_, _, _| {}).unwrap();
    lq::requantize_gguf(&src, &theirs, lq::LLAMA_FTYPE_MOSTLY_Q4_K_M);
    let counts = assert_same_tensors(&ours, &theirs, "SmolLM2 q4_k_m");
    eprintln!("SmolLM2 q4_k_m: every tensor equal, by type {counts:?}");
    if let Some(keep) = std::env::var_os("TERN_QUANTIZE_KEEP") {
        let keep = std::path::PathBuf::from(keep);
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::copy(&ours, keep.join("tern.gguf")).unwrap();
        std::fs::copy(&theirs, keep.join("llama.gguf")).unwrap();
    }
}
