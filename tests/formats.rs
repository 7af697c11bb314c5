//! Weight formats against llama.cpp: a tiny model quantized by llama.cpp's
//! own quantizer to each format, teacher-forced through Tern and through the
//! in-process llama.cpp, must give bit-identical logits at every position.
#![cfg(feature = "llama-cpp")]

use candle_core::quantized::GgmlDType;

use crate::backend::file_agreement;
use crate::support::quantize::{self, count_of, llama_ftype};
use crate::support::tiny::TinySpec;

/// Quantizes the default tiny model (and `spec`'s shape) to `ftype`, checks that
/// at least `min_tensors` tensors came out as `format` (llama.cpp keeps norms
/// F32 and may pick other types elsewhere), and asserts bit-identical logits
/// with llama.cpp over the whole context (256 positions).
pub(crate) fn assert_quantized_tiny_matches(
    spec: &TinySpec,
    ftype: llama_ftype,
    format: GgmlDType,
    min_tensors: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let (path, types) = quantize::quantized_tiny(dir.path(), spec, ftype);
    let got = count_of(&types, format);
    assert!(
        got >= min_tensors,
        "ftype {ftype}: {got} {format:?} tensors, wanted at least {min_tensors}: {types:?}"
    );
    let (identical, top1, max_diff, n) = file_agreement(&path, spec.context_length);
    eprintln!(
        "{format:?} ({got} tensors): {identical}/{n} positions bit-identical, top-1 {top1}/{n}, max |diff| {max_diff:e}"
    );
    assert_eq!(
        identical, n,
        "{format:?}: max |diff| {max_diff:e}, top-1 {top1}/{n}"
    );
}

/// 2 layers of 7 projections each: all 14 in the format under test.
const PROJECTIONS: usize = 14;

#[test]
fn tiny_q5_0_matches_llama_cpp_bit_for_bit() {
    assert_quantized_tiny_matches(
        &TinySpec::default(),
        quantize::LLAMA_FTYPE_MOSTLY_Q5_0,
        GgmlDType::Q5_0,
        PROJECTIONS,
    );
}

/// `(candle dtype, ggml type)` of the formats checked against ggml's functions.
const GGML_FORMATS: [(GgmlDType, quantize::ggml_type); 6] = [
    (GgmlDType::Q4_1, quantize::GGML_TYPE_Q4_1),
    (GgmlDType::Q8_0, quantize::GGML_TYPE_Q8_0),
    (GgmlDType::Q5_0, quantize::GGML_TYPE_Q5_0),
    (GgmlDType::Q5_1, quantize::GGML_TYPE_Q5_1),
    (GgmlDType::F16, quantize::GGML_TYPE_F16),
    (GgmlDType::BF16, quantize::GGML_TYPE_BF16),
];

/// Seeded values in `[-scale, scale)` (xorshift, no rand dependency here).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Tern's embedding rows (its dequantization) equal ggml's `to_float` bit for
/// bit, and a single activation row (a decode step) through Tern's layer equals
/// ggml's `vec_dot` on ggml's own converted activations, for every native format.
#[test]
fn native_formats_dequantize_and_dot_like_ggml() {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};
    use tern_models::quant::QLinear;
    for (dtype, gt) in GGML_FORMATS {
        // 96: a tail past the last 32 for the float formats' vec_dot.
        let dims: &[usize] = if matches!(dtype, GgmlDType::F16 | GgmlDType::BF16) {
            &[64, 96, 576]
        } else {
            &[64, 576]
        };
        for &inp in dims {
            let out = 12;
            let w = values(inp as u64 * 31 + gt as u64, out * inp, 0.8);
            // An offset so Q4_1's and Q5_1's `m` matter.
            let w: Vec<f32> = w.iter().map(|v| v + 0.1).collect();
            let wt = Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap();
            let qw = QTensor::quantize(&wt, dtype).unwrap();
            let raw = qw.data().unwrap().to_vec();
            let lin = QLinear::from_qtensor(qw).unwrap();
            assert!(lin.is_native(), "{dtype:?}");
            let row_bytes = raw.len() / out;
            let ids: Vec<u32> = (0..out as u32).collect();
            let rows = lin.rows(&ids).unwrap();
            let x = values(inp as u64 + 5, inp, 2.0);
            let xt = Tensor::from_vec(x.clone(), (1, inp), &Device::Cpu).unwrap();
            let y = lin
                .forward(&xt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for r in 0..out {
                let bytes = &raw[r * row_bytes..(r + 1) * row_bytes];
                let want = quantize::ggml_dequantize(gt, bytes, inp);
                let got = rows.get(r).unwrap().to_vec1::<f32>().unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{dtype:?} in={inp} row {r}: dequantized"
                );
                let d = quantize::ggml_vec_dot(gt, bytes, &x);
                assert_eq!(
                    y[r].to_bits(),
                    d.to_bits(),
                    "{dtype:?} in={inp} row {r}: Tern {} vs ggml vec_dot {d}",
                    y[r]
                );
            }
        }
    }
}

#[test]
fn tiny_q5_1_matches_llama_cpp_bit_for_bit() {
    assert_quantized_tiny_matches(
        &TinySpec::default(),
        quantize::LLAMA_FTYPE_MOSTLY_Q5_1,
        GgmlDType::Q5_1,
        PROJECTIONS,
    );
}

#[test]
fn tiny_f16_matches_llama_cpp_bit_for_bit() {
    assert_quantized_tiny_matches(
        &TinySpec::default(),
        quantize::LLAMA_FTYPE_MOSTLY_F16,
        GgmlDType::F16,
        PROJECTIONS,
    );
}

/// Wider than the default model: a product of two bf16 values is exact in f32
/// and short sums of them often are too, so at width 64 a wrong summation order
/// still matched (seen with tinyBLAS's order switched off); at 256 it does not.
#[test]
fn tiny_bf16_matches_llama_cpp_bit_for_bit() {
    assert_quantized_tiny_matches(
        &TinySpec {
            n_embd: 256,
            n_ff: 512,
            ..TinySpec::default()
        },
        quantize::LLAMA_FTYPE_MOSTLY_BF16,
        GgmlDType::BF16,
        PROJECTIONS,
    );
}

/// Q8_0 as llama.cpp's quantizer writes it (the hand-written tiny models are
/// candle-quantized): a check of the harness on a format matched before.
#[test]
fn tiny_q8_0_matches_llama_cpp_bit_for_bit() {
    assert_quantized_tiny_matches(
        &TinySpec::default(),
        quantize::LLAMA_FTYPE_MOSTLY_Q8_0,
        GgmlDType::Q8_0,
        PROJECTIONS,
    );
}

/// A tiny model quantized to Q4_0 by llama.cpp's quantizer: every projection
/// has a row count divisible by 8, so llama.cpp repacks all 14 and runs them
/// in the gemm/gemv order; the tied output (263 rows) stays plain.
#[test]
fn tiny_q4_0_matches_llama_cpp_bit_for_bit() {
    assert_quantized_tiny_matches(
        &TinySpec::default(),
        quantize::LLAMA_FTYPE_MOSTLY_Q4_0,
        GgmlDType::Q4_0,
        PROJECTIONS,
    );
}
