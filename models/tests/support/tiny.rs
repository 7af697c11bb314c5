//! A tiny llama model, generated: random weights, a byte-level vocabulary and a
//! ChatML template, written as a real GGUF file so every loading path is the
//! production one. (The root package's end-to-end tests include this file as
//! their `support::tiny` too, and load the model there.)

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Shape and naming knobs of the tiny model.
pub struct TinySpec {
    pub architecture: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub n_ff: usize,
    pub context_length: usize,
    pub seed: u64,
    /// A declared head dimension (`attention.key_length`), as Qwen3 has;
    /// `None` is `n_embd / n_head`.
    pub head_dim: Option<usize>,
    /// Llama 3's RoPE frequency factors (`rope_freqs.weight`), one per pair.
    pub rope_freqs: Option<Vec<f32>>,
    /// Linear RoPE scaling (`rope.scaling.type = linear`) by this factor.
    pub rope_linear: Option<f32>,
    /// Write a chat template (a base model has none).
    pub chat_template: bool,
    /// phi3: LongRoPE factors and their metadata.
    pub long_rope: Option<TinyLongRope>,
    /// phi3: separate `attn_{q,k,v}` instead of the fused `attn_qkv`.
    pub separate_qkv: bool,
    /// The type of the 2-D weights (embedding and projections): Q8_0 by
    /// default; F32 gives llama.cpp's quantizer full-precision input
    /// (`support::quantize`).
    pub weight_dtype: GgmlDType,
    /// `rope.freq_base` (10000 when `None`).
    pub rope_base: Option<f32>,
    /// Sliding-window attention (`attention.sliding_window`), as Gemma 3 has.
    pub sliding_window: Option<usize>,
    /// The sliding layers' RoPE base (`rope.freq_base_swa`).
    pub rope_base_swa: Option<f32>,
    /// Final logit soft-capping (`final_logit_softcapping`), as Gemma 2 and
    /// some Gemma 3 conversions declare.
    pub logit_softcap: Option<f32>,
}

/// Phi-3's LongRoPE as a GGUF holds it.
#[derive(Clone)]
pub struct TinyLongRope {
    /// `rope_factors_short.weight`, one per rotated pair.
    pub short: Vec<f32>,
    /// `rope_factors_long.weight`.
    pub long: Vec<f32>,
    /// `rope.scaling.original_context_length`: the long factors apply when
    /// the context exceeds it.
    pub original_context: usize,
    /// `rope.scaling.attn_factor`.
    pub attn_factor: f32,
}

impl TinySpec {
    /// The tiny model the per-architecture checks use for `arch`: the
    /// default shape, plus what the architecture needs to show its features
    /// (Qwen3's declared head dimension, Gemma 3's sliding layers).
    pub fn for_architecture(arch: &'static str) -> Self {
        match arch {
            "gemma3" => Self::gemma3(),
            _ => Self {
                architecture: arch,
                // Qwen3 declares its head dimension apart from n_embd / n_head.
                head_dim: (arch == "qwen3").then_some(32),
                ..Self::default()
            },
        }
    }

    /// A tiny Gemma 3: six layers so that llama.cpp's default pattern makes
    /// five slide and the last attend globally, a window of 16 (far shorter
    /// than the 256-token context), a declared head dimension (32, not
    /// 64 / 4), one KV head as the real 270M has, different RoPE bases for
    /// global and sliding layers, and no chat template (a base model).
    pub fn gemma3() -> Self {
        Self {
            architecture: "gemma3",
            n_layer: 6,
            n_kv_head: 1,
            head_dim: Some(32),
            chat_template: false,
            rope_base: Some(1_000_000.0),
            sliding_window: Some(16),
            rope_base_swa: Some(10_000.0),
            ..Self::default()
        }
    }
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            architecture: "llama",
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_kv_head: 2,
            n_ff: 128,
            context_length: 256,
            seed: 7,
            head_dim: None,
            rope_freqs: None,
            rope_linear: None,
            chat_template: true,
            long_rope: None,
            separate_qkv: false,
            weight_dtype: GgmlDType::Q8_0,
            rope_base: None,
            sliding_window: None,
            rope_base_swa: None,
            logit_softcap: None,
        }
    }
}

/// GPT-2's printable stand-in for each byte, as byte-level BPE vocabularies use.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("valid char")
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Writes the tiny model to `path`.
/// A vocabulary for a generated model: a real one (Qwen's, Llama 3's, read
/// from their `tokenizer.json`) in place of the tiny byte-level default.
pub struct TinyVocab {
    /// Token text by id, byte-level encoded.
    pub tokens: Vec<String>,
    /// GGUF token types by id (1 normal, 3 control, 4 user-defined).
    pub types: Vec<i32>,
    /// BPE merges, `"a b"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// BOS and EOS ids, and whether BOS is added to prompts.
    pub bos: u32,
    pub eos: u32,
    pub add_bos: bool,
    /// Further `tokenizer.*` keys, written over the ones above (a real
    /// file's `tokenizer.ggml.model`, scores, flags ...).
    pub meta: Vec<(String, Value)>,
}

pub fn write_tiny_model(path: &Path, spec: &TinySpec) {
    write_tiny_model_with(path, spec, None)
}

/// [`write_tiny_model`] with `vocab` instead of the byte-level default.
pub fn write_tiny_model_with(path: &Path, spec: &TinySpec, vocab: Option<&TinyVocab>) {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types: Vec<i32> = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    let mut merges: Vec<String> = ["h e", "l l", "Ġ t", "he ll"].map(String::from).into();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let (mut pre, mut bos, mut eos, mut add_bos) = ("smollm", 1, 2, false);
    let mut extra: Vec<(String, Value)> = Vec::new();
    if let Some(v) = vocab {
        (tokens, types, merges) = (v.tokens.clone(), v.types.clone(), v.merges.clone());
        (pre, bos, eos, add_bos) = (v.pre, v.bos as usize, v.eos as usize, v.add_bos);
        extra = v.meta.clone();
    }
    let vocab = tokens.len();

    let mut rng = spec.seed;
    let mut next = move || {
        // xorshift64*: deterministic weights without a rand dependency.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        ((rng.wrapping_mul(0x2545F4914F6CDD1D) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let mut tensor = |dims: &[usize], scale: f32, dtype: GgmlDType| -> QTensor {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| next() * scale).collect();
        let t = Tensor::from_vec(data, dims, &Device::Cpu).expect("tensor");
        QTensor::quantize(&t, dtype).expect("quantize")
    };
    let ones = |n: usize| {
        let t = Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).expect("ones");
        QTensor::quantize(&t, GgmlDType::F32).expect("f32")
    };
    let wt = spec.weight_dtype;
    let hd = spec.head_dim.unwrap_or(spec.n_embd / spec.n_head);
    let (d, qd, kvd, ff) = (
        spec.n_embd,
        hd * spec.n_head,
        hd * spec.n_kv_head,
        spec.n_ff,
    );
    let mut named: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), tensor(&[vocab, d], 1.0, wt)),
        ("output_norm.weight".into(), ones(d)),
    ];
    for i in 0..spec.n_layer {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        named.push((p("attn_norm"), ones(d)));
        let phi3 = spec.architecture == "phi3";
        if phi3 && !spec.separate_qkv {
            // Phi-3's fused [Q; K; V].
            let t = tensor(&[qd + 2 * kvd, d], 0.5, wt);
            named.push((p("attn_qkv"), t));
        } else {
            named.push((p("attn_q"), tensor(&[qd, d], 0.5, wt)));
            named.push((p("attn_k"), tensor(&[kvd, d], 0.5, wt)));
            named.push((p("attn_v"), tensor(&[kvd, d], 0.5, wt)));
        }
        if spec.architecture == "qwen2" {
            // Qwen2's projection biases, f32 as its GGUFs hold them.
            for (stem, n) in [("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)] {
                named.push((
                    format!("blk.{i}.{stem}.bias"),
                    tensor(&[n], 0.5, GgmlDType::F32),
                ));
            }
        }
        named.push((p("attn_output"), tensor(&[d, qd], 0.5, wt)));
        if spec.architecture == "qwen3" || spec.architecture == "gemma3" {
            // Qwen3's and Gemma 3's per-head Q and K norms, near one.
            for stem in ["attn_q_norm", "attn_k_norm"] {
                let noise = tensor(&[hd], 0.5, GgmlDType::F32)
                    .dequantize(&Device::Cpu)
                    .expect("noise");
                let t = (noise + 1.0).expect("near one");
                named.push((p(stem), QTensor::quantize(&t, GgmlDType::F32).expect("f32")));
            }
        }
        named.push((p("ffn_norm"), ones(d)));
        if phi3 {
            // Phi-3's fused [gate; up].
            named.push((p("ffn_up"), tensor(&[2 * ff, d], 0.5, wt)));
        } else {
            named.push((p("ffn_gate"), tensor(&[ff, d], 0.5, wt)));
            named.push((p("ffn_up"), tensor(&[ff, d], 0.5, wt)));
        }
        named.push((p("ffn_down"), tensor(&[d, ff], 0.5, wt)));
        if spec.architecture == "gemma3" {
            // Gemma's post-attention and post-MLP norms, near one.
            for stem in ["post_attention_norm", "post_ffw_norm"] {
                let noise = tensor(&[d], 0.5, GgmlDType::F32)
                    .dequantize(&Device::Cpu)
                    .expect("noise");
                let t = (noise + 1.0).expect("near one");
                named.push((p(stem), QTensor::quantize(&t, GgmlDType::F32).expect("f32")));
            }
        }
    }

    if let Some(f) = &spec.rope_freqs {
        assert_eq!(f.len(), hd / 2, "one factor per rotated pair");
        let t = Tensor::from_vec(f.clone(), f.len(), &Device::Cpu).expect("freqs");
        named.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32).expect("f32"),
        ));
    }
    if spec.architecture == "phi3" {
        // Phi-3 has its own output projection.
        let t = tensor(&[vocab, d], 1.0, GgmlDType::Q8_0);
        named.push(("output.weight".into(), t));
    }
    if let Some(lr) = &spec.long_rope {
        for (name, f) in [
            ("rope_factors_short.weight", &lr.short),
            ("rope_factors_long.weight", &lr.long),
        ] {
            assert_eq!(f.len(), hd / 2, "one factor per rotated pair");
            let t = Tensor::from_vec(f.clone(), f.len(), &Device::Cpu).expect("factors");
            named.push((
                name.into(),
                QTensor::quantize(&t, GgmlDType::F32).expect("f32"),
            ));
        }
    }
    let arch = spec.architecture;
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    let meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), s(arch)),
        ("general.name".into(), s("tern-tiny")),
        (format!("{arch}.block_count"), u(spec.n_layer)),
        (format!("{arch}.embedding_length"), u(d)),
        (format!("{arch}.feed_forward_length"), u(ff)),
        (format!("{arch}.attention.head_count"), u(spec.n_head)),
        (format!("{arch}.attention.head_count_kv"), u(spec.n_kv_head)),
        (format!("{arch}.context_length"), u(spec.context_length)),
        (
            format!("{arch}.rope.freq_base"),
            Value::F32(spec.rope_base.unwrap_or(10_000.0)),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{arch}.vocab_size"), u(vocab)),
        (format!("{arch}.attention.key_length"), u(hd)),
        (format!("{arch}.attention.value_length"), u(hd)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s(pre)),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.iter().map(|m| s(m)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), u(bos)),
        ("tokenizer.ggml.eos_token_id".into(), u(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
        ("tokenizer.chat_template".into(), s(CHATML)),
    ];
    let mut meta = meta;
    meta.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    if merges.is_empty() {
        // (an empty array has no element type to write; SentencePiece
        // vocabularies carry no merges)
        meta.retain(|(k, _)| k != "tokenizer.ggml.merges");
    }
    meta.extend(extra);
    if !spec.chat_template {
        meta.retain(|(k, _)| k != "tokenizer.chat_template");
    }
    if let Some(lr) = &spec.long_rope {
        let key = format!("{arch}.rope.scaling.original_context_length");
        meta.push((key, u(lr.original_context)));
        let key = format!("{arch}.rope.scaling.attn_factor");
        meta.push((key, Value::F32(lr.attn_factor)));
    }
    if let Some(w) = spec.sliding_window {
        meta.push((format!("{arch}.attention.sliding_window"), u(w)));
    }
    if let Some(cap) = spec.logit_softcap {
        meta.push((format!("{arch}.final_logit_softcapping"), Value::F32(cap)));
    }
    if let Some(base) = spec.rope_base_swa {
        meta.push((format!("{arch}.rope.freq_base_swa"), Value::F32(base)));
    }
    if let Some(factor) = spec.rope_linear {
        meta.push((format!("{arch}.rope.scaling.type"), s("linear")));
        meta.push((format!("{arch}.rope.scaling.factor"), Value::F32(factor)));
    }
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = named.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).expect("create tiny model");
    candle_core::quantized::gguf_file::write(&mut file, &meta_refs, &tensor_refs)
        .expect("write gguf");
}
