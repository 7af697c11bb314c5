//! Q2_K: per 256 values sixteen scale bytes (one per 16 values: a 4-bit scale
//! `sc` in the low nibble, a 4-bit minimum `m` in the high one), 64 bytes of
//! 2-bit quants `q`, then an f16 `d` and `dmin`; value `j` is
//! `d * sc[j / 16] * q - dmin * m[j / 16]`. In each half of 128 values, byte `l`
//! of the half's 32 holds values `l`, `l + 32`, `l + 64`, `l + 96` at bit
//! offsets 0, 2, 4, 6.
//!
//! llama.cpp runs `ggml_vec_dot_q2_K_q8_K` for every Q2_K weight below 8
//! activation rows on AVX2 (its repack buffer takes Q2_K only with AVX-512).
//! Its order: eight lanes; per super-block first the minimums,
//! `acc[l] = fma(-d_x * dmin, m[2l] bsum[2l] + m[2l+1] bsum[2l+1], acc[l])`, then
//! `acc[l] = fma(d_x * d, lane, acc[l])` with lane `l` the scaled integer dot of
//! values `4l .. 4l + 4` of every run of 32; result `hsum_float_8(acc)`. From 8
//! rows ggml-cpu's tiled matmul runs (`SUBBLK` 16, with minimums, no bias): per
//! super-block `res = fma(-dmin, total_min, d * total)`, `acc = fma(res, d_x, acc)`.

use super::q8k::Q8KBlock;
use super::superblock::SuperBlock;
use super::{f16_at, hsum8, Variant, QK_K};

/// Bytes of one Q2_K super-block.
pub const BLOCK_BYTES: usize = 84;

/// Offset of the 2-bit quants.
const QS: usize = 16;
/// Offset of `d` (`dmin` follows it).
const D: usize = 80;

/// The 2-bit quant of value `j` of block `b`.
#[inline(always)]
pub fn quant(b: &[u8], j: usize) -> u8 {
    let (h, e) = (j / 128, j % 128);
    (b[QS + 32 * h + e % 32] >> (2 * (e / 32))) & 3
}

/// The sixteen 4-bit scales and minimums.
#[inline(always)]
fn scales_mins(b: &[u8]) -> ([u8; 16], [u8; 16]) {
    (
        std::array::from_fn(|s| b[s] & 0xF),
        std::array::from_fn(|s| b[s] >> 4),
    )
}

/// ggml's `dequantize_row_q2_K` for one super-block, as GCC builds it: each value
/// one fused `dl * q - ml`.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, D), f16_at(b, D + 2));
    let (sc, m) = scales_mins(b);
    for (j, o) in out[..QK_K].iter_mut().enumerate() {
        let (dl, ml) = (d * sc[j / 16] as f32, dmin * m[j / 16] as f32);
        *o = dl.mul_add(quant(b, j) as f32, -ml);
    }
}

/// The exact integer parts of one super-block product: ggml's eight position
/// lanes and its eight minimum lanes.
#[derive(Clone, Copy)]
pub struct Ints {
    /// Lane `l`: the scaled dot of values `4l .. 4l + 4` of every run of 32.
    pub pos: [i32; 8],
    /// Lane `l`: `m[2l] * bsum[2l] + m[2l + 1] * bsum[2l + 1]`.
    pub mins: [i32; 8],
}

/// The minimum lanes from the activations' `bsums`.
#[inline(always)]
fn min_lanes(m: &[u8; 16], a: &Q8KBlock) -> [i32; 8] {
    std::array::from_fn(|l| {
        m[2 * l] as i32 * a.bsums[2 * l] as i32 + m[2 * l + 1] as i32 * a.bsums[2 * l + 1] as i32
    })
}

/// A super-block's quants (value order), scales and minimums, scalar.
pub(crate) struct Unpacked {
    q: [u8; QK_K],
    sc: [u8; 16],
    m: [u8; 16],
}

#[inline(always)]
fn unpack_scalar(w: &[u8]) -> Unpacked {
    let (sc, m) = scales_mins(w);
    Unpacked {
        q: std::array::from_fn(|j| quant(w, j)),
        sc,
        m,
    }
}

#[inline(always)]
fn ints_unpacked(u: &Unpacked, a: &Q8KBlock) -> Ints {
    let mut pos = [0i32; 8];
    for j in 0..QK_K {
        pos[(j % 32) / 4] += u.sc[j / 16] as i32 * u.q[j] as i32 * a.qs[j] as i32;
    }
    Ints {
        pos,
        mins: min_lanes(&u.m, a),
    }
}

/// The integer parts of one super-block, scalar.
pub fn ints_scalar(w: &[u8], a: &Q8KBlock) -> Ints {
    ints_unpacked(&unpack_scalar(w), a)
}

/// Adds one super-block's integer parts to the running sums `acc` in ggml's
/// order (see the module doc); the tiled order keeps its one sum in lane 0.
#[inline(always)]
fn step(v: Variant, acc: &mut [f32; 8], wb: &[u8], ab: &Q8KBlock, i: &Ints) {
    if v == Variant::Tiled {
        let s1: i32 = i.pos.iter().sum();
        let s2: i32 = i.mins.iter().sum();
        let res = f16_at(wb, D) * s1 as f32;
        let res = (-f16_at(wb, D + 2)).mul_add(s2 as f32, res);
        acc[0] = res.mul_add(ab.d, acc[0]);
    } else {
        let d = ab.d * f16_at(wb, D);
        let dmin = -ab.d * f16_at(wb, D + 2);
        for (acc, &p) in acc.iter_mut().zip(&i.mins) {
            *acc = dmin.mul_add(p as f32, *acc);
        }
        for (acc, &p) in acc.iter_mut().zip(&i.pos) {
            *acc = d.mul_add(p as f32, *acc);
        }
    }
}

#[inline(always)]
fn finish(v: Variant, acc: &[f32; 8]) -> f32 {
    if v == Variant::Tiled {
        acc[0]
    } else {
        hsum8(acc)
    }
}

/// Q2_K as the shared drivers see it ([`SuperBlock`]).
pub(crate) struct Format;

impl SuperBlock for Format {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    type Ints = Ints;
    type Acc = [f32; 8];
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
    fn step(v: Variant, acc: &mut [f32; 8], wb: &[u8], ab: &Q8KBlock, i: &Ints) {
        step(v, acc, wb, ab, i)
    }

    #[inline(always)]
    fn finish(v: Variant, acc: &[f32; 8]) -> f32 {
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
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Ints, Q8KBlock, QS};

    /// A super-block unpacked for AVX2: its quants as eight vectors of 32 (value
    /// order), per vector the scales of its two 16-value halves, and the sixteen
    /// minimums widened to i16.
    pub(crate) struct Unpacked {
        q: [__m256i; 8],
        sc: [__m256i; 8],
        mins: __m256i,
    }

    #[inline(always)]
    pub(super) unsafe fn unpack(w: &[u8]) -> Unpacked {
        let p = w.as_ptr();
        let m3 = _mm256_set1_epi8(3);
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let bits = _mm256_loadu_si256(p.add(QS + 32 * h).cast());
            q[4 * h] = _mm256_and_si256(bits, m3);
            q[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<2>(bits), m3);
            q[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m3);
            q[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16::<6>(bits), m3);
        }
        let packed = _mm_loadu_si128(p.cast());
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0xF));
        Unpacked {
            q,
            sc: std::array::from_fn(|c| {
                _mm256_set_m128i(
                    _mm_set1_epi16((w[2 * c + 1] & 0xF) as i16),
                    _mm_set1_epi16((w[2 * c] & 0xF) as i16),
                )
            }),
            mins: _mm256_cvtepu8_epi16(mins8),
        }
    }

    /// The integer parts from an unpacked block: `maddubs` of the unsigned quants
    /// with the activation quants, `madd` with the scales (the same exact
    /// integers as ggml's lanes), and the minimums against `bsums`.
    #[inline(always)]
    pub(super) unsafe fn ints_unpacked(u: &Unpacked, a: &Q8KBlock) -> Ints {
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * c).cast());
            let p = _mm256_madd_epi16(u.sc[c], _mm256_maddubs_epi16(u.q[c], yv));
            sumi = _mm256_add_epi32(sumi, p);
        }
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        let mut ints = Ints {
            pos: [0; 8],
            mins: [0; 8],
        };
        _mm256_storeu_si256(ints.pos.as_mut_ptr().cast(), sumi);
        _mm256_storeu_si256(
            ints.mins.as_mut_ptr().cast(),
            _mm256_madd_epi16(u.mins, bsums),
        );
        ints
    }
}
