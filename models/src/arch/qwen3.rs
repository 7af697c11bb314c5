//! The qwen3 architecture (Qwen3, Alibaba 2025): llama's decoder with NeoX
//! RoPE like qwen2, but no projection biases and instead an RMSNorm of every
//! query and key head before RoPE (`blk.N.attn_{q,k}_norm.weight`, one
//! `[head_dim]` weight shared by the heads). Its head dimension is declared
//! (`qwen3.attention.key_length`, 128 on the small models) rather than
//! `n_embd / n_head`, so the Q projection is `[n_head * head_dim, n_embd]`.
//! The forward itself is [`crate::decoder`]'s, run with [`FEATURES`].

use crate::decoder::{Decoder, Features, RopeStyle};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::weight::Precision;

/// What qwen3 changes in llama's features.
pub const FEATURES: Features = Features {
    qkv_bias: false,
    qk_norm: true,
    rope: RopeStyle::Neox,
    ..super::llama::FEATURES
};

/// Loads a qwen3 GGUF held as `precision`.
pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Decoder> {
    Decoder::load_with(file, precision, FEATURES)
}
