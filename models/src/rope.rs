//! Rotary position embedding tables, computed as ggml computes its angles.

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;

/// RoPE cos/sin tables for every position up to the context length.
pub(crate) fn rope_tables(c: &ModelConfig) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    // ggml's recurrence: theta_i = p * scale^i by repeated f32 multiplication,
    // scale = base^(-2/d); kept so angles match llama.cpp's bit for bit.
    let theta_scale = c.rope_base.powf(-2.0 / c.head_dim as f32);
    let mut cos = Vec::with_capacity(c.context_length * half);
    let mut sin = Vec::with_capacity(c.context_length * half);
    for p in 0..c.context_length {
        let mut theta = p as f32;
        for _ in 0..half {
            cos.push(theta.cos());
            sin.push(theta.sin());
            theta *= theta_scale;
        }
    }
    let shape = (c.context_length, half);
    Ok((
        Tensor::from_vec(cos, shape, &Device::Cpu)?,
        Tensor::from_vec(sin, shape, &Device::Cpu)?,
    ))
}
