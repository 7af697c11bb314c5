//! The gemma3 architecture (Gemma 3, Google 2025), text decoder, as llama.cpp
//! runs it. In forward order, what differs from [`super::llama`]:
//!
//! 1. the token embedding is multiplied by `sqrt(n_embd)` (f32, after the
//!    lookup);
//! 2. each query and key head is RMS-normed before RoPE
//!    (`blk.N.attn_{q,k}_norm.weight`, `[head_dim]`), as in Qwen3;
//! 3. RoPE is NeoX style; sliding-window layers rotate with their own base
//!    (`gemma3.rope.freq_base_swa`, 10000 when absent) and scale 1, global
//!    layers with `rope.freq_base` and any linear scaling;
//! 4. the rotated queries are multiplied by the attention scale in f32 and the
//!    scores are not scaled again (llama.cpp's order, which rounds differently
//!    from scaling the scores): `1/sqrt(head_dim)`, or for a 62-layer model
//!    `1/sqrt(n_embd / n_head)`, llama.cpp's rule (it ignores
//!    `attention.scale` for this architecture, so Tern does too);
//! 5. sliding-window layers see only the last `gemma3.attention.sliding_window`
//!    positions (the query's own included); which layers slide comes from
//!    `attention.sliding_window_pattern` (an array of flags, or a period `n`:
//!    every `n`-th layer global), else llama.cpp's default period of 6. No
//!    window key, or 0: every layer global;
//! 6. attention's output and the MLP's output are RMS-normed before joining
//!    the residual (`post_attention_norm`, `post_ffw_norm`);
//! 7. the MLP is GeGLU with GELU's tanh form;
//! 8. the output head is tied to the embedding unless `output.weight`
//!    exists, and logits are soft-capped only if
//!    `gemma3.final_logit_softcapping` is declared and non-zero.
//!
//! The forward itself is [`crate::decoder`]'s, run with [`FEATURES`] and the
//! settings above.

use candle_core::quantized::gguf_file::Value;

use crate::config::Sliding;
use crate::decoder::{Decoder, Features, Mlp, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::weight::Precision;

/// What gemma3 changes in llama's features.
pub const FEATURES: Features = Features {
    qkv_bias: false,
    qk_norm: true,
    rope: RopeStyle::Neox,
    post_norms: true,
    mlp: Mlp::GeluTanh,
    embed_scale: true,
    ..super::llama::FEATURES
};

/// llama.cpp's sliding-window period for Gemma 3 when the GGUF names none:
/// five sliding layers, then one global.
const DEFAULT_PATTERN: usize = 6;

/// Loads a gemma3 GGUF held as `precision`.
pub fn load_as(file: &GgufFile, precision: Precision) -> Result<Decoder> {
    // The sliding layers come with the configuration (see [`sliding`]).
    let model = Decoder::load_with(file, precision, FEATURES)?;
    let c = model.config().clone();
    let mut model = model.with_query_scale(query_scale(c.n_layer, c.n_embd, c.n_head, c.head_dim));
    match file.f32("gemma3.final_logit_softcapping") {
        Ok(cap) if cap != 0.0 => model = model.with_logit_softcap(cap),
        _ => {}
    }
    Ok(model)
}

/// The factor the rotated queries are multiplied by, as llama.cpp sets it.
pub fn query_scale(n_layer: usize, n_embd: usize, n_head: usize, head_dim: usize) -> f32 {
    // llama.cpp's rule: the 27B model (62 layers) scales by the hidden
    // size per head rather than by the head dimension.
    let per_head = if n_layer == 62 {
        n_embd / n_head
    } else {
        head_dim
    };
    1.0 / (per_head as f32).sqrt()
}

/// Which layers slide and by how much, from the GGUF; `None` when the file
/// declares no window (every layer global).
pub fn sliding(file: &GgufFile, n_layer: usize) -> Result<Option<Sliding>> {
    let window = match file.u32("gemma3.attention.sliding_window") {
        Ok(w) if w > 0 => w as usize,
        _ => return Ok(None),
    };
    let key = "gemma3.attention.sliding_window_pattern";
    let layers = match file.get(key) {
        Some(Value::Array(flags)) => {
            if flags.len() < n_layer {
                return Err(ModelError::BadTensor {
                    name: key.into(),
                    reason: format!("{} flags for {n_layer} layers", flags.len()),
                });
            }
            flags[..n_layer]
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Ok(*b),
                    Value::U8(x) => Ok(*x != 0),
                    Value::I8(x) => Ok(*x != 0),
                    Value::U32(x) => Ok(*x != 0),
                    Value::I32(x) => Ok(*x != 0),
                    other => Err(ModelError::BadTensor {
                        name: key.into(),
                        reason: format!("expected flags, found {other:?}"),
                    }),
                })
                .collect::<Result<Vec<bool>>>()?
        }
        Some(_) => pattern(file.u32(key)? as usize, n_layer),
        None => pattern(DEFAULT_PATTERN, n_layer),
    };
    let rope_base = file.f32("gemma3.rope.freq_base_swa").unwrap_or(10_000.0);
    Ok(Some(Sliding {
        window,
        layers,
        rope_base,
    }))
}

/// Layers sliding under a period `n`: all but every `n`-th (the last of each
/// period); a period of 0 makes every layer slide (llama.cpp's reading).
pub fn pattern(n: usize, n_layer: usize) -> Vec<bool> {
    (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sixth_layer_is_global_by_default() {
        let p = pattern(DEFAULT_PATTERN, 18);
        let global: Vec<usize> = (0..18).filter(|&i| !p[i]).collect();
        assert_eq!(global, vec![5, 11, 17]);
        assert_eq!(pattern(2, 4), vec![true, false, true, false]);
        assert!(pattern(0, 3).iter().all(|&s| s));
    }

    #[test]
    fn the_query_scale_follows_llama_cpp() {
        // Gemma 3 270M: head dim 256 (not 640 / 4).
        assert_eq!(query_scale(18, 640, 4, 256), 1.0 / 16.0);
        // 27B: n_embd / n_head.
        assert_eq!(query_scale(62, 5376, 32, 128), 1.0 / 168f32.sqrt());
    }
}
