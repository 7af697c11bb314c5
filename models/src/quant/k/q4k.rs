//! Q4_K: per 256 values an f16 `d` and `dmin`, eight 6-bit scales `sc` and
//! minimums `m` packed in 12 bytes, and 128 bytes of 4-bit quants `q`; value
//! `j` of sub-block `s` (32 values) is `d * sc[s] * q - dmin * m[s]`. Quant
//! bytes `32 k .. 32 k + 32` hold sub-block `2k` in their low nibbles and
//! `2k + 1` in their high ones.
//!
//! The floating-point orders of llama.cpp's three AVX2 kernels, per output
//! (all integer sums exact):
//! - `ggml_vec_dot_q4_K_q8_K`: eight lanes, lane `l` the scaled integer dot of
//!   values `4l .. 4l + 4` of every sub-block; per super-block
//!   `acc[l] = fma(d_x * d, lane, acc[l])`; four minimum lanes, lane `t` =
//!   `m[2t] * sum_x(2t) + m[2t+1] * sum_x(2t+1)`, `accm[t] = fma(-d_x * dmin,
//!   lane, accm[t])`; result `hsum_float_8(acc) + ((accm0 + accm2) + (accm1 + accm3))`.
//! - `ggml_gemv_q4_K_8x8_q8_K` (repacked, a lone activation row): per super-block
//!   `acc = fma(total, d * d_x, acc)` and `accm = fma(total_min, dmin * d_x, accm)`;
//!   result `acc - accm`.
//! - `ggml_gemm_q4_K_8x8_q8_K` (repacked, rows in groups of four): the same two
//!   accumulators, but one FMA per pair of sub-blocks (64 values).
//! - the tiled matmul (not repacked, 8 or more rows): per super-block
//!   `res = fma(-dmin, total_min, d * total)`, `acc = fma(res, d_x, acc)`.

use super::q8k::Q8KBlock;
use super::superblock::SuperBlock;
use super::{f16_at, hsum8, Variant, QK_K};

/// Bytes of one Q4_K super-block.
pub const BLOCK_BYTES: usize = 144;

/// The eight 6-bit scales and minimums of a super-block (ggml's
/// `get_scale_min_k4`), from its 12 packed bytes.
pub fn scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        if j < 4 {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (sc, m)
}

/// ggml's `dequantize_row_q4_K` for one super-block, as GCC builds it: each value
/// one fused `d1 * q - m1`.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_mins(&b[4..16]);
    let qs = &b[16..BLOCK_BYTES];
    for j in 0..4 {
        let (d1, m1) = (d * sc[2 * j] as f32, dmin * m[2 * j] as f32);
        let (d2, m2) = (d * sc[2 * j + 1] as f32, dmin * m[2 * j + 1] as f32);
        for l in 0..32 {
            let q = qs[32 * j + l];
            out[64 * j + l] = d1.mul_add((q & 0xF) as f32, -m1);
            out[64 * j + 32 + l] = d2.mul_add((q >> 4) as f32, -m2);
        }
    }
}

/// The exact integer parts of one super-block product.
pub struct Ints {
    /// `ggml_vec_dot`'s eight position lanes.
    pub pos: [i32; 8],
    /// The scaled dot of each pair of sub-blocks `(2k, 2k + 1)`.
    pub pair: [i32; 4],
    /// `m[2k] * sum_x(2k) + m[2k + 1] * sum_x(2k + 1)` per pair, `sum_x(s)` the sum
    /// of the activation quants of sub-block `s`.
    pub mins: [i32; 4],
}

/// The minimum terms per pair of sub-blocks, from the activations' `bsums`.
#[inline(always)]
fn min_pairs(m: &[u8; 8], a: &Q8KBlock) -> [i32; 4] {
    let s = |k: usize| a.bsums[2 * k] as i32 + a.bsums[2 * k + 1] as i32;
    std::array::from_fn(|t| m[2 * t] as i32 * s(2 * t) + m[2 * t + 1] as i32 * s(2 * t + 1))
}

/// The integer parts, scalar.
pub fn ints_scalar(w: &[u8], a: &Q8KBlock) -> Ints {
    let (sc, m) = scales_mins(&w[4..16]);
    let qs = &w[16..BLOCK_BYTES];
    let mut ints = Ints {
        pos: [0; 8],
        pair: [0; 4],
        mins: min_pairs(&m, a),
    };
    for j in 0..4 {
        for e in 0..32 {
            let q = qs[32 * j + e];
            let lo = (q & 0xF) as i32 * a.qs[64 * j + e] as i32 * sc[2 * j] as i32;
            let hi = (q >> 4) as i32 * a.qs[64 * j + 32 + e] as i32 * sc[2 * j + 1] as i32;
            ints.pos[e / 4] += lo + hi;
            ints.pair[j] += lo + hi;
        }
    }
    ints
}

/// One output's running floating-point state; which fields a kernel uses
/// depends on its [`Variant`].
#[derive(Clone, Copy, Default)]
pub(crate) struct Acc {
    acc: [f32; 8],
    accm: [f32; 4],
}

/// Adds one super-block's integer parts to `s` in the order of `v`'s ggml kernel
/// (see the module doc).
#[inline(always)]
fn step(v: Variant, s: &mut Acc, wb: &[u8], ab: &Q8KBlock, i: &Ints) {
    match v {
        Variant::VecDot => {
            let d = ab.d * f16_at(wb, 0);
            let dmin = -ab.d * f16_at(wb, 2);
            for (acc, &p) in s.acc.iter_mut().zip(&i.pos) {
                *acc = d.mul_add(p as f32, *acc);
            }
            for (accm, &p) in s.accm.iter_mut().zip(&i.mins) {
                *accm = dmin.mul_add(p as f32, *accm);
            }
        }
        Variant::Tiled => {
            let s1: i32 = i.pair.iter().sum();
            let s2: i32 = i.mins.iter().sum();
            let res = f16_at(wb, 0) * s1 as f32;
            let res = (-f16_at(wb, 2)).mul_add(s2 as f32, res);
            s.acc[0] = res.mul_add(ab.d, s.acc[0]);
        }
        Variant::Gemv | Variant::Gemm => {
            let dd = f16_at(wb, 0) * ab.d;
            let ddm = f16_at(wb, 2) * ab.d;
            let (mut acc, mut accm) = (s.acc[0], s.accm[0]);
            if v == Variant::Gemm {
                for k in 0..4 {
                    acc = (i.pair[k] as f32).mul_add(dd, acc);
                    accm = (i.mins[k] as f32).mul_add(ddm, accm);
                }
            } else {
                let total: i32 = i.pair.iter().sum();
                let total_min: i32 = i.mins.iter().sum();
                acc = (total as f32).mul_add(dd, acc);
                accm = (total_min as f32).mul_add(ddm, accm);
            }
            (s.acc[0], s.accm[0]) = (acc, accm);
        }
    }
}

/// The output from the state after the last super-block.
#[inline(always)]
fn finish(v: Variant, s: &Acc) -> f32 {
    match v {
        Variant::VecDot => hsum8(&s.acc) + ((s.accm[0] + s.accm[2]) + (s.accm[1] + s.accm[3])),
        Variant::Tiled => s.acc[0],
        Variant::Gemv | Variant::Gemm => s.acc[0] - s.accm[0],
    }
}

/// A weight super-block unpacked once for dotting against many activation rows.
pub(crate) struct Unpacked {
    sc: [u8; 8],
    m: [u8; 8],
    /// The quants of sub-block `s` at `q[32 s..]`.
    q: [u8; QK_K],
}

/// Unpacks super-block `w`.
#[inline(always)]
fn unpack_scalar(w: &[u8]) -> Unpacked {
    let (sc, m) = scales_mins(&w[4..16]);
    let mut q = [0u8; QK_K];
    for j in 0..4 {
        for e in 0..32 {
            let b = w[16 + 32 * j + e];
            q[64 * j + e] = b & 0xF;
            q[64 * j + 32 + e] = b >> 4;
        }
    }
    Unpacked { sc, m, q }
}

/// The integer parts from an unpacked weight block, scalar.
#[inline(always)]
fn ints_unpacked(u: &Unpacked, a: &Q8KBlock) -> Ints {
    let mut ints = Ints {
        pos: [0; 8],
        pair: [0; 4],
        mins: min_pairs(&u.m, a),
    };
    for (j, &s) in u.sc.iter().enumerate() {
        for e in 0..32 {
            let t = u.q[32 * j + e] as i32 * a.qs[32 * j + e] as i32 * s as i32;
            ints.pos[e / 4] += t;
            ints.pair[j / 2] += t;
        }
    }
    ints
}

/// Q4_K as the shared drivers see it ([`SuperBlock`]).
pub(crate) struct Format;

impl SuperBlock for Format {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    type Ints = Ints;
    type Acc = Acc;
    type Unpacked = Unpacked;

    #[inline(always)]
    fn unpack(w: &[u8]) -> Self::Unpacked {
        unpack_scalar(w)
    }

    #[inline(always)]
    fn ints(u: &Self::Unpacked, a: &Q8KBlock) -> Ints {
        ints_unpacked(u, a)
    }

    #[inline(always)]
    fn ints_one(w: &[u8], a: &Q8KBlock) -> Ints {
        ints_scalar(w, a)
    }

    #[inline(always)]
    fn step(v: Variant, acc: &mut Acc, wb: &[u8], ab: &Q8KBlock, i: &Ints) {
        step(v, acc, wb, ab, i)
    }

    #[inline(always)]
    fn finish(v: Variant, acc: &Acc) -> f32 {
        finish(v, acc)
    }

    #[cfg(target_arch = "x86_64")]
    type Vectors = avx2::Unpacked;

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn unpack_avx2(w: &[u8]) -> avx2::Unpacked {
        avx2::unpack(w)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ints_avx2(u: &avx2::Unpacked, a: &Q8KBlock) -> Ints {
        avx2::ints_unpacked(u, a)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ints_one_avx2(w: &[u8], a: &Q8KBlock) -> Ints {
        avx2::ints(w, a)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{min_pairs, scales_mins, Ints, Q8KBlock};

    /// The integer parts with AVX2: per pair of sub-blocks, unsigned 4-bit quants
    /// times signed activation quants pairwise (`maddubs`), then times the scale
    /// and summed to 8 lanes of 4 values (`madd`), as ggml does.
    #[inline(always)]
    pub(super) unsafe fn ints(w: &[u8], a: &Q8KBlock) -> Ints {
        let (sc, m) = scales_mins(&w[4..16]);
        let qs = w.as_ptr().add(16);
        let y = a.qs.as_ptr();
        let m4 = _mm256_set1_epi8(0xF);
        let mut pos = _mm256_setzero_si256();
        let mut pair = [0i32; 4];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(qs.add(32 * j).cast());
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            let yl = _mm256_loadu_si256(y.add(64 * j).cast());
            let yh = _mm256_loadu_si256(y.add(64 * j + 32).cast());
            let pl = _mm256_madd_epi16(
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_maddubs_epi16(lo, yl),
            );
            let ph = _mm256_madd_epi16(
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
                _mm256_maddubs_epi16(hi, yh),
            );
            let s = _mm256_add_epi32(pl, ph);
            pos = _mm256_add_epi32(pos, s);
            pair[j] = hsum_i32(s);
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), pos);
        Ints {
            pos: lanes,
            pair,
            mins: min_pairs(&m, a),
        }
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// A super-block's nibbles split into eight vectors of 32 quants and its
    /// scales broadcast, once for many activation rows.
    pub(crate) struct Unpacked {
        q: [__m256i; 8],
        sc: [__m256i; 8],
        m: [u8; 8],
    }

    #[inline(always)]
    pub(super) unsafe fn unpack(w: &[u8]) -> Unpacked {
        let (sc, m) = scales_mins(&w[4..16]);
        let qs = w.as_ptr().add(16);
        let m4 = _mm256_set1_epi8(0xF);
        let mut q = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(qs.add(32 * j).cast());
            q[2 * j] = _mm256_and_si256(bits, m4);
            q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
        }
        Unpacked {
            q,
            sc: std::array::from_fn(|s| _mm256_set1_epi16(sc[s] as i16)),
            m,
        }
    }

    /// The integer parts from an unpacked block (the same exact integers).
    #[inline(always)]
    pub(super) unsafe fn ints_unpacked(u: &Unpacked, a: &Q8KBlock) -> Ints {
        let y = a.qs.as_ptr();
        let mut pos = _mm256_setzero_si256();
        let mut s = [_mm256_setzero_si256(); 4];
        for (j, s) in s.iter_mut().enumerate() {
            let yl = _mm256_loadu_si256(y.add(64 * j).cast());
            let yh = _mm256_loadu_si256(y.add(64 * j + 32).cast());
            let pl = _mm256_madd_epi16(u.sc[2 * j], _mm256_maddubs_epi16(u.q[2 * j], yl));
            let ph = _mm256_madd_epi16(u.sc[2 * j + 1], _mm256_maddubs_epi16(u.q[2 * j + 1], yh));
            *s = _mm256_add_epi32(pl, ph);
            pos = _mm256_add_epi32(pos, *s);
        }
        // The four pair totals at once: two rounds of pairwise adds, then the halves.
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        let p = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), pos);
        let mut pair = [0i32; 4];
        _mm_storeu_si128(pair.as_mut_ptr().cast(), p);
        Ints {
            pos: lanes,
            pair,
            mins: min_pairs(&u.m, a),
        }
    }
}
