//! Tiny generated models whose weights ggml's quantizer or llama.cpp's
//! `llama_model_quantize` wrote, for the kernel tests here and the root
//! package's end-to-end agreement with llama.cpp (which includes this file).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QStorage, QTensor};
use candle_core::Device;
use tern_models::gguf_types::OwnType;

use crate::support::ggml::{
    ggml_quantize, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};
use crate::support::quantize::{self, quantize_gguf_with};
use crate::support::tiny::{write_tiny_model, TinySpec};

/// A weight type picked for a tensor: Tern's dtype and ggml's type id.
pub type Pick = Option<(GgmlDType, i32)>;

pub const Q2K: Pick = Some((GgmlDType::Q2K, GGML_TYPE_Q2_K));
pub const Q3K: Pick = Some((GgmlDType::Q3K, GGML_TYPE_Q3_K));
pub const Q4K: Pick = Some((GgmlDType::Q4K, GGML_TYPE_Q4_K));
pub const Q5K: Pick = Some((GgmlDType::Q5K, GGML_TYPE_Q5_K));
pub const Q6K: Pick = Some((GgmlDType::Q6K, GGML_TYPE_Q6_K));

/// The default tiny model's projections: 2 layers of 7 each.
pub const PROJECTIONS: usize = 14;

/// Q4_K_M's mix: Q6_K for the embedding/output and ffn_down, Q4_K elsewhere.
pub fn q4_k_m_mix(name: &str) -> Pick {
    if name == "token_embd.weight" || name.ends_with("ffn_down.weight") {
        Q6K
    } else if name.starts_with("blk.") {
        Q4K
    } else {
        None
    }
}

/// Rewrites the GGUF at `path` with each 2-D weight requantized by ggml's own
/// quantizer to the type `pick` names for it (None: kept).
fn requantize(path: &Path, pick: impl Fn(&str) -> Pick) {
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

/// A tiny llama in `dir` with n_embd and n_ff multiples of 256 (K-quant
/// rows), its weights requantized by ggml per `pick`.
pub fn tiny_kquant_model(dir: &Path, pick: impl Fn(&str) -> Pick) -> (PathBuf, TinySpec) {
    let spec = TinySpec {
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_kv_head: 2,
        ..Default::default()
    };
    let path = dir.join("tiny-k.gguf");
    write_tiny_model(&path, &spec);
    requantize(&path, pick);
    (path, spec)
}

/// The tiny model of `spec` in `dir`, quantized by llama.cpp to `ftype` (the
/// token embedding and tied output too when `embd`); its path and how many of
/// its tensors are `own`.
pub fn tiny_iq4(
    dir: &Path,
    spec: &TinySpec,
    ftype: quantize::llama_ftype,
    own: OwnType,
    embd: bool,
) -> (PathBuf, usize) {
    let f32_path = dir.join("tiny-f32.gguf");
    write_tiny_model(
        &f32_path,
        &TinySpec {
            weight_dtype: GgmlDType::F32,
            rope_freqs: spec.rope_freqs.clone(),
            long_rope: spec.long_rope.clone(),
            ..*spec
        },
    );
    let path = dir.join("tiny-iq4.gguf");
    let embd = embd.then_some(own.id() as quantize::ggml_type);
    quantize_gguf_with(&f32_path, &path, ftype, embd);
    let file = tern_models::GgufFile::open(&path).unwrap();
    let types: Vec<String> = file
        .tensor_names()
        .iter()
        .map(|n| match file.own_type(n) {
            Some(t) => format!("{n}:{}", t.name()),
            None => format!("{n}:{:?}", file.tensor_dtype(n).unwrap()),
        })
        .collect();
    eprintln!("ftype {ftype}: {}", types.join(" "));
    let count = file
        .tensor_names()
        .iter()
        .filter(|n| file.own_type(n) == Some(own))
        .count();
    (path, count)
}

/// A tiny model wide enough for K-quant super-blocks: 256-wide rows, so the
/// projections take Q4_K/Q5_K/Q6_K and the tied embedding Q6_K, while rows of
/// other widths (Gemma 3's 128-wide attention output) take the fallbacks.
pub fn wide(arch: &'static str, layers: usize) -> TinySpec {
    TinySpec {
        n_embd: 256,
        n_ff: 512,
        n_layer: layers,
        weight_dtype: GgmlDType::F32,
        ..TinySpec::for_architecture(arch)
    }
}
