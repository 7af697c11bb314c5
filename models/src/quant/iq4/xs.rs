//! IQ4_XS: per 256 values an f16 `d`, eight 6-bit sub-block scales `ls` (low
//! nibbles in `scales_l[4]`, high 2 bits in the 16-bit `scales_h`) and 128
//! bytes of 4-bit indices, 16 per 32-value sub-block laid out as IQ4_NL's;
//! value `j` of sub-block `s` is `(d * (ls[s] - 32)) * KVALUES[q]`.
//!
//! llama.cpp's AVX2 kernels (all integer sums exact):
//! - `ggml_vec_dot_iq4_xs_q8_K` (fewer than 8 activation rows): eight lanes,
//!   lane `l` the scaled integer dot of values `4l .. 4l + 4` of every
//!   sub-block; per super-block `acc[l] = fma(d * d_x, lane, acc[l])`; result
//!   `hsum_float_8(acc)`.
//! - ggml-cpu's tiled matmul (8 or more): per super-block `res = d * total`,
//!   `acc = fma(res, d_x, acc)`, as for Q6_K.
//!
//! The super-blocks sit in [`crate::quant::k::KWeights`] as the K-quants do.

use super::{expand16, KVALUES};
use crate::quant::k::q8k::Q8KBlock;
use crate::quant::k::{f16_at, hsum8, Variant, QK_K, ROWS_AT_ONCE};

/// Bytes of one IQ4_XS super-block.
pub const BLOCK_BYTES: usize = 136;

/// The eight sub-block scales `ls - 32`.
#[inline(always)]
pub fn scales(b: &[u8]) -> [i32; 8] {
    let h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|s| {
        let lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0xF;
        let hi = ((h >> (2 * s)) & 3) as u8;
        (lo | (hi << 4)) as i32 - 32
    })
}

/// ggml's `dequantize_row_iq4_xs` for one super-block.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (s, ls) in scales(b).into_iter().enumerate() {
        let dl = d * ls as f32;
        let qs = &b[8 + 16 * s..8 + 16 * s + 16];
        for j in 0..32 {
            let q = qs[j % 16];
            let i = if j < 16 { q & 0xF } else { q >> 4 };
            out[32 * s + j] = dl * KVALUES[i as usize] as f32;
        }
    }
}

/// A super-block's values as signed bytes, in position order.
#[inline(always)]
fn unpack_scalar(w: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for s in 0..8 {
        q[32 * s..32 * s + 32].copy_from_slice(&expand16(&w[8 + 16 * s..]));
    }
    q
}

/// The eight exact integer lanes from unpacked values and scales.
#[inline(always)]
fn lanes_unpacked(q: &[i8; QK_K], sc: &[i32; 8], a: &Q8KBlock) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for j in 0..QK_K {
        lanes[(j % 32) / 4] += sc[j / 32] * q[j] as i32 * a.qs[j] as i32;
    }
    lanes
}

/// The eight exact integer lanes of one super-block, scalar.
pub fn lanes_scalar(w: &[u8], a: &Q8KBlock) -> [i32; 8] {
    lanes_unpacked(&unpack_scalar(w), &scales(w), a)
}

/// Adds one super-block's lanes to the running sums in `v`'s ggml order.
#[inline(always)]
fn step(v: Variant, acc: &mut [f32; 8], wb: &[u8], ab: &Q8KBlock, lanes: &[i32; 8]) {
    if v == Variant::Tiled {
        let s1: i32 = lanes.iter().sum();
        acc[0] = (f16_at(wb, 0) * s1 as f32).mul_add(ab.d, acc[0]);
    } else {
        let d = f16_at(wb, 0) * ab.d;
        for (acc, &p) in acc.iter_mut().zip(lanes) {
            *acc = d.mul_add(p as f32, *acc);
        }
    }
}

/// The output from the sums after the last super-block.
#[inline(always)]
fn finish(v: Variant, acc: &[f32; 8]) -> f32 {
    if v == Variant::Tiled {
        acc[0]
    } else {
        hsum8(acc)
    }
}

/// ggml's floating-point order over the super-blocks' integer lanes.
#[inline(always)]
fn combine(
    v: Variant,
    w: &[u8],
    a: &[Q8KBlock],
    lanes: impl Fn(&[u8], &Q8KBlock) -> [i32; 8],
) -> f32 {
    let mut acc = [0f32; 8];
    for (wb, ab) in w.chunks_exact(BLOCK_BYTES).zip(a) {
        step(v, &mut acc, wb, ab, &lanes(wb, ab));
    }
    finish(v, &acc)
}

/// One weight row `w` against several activation rows `a[i]` (kernel `v[i]`),
/// into `out[i]`, each weight super-block unpacked once for all of them; `out[i]`
/// equals `dot(avx2, v[i], w, a[i])` bit for bit.
pub fn dot_rows(avx2: bool, v: &[Variant], w: &[u8], a: &[&[Q8KBlock]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the caller checked AVX2 and FMA.
        return unsafe { avx2::dot_rows(v, w, a, out) };
    }
    let _ = avx2;
    let n = ROWS_AT_ONCE;
    for ((v, a), out) in v.chunks(n).zip(a.chunks(n)).zip(out.chunks_mut(n)) {
        let mut accs = [[0f32; 8]; ROWS_AT_ONCE];
        for (b, wb) in w.chunks_exact(BLOCK_BYTES).enumerate() {
            let (q, sc) = (unpack_scalar(wb), scales(wb));
            for ((s, ar), &vi) in accs.iter_mut().zip(a).zip(v) {
                step(vi, s, wb, &ar[b], &lanes_unpacked(&q, &sc, &ar[b]));
            }
        }
        for ((o, s), &vi) in out.iter_mut().zip(&accs).zip(v) {
            *o = finish(vi, s);
        }
    }
}

/// One output: weight row `w` against activation row `a`; `avx2` picks the AVX2
/// integer kernel (the caller checked the CPU has it).
pub fn dot(avx2: bool, v: Variant, w: &[u8], a: &[Q8KBlock]) -> f32 {
    debug_assert_eq!(w.len(), a.len() * BLOCK_BYTES);
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the caller checked AVX2 and FMA; the lengths match.
        return unsafe { avx2::dot(v, w, a) };
    }
    let _ = avx2;
    combine(v, w, a, lanes_scalar)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{combine, finish, scales, step, Q8KBlock, Variant, BLOCK_BYTES, KVALUES};
    use crate::quant::k::ROWS_AT_ONCE;

    /// A super-block's values (per sub-block `(|q|, q)` for ggml's sign trick)
    /// and scales broadcast, once for many activation rows.
    struct Unpacked {
        q: [(__m256i, __m256i); 8],
        sc: [__m256i; 8],
    }

    /// Looks the indices up as ggml does: `pshufb` of the table by each nibble,
    /// low nibbles in the lower 128 bits, high ones in the upper.
    #[inline(always)]
    unsafe fn unpack(w: &[u8]) -> Unpacked {
        let table = _mm_loadu_si128(KVALUES.as_ptr().cast());
        let m4 = _mm_set1_epi8(0xF);
        let sc = scales(w);
        let qs = w.as_ptr().add(8);
        let q = std::array::from_fn(|s| {
            let bits = _mm_loadu_si128(qs.add(16 * s).cast());
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(bits, m4));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4));
            let v = _mm256_set_m128i(hi, lo);
            (_mm256_sign_epi8(v, v), v)
        });
        Unpacked {
            q,
            sc: std::array::from_fn(|s| _mm256_set1_epi16(sc[s] as i16)),
        }
    }

    /// The lanes from an unpacked block: `maddubs(|q|, sign(y, q))` pairwise,
    /// `madd` with the sub-block's scale, summed over the sub-blocks.
    #[inline(always)]
    unsafe fn lanes_unpacked(u: &Unpacked, a: &Q8KBlock) -> [i32; 8] {
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for s in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * s).cast());
            let p = _mm256_maddubs_epi16(u.q[s].0, _mm256_sign_epi8(yv, u.q[s].1));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(u.sc[s], p));
        }
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), sumi);
        out
    }

    /// # Safety
    /// AVX2 and FMA available; every `a[i]` as long as `w` in super-blocks.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows(v: &[Variant], w: &[u8], a: &[&[Q8KBlock]], out: &mut [f32]) {
        let n = ROWS_AT_ONCE;
        for ((v, a), out) in v.chunks(n).zip(a.chunks(n)).zip(out.chunks_mut(n)) {
            let mut accs = [[0f32; 8]; ROWS_AT_ONCE];
            for (b, wb) in w.chunks_exact(BLOCK_BYTES).enumerate() {
                let u = unpack(wb);
                for ((s, ar), &vi) in accs.iter_mut().zip(a).zip(v) {
                    step(vi, s, wb, &ar[b], &lanes_unpacked(&u, &ar[b]));
                }
            }
            for ((o, s), &vi) in out.iter_mut().zip(&accs).zip(v) {
                *o = finish(vi, s);
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA available; `w.len() == a.len() * BLOCK_BYTES`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(v: Variant, w: &[u8], a: &[Q8KBlock]) -> f32 {
        combine(v, w, a, |wb, ab| unsafe { lanes_unpacked(&unpack(wb), ab) })
    }
}
