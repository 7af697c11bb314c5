//! The small per-element operations of the forward pass, rounded exactly as
//! llama.cpp's CPU build rounds them.
//!
//! Why bit-exactness here matters: each linear layer quantizes its input to
//! 8 bits per block, so a last-bit difference in a norm's output can move an
//! activation across a rounding boundary and change a projection by a whole
//! quantization step. Tern's answer to "is this the same model llama.cpp runs"
//! is then token-for-token agreement, which needs the same floats going in.
//! What llama.cpp's build does that a straightforward version would not: sums
//! of squares in double, a multiply by the reciprocal rather than a divide, a
//! polynomial `exp` in SiLU, and fused multiply-adds where its compiler
//! contracts `a*b - c*d` (checked in the compiled object).

/// RMSNorm of each `dim`-long row of `x`, scaled by `w`: the sum of squares in
/// double, `1/sqrt(mean + eps)` in f32, then `(x * scale) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let dim = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(dim) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &wi)| (v * scale) * wi));
    }
    out
}

/// RoPE on adjacent pairs (llama's "normal" mode), in place: `x` holds rows of
/// `heads * head_dim`; row `r` rotates by the angles in `cos[r]`, `sin[r]`
/// (`head_dim / 2` each).
pub fn rope_pairs(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    rope_heads(x, head_dim, cos, sin, |i| (2 * i, 2 * i + 1));
}

/// NeoX-style RoPE (Qwen2, Gemma, Phi-3): each head's first half is rotated
/// against its second half, element `i` with `i + head_dim / 2`, at the
/// same angles and with the same fused multiply-adds as [`rope_pairs`].
pub fn rope_neox(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    rope_heads(x, head_dim, cos, sin, |i| (i, i + half));
}

/// Rotates pair `i` of every head, the elements `pair(i)`, by angle `i` of
/// its row, as ggml's rope kernels round: `x0 cos - x1 sin` and
/// `x0 sin + x1 cos`, each with one fused multiply-add.
fn rope_heads(
    x: &mut [f32],
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    pair: impl Fn(usize) -> (usize, usize),
) {
    let half = head_dim / 2;
    let row_len = x.len() / (cos.len() / half).max(1);
    for (r, row) in x.chunks_exact_mut(row_len).enumerate() {
        let (c, s) = (
            &cos[r * half..(r + 1) * half],
            &sin[r * half..(r + 1) * half],
        );
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = pair(i);
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0.mul_add(c[i], -(x1 * s[i]));
                head[b] = x0.mul_add(s[i], x1 * c[i]);
            }
        }
    }
}

/// SwiGLU: `silu(gate) * up` with SiLU as `x / (1 + e^-x)` over the
/// polynomial `exp`.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    zip_map(gate, up, |g, u| (g / (1.0 + expf_poly(0.0 - g))) * u)
}

/// `f(gate[i], up[i])` for every `i`, on the kernel pool in chunks (a
/// prefill's MLP holds millions of elements; each value is the same
/// whichever thread computes it).
fn zip_map(gate: &[f32], up: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    const CHUNK: usize = 1 << 15;
    let n = gate.len().min(up.len());
    let mut out = vec![0f32; n];
    crate::quant::pool::Pool::global().fill_chunks(&mut out, CHUNK, &|start, part| {
        let (g, u) = (
            &gate[start..start + part.len()],
            &up[start..start + part.len()],
        );
        for ((o, &g), &u) in part.iter_mut().zip(g).zip(u) {
            *o = f(g, u);
        }
    });
    out
}

/// GeGLU: `gelu(gate) * up` with GELU's tanh form as ggml's CPU build runs
/// it: through a table over every f16 input (the gate rounded to f16, its
/// GELU rounded back to f16), saturating to 0 below -10 and the identity
/// above 10.
pub fn geglu_tanh(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let table = gelu_table();
    zip_map(gate, up, |g, u| {
        if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            table[half::f16::from_f32(g).to_bits() as usize] * u
        }
    })
}

/// GELU (tanh form) of every f16 value, rounded to f16 and widened: ggml's
/// table, built once.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                half::f16::from_f32(gelu_tanh(x)).to_f32()
            })
            .collect()
    })
}

/// `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))` in f32, with the one
/// fused multiply-add llama.cpp's compiler forms (`1 + (a x) x`).
fn gelu_tanh(x: f32) -> f32 {
    const A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4_f64 as f32;
    let inner = (SQRT_2_OVER_PI * x) * (A * x).mul_add(x, 1.0);
    (0.5 * x) * (1.0 + inner.tanh())
}

/// ggml's vectorized `exp` (one lane of it): a degree-5 polynomial after
/// range reduction by `2^n`, with its over/underflow handling.
#[inline]
pub fn expf_poly(x: f32) -> f32 {
    let bits = f32::from_bits;
    let r = bits(0x4b40_0000); // 1.5 * 2^23
    let z = x.mul_add(bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(bits(0x35bf_be8e), (-n).mul_add(bits(0x3f31_7200), x));
    let e = z.to_bits() << 23;
    let k = bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = bits(0x3c07_2010)
        .mul_add(b, bits(0x3d2b_9f17))
        .mul_add(u, bits(0x3e2a_af33).mul_add(b, bits(0x3eff_fedb)))
        .mul_add(u, bits(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = bits(g.wrapping_add(0x7f00_0000));
    let s2 = bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// Rounds an f32 tensor to the nearest f16 value, kept as f32.
pub(crate) fn round_f16(t: &candle_core::Tensor) -> crate::error::Result<candle_core::Tensor> {
    use candle_core::DType;
    Ok(t.to_dtype(DType::F16)?.to_dtype(DType::F32)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polynomial_exp_is_close_to_libm_and_saturates() {
        let mut worst = 0f32;
        let mut x = 80f32;
        while x > -100.0 {
            let (got, want) = (expf_poly(x), x.exp());
            if want > 1e-37 {
                worst = worst.max((got - want).abs() / want);
            }
            x -= 0.000_97;
        }
        assert!(worst < 3e-7, "max relative error {worst}");
        assert_eq!(expf_poly(0.0), 1.0);
        assert_eq!(expf_poly(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf_poly(-300.0), 0.0);
        assert_eq!(expf_poly(200.0), f32::INFINITY);
    }

    #[test]
    fn rms_norm_sums_in_double() {
        // In f32, 2^12 squared (2^24) swallows the 1s that follow it; in
        // double they count: mean = (2^24 + 3) / 4.
        let x = [4096.0f32, 1.0, 1.0, 1.0];
        let y = rms_norm(&x, &[1.0; 4], 0.0);
        let scale = 1.0 / (((16_777_216.0f64 + 3.0) / 4.0) as f32).sqrt();
        assert_eq!(y[1], scale);
        // Each row is normalised on its own and then weighted.
        let y = rms_norm(&[3.0, 4.0, 0.0, 5.0], &[1.0, 2.0], 0.0);
        let r = 1.0 / 12.5f32.sqrt();
        assert_eq!(
            y,
            vec![
                3.0 * r,
                (4.0 * r) * 2.0,
                0.0,
                (5.0 * (1.0 / 12.5f32.sqrt())) * 2.0
            ]
        );
    }

    #[test]
    fn rope_rotates_each_pair_by_its_angle() {
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        // One row, one head of 4: the first pair turns a quarter, the second
        // not at all.
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        rope_pairs(&mut x, 4, &cos, &sin);
        assert_eq!(x, [-2.0, 1.0, 3.0, 4.0]);
    }

    #[test]
    fn swiglu_gates_with_silu() {
        let y = swiglu(&[0.0, 10.0, -10.0], &[5.0, 2.0, 2.0]);
        assert_eq!(y[0], 0.0);
        assert!((y[1] - 2.0 * 10.0 / (1.0 + (-10f32).exp())).abs() < 1e-5);
        assert!(y[2].abs() < 1e-3 && y[2] < 0.0);
    }
}
