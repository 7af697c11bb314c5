//! Which ggml type each tensor of a quantized file gets: llama.cpp's
//! `llama_tensor_get_type` (src/llama-quant.cpp) for the file types Tern
//! writes, so that `tern quantize` and `llama-quantize` choose the same type
//! for every tensor.
//!
//! The rules, for the architectures Tern runs (no experts, no Falcon):
//! - only 2-D (or larger) tensors whose name ends in `weight` are quantized,
//!   not norms (`*_norm.weight`) and not a few small special tensors; the
//!   rest keep their type;
//! - F16 and BF16 files convert every quantizable tensor and stop there;
//! - the output projection (`output.weight`, or the token embedding when the
//!   model ties them) gets Q6_K unless the file type is Q8_0, or Q8_0 when its
//!   rows are not whole blocks of the file's type;
//! - Q4_K_M and Q5_K_M give `attn_v` and `ffn_down` Q6_K in the layers
//!   `use_more_bits` picks (the first and last eighth, and every third one
//!   between); Q4_K_S gives the first four `attn_v` and the first eighth of
//!   `ffn_down` Q5_K;
//! - IQ4_NL and IQ4_XS give `attn_v` Q5_K when four or more query heads share
//!   a KV head, and the first eighth of `ffn_down` Q5_K (no importance matrix);
//! - a row length that is not whole blocks of the chosen type falls back:
//!   Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to IQ4_NL, and to F16
//!   when even 32 does not divide it.
//!
//! Counters run over the tensors in llama.cpp's order (layer number, then
//! name), which [`Mix::plan`] follows.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use candle_core::quantized::GgmlDType;

use crate::error::ModelError;
use crate::gguf_types::OwnType;
use crate::quant::WeightType;

/// A candle type as a [`WeightType`].
const fn g(t: GgmlDType) -> WeightType {
    WeightType::Ggml(t)
}

/// A quantized file's type, as `llama-quantize` names it: the default type
/// of its matrices and, for the K mixes, the rules that raise some of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 4-bit blocks of 32, one f16 scale.
    Q4_0,
    /// 4-bit blocks of 32, f16 scale and minimum.
    Q4_1,
    /// 5-bit blocks of 32, one f16 scale.
    Q5_0,
    /// 5-bit blocks of 32, f16 scale and minimum.
    Q5_1,
    /// 8-bit blocks of 32: near-lossless.
    Q8_0,
    /// Half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Q4_K with Q6_K for the sensitive half of `attn_v` and `ffn_down`.
    Q4KM,
    /// Q4_K with Q5_K for the first `attn_v` and `ffn_down` layers.
    Q4KS,
    /// Q5_K with Q6_K for the sensitive half of `attn_v` and `ffn_down`.
    Q5KM,
    /// Q6_K throughout.
    Q6K,
    /// IQ4_NL: 4-bit non-linear blocks of 32.
    Iq4Nl,
    /// IQ4_XS: 4-bit non-linear super-blocks of 256 with 6-bit sub-block scales.
    Iq4Xs,
}

impl QuantType {
    /// Every type, in the order `--help` lists them.
    pub const ALL: [QuantType; 13] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::F16,
        Self::BF16,
        Self::Q4KM,
        Self::Q4KS,
        Self::Q5KM,
        Self::Q6K,
        Self::Iq4Nl,
        Self::Iq4Xs,
    ];

    /// The name llama.cpp's tools use, lower case.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q4KM => "q4_k_m",
            Self::Q4KS => "q4_k_s",
            Self::Q5KM => "q5_k_m",
            Self::Q6K => "q6_k",
            Self::Iq4Nl => "iq4_nl",
            Self::Iq4Xs => "iq4_xs",
        }
    }

    /// The valid names, comma-separated, for error messages and help.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The type most matrices get (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> WeightType {
        match self {
            Self::Q4_0 => g(GgmlDType::Q4_0),
            Self::Q4_1 => g(GgmlDType::Q4_1),
            Self::Q5_0 => g(GgmlDType::Q5_0),
            Self::Q5_1 => g(GgmlDType::Q5_1),
            Self::Q8_0 => g(GgmlDType::Q8_0),
            Self::F16 => g(GgmlDType::F16),
            Self::BF16 => g(GgmlDType::BF16),
            Self::Q4KM | Self::Q4KS => g(GgmlDType::Q4K),
            Self::Q5KM => g(GgmlDType::Q5K),
            Self::Q6K => g(GgmlDType::Q6K),
            Self::Iq4Nl => WeightType::Own(OwnType::Iq4Nl),
            Self::Iq4Xs => WeightType::Own(OwnType::Iq4Xs),
        }
    }

    /// llama.cpp's `general.file_type` value (`LLAMA_FTYPE_MOSTLY_*`), which
    /// tools show as the file's quantization.
    pub fn file_type(self) -> u32 {
        match self {
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 7,
            Self::Q5_0 => 8,
            Self::Q5_1 => 9,
            Self::Q4KS => 14,
            Self::Q4KM => 15,
            Self::Q5KM => 17,
            Self::Q6K => 18,
            Self::Iq4Nl => 25,
            Self::Iq4Xs => 30,
            Self::BF16 => 32,
        }
    }

    /// Whether the default type is a block quantization (F16 and BF16 are
    /// plain conversions and skip the mix rules).
    fn is_quantized(self) -> bool {
        !matches!(self, Self::F16 | Self::BF16)
    }
}

impl FromStr for QuantType {
    type Err = ModelError;

    /// Parses a name as llama.cpp spells it, any case (`Q4_K_M`, `q8_0`).
    fn from_str(s: &str) -> Result<Self, ModelError> {
        let lower = s.to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|q| q.name() == lower)
            .ok_or_else(|| ModelError::UnknownExportType {
                name: s.to_string(),
                valid: Self::names(),
            })
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The broad role of a tensor, by name (llama.cpp's `tensor_category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnV,
    FfnDown,
    FfnGate,
    FfnUp,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Category::TokenEmbd
    } else if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
        .iter()
        .any(|s| name.contains(s))
    {
        Category::AttnV
    } else if name.contains("ffn_up") {
        Category::FfnUp
    } else if name.contains("ffn_gate") {
        Category::FfnGate
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// Whether llama.cpp quantizes a tensor at all (`tensor_allows_quantization`
/// with default parameters): matrices named `*weight`, minus norms and the
/// small special tensors some architectures have.
pub fn allows_quantization(name: &str, dims: &[usize]) -> bool {
    let n_dims = dims.iter().skip_while(|&&d| d == 1).count().max(1);
    if n_dims < 2 || !name.ends_with("weight") {
        return false;
    }
    const KEEP: [&str; 16] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "attn_rel_b.weight",
        ".position_embd",
        ".patch_embd",
        ".rel_pos",
        "time_mix_",
        "a.rvq.codebook",
    ];
    !KEEP.iter().any(|k| name.contains(k))
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

/// The model facts the rules read.
#[derive(Debug, Clone)]
pub struct ModelShape {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: usize,
    /// Attention heads and KV heads (llama.cpp treats an 80-layer llama with
    /// grouped KV heads as 70B, whose `attn_v` gets more bits).
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
}

/// The per-file state of llama.cpp's type choice.
pub struct Mix {
    quant: QuantType,
    shape: ModelShape,
    tied: bool,
    n_attn_v: usize,
    i_attn_v: usize,
    i_ffn_down: usize,
    /// Tensors whose row length forced a fallback type.
    pub fallbacks: usize,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and
/// every third layer between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// llama.cpp's tensor order: by layer number (tensors outside layers first),
/// then by name.
fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |s: &str| -> i64 {
        s.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(-1)
    };
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

impl Mix {
    /// The target type of every tensor of a file, given `(name, dims, type)`
    /// for each, in any order.
    pub fn plan(
        quant: QuantType,
        shape: ModelShape,
        tensors: &[(String, Vec<usize>, GgmlDType)],
    ) -> (HashMap<String, WeightType>, usize) {
        let mut mix = Mix {
            quant,
            shape,
            tied: !tensors
                .iter()
                .any(|(n, _, _)| category(n) == Category::Output),
            n_attn_v: tensors
                .iter()
                .filter(|(n, _, _)| category(n) == Category::AttnV)
                .count(),
            i_attn_v: 0,
            i_ffn_down: 0,
            fallbacks: 0,
        };
        let mut order: Vec<&(String, Vec<usize>, GgmlDType)> = tensors.iter().collect();
        order.sort_by(|a, b| llama_order(&a.0, &b.0));
        let types = order
            .into_iter()
            .map(|(name, dims, src)| (name.clone(), mix.tensor_type(name, dims, *src)))
            .collect();
        (types, mix.fallbacks)
    }

    /// `llama_tensor_get_type` for one tensor, advancing the counters.
    fn tensor_type(&mut self, name: &str, dims: &[usize], src: GgmlDType) -> WeightType {
        if !allows_quantization(name, dims) {
            return g(src);
        }
        let default = self.quant.default_type();
        if !self.quant.is_quantized() {
            return default;
        }
        let chosen = self.rules(name, dims, default);
        self.fallback(dims, chosen)
    }

    /// `llama_tensor_get_type_impl`, for the file types Tern writes.
    fn rules(&mut self, name: &str, dims: &[usize], default: WeightType) -> WeightType {
        use QuantType::*;
        let cat = category(name);
        let falcon = self.shape.arch == "falcon";
        let n_layer = self.shape.n_layer;
        let cols = dims.last().copied().unwrap_or(0);
        let mut t = default;
        if cat == Category::Output || (self.tied && cat == Category::TokenEmbd) {
            if falcon || !cols.is_multiple_of(t.block_size()) {
                t = g(GgmlDType::Q8_0);
            } else if t != g(GgmlDType::Q8_0) {
                t = g(GgmlDType::Q6K);
            }
        } else if cat == Category::AttnV {
            let more = use_more_bits(self.i_attn_v, self.n_attn_v);
            let n_gqa = self.shape.n_head / self.shape.n_head_kv.max(1);
            if matches!(self.quant, Iq4Nl | Iq4Xs) && n_gqa >= 4 {
                t = g(GgmlDType::Q5K);
            } else if matches!(self.quant, Q4KM | Q5KM) && more {
                t = g(GgmlDType::Q6K);
            } else if self.quant == Q4KS && self.i_attn_v < 4 {
                t = g(GgmlDType::Q5K);
            }
            let is_70b = self.shape.arch == "llama"
                && n_layer == 80
                && self.shape.n_head != self.shape.n_head_kv;
            if is_70b && matches!(t, WeightType::Ggml(GgmlDType::Q3K | GgmlDType::Q4K)) {
                t = g(GgmlDType::Q5K);
            }
            self.i_attn_v += 1;
        } else if cat == Category::FfnDown {
            let i = self.i_ffn_down;
            if self.quant == Q4KM {
                if falcon {
                    t = g(if i < n_layer / 16 {
                        GgmlDType::Q6K
                    } else if use_more_bits(i, n_layer) {
                        GgmlDType::Q5K
                    } else {
                        GgmlDType::Q4K
                    });
                } else if use_more_bits(i, n_layer) {
                    t = g(GgmlDType::Q6K);
                }
            } else if matches!(self.quant, Iq4Nl | Iq4Xs) && i < n_layer / 8 {
                t = g(GgmlDType::Q5K);
            } else if self.quant == Q5KM && use_more_bits(i, n_layer) {
                t = g(GgmlDType::Q6K);
            } else if self.quant == Q4KS && !falcon && i < n_layer / 8 {
                t = g(GgmlDType::Q5K);
            }
            self.i_ffn_down += 1;
        }
        t
    }

    /// `tensor_type_fallback`: a type whose blocks do not divide the row length
    /// gives way to a 32-value one, or to F16.
    fn fallback(&mut self, dims: &[usize], t: WeightType) -> WeightType {
        let cols = dims.last().copied().unwrap_or(0);
        if cols.is_multiple_of(t.block_size()) {
            return t;
        }
        self.fallbacks += 1;
        let r = match t {
            WeightType::Ggml(GgmlDType::Q2K | GgmlDType::Q3K) => g(GgmlDType::Q4_0),
            WeightType::Ggml(GgmlDType::Q4K) => g(GgmlDType::Q5_0),
            WeightType::Ggml(GgmlDType::Q5K) => g(GgmlDType::Q5_1),
            WeightType::Ggml(GgmlDType::Q6K) => g(GgmlDType::Q8_0),
            WeightType::Own(OwnType::Iq4Xs) => WeightType::Own(OwnType::Iq4Nl),
            other => other,
        };
        if cols.is_multiple_of(r.block_size()) {
            r
        } else {
            g(GgmlDType::F16)
        }
    }
}
