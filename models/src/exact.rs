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
    const CHUNK: usize = 1 << 15;
    let n = gate.len().min(up.len());
    let mut out = vec![0f32; n];
    crate::quant::pool::Pool::global().fill_chunks(&mut out, CHUNK, &|start, part| {
        let end = start + part.len();
        swiglu_into(&gate[start..end], &up[start..end], part);
    });
    out
}

/// [`swiglu`] of `g` and `u` (as long as `out`) into `out`, on the caller.
pub fn swiglu_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    let (g, u) = (&g[..out.len()], &u[..out.len()]);
    let mut done = 0;
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    // SAFETY: AVX2 and FMA are enabled at compile time; every load and
    // store touches 8 floats inside `g`, `u` or `out` (same lengths).
    unsafe {
        use std::arch::x86_64::*;
        let (zero, one) = (_mm256_setzero_ps(), _mm256_set1_ps(1.0));
        while done + 8 <= out.len() {
            let gv = _mm256_loadu_ps(g.as_ptr().add(done));
            let uv = _mm256_loadu_ps(u.as_ptr().add(done));
            let e = expf_poly_x8(_mm256_sub_ps(zero, gv));
            let v = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
            _mm256_storeu_ps(out.as_mut_ptr().add(done), v);
            done += 8;
        }
    }
    for ((o, &g), &u) in out[done..].iter_mut().zip(&g[done..]).zip(&u[done..]) {
        *o = (g / (1.0 + expf_poly(0.0 - g))) * u;
    }
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
    zip_map(gate, up, |g, u| geglu_one(table, g, u))
}

/// [`geglu_tanh`] of `g` and `u` (as long as `out`) into `out`, on the caller.
pub fn geglu_tanh_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    let table = gelu_table();
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = geglu_one(table, g, u);
    }
}

/// One GeGLU output through ggml's table.
#[inline(always)]
fn geglu_one(table: &[f32], g: f32, u: f32) -> f32 {
    if g <= -10.0 {
        0.0
    } else if g >= 10.0 {
        g * u
    } else {
        table[half::f16::from_f32(g).to_bits() as usize] * u
    }
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

/// [`expf_poly`] on eight lanes: the same operations lane by lane (the
/// branches as blends, NaN taking the scalar's path), so the same bits.
///
/// # Safety
/// AVX2 and FMA available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn expf_poly_x8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
    let r = c(0x4b40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
    let n = _mm256_sub_ps(z, r);
    // `(-n) * c + x` is `-(n * c) + x`: negation is exact.
    let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_set1_epi32(1f32.to_bits() as i32),
    ));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_mul_ps(c(0x3f7f_fff6), b),
    );
    let normal = _mm256_fmadd_ps(j, k, k);
    let an = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    // `!(|n| <= 126)`: true for NaN, as the scalar's `if` falls through.
    let outside = _mm256_cmp_ps::<_CMP_NLE_UQ>(an, _mm256_set1_ps(126.0));
    // As ggml: the scaled paths only where a lane needs them. Computed for
    // normal lanes (and then discarded) they make subnormal intermediates,
    // which cost a microcode assist each: three times the whole SwiGLU.
    if _mm256_movemask_ps(outside) == 0 {
        return normal;
    }
    let neg = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()));
    let g = _mm256_and_si256(neg, _mm256_set1_epi32(0x8200_0000u32 as i32));
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(an, _mm256_set1_ps(192.0));
    let special = _mm256_blendv_ps(
        _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
        _mm256_mul_ps(s1, s1),
        huge,
    );
    _mm256_blendv_ps(normal, special, outside)
}

/// `xs[i] = expf_poly(xs[i] - shift)` for every `i`, eight at a time where
/// the build has AVX2 (the same bits as the scalar loop).
#[inline]
pub fn expf_poly_shifted(xs: &mut [f32], shift: f32) {
    let mut done = 0;
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    // SAFETY: AVX2 and FMA are enabled at compile time; each load and store
    // touches 8 floats inside `xs`.
    unsafe {
        use std::arch::x86_64::*;
        let sh = _mm256_set1_ps(shift);
        while done + 8 <= xs.len() {
            let p = xs.as_mut_ptr().add(done);
            _mm256_storeu_ps(p, expf_poly_x8(_mm256_sub_ps(_mm256_loadu_ps(p), sh)));
            done += 8;
        }
    }
    for x in &mut xs[done..] {
        *x = expf_poly(*x - shift);
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

    /// The eight-lane `exp` gives the scalar's bits everywhere it branches:
    /// ordinary values, both range edges (126 and 192 steps of `2^n`),
    /// infinities, NaN, zeros and subnormals, and a sweep between.
    #[test]
    fn polynomial_exp_eight_lanes_equal_the_scalar_bit_for_bit() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-40,
            -1e-40,
            f32::MAX,
            f32::MIN,
        ];
        for edge in [126.0f32, 192.0] {
            let x = edge * std::f32::consts::LN_2;
            for d in -40..=40 {
                xs.push(x + d as f32 * 1e-3);
                xs.push(-x + d as f32 * 1e-3);
            }
        }
        let mut x = -150.0f32;
        while x < 150.0 {
            xs.push(x);
            x += 0.0137;
        }
        while !xs.len().is_multiple_of(8) {
            xs.push(1.0);
        }
        let want: Vec<u32> = xs.iter().map(|&x| expf_poly(x).to_bits()).collect();
        let mut got = xs.clone();
        expf_poly_shifted(&mut got, 0.0);
        let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                w,
                "exp({}) = {:e} against {:e}",
                xs[i],
                f32::from_bits(*g),
                f32::from_bits(*w)
            );
        }
        let (gate, up): (Vec<f32>, Vec<f32>) = xs.iter().map(|&x| (x / 3.0, 1.0 - x / 7.0)).unzip();
        let sw = swiglu(&gate, &up);
        for (i, (&g, &u)) in gate.iter().zip(&up).enumerate() {
            let want = (g / (1.0 + expf_poly(0.0 - g))) * u;
            assert_eq!(sw[i].to_bits(), want.to_bits(), "swiglu({g}, {u})");
        }
    }

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
