//! The qwen2 architecture (Qwen2 and Qwen2.5, Alibaba 2024): llama's decoder
//! (pre-norm blocks, grouped-query attention, RMSNorm, SwiGLU MLP) with two
//! differences, both read from the GGUF as llama.cpp reads them:
//!
//! 1. the Q, K and V projections carry biases (`blk.N.attn_{q,k,v}.bias`),
//!    added after the projection;
//! 2. RoPE rotates each head's halves against each other (NeoX style), not
//!    adjacent pairs.
//!
//! The output head is tied to the embedding unless the file has
//! `output.weight` (Qwen2.5 0.5B/1.5B tie it, larger ones do not). The
//! forward itself is [`crate::decoder`]'s, run with [`FEATURES`].

use crate::decoder::{Decoder, Features, RopeStyle};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::weight::Precision;

/// What qwen2 changes in llama's features.
pub const FEATURES: Features = Features {
    qkv_bias: true,
    qk_norm: false,
    rope: RopeStyle::Neox,
    ..super::llama::FEATURES
};

/// Loads a qwen2 GGUF held as `precision`.
pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Decoder> {
    Decoder::load_with(file, precision, FEATURES)
}
