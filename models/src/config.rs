//! Model hyper-parameters read from GGUF metadata.
//!
//! One plain struct, filled from the `<arch>.*` keys llama.cpp writes; the forward
//! pass and the KV cache size themselves from it.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Hyper-parameters of a llama-family decoder.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    /// `general.architecture`, e.g. `llama`.
    pub architecture: String,
    /// Human-readable name from `general.name`, if any.
    pub name: Option<String>,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Hidden size (embedding length).
    pub n_embd: usize,
    /// Number of query heads.
    pub n_head: usize,
    /// Number of key/value heads (GQA when smaller than `n_head`).
    pub n_kv_head: usize,
    /// Per-head dimension: `attention.key_length` where the GGUF declares it
    /// (Qwen3, Gemma 3 set it apart from `n_embd / n_head`), else `n_embd / n_head`.
    pub head_dim: usize,
    /// Hidden size of the SwiGLU MLP.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Training context length.
    pub context_length: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RoPE's position scale: 1, or `1 / rope.scaling.factor` under linear
    /// scaling (llama.cpp's `freq_scale`).
    pub rope_freq_scale: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Sliding-window layers (Gemma 3), when the architecture has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding: Option<Sliding>,
}

/// Sliding-window attention, as an architecture reads it from the GGUF:
/// which layers attend only to their last `window` positions, and the RoPE
/// base those layers rotate with.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sliding {
    /// Positions a sliding layer's query sees, its own included.
    pub window: usize,
    /// Whether each layer slides (the others attend globally).
    pub layers: Vec<bool>,
    /// RoPE frequency base of the sliding layers (their scale is 1).
    pub rope_base: f32,
}

impl ModelConfig {
    /// Reads and checks the hyper-parameters of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file.str("general.architecture")?.to_string();
        if !crate::arch::SUPPORTED.contains(&arch.as_str()) {
            return Err(crate::arch::unsupported(&arch));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let n_embd = file.u32(&key("embedding_length"))? as usize;
        let n_head = file.u32(&key("attention.head_count"))? as usize;
        let n_kv_head = file
            .u32(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(n_head);
        let vocab_size = match file.u32(&key("vocab_size")) {
            Ok(v) => v as usize,
            Err(_) => file
                .tensor_dims("token_embd.weight")
                .and_then(|d| d.first().copied())
                .ok_or_else(|| ModelError::MissingMetadata {
                    key: key("vocab_size"),
                })?,
        };
        let head_dim = match file.u32(&key("attention.key_length")) {
            Ok(k) => {
                let v = file.u32(&key("attention.value_length")).unwrap_or(k);
                if v != k {
                    return Err(ModelError::BadTensor {
                        name: key("attention.value_length"),
                        reason: format!("value length {v} differs from key length {k}, which Tern does not support"),
                    });
                }
                k as usize
            }
            Err(_) => n_embd.checked_div(n_head).unwrap_or(0),
        };
        let cfg = Self {
            name: file.str("general.name").ok().map(str::to_string),
            n_layer: file.u32(&key("block_count"))? as usize,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_ff: file.u32(&key("feed_forward_length"))? as usize,
            vocab_size,
            context_length: file.u32(&key("context_length"))? as usize,
            rope_base: file.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_freq_scale: rope_freq_scale(file, &arch)?,
            rms_eps: file.f32(&key("attention.layer_norm_rms_epsilon"))?,
            sliding: crate::arch::sliding(file, &arch)?,
            architecture: arch,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        if !(self.rope_freq_scale.is_finite() && self.rope_freq_scale > 0.0) {
            return Err(ModelError::MissingMetadata {
                key: format!("{}.rope.scaling.factor", self.architecture),
            });
        }
        let bad = |key: &str| ModelError::MissingMetadata {
            key: format!("{}.{key}", self.architecture),
        };
        if self.n_layer == 0 {
            return Err(bad("block_count"));
        }
        if self.n_head == 0 || self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(bad("attention.head_count"));
        }
        if self.n_kv_head == 0 || !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err(bad("attention.head_count_kv"));
        }
        if self.context_length == 0 {
            return Err(bad("context_length"));
        }
        Ok(())
    }

    /// Width of all query heads together (`n_head * head_dim`): the Q
    /// projection's output and the attention output projection's input.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The window of `layer` when it is a sliding-window layer: the most
    /// positions its attention reads, so the most entries its cache needs.
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        let s = self.sliding.as_ref()?;
        s.layers
            .get(layer)
            .copied()
            .unwrap_or(false)
            .then_some(s.window)
    }

    /// Query heads sharing one key/value head.
    pub fn group_size(&self) -> usize {
        self.n_head / self.n_kv_head
    }

    /// Bytes one cached position costs across all layers with an f32 cache (K and V).
    pub fn kv_bytes_per_position(&self) -> usize {
        self.n_layer * 2 * self.n_kv_head * self.head_dim * std::mem::size_of::<f32>()
    }
}

/// llama.cpp's `freq_scale` from `<arch>.rope.scaling.*`: 1 without scaling,
/// `1 / factor` under linear scaling. YaRN and other schemes change the
/// angles in ways Tern does not reproduce yet, so they are refused by name.
/// (Llama 3's scaling needs no key: its `rope_freqs.weight` factors are read
/// with the weights.)
fn rope_freq_scale(file: &GgufFile, arch: &str) -> Result<f32> {
    let key = format!("{arch}.rope.scaling.type");
    match file.str(&key) {
        Err(_) | Ok("none") => Ok(1.0),
        Ok("linear") => {
            let factor = file
                .f32(&format!("{arch}.rope.scaling.factor"))
                .unwrap_or(1.0);
            Ok(if factor == 0.0 { 1.0 } else { 1.0 / factor })
        }
        Ok(other) => Err(ModelError::UnsupportedFeature {
            key,
            value: other.to_string(),
            supported: "none, linear, and Llama 3's rope_freqs factors".into(),
        }),
    }
}
