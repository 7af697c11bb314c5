//! Tiny models quantized by llama.cpp's own quantizer (`llama_model_quantize`
//! with its default parameters), so a test runs Tern on exactly the tensor
//! types a real `llama-quantize` output holds: the format under test for the
//! projections, and whatever llama.cpp keeps or falls back to elsewhere
//! (1-D norms stay F32; the tied embedding may get another type; a row length
//! that does not divide a K-quant's 256 falls back to a 32-value format).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType};

use super::tiny::{write_tiny_model, TinySpec};

/// llama.cpp's target file types (`llama_ftype`), as `llama-quantize` names them
/// (the ones the format tests quantize to, present or planned).
#[allow(unused_imports)]
pub use llama_cpp_sys_2::{
    llama_ftype, LLAMA_FTYPE_MOSTLY_BF16, LLAMA_FTYPE_MOSTLY_F16, LLAMA_FTYPE_MOSTLY_IQ4_NL,
    LLAMA_FTYPE_MOSTLY_IQ4_XS, LLAMA_FTYPE_MOSTLY_Q2_K, LLAMA_FTYPE_MOSTLY_Q3_K_M,
    LLAMA_FTYPE_MOSTLY_Q4_0, LLAMA_FTYPE_MOSTLY_Q4_1, LLAMA_FTYPE_MOSTLY_Q4_K_M,
    LLAMA_FTYPE_MOSTLY_Q4_K_S, LLAMA_FTYPE_MOSTLY_Q5_0, LLAMA_FTYPE_MOSTLY_Q5_1,
    LLAMA_FTYPE_MOSTLY_Q5_K_M, LLAMA_FTYPE_MOSTLY_Q6_K, LLAMA_FTYPE_MOSTLY_Q8_0,
};

/// Quantizes the GGUF at `input` into `output` as `ftype` with llama.cpp's
/// quantizer and its default parameters. Panics with llama.cpp's status on
/// failure.
pub fn quantize_gguf(input: &Path, output: &Path, ftype: llama_ftype) {
    quantize_gguf_with(input, output, ftype, None)
}

/// [`quantize_gguf`], with the token embedding and output forced to `embd`
/// when given (`llama-quantize --token-embedding-type --output-tensor-type`).
pub fn quantize_gguf_with(
    input: &Path,
    output: &Path,
    ftype: llama_ftype,
    embd: Option<ggml_type>,
) {
    let inp = CString::new(input.to_str().expect("utf-8 path")).expect("path");
    let out = CString::new(output.to_str().expect("utf-8 path")).expect("path");
    // SAFETY: plain C calls; the parameter struct is llama.cpp's own default,
    // its pointers null, and both paths are NUL-terminated and outlive the call.
    let status = unsafe {
        let mut params = llama_cpp_sys_2::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.nthread = 2;
        if let Some(t) = embd {
            params.token_embedding_type = t;
            params.output_tensor_type = t;
        }
        llama_cpp_sys_2::llama_model_quantize(inp.as_ptr(), out.as_ptr(), &params)
    };
    assert_eq!(
        status,
        0,
        "llama_model_quantize({} -> {}, ftype {ftype}) failed",
        input.display(),
        output.display()
    );
}

/// Every tensor of the GGUF at `path` with its type, in file order.
pub fn tensor_types(path: &Path) -> Vec<(String, GgmlDType)> {
    let mut file = std::fs::File::open(path).expect("open gguf");
    let content = gguf_file::Content::read(&mut file).expect("read gguf");
    let mut infos: Vec<_> = content
        .tensor_infos
        .iter()
        .map(|(name, info)| (info.offset, name.clone(), info.ggml_dtype))
        .collect();
    infos.sort_by_key(|(offset, _, _)| *offset);
    infos.into_iter().map(|(_, n, t)| (n, t)).collect()
}

/// Writes the tiny model of `spec` with F32 weights into `dir` and quantizes it
/// to `ftype` with llama.cpp. Returns the quantized file's path and its tensor
/// types (also printed, so a test log shows what was exercised).
pub fn quantized_tiny(
    dir: &Path,
    spec: &TinySpec,
    ftype: llama_ftype,
) -> (PathBuf, Vec<(String, GgmlDType)>) {
    let f32_path = dir.join("tiny-f32.gguf");
    let spec = TinySpec {
        weight_dtype: GgmlDType::F32,
        rope_freqs: spec.rope_freqs.clone(),
        long_rope: spec.long_rope.clone(),
        ..*spec
    };
    write_tiny_model(&f32_path, &spec);
    let out = dir.join(format!("tiny-ftype{ftype}.gguf"));
    quantize_gguf(&f32_path, &out, ftype);
    let types = tensor_types(&out);
    let listed: Vec<String> = types.iter().map(|(n, t)| format!("{n}:{t:?}")).collect();
    eprintln!("ftype {ftype}: {}", listed.join(" "));
    (out, types)
}

/// How many tensors of `types` are of type `t`.
pub fn count_of(types: &[(String, GgmlDType)], t: GgmlDType) -> usize {
    types.iter().filter(|(_, x)| *x == t).count()
}

/// ggml's type ids, for [`ggml_dequantize`] and [`ggml_vec_dot`].
#[allow(unused_imports)]
pub use llama_cpp_sys_2::{
    ggml_type, GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
    GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
};

/// `n` values of type `t` in `data` converted to f32 by ggml's own `to_float`
/// (what its `get_rows` runs for an embedding lookup).
pub fn ggml_dequantize(t: ggml_type, data: &[u8], n: usize) -> Vec<f32> {
    // SAFETY: the row size is ggml's own for `n` values of `t`, checked against
    // `data`; `out` holds `n` floats.
    unsafe {
        assert_eq!(data.len(), llama_cpp_sys_2::ggml_row_size(t, n as i64));
        let traits = &*llama_cpp_sys_2::ggml_get_type_traits(t);
        let to_float = traits.to_float.expect("type has to_float");
        let mut out = vec![0f32; n];
        to_float(data.as_ptr().cast(), out.as_mut_ptr(), n as i64);
        out
    }
}

/// One weight row `w` of type `t` (ggml's bytes) dotted with activations `x` the
/// way ggml's CPU backend does for a single activation row: `x` converted to the
/// type's `vec_dot_type` by ggml's `from_float`, then ggml's `vec_dot`.
pub fn ggml_vec_dot(t: ggml_type, w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    // SAFETY: ggml is initialised first (its f16 table); the buffers have ggml's
    // own row sizes for `n` values of their types.
    unsafe {
        llama_cpp_sys_2::ggml_cpu_init();
        assert_eq!(w.len(), llama_cpp_sys_2::ggml_row_size(t, n as i64));
        let traits = &*llama_cpp_sys_2::ggml_get_type_traits_cpu(t);
        let vt = traits.vec_dot_type;
        let mut y = vec![0u8; llama_cpp_sys_2::ggml_row_size(vt, n as i64)];
        let from_float = (*llama_cpp_sys_2::ggml_get_type_traits_cpu(vt))
            .from_float
            .expect("vec_dot_type has from_float");
        from_float(x.as_ptr(), y.as_mut_ptr().cast(), n as i64);
        let vec_dot = traits.vec_dot.expect("type has vec_dot");
        let mut s = 0f32;
        vec_dot(
            n as i32,
            &mut s,
            0,
            w.as_ptr().cast(),
            0,
            y.as_ptr().cast(),
            0,
            1,
        );
        s
    }
}

/// [`quantize_gguf`] with `--allow-requantize`: a source whose tensors are
/// already quantized is dequantized by ggml and quantized again.
pub fn requantize_gguf(input: &Path, output: &Path, ftype: llama_ftype) {
    let inp = CString::new(input.to_str().expect("utf-8 path")).expect("path");
    let out = CString::new(output.to_str().expect("utf-8 path")).expect("path");
    // SAFETY: as in `quantize_gguf`.
    let status = unsafe {
        let mut params = llama_cpp_sys_2::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.nthread = 2;
        params.allow_requantize = true;
        llama_cpp_sys_2::llama_model_quantize(inp.as_ptr(), out.as_ptr(), &params)
    };
    assert_eq!(status, 0, "llama_model_quantize (requantize) failed");
}
