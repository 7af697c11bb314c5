//! Q5_K: Q4_K's layout (f16 `d`, `dmin`, eight 6-bit scales and minimums in 12
//! bytes) plus 32 bytes `qh` of fifth bits before the 128 nibble bytes: value `l`
//! of sub-block `s` takes bit `s` of `qh[l]` as its 16s bit.
//!
//! llama.cpp runs `ggml_vec_dot_q5_K_q8_K` for every Q5_K weight on AVX2 (its
//! repack buffer takes Q5_K on ARM only). Its order: eight lanes as Q4_K's
//! (`acc[l] = fma(d_x * d, lane, acc[l])` per super-block), but the minimums as
//! one scalar: per super-block `summs = fma(-d_x * dmin, total_min, summs)` (GCC
//! contracts ggml's `summs += dmin * total`; seen as `vfmadd231ss` in the object
//! code); result `hsum_float_8(acc) + summs`. From 8 activation rows ggml-cpu's
//! tiled matmul runs instead, in Q4_K's tiled order (see [`super::q4k`]).

use super::q4k::scales_mins;
use super::q8k::Q8KBlock;
use super::superblock::SuperBlock;
use super::{f16_at, hsum8, Variant, QK_K};

/// Bytes of one Q5_K super-block.
pub const BLOCK_BYTES: usize = 176;

/// The 5-bit quant of value `j` of block `b`.
#[inline(always)]
pub fn quant(b: &[u8], j: usize) -> u8 {
    let (s, l) = (j / 32, j % 32);
    let byte = b[48 + 32 * (s / 2) + l];
    let low = if s % 2 == 0 { byte & 0xF } else { byte >> 4 };
    low | (((b[16 + l] >> s) & 1) << 4)
}

/// ggml's `dequantize_row_q5_K` for one super-block, as GCC builds it: each value
/// one fused `d1 * q - m1`.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_mins(&b[4..16]);
    for (j, o) in out[..QK_K].iter_mut().enumerate() {
        let s = j / 32;
        let (d1, m1) = (d * sc[s] as f32, dmin * m[s] as f32);
        *o = d1.mul_add(quant(b, j) as f32, -m1);
    }
}

/// The exact integer parts from a super-block's unpacked quants `q` (value order)
/// and scales and minimums: the eight position lanes and the total of the
/// minimum terms.
#[inline(always)]
fn ints_unpacked(q: &[u8; QK_K], sc: &[u8; 8], m: &[u8; 8], a: &Q8KBlock) -> ([i32; 8], i32) {
    let mut lanes = [0i32; 8];
    for j in 0..QK_K {
        lanes[(j % 32) / 4] += sc[j / 32] as i32 * q[j] as i32 * a.qs[j] as i32;
    }
    (lanes, min_total(m, a))
}

/// The exact integer parts of one super-block: the eight position lanes and the
/// total of the minimum terms.
pub fn ints_scalar(w: &[u8], a: &Q8KBlock) -> ([i32; 8], i32) {
    let (sc, m) = scales_mins(&w[4..16]);
    ints_unpacked(&std::array::from_fn(|j| quant(w, j)), &sc, &m, a)
}

#[inline(always)]
fn min_total(m: &[u8; 8], a: &Q8KBlock) -> i32 {
    (0..8)
        .map(|s| m[s] as i32 * (a.bsums[2 * s] as i32 + a.bsums[2 * s + 1] as i32))
        .sum()
}

/// One output's running sums: eight lanes and the minimums (`summs`); the tiled
/// order keeps its one sum in lane 0.
#[derive(Clone, Copy, Default)]
pub(crate) struct Acc {
    acc: [f32; 8],
    summs: f32,
}

/// Adds one super-block's integer parts in ggml's order (see the module doc).
#[inline(always)]
fn step(v: Variant, s: &mut Acc, wb: &[u8], ab: &Q8KBlock, (lanes, s2): ([i32; 8], i32)) {
    if v == Variant::Tiled {
        let s1: i32 = lanes.iter().sum();
        let res = f16_at(wb, 0) * s1 as f32;
        let res = (-f16_at(wb, 2)).mul_add(s2 as f32, res);
        s.acc[0] = res.mul_add(ab.d, s.acc[0]);
    } else {
        let d = ab.d * f16_at(wb, 0);
        let dmin = -ab.d * f16_at(wb, 2);
        s.summs = dmin.mul_add(s2 as f32, s.summs);
        for (acc, &p) in s.acc.iter_mut().zip(&lanes) {
            *acc = d.mul_add(p as f32, *acc);
        }
    }
}

#[inline(always)]
fn finish(v: Variant, s: &Acc) -> f32 {
    if v == Variant::Tiled {
        s.acc[0]
    } else {
        hsum8(&s.acc) + s.summs
    }
}

/// Q5_K as the shared drivers see it ([`SuperBlock`]).
pub(crate) struct Format;

impl SuperBlock for Format {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    type Ints = ([i32; 8], i32);
    type Acc = Acc;
    type Unpacked = ([u8; QK_K], [u8; 8], [u8; 8]);

    #[inline(always)]
    fn unpack(w: &[u8]) -> Self::Unpacked {
        let (sc, m) = scales_mins(&w[4..16]);
        (std::array::from_fn(|j| quant(w, j)), sc, m)
    }

    #[inline(always)]
    fn ints(u: &Self::Unpacked, a: &Q8KBlock) -> ([i32; 8], i32) {
        ints_unpacked(&u.0, &u.1, &u.2, a)
    }

    #[inline(always)]
    fn ints_one(w: &[u8], a: &Q8KBlock) -> ([i32; 8], i32) {
        ints_scalar(w, a)
    }

    #[inline(always)]
    fn step(v: Variant, acc: &mut Acc, wb: &[u8], ab: &Q8KBlock, i: &([i32; 8], i32)) {
        step(v, acc, wb, ab, *i)
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
    unsafe fn ints_avx2(u: &avx2::Unpacked, a: &Q8KBlock) -> ([i32; 8], i32) {
        avx2::ints_unpacked(u, a)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ints_one_avx2(w: &[u8], a: &Q8KBlock) -> ([i32; 8], i32) {
        avx2::ints(w, a)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{min_total, scales_mins, Q8KBlock};

    /// The integer parts with AVX2: 5-bit quants rebuilt from nibbles and `qh`
    /// bits, `maddubs` with the activation quants, `madd` with the scales.
    #[inline(always)]
    pub(super) unsafe fn ints(w: &[u8], a: &Q8KBlock) -> ([i32; 8], i32) {
        let (sc, m) = scales_mins(&w[4..16]);
        let hbits = _mm256_loadu_si256(w.as_ptr().add(16).cast());
        let qs = w.as_ptr().add(48);
        let y = a.qs.as_ptr();
        let m4 = _mm256_set1_epi8(0xF);
        let one = _mm256_set1_epi8(1);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = _mm256_loadu_si256(qs.add(32 * j).cast());
            let hi_bit = |s: usize| {
                // Bit `s` of each qh byte, moved to 16.
                let shifted = match s {
                    0 => hbits,
                    1 => _mm256_srli_epi16::<1>(hbits),
                    2 => _mm256_srli_epi16::<2>(hbits),
                    3 => _mm256_srli_epi16::<3>(hbits),
                    4 => _mm256_srli_epi16::<4>(hbits),
                    5 => _mm256_srli_epi16::<5>(hbits),
                    6 => _mm256_srli_epi16::<6>(hbits),
                    _ => _mm256_srli_epi16::<7>(hbits),
                };
                _mm256_slli_epi16::<4>(_mm256_and_si256(shifted, one))
            };
            let q0 = _mm256_or_si256(_mm256_and_si256(bits, m4), hi_bit(2 * j));
            let q1 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                hi_bit(2 * j + 1),
            );
            let y0 = _mm256_loadu_si256(y.add(64 * j).cast());
            let y1 = _mm256_loadu_si256(y.add(64 * j + 32).cast());
            let p0 = _mm256_madd_epi16(
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_maddubs_epi16(q0, y0),
            );
            let p1 = _mm256_madd_epi16(
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
                _mm256_maddubs_epi16(q1, y1),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sumi);
        (lanes, min_total(&m, a))
    }

    /// A super-block's 5-bit quants (eight vectors of 32), broadcast scales and
    /// minimums, once for many activation rows.
    pub(crate) struct Unpacked {
        q: [__m256i; 8],
        sc: [__m256i; 8],
        m: [u8; 8],
    }

    #[inline(always)]
    pub(super) unsafe fn unpack(w: &[u8]) -> Unpacked {
        let (sc, m) = scales_mins(&w[4..16]);
        let mut hbits = _mm256_loadu_si256(w.as_ptr().add(16).cast());
        let qs = w.as_ptr().add(48);
        let m4 = _mm256_set1_epi8(0xF);
        let one = _mm256_set1_epi8(1);
        let mut q = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(qs.add(32 * j).cast());
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(hbits, one));
            hbits = _mm256_srli_epi16::<1>(hbits);
            let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(hbits, one));
            hbits = _mm256_srli_epi16::<1>(hbits);
            q[2 * j] = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
            q[2 * j + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4), h1);
        }
        Unpacked {
            q,
            sc: std::array::from_fn(|s| _mm256_set1_epi16(sc[s] as i16)),
            m,
        }
    }

    /// The integer parts from an unpacked block (the same exact integers).
    #[inline(always)]
    pub(super) unsafe fn ints_unpacked(u: &Unpacked, a: &Q8KBlock) -> ([i32; 8], i32) {
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for s in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * s).cast());
            let p = _mm256_madd_epi16(u.sc[s], _mm256_maddubs_epi16(u.q[s], yv));
            sumi = _mm256_add_epi32(sumi, p);
        }
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sumi);
        (lanes, min_total(&u.m, a))
    }
}
