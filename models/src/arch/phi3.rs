//! The phi3 architecture (Phi-3 and Phi-3.5, Microsoft 2024): llama's decoder
//! (pre-norm blocks, RMSNorm, grouped-query attention, SwiGLU MLP) as
//! llama.cpp runs it, with four differences, all read from the GGUF:
//!
//! 1. Fused storage. Q, K and V are usually one `blk.N.attn_qkv.weight` of
//!    `qd + 2 kvd` rows (separate `attn_{q,k,v}` are accepted too, as
//!    llama.cpp accepts them), and gate and up are always one
//!    `blk.N.ffn_up.weight` of `2 n_ff` rows, gate first (ggml's `swiglu`
//!    activates the first half and multiplies by the second). Both are split
//!    by rows at load: every output of a matmul is its own dot product of one
//!    weight row with one activation row, so the parts compute exactly the
//!    numbers of the fused product, and the trainer's Q/K/V/gate/up adapters
//!    keep llama's shapes. Export writes them fused again
//!    ([`crate::decoder::fused`]).
//! 2. RoPE rotates halves (NeoX).
//! 3. The query is multiplied by `1/sqrt(head_dim)` after RoPE and the scores
//!    are not scaled, where llama scales the scores: another rounding of the
//!    f16 query, so it matters for bit-exactness.
//! 4. LongRoPE (Phi-3 128k): per-pair frequency factors
//!    `rope_factors_long.weight` and `rope_factors_short.weight`, llama.cpp
//!    taking the long ones when the context exceeds
//!    `phi3.rope.scaling.original_context_length` (Tern's context is the
//!    model's `context_length`), and `phi3.rope.scaling.attn_factor` scaling
//!    every cos and sin (both read with the decoder's RoPE tables).
//!
//! llama.cpp disables Phi-3's sliding window (`attention.sliding_window` is
//! read and then ignored), so Tern ignores it too. Projection biases, which
//! llama.cpp's phi3 would add, are refused by name rather than dropped. The
//! forward itself is [`crate::decoder`]'s, run with [`FEATURES`].

use crate::config::ModelConfig;
use crate::decoder::{Decoder, Features, RopeFactors, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::weight::Precision;

/// What phi3 changes in llama's features.
pub const FEATURES: Features = Features {
    rope: RopeStyle::Neox,
    fused_projections: true,
    scale_query: true,
    rope_factors: RopeFactors::LongRope,
    ..super::llama::FEATURES
};

/// Loads a phi3 GGUF held as `precision`.
pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Decoder> {
    let config = ModelConfig::from_gguf(file)?;
    refuse_unsupported(file, &config)?;
    Decoder::load_with(file, precision, FEATURES)
}

/// What llama.cpp's phi3 would run and Tern does not: projection biases and a
/// partial rotary dimension.
fn refuse_unsupported(file: &GgufFile, c: &ModelConfig) -> Result<()> {
    let key = "phi3.rope.dimension_count";
    if let Ok(n_rot) = file.u32(key) {
        if n_rot as usize != c.head_dim {
            return Err(ModelError::UnsupportedFeature {
                key: key.into(),
                value: n_rot.to_string(),
                supported: format!("the head dimension, {}", c.head_dim),
            });
        }
    }
    for i in 0..c.n_layer {
        for stem in ["attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output"] {
            let name = format!("blk.{i}.{stem}.bias");
            if file.has_tensor(&name) {
                return Err(ModelError::BadTensor {
                    name,
                    reason: "phi3 projection biases are not supported".into(),
                });
            }
        }
    }
    Ok(())
}
