//! Rotary position embedding tables, computed as ggml computes its angles.

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;

/// RoPE cos/sin tables for every position up to the context length.
/// `freq_factors` (Llama 3's `rope_freqs.weight`, one per rotated pair)
/// divide each pair's angle, and `rope_freq_scale` scales it, as ggml's
/// rope cache does.
pub(crate) fn rope_tables(
    c: &ModelConfig,
    freq_factors: Option<&[f32]>,
) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    // ggml's recurrence: theta_i = p * scale^i by repeated f32 multiplication,
    // scale = base^(-2/d); kept so angles match llama.cpp's bit for bit.
    let theta_scale = c.rope_base.powf(-2.0 / c.head_dim as f32);
    let mut cos = Vec::with_capacity(c.context_length * half);
    let mut sin = Vec::with_capacity(c.context_length * half);
    for p in 0..c.context_length {
        let mut theta = p as f32;
        for i in 0..half {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let angle = c.rope_freq_scale * (theta / ff);
            cos.push(angle.cos());
            sin.push(angle.sin());
            theta *= theta_scale;
        }
    }
    let shape = (c.context_length, half);
    Ok((
        Tensor::from_vec(cos, shape, &Device::Cpu)?,
        Tensor::from_vec(sin, shape, &Device::Cpu)?,
    ))
}
