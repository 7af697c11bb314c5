//! ggml's IQ4_NL and IQ4_XS quantizers without an importance matrix
//! (`quantize_iq4_nl`, `quantize_iq4_xs` and their shared
//! `quantize_row_iq4_nl_impl` in ggml-quants.c, seven trial scales each side),
//! bit for bit as GCC builds them for x86-64-v3: `sumqx += w * q * x` and
//! `sumq2 += w * q * q` are one fused multiply-add each after the rounded
//! `w * q`, and `nearest_int(id * scale)` fuses the product with its offset
//! (see [`super::kquants`] for the contraction rule).
//!
//! Only the bytes are here; candle's `GgmlDType` has neither type, so
//! [`super::quantize`] does not dispatch to them.

// Index loops keep ggml's loop structure, so the port reads against it line by line.
#![allow(clippy::needless_range_loop)]

use half::f16;

use crate::quant::iq4::KVALUES;

/// Blocks whose largest value is below this are all zeros (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;
/// Trial scales on each side of the first guess (`ntry`).
const NTRY: i32 = 7;

/// ggml's `best_index_int8`: the table entry nearest `x` (ties to the upper).
fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// One 32-value sub-block's best scale (`quantize_row_iq4_nl_impl`'s search):
/// 0 for an all-zero block, its indices left in `l`.
fn block_scale(xb: &[f32], l: &mut [u8]) -> f32 {
    let weight: [f32; 32] = std::array::from_fn(|j| xb[j] * xb[j]);
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let sums = |id: f32, l: Option<&mut [u8]>| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        let mut l = l;
        for j in 0..32 {
            let i = best_index(id * xb[j]);
            if let Some(l) = l.as_deref_mut() {
                l[j] = i;
            }
            let q = KVALUES[i as usize] as f32;
            let wq = weight[j] * q;
            sumqx = wq.mul_add(xb[j], sumqx);
            sumq2 = wq.mul_add(q, sumq2);
        }
        (sumqx, sumq2)
    };
    let d = -max / KVALUES[0] as f32;
    let (sumqx, sumq2) = sums(1.0 / d, Some(l));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + KVALUES[0] as i32) as f32 / max;
        let (sumqx, sumq2) = sums(id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices into 16 bytes: value `j` low nibble, `j + 16` high.
fn pack(l: &[u8], q4: &mut [u8]) {
    for j in 0..16 {
        q4[j] = l[j] | (l[16 + j] << 4);
    }
}

/// `x` (whole blocks of 32) as IQ4_NL, ggml's bytes appended to `out`.
pub fn iq4_nl(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; 32];
    for xb in x.chunks_exact(32) {
        let scale = block_scale(xb, &mut l);
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for j in 0..32 {
            l[j] = best_index(id * xb[j]);
        }
        out.extend_from_slice(&f16::from_f32(scale).to_le_bytes());
        let mut q4 = [0u8; 16];
        pack(&l, &mut q4);
        out.extend_from_slice(&q4);
    }
}

/// `x` (whole super-blocks of 256) as IQ4_XS, ggml's bytes appended to `out`.
pub fn iq4_xs(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; 32];
    for xs in x.chunks_exact(256) {
        let mut scales = [0f32; 8];
        let (mut max_scale, mut amax_scale) = (0f32, 0f32);
        for (ib, s) in scales.iter_mut().enumerate() {
            *s = block_scale(&xs[32 * ib..32 * ib + 32], &mut l);
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = *s;
            }
        }
        let d = -max_scale / 32.0;
        let dh = f16::from_f32(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
        let mut qs = [0u8; 128];
        for ib in 0..8 {
            let ls =
                (id.mul_add(scales[ib], 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000;
            let ls = ls.clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &xs[32 * ib..32 * ib + 32];
            for j in 0..32 {
                l[j] = best_index(idl * xb[j]);
            }
            pack(&l, &mut qs[16 * ib..16 * ib + 16]);
            let ls = (ls + 32) as u8;
            scales_l[ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
            scales_h |= ((ls >> 4) as u16) << (2 * ib);
        }
        out.extend_from_slice(&dh.to_le_bytes());
        out.extend_from_slice(&scales_h.to_le_bytes());
        out.extend_from_slice(&scales_l);
        out.extend_from_slice(&qs);
    }
}
