//! ggml's reference K-quant quantizers without an importance matrix
//! (`quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`, `quantize_row_q6_K_ref`
//! and their helpers `make_qkx2_quants`, `make_qx_quants`, `nearest_int` in
//! ggml-quants.c), bit for bit as GCC builds them for x86-64-v3.
//!
//! GCC contracts a product followed by a sum into one fused multiply-add
//! (`-ffp-contract=fast`, its default for GNU C), across statements too; the
//! object code of ggml-base shows which. Each `mul_add` below stands where the
//! object code has a `vfmadd`/`vfmsub`/`vfnmadd`, and every other product is
//! rounded on its own: a different choice flips a quant now and then, and
//! then the search for the best scale goes elsewhere.

// Index loops keep ggml's loop structure, so the port reads against it line by line.
#![allow(clippy::needless_range_loop)]

use half::f16;

/// Values per super-block.
pub const QK_K: usize = 256;

/// `1.5 * 2^23`: added to a float of magnitude below `2^22`, it leaves the
/// rounded integer in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;

/// Blocks whose largest value is below this are all zeros (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int` of an already-offset value `v + MAGIC`.
fn int_bits(offset: f32) -> i32 {
    (offset.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `nearest_int(a * b)` where ggml's compiled code fuses the product with the
/// offset.
fn nearest_fused(a: f32, b: f32) -> i32 {
    int_bits(a.mul_add(b, MAGIC))
}

/// `nearest_int(v)` of a value already rounded.
fn nearest(v: f32) -> i32 {
    int_bits(v + MAGIC)
}

fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
}

fn f16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// `make_qkx2_quants` with `use_mad = false` and `rdelta = 0.1`: 32 values,
/// quants in `0..=nmax` into `l`; returns `(scale, -min)`.
fn make_qkx2(
    x: &[f32],
    w: &[f32; 32],
    nmax: i32,
    l: &mut [u8],
    rmin: f32,
    nstep: i32,
) -> (f32, f32) {
    const RDELTA: f32 = 0.1;
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x = x[i].mul_add(w[i], sum_x);
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_fused(x[i] - min, iscale).clamp(0, nmax);
        l[i] = q as u8;
        let diff = (q as f32).mul_add(scale, min) - x[i];
        best_error = (diff * diff).mul_add(w[i], best_error);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        let iscale = (RDELTA.mul_add(is as f32, rmin) + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_fused(x[i] - min, iscale).clamp(0, nmax);
            laux[i] = q as u8;
            let qf = q as f32;
            let wl = qf * w[i];
            sum_l2 = qf.mul_add(wl, sum_l2);
            sum_xl = x[i].mul_add(wl, sum_xl);
            sum_l += wl;
        }
        let det = sum_l2.mul_add(sum_w, -(sum_l * sum_l));
        if det > 0.0 {
            let mut this_min = sum_x.mul_add(sum_l2, -(sum_l * sum_xl)) / det;
            let this_scale = if this_min > 0.0 {
                this_min = 0.0;
                sum_xl / sum_l2
            } else {
                (-sum_l).mul_add(sum_x, sum_xl * sum_w) / det
            };
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = (laux[i] as f32).mul_add(this_scale, this_min) - x[i];
                cur_error = (diff * diff).mul_add(w[i], cur_error);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qx_quants` with `rmse_type = 1` and no weights (Q6_K's call): signed
/// quants `-nmax..nmax` stored offset by `nmax` into `l`; returns the scale.
fn make_qx(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let quant = |v: f32, iscale: f32| nearest_fused(v, iscale).clamp(-nmax, nmax - 1);
    // One pass: the weighted sums of `x * q` and `q * q` (weight `x * x`).
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let q = quant(v, iscale) as f32;
            let w = v * v;
            sumlx = (w * v).mul_add(q, sumlx);
            suml2 = q.mul_add(w * q, suml2);
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (l, &v) in l.iter_mut().zip(x) {
        *l = (quant(v, iscale) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = sumlx * scale;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(0.1f32.mul_add(is as f32, nmax as f32)) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l, &v) in l.iter_mut().zip(x) {
                *l = (quant(v, iscale) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = sumlx * scale;
        }
    }
    scale
}

/// The 6-bit scales and minimums of Q4_K and Q5_K packed into 12 bytes.
fn pack_scales_mins(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The common part of Q4_K and Q5_K: per 32-value sub-block a weighted
/// scale-and-minimum fit, the eight scales and minimums quantized to 6 bits
/// against the super-block's `d` and `dmin`, then every value requantized
/// against its sub-block's rounded scale. Writes `d`, `dmin` and the packed
/// scales to `out` and returns the quants.
fn scale_min_block(x: &[f32], nmax: i32, rmin: f32, nstep: i32, out: &mut Vec<u8>) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 * (1.0 / 32.0)).sqrt();
        let mut w = [0f32; 32];
        for (w, &v) in w.iter_mut().zip(sub) {
            *w = v.abs() + av_x;
        }
        let (scale, min) = make_qkx2(sub, &w, nmax, &mut l[32 * j..32 * j + 32], rmin, nstep);
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        ls[j] = (nearest_fused(scales[j], inv_scale) as u8).min(63);
        lm[j] = (nearest_fused(mins[j], inv_min) as u8).min(63);
    }
    let d = f16_round(max_scale / 63.0);
    let dmin = f16_round(max_min / 63.0);
    put_f16(out, d);
    put_f16(out, dmin);
    out.extend_from_slice(&pack_scales_mins(&ls, &lm));
    for j in 0..8 {
        let dj = d * ls[j] as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * lm[j] as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    l
}

/// Q4_K: 144 bytes per 256 values.
pub fn q4_k(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK_K) {
        let l = scale_min_block(b, 15, -1.0, 20, out);
        for j in (0..QK_K).step_by(64) {
            for i in 0..32 {
                out.push(l[j + i] | (l[j + i + 32] << 4));
            }
        }
    }
}

/// Q5_K: 176 bytes per 256 values.
pub fn q5_k(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK_K) {
        let l = scale_min_block(b, 31, -0.5, 15, out);
        let mut qh = [0u8; 32];
        let mut ql = [0u8; 128];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (k, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[32 * k + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
        out.extend_from_slice(&qh);
        out.extend_from_slice(&ql);
    }
}

/// Q6_K: 210 bytes per 256 values (`ql`, `qh`, 16 signed 8-bit scales, `d`).
pub fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK_K) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for ib in 0..16 {
            let s = make_qx(&b[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            out.extend_from_slice(&[0u8; 210]);
            continue;
        }
        let iscale = -128.0 / max_scale;
        let d = f16_round(1.0 / iscale);
        let mut sc = [0i8; 16];
        for ib in 0..16 {
            sc[ib] = nearest_fused(scales[ib], iscale).min(127) as i8;
        }
        for j in 0..16 {
            let dj = d * sc[j] as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest(b[i] / dj).clamp(-32, 31) + 32) as i8;
            }
        }
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for (k, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                let q = |o: usize| l[j + i + o] as u8;
                ql[64 * k + i] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
                ql[64 * k + i + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
                qh[32 * k + i] =
                    (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend_from_slice(&sc.map(|s| s as u8));
        put_f16(out, d);
    }
}
