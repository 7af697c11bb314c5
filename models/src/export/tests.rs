//! Export on a tiny generated llama: round trips through `GgufFile` and
//! `Model::load`, replacements, bad input, and the atomic write.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::{export_gguf, ExportQuant};
use crate::error::{ModelError, Result};
use crate::{GgufFile, KvStore, LogitsWanted, Model, SeqBatch};

const VOCAB: usize = 96;
const D: usize = 64;
const KVD: usize = 32;
const FF: usize = 128;
const LAYERS: usize = 2;

/// Writes a tiny llama whose matrices are Q4_1 and whose embedding is Q8_0, as
/// in the real SmolLM2 file, so a q8_0 export re-quantizes some tensors and
/// copies others. Tied: there is no `output.weight`.
fn write_source(path: &Path) {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        // xorshift64*: deterministic weights without a rand dependency.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed.wrapping_mul(0x2545F4914F6CDD1D) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let mut tensor = |dims: &[usize], scale: f32, offset: f32, dtype: GgmlDType| {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| offset + next() * scale).collect();
        let t = Tensor::from_vec(data, dims, &Device::Cpu).unwrap();
        QTensor::quantize(&t, dtype).unwrap()
    };
    let mut named: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            tensor(&[VOCAB, D], 1.0, 0.0, GgmlDType::Q8_0),
        ),
        (
            "output_norm.weight".into(),
            tensor(&[D], 0.2, 1.0, GgmlDType::F32),
        ),
    ];
    for i in 0..LAYERS {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let q41 = GgmlDType::Q4_1;
        named.push((p("attn_norm"), tensor(&[D], 0.2, 1.0, GgmlDType::F32)));
        named.push((p("attn_q"), tensor(&[D, D], 0.5, 0.0, q41)));
        named.push((p("attn_k"), tensor(&[KVD, D], 0.5, 0.0, q41)));
        named.push((p("attn_v"), tensor(&[KVD, D], 0.5, 0.0, q41)));
        named.push((p("attn_output"), tensor(&[D, D], 0.5, 0.0, q41)));
        named.push((p("ffn_norm"), tensor(&[D], 0.2, 1.0, GgmlDType::F32)));
        named.push((p("ffn_gate"), tensor(&[FF, D], 0.5, 0.0, q41)));
        named.push((p("ffn_up"), tensor(&[FF, D], 0.5, 0.0, q41)));
        named.push((p("ffn_down"), tensor(&[D, FF], 0.5, 0.0, q41)));
    }
    let u = |v: usize| Value::U32(v as u32);
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("export-tiny".into())),
        ("general.file_type", u(3)),
        ("llama.block_count", u(LAYERS)),
        ("llama.embedding_length", u(D)),
        ("llama.feed_forward_length", u(FF)),
        ("llama.attention.head_count", u(4)),
        ("llama.attention.head_count_kv", u(2)),
        ("llama.context_length", u(64)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", u(VOCAB)),
        (
            "tokenizer.ggml.scores",
            Value::Array((0..VOCAB).map(|i| Value::F32(i as f32)).collect()),
        ),
        ("tokenizer.ggml.empty", Value::Array(vec![])),
    ];
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = named.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    candle_core::quantized::gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
}

/// A plain full-attention cache: enough to run the forward pass here.
struct FullCache {
    k: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    pos: Vec<Vec<u32>>,
}

impl FullCache {
    fn new() -> Self {
        Self {
            k: vec![None; LAYERS],
            v: vec![None; LAYERS],
            pos: vec![Vec::new(); LAYERS],
        }
    }
}

impl KvStore for FullCache {
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        positions: &[u32],
    ) -> Result<(Tensor, Tensor)> {
        let cat = |old: &Option<Tensor>, new: &Tensor| -> Result<Tensor> {
            Ok(match old {
                Some(o) => Tensor::cat(&[o, new], 1)?,
                None => new.clone(),
            })
        };
        let (k, v) = (cat(&self.k[layer], k)?, cat(&self.v[layer], v)?);
        self.k[layer] = Some(k.clone());
        self.v[layer] = Some(v.clone());
        self.pos[layer].extend_from_slice(positions);
        Ok((k, v))
    }

    fn positions(&self, layer: usize, _head: usize) -> &[u32] {
        &self.pos[layer]
    }
}

/// Logits of every position of a fixed prompt: `[n, vocab]` f32.
fn logits(path: &Path) -> Tensor {
    let file = GgufFile::open(path).unwrap();
    let model = Model::load(&file).unwrap();
    let tokens: Vec<u32> = vec![1, 5, 9, 17, 33, 60, 2, 95, 40, 11];
    let mut cache = FullCache::new();
    let mut batch = [SeqBatch {
        tokens: &tokens,
        start_pos: 0,
        cache: &mut cache,
        logits: LogitsWanted::All,
    }];
    model.forward(&mut batch).unwrap().remove(0).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).and_then(|d| d.abs()).and_then(|d| d.max_all());
    d.and_then(|d| d.to_scalar()).unwrap()
}

fn rms(a: &Tensor) -> f32 {
    let ms = a
        .sqr()
        .and_then(|s| s.mean_all())
        .and_then(|m| m.to_scalar::<f32>());
    ms.unwrap().sqrt()
}

fn max_abs(a: &Tensor) -> f32 {
    max_abs_diff(a, &a.zeros_like().unwrap())
}

/// A temporary directory holding the tiny source model.
fn source() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.gguf");
    write_source(&src);
    (dir, src)
}

fn dequantized(path: &Path, name: &str) -> Tensor {
    let file = GgufFile::open(path).unwrap();
    file.tensor(name).unwrap().dequantize(&Device::Cpu).unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn export_types_parse_and_print() {
    for (s, q) in [
        ("q8_0", ExportQuant::Q8_0),
        ("Q4_0", ExportQuant::Q4_0),
        ("f16", ExportQuant::F16),
    ] {
        let parsed: ExportQuant = s.parse().unwrap();
        assert_eq!(parsed, q);
        assert_eq!(parsed.to_string(), s.to_ascii_lowercase());
    }
    for q in ExportQuant::ALL {
        assert_eq!(q.name().to_uppercase().parse::<ExportQuant>().unwrap(), q);
    }
    let err = "q5_k".parse::<ExportQuant>().unwrap_err().to_string();
    assert_eq!(
        err,
        "unknown quantization type `q5_k` (valid: q4_0, q4_1, q5_0, q5_1, q8_0, f16, bf16, q4_k_m, q4_k_s, q5_k_m, q6_k, iq4_nl, iq4_xs)"
    );
}

#[test]
fn q8_0_round_trip_keeps_metadata_types_and_logits() {
    let (dir, src) = source();
    let out = dir.path().join("out.gguf");
    let report = export_gguf(&src, &out, &HashMap::new(), ExportQuant::Q8_0).unwrap();
    assert_eq!(report.tensors, 2 + 9 * LAYERS);
    assert_eq!(report.replaced, 0);
    assert_eq!(report.bytes, std::fs::metadata(&out).unwrap().len());

    let (a, b) = (GgufFile::open(&src).unwrap(), GgufFile::open(&out).unwrap());
    let keys = |f: &GgufFile| {
        f.metadata()
            .iter()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
    };
    // Every key copied, plus the quantization version llama.cpp adds.
    let mut want = keys(&a);
    if !want.iter().any(|k| k == "general.quantization_version") {
        want.push("general.quantization_version".into());
        want.sort();
    }
    assert_eq!(want, keys(&b), "every metadata key copied");
    assert_eq!(b.u32("general.quantization_version").unwrap(), 2);
    assert_eq!(b.u32("general.file_type").unwrap(), 7);
    assert_eq!(b.str("general.name").unwrap(), "export-tiny");
    match b.get("tokenizer.ggml.scores") {
        Some(Value::Array(v)) => assert_eq!(v.len(), VOCAB),
        other => panic!("scores not copied: {other:?}"),
    }
    for name in a.tensor_names() {
        let want = if a.tensor_dims(name).unwrap().len() == 1 {
            GgmlDType::F32
        } else {
            GgmlDType::Q8_0
        };
        assert_eq!(b.tensor_dtype(name), Some(want), "{name}");
        assert_eq!(a.tensor_dims(name), b.tensor_dims(name), "{name}");
    }
    // The Q8_0 embedding is copied byte for byte, not re-quantized.
    let raw = |f: &GgufFile| {
        f.tensor("token_embd.weight")
            .unwrap()
            .data()
            .unwrap()
            .to_vec()
    };
    assert_eq!(raw(&a), raw(&b));

    let (la, lb) = (logits(&src), logits(&out));
    let diff = max_abs_diff(&la, &lb);
    eprintln!(
        "q8_0 export: max |logit diff| {diff:.5} (logits up to {:.2})",
        max_abs(&la)
    );
    assert!(diff < 0.05 * max_abs(&la), "q8_0 drifted by {diff}");
}

#[test]
fn f16_and_q4_0_exports_load_and_stay_close() {
    let (dir, src) = source();
    let reference = logits(&src);
    let name = "blk.1.ffn_down.weight";
    let weight = dequantized(&src, name);
    // (type, RMS weight error relative to the weights' RMS, max logit error
    // relative to the largest logit). F16's logits still move: the Q4_1 source
    // runs on kernels that quantize activations to 8 bits, as llama.cpp does,
    // while F16 runs on f32 ones. The random tiny model amplifies Q4_0's
    // rounding into its logits, hence the wide logit bound.
    for (quant, weight_tol, logit_tol) in [
        (ExportQuant::F16, 0.001, 0.05),
        (ExportQuant::Q4_0, 0.1, 0.5),
    ] {
        let out = dir.path().join(format!("out-{quant}.gguf"));
        export_gguf(&src, &out, &HashMap::new(), quant).unwrap();
        let file = GgufFile::open(&out).unwrap();
        assert_eq!(
            file.tensor_dtype(name).map(crate::quant::WeightType::Ggml),
            Some(quant.default_type())
        );
        assert_eq!(file.u32("general.file_type").unwrap(), quant.file_type());
        // The tied embedding is the output projection: never below 8 bits.
        let embd = match quant {
            ExportQuant::Q4_0 => crate::quant::WeightType::Ggml(GgmlDType::Q8_0),
            _ => quant.default_type(),
        };
        assert_eq!(
            file.tensor_dtype("token_embd.weight")
                .map(crate::quant::WeightType::Ggml),
            Some(embd)
        );
        let w_diff = rms(&(&weight - dequantized(&out, name)).unwrap()) / rms(&weight);
        let diff = max_abs_diff(&reference, &logits(&out));
        eprintln!(
            "{quant} export: relative RMS weight error {w_diff:.5}, max |logit diff| {diff:.5}"
        );
        assert!(w_diff < weight_tol, "{quant}: weight {w_diff}");
        assert!(
            diff < logit_tol * max_abs(&reference),
            "{quant}: logits {diff}"
        );
    }
}

#[test]
fn replacements_take_the_place_of_source_tensors() {
    let (dir, src) = source();
    let reference = logits(&src);

    // The source's own values as a replacement: same model, and it counts.
    let same = HashMap::from([(
        "blk.0.ffn_down.weight".to_string(),
        dequantized(&src, "blk.0.ffn_down.weight"),
    )]);
    let out = dir.path().join("same.gguf");
    let report = export_gguf(&src, &out, &same, ExportQuant::Q8_0).unwrap();
    assert_eq!(report.replaced, 1);
    assert!(max_abs_diff(&reference, &logits(&out)) < 0.05 * max_abs(&reference));

    // New values: the file holds them and the output changes.
    let new_down = (dequantized(&src, "blk.0.ffn_down.weight") * -3.0).unwrap();
    let new_norm = Tensor::full(0.5f32, D, &Device::Cpu).unwrap();
    let changed = HashMap::from([
        ("blk.0.ffn_down.weight".to_string(), new_down.clone()),
        ("output_norm.weight".to_string(), new_norm.clone()),
    ]);
    let out = dir.path().join("changed.gguf");
    let report = export_gguf(&src, &out, &changed, ExportQuant::Q8_0).unwrap();
    assert_eq!(report.replaced, 2);
    let back = dequantized(&out, "blk.0.ffn_down.weight");
    assert!(max_abs_diff(&back, &new_down) < 0.02 * max_abs(&new_down));
    assert_eq!(
        dequantized(&out, "output_norm.weight")
            .to_vec1::<f32>()
            .unwrap(),
        new_norm.to_vec1::<f32>().unwrap(),
        "norms are written as exact f32"
    );
    let diff = max_abs_diff(&reference, &logits(&out));
    assert!(diff > 0.5, "replacement did not change the output ({diff})");

    // The tied embedding is also the output projection: replacing it moves the
    // logits even of a prompt whose own embeddings stay the same.
    let mut embd = dequantized(&src, "token_embd.weight")
        .to_vec2::<f32>()
        .unwrap();
    embd[70].iter_mut().for_each(|x| *x = 4.0);
    let embd = Tensor::new(embd, &Device::Cpu).unwrap();
    let tied = HashMap::from([("token_embd.weight".to_string(), embd)]);
    let out = dir.path().join("tied.gguf");
    export_gguf(&src, &out, &tied, ExportQuant::Q8_0).unwrap();
    let l = logits(&out);
    let col = |t: &Tensor| t.narrow(1, 70, 1).unwrap();
    assert!(max_abs_diff(&col(&reference), &col(&l)) > 1.0);
}

#[test]
fn bad_names_and_shapes_are_refused_before_writing() {
    let (dir, src) = source();
    let out = dir.path().join("out.gguf");
    let zeros =
        |dims: &[usize]| Tensor::zeros(dims, candle_core::DType::F32, &Device::Cpu).unwrap();

    let bad = HashMap::from([("blk.9.attn_q.weight".to_string(), zeros(&[D, D]))]);
    let err = export_gguf(&src, &out, &bad, ExportQuant::Q8_0).unwrap_err();
    assert!(matches!(err, ModelError::UnknownTensor { .. }), "{err}");
    assert!(err.to_string().contains("`blk.9.attn_q.weight`"), "{err}");

    let bad = HashMap::from([("output.weight".to_string(), zeros(&[VOCAB, D]))]);
    let err = export_gguf(&src, &out, &bad, ExportQuant::Q8_0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ties its output projection to `token_embd.weight`"),
        "{err}"
    );

    // [in, out] instead of [out, in]: the transposition mistake this catches.
    let bad = HashMap::from([("blk.0.attn_k.weight".to_string(), zeros(&[D, KVD]))]);
    let err = export_gguf(&src, &out, &bad, ExportQuant::Q8_0).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "replacement for tensor `blk.0.attn_k.weight` has shape [{D}, {KVD}], the source's is [{KVD}, {D}]"
        )
    );
    assert_eq!(files_in(dir.path()), ["src.gguf"], "nothing written");
}

#[test]
fn a_failed_export_leaves_the_old_file_and_no_partial() {
    let (dir, src) = source();
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"the previous export").unwrap();
    // NaN in a tensor written late: the failure comes mid-file.
    let mut w = dequantized(&src, "blk.1.ffn_down.weight")
        .to_vec2::<f32>()
        .unwrap();
    w[3][5] = f32::NAN;
    let nan = HashMap::from([(
        "blk.1.ffn_down.weight".to_string(),
        Tensor::new(w, &Device::Cpu).unwrap(),
    )]);
    let err = export_gguf(&src, &out, &nan, ExportQuant::Q8_0).unwrap_err();
    assert!(matches!(err, ModelError::NonFiniteTensor { .. }), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous export");
    assert_eq!(files_in(dir.path()), ["out.gguf", "src.gguf"]);

    // A success replaces it whole.
    export_gguf(&src, &out, &HashMap::new(), ExportQuant::Q8_0).unwrap();
    assert_eq!(files_in(dir.path()), ["out.gguf", "src.gguf"]);
    GgufFile::open(&out).unwrap();
}

#[test]
fn an_unwritable_output_directory_is_a_clear_error() {
    let (dir, src) = source();
    // A regular file where the directory should be: unwritable even as root.
    let not_a_dir = dir.path().join("plain-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let out = not_a_dir.join("model.gguf");
    let err = export_gguf(&src, &out, &HashMap::new(), ExportQuant::Q8_0).unwrap_err();
    assert!(matches!(err, ModelError::Write { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("cannot write {}", out.display())),
        "{msg}"
    );
    let out = dir.path().join("missing-dir/model.gguf");
    let err = export_gguf(&src, &out, &HashMap::new(), ExportQuant::Q8_0).unwrap_err();
    assert!(err.to_string().contains("missing-dir"), "{err}");
}

/// `tern export --quant q4_k_m` goes through llama.cpp's mix: with 64-wide
/// rows every K-quant falls back to its 32-value stand-in (Q4_K to Q5_0, the
/// extra-bits Q6_K of the last layer's `attn_v` and `ffn_down` to Q8_0), the tied embedding
/// stays at Q8_0 and the norms keep F32.
#[test]
fn q4_k_m_export_follows_llama_cpp_mix() {
    let (dir, src) = source();
    let out = dir.path().join("out-q4_k_m.gguf");
    let report = export_gguf(&src, &out, &HashMap::new(), ExportQuant::Q4KM).unwrap();
    let file = GgufFile::open(&out).unwrap();
    let ty = |n: &str| file.tensor_dtype(n).unwrap();
    assert_eq!(file.u32("general.file_type").unwrap(), 15);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlDType::Q5_0);
    // Of two layers, `use_more_bits` picks the last only.
    assert_eq!(ty("blk.0.attn_v.weight"), GgmlDType::Q5_0);
    assert_eq!(ty("blk.1.attn_v.weight"), GgmlDType::Q8_0);
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlDType::Q5_0);
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlDType::Q8_0);
    assert_eq!(ty("token_embd.weight"), GgmlDType::Q8_0);
    assert_eq!(ty("blk.0.attn_norm.weight"), GgmlDType::F32);
    assert_eq!(report.fallbacks, 7 * LAYERS);
    let diff = max_abs_diff(&logits(&src), &logits(&out));
    assert!(diff.is_finite(), "q4_k_m export does not run");
}
