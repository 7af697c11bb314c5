//! The llama architecture (Touvron et al. 2023, "LLaMA"; Llama 1-3, SmolLM2,
//! Mistral-style decoders): the plain [`crate::decoder`], which every other
//! architecture here starts from. Pre-norm blocks, grouped-query attention,
//! RMSNorm, a SwiGLU MLP, no projection biases, and RoPE rotating adjacent
//! pairs, as GGUF llama weights are laid out for it; Llama 3's long-context
//! frequency factors (`rope_freqs.weight`) when the file has them.

use crate::decoder::{Decoder, Features, Mlp, RopeFactors, RopeStyle};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::weight::Precision;

/// What a llama model is: no projection biases, interleaved RoPE.
pub const FEATURES: Features = Features {
    qkv_bias: false,
    qk_norm: false,
    rope: RopeStyle::Interleaved,
    fused_projections: false,
    scale_query: false,
    rope_factors: RopeFactors::Llama3,
    post_norms: false,
    mlp: Mlp::Silu,
    embed_scale: false,
};

/// Loads a llama GGUF held as `precision`.
pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Decoder> {
    Decoder::load_with(file, precision, FEATURES)
}
