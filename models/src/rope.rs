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

/// How one layer's RoPE turns a head vector as its position advances: the
/// pairing and each pair's angle per position. A policy that predicts future
/// queries (Expected Attention) moves a query to a later position with it.
///
/// RoPE composes: a vector rotated for position `p` and then by `d` positions
/// is the vector rotated for `p + d`, so a query can be carried forward
/// without its pre-RoPE form. The rotation is pure: LongRoPE's magnitude
/// factor (`rope.scaling.attn_factor`), which scales every cos and sin the
/// model uses, is already in the rotated vector and is not applied again.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotary {
    neox: bool,
    head_dim: usize,
    /// Radians per position of each pair, `[head_dim / 2]`.
    freqs: Vec<f64>,
}

impl Rotary {
    /// The rotation [`rope_tables`] builds for `c` with the same
    /// `freq_factors`; `neox` pairs `(i, i + hd/2)`, else `(2i, 2i+1)`.
    pub fn new(c: &ModelConfig, neox: bool, freq_factors: Option<&[f32]>) -> Self {
        let half = c.head_dim / 2;
        let theta_scale = c.rope_base.powf(-2.0 / c.head_dim as f32) as f64;
        let freqs = (0..half)
            .map(|i| {
                let ff = freq_factors.map_or(1.0, |f| f[i]) as f64;
                c.rope_freq_scale as f64 * theta_scale.powi(i as i32) / ff
            })
            .collect();
        Self {
            neox,
            head_dim: c.head_dim,
            freqs,
        }
    }

    /// Whether pairs are halves (NeoX) rather than adjacent elements.
    pub fn neox(&self) -> bool {
        self.neox
    }

    /// Width of one head vector.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Radians per position of each pair, `[head_dim / 2]`.
    pub fn freqs(&self) -> &[f64] {
        &self.freqs
    }

    /// The two elements pair `i` rotates together, first then second.
    pub fn pair(&self, i: usize) -> (usize, usize) {
        if self.neox {
            (i, i + self.head_dim / 2)
        } else {
            (2 * i, 2 * i + 1)
        }
    }

    /// Turns every head vector in `x` (a multiple of `head_dim` long) forward
    /// by `delta` positions (backward when negative), as RoPE would had the
    /// vector been at a position `delta` later.
    pub fn rotate(&self, x: &mut [f64], delta: f64) {
        let turns: Vec<(f64, f64)> = self.freqs.iter().map(|w| (delta * w).sin_cos()).collect();
        for head in x.chunks_exact_mut(self.head_dim) {
            for (i, &(s, c)) in turns.iter().enumerate() {
                let (a, b) = self.pair(i);
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::IndexOp;
    use rand::{Rng, SeedableRng};

    fn config(rope_base: f32, rope_freq_scale: f32) -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            name: None,
            n_layer: 1,
            n_embd: 128,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 64,
            n_ff: 256,
            vocab_size: 16,
            context_length: 4096,
            rope_base,
            rope_freq_scale,
            rms_eps: 1e-5,
            sliding: None,
        }
    }

    /// `x` rotated for position `p` by the model's serving RoPE.
    fn model_rope(
        c: &ModelConfig,
        ff: Option<&[f32]>,
        neox: bool,
        x: &[f32],
        p: usize,
    ) -> Vec<f32> {
        let (cos, sin) = rope_tables(c, ff).unwrap();
        let cos: Vec<f32> = cos.i(p).unwrap().to_vec1().unwrap();
        let sin: Vec<f32> = sin.i(p).unwrap().to_vec1().unwrap();
        let mut y = x.to_vec();
        if neox {
            crate::exact::rope_neox(&mut y, c.head_dim, &cos, &sin);
        } else {
            crate::exact::rope_pairs(&mut y, c.head_dim, &cos, &sin);
        }
        y
    }

    /// Largest difference between `a` and `b`, relative to `b`'s largest element.
    fn rel_diff(a: &[f64], b: &[f32]) -> f64 {
        let scale = b.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
        let diff = a
            .iter()
            .zip(b)
            .fold(0f64, |m, (&x, &y)| m.max((x - y as f64).abs()));
        diff / scale
    }

    #[test]
    fn advancing_a_rotated_vector_equals_rotating_it_later() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let ff: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 * 0.25).collect();
        let cases: [(ModelConfig, Option<&[f32]>); 3] = [
            (config(10_000.0, 1.0), None),
            (config(1_000_000.0, 0.25), None),
            (config(500_000.0, 1.0), Some(&ff)),
        ];
        for (c, ff) in cases {
            for neox in [false, true] {
                let rot = Rotary::new(&c, neox, ff);
                let wrong = Rotary::new(&c, !neox, ff);
                // Two heads of a pre-RoPE query.
                let x: Vec<f32> = (0..2 * c.head_dim)
                    .map(|_| rng.gen_range(-2.0..2.0))
                    .collect();
                for (p, d) in [(0, 1), (5, 17), (300, 512), (1000, 2047), (2048, -700)] {
                    let at_p: Vec<f64> = model_rope(&c, ff, neox, &x, p)
                        .into_iter()
                        .map(f64::from)
                        .collect();
                    let want = model_rope(&c, ff, neox, &x, (p as i64 + d) as usize);
                    let mut got = at_p.clone();
                    rot.rotate(&mut got, d as f64);
                    let err = rel_diff(&got, &want);
                    assert!(err < 2e-4, "neox {neox} p {p} d {d}: {err}");
                    // The other pairing carries it somewhere else entirely.
                    let mut off = at_p;
                    wrong.rotate(&mut off, d as f64);
                    assert!(rel_diff(&off, &want) > 0.05, "neox {neox} p {p} d {d}");
                }
            }
        }
    }

    #[test]
    fn pairs_follow_the_style() {
        let c = config(10_000.0, 1.0);
        assert_eq!(Rotary::new(&c, false, None).pair(3), (6, 7));
        assert_eq!(Rotary::new(&c, true, None).pair(3), (3, 35));
        // Pair 0 turns one radian per position; the last, the slowest.
        let r = Rotary::new(&c, true, None);
        assert_eq!(r.freqs()[0], 1.0);
        assert!(r.freqs()[31] < 1e-3 && r.freqs()[31] > 0.0);
    }
}
