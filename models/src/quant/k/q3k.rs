//! Q3_K: per 256 values 32 bytes `hmask` of high bits, 64 bytes of low 2-bit
//! parts, sixteen 6-bit scales packed in 12 bytes (one per 16 values, stored
//! plus 32) and an f16 `d`; value `j` is `d * (sc[j / 16] - 32) * q` with
//! `q = low - 4` where its high bit is clear and `q = low` where it is set. In
//! each half of 128 values, byte `l` of the half's 32 low bytes holds values
//! `l`, `l + 32`, `l + 64`, `l + 96` at bit offsets 0, 2, 4, 6; the high bit of
//! the value at run `r` (of 32, 0..8) and position `l` is bit `r` of `hmask[l]`.
//!
//! llama.cpp runs `ggml_vec_dot_q3_K_q8_K` for every Q3_K weight below 8
//! activation rows on AVX2 (no repack buffer takes Q3_K there). Its order: eight
//! lanes, lane `l` the scaled integer dot of values `4l .. 4l + 4` of every run
//! of 32; per super-block `acc[l] = fma(d_x * d, lane, acc[l])`; result
//! `hsum_float_8(acc)`. From 8 rows ggml-cpu's tiled matmul runs (`SUBBLK` 16,
//! no minimums, codes biased by 4 with the bias taken out in integers): per
//! super-block `acc = fma(d * total, d_x, acc)`.

use super::q8k::Q8KBlock;
use super::superblock::{lanes_finish, lanes_step, SuperBlock};
use super::{f16_at, Variant, QK_K};

/// Bytes of one Q3_K super-block.
pub const BLOCK_BYTES: usize = 110;

/// Offset of the low 2-bit parts (`hmask` is at 0).
const QS: usize = 32;
/// Offset of the packed scales.
const SCALES: usize = 96;
/// Offset of `d`.
const D: usize = 108;

/// The signed 3-bit quant (-4..=3) of value `j` of block `b`.
#[inline(always)]
pub fn quant(b: &[u8], j: usize) -> i8 {
    let (h, e) = (j / 128, j % 128);
    let (r, l) = (j / 32, e % 32);
    let low = ((b[QS + 32 * h + l] >> (2 * (e / 32))) & 3) as i8;
    let high = (b[l] >> r) & 1;
    if high == 0 {
        low - 4
    } else {
        low
    }
}

/// The sixteen scales, 32 already taken off (ggml's `kmask` unpacking: the low
/// four bits from the first eight bytes, the top two from the last four).
#[inline(always)]
pub fn scales(b: &[u8]) -> [i8; 16] {
    let s = &b[SCALES..SCALES + 12];
    std::array::from_fn(|i| {
        let (low, high) = match i / 4 {
            0 => (s[i] & 0xF, s[8 + i] & 3),
            1 => (s[i] & 0xF, (s[4 + i] >> 2) & 3),
            2 => (s[i - 8] >> 4, (s[i] >> 4) & 3),
            _ => (s[i - 8] >> 4, (s[i - 4] >> 6) & 3),
        };
        (low | (high << 4)) as i8 - 32
    })
}

/// ggml's `dequantize_row_q3_K` for one super-block: `(d * sc) * q`.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, D);
    let sc = scales(b);
    for (j, o) in out[..QK_K].iter_mut().enumerate() {
        *o = d * sc[j / 16] as f32 * quant(b, j) as f32;
    }
}

/// The eight exact integer lanes from a super-block's signed quants `q` (value
/// order) and scales `sc`, scalar.
#[inline(always)]
fn lanes_unpacked(q: &[i8; QK_K], sc: &[i8; 16], a: &Q8KBlock) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for j in 0..QK_K {
        lanes[(j % 32) / 4] += sc[j / 16] as i32 * q[j] as i32 * a.qs[j] as i32;
    }
    lanes
}

#[inline(always)]
fn unpack_scalar(w: &[u8]) -> [i8; QK_K] {
    std::array::from_fn(|j| quant(w, j))
}

/// The eight exact integer lanes of one super-block, scalar.
pub fn lanes_scalar(w: &[u8], a: &Q8KBlock) -> [i32; 8] {
    lanes_unpacked(&unpack_scalar(w), &scales(w), a)
}

/// Q3_K as the shared drivers see it ([`SuperBlock`]).
pub(crate) struct Format;

impl SuperBlock for Format {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    type Ints = [i32; 8];
    type Acc = [f32; 8];
    type Unpacked = ([i8; QK_K], [i8; 16]);

    #[inline(always)]
    fn unpack(w: &[u8]) -> Self::Unpacked {
        (unpack_scalar(w), scales(w))
    }

    #[inline(always)]
    fn ints(u: &Self::Unpacked, a: &Q8KBlock) -> [i32; 8] {
        lanes_unpacked(&u.0, &u.1, a)
    }

    #[inline(always)]
    fn ints_one(w: &[u8], a: &Q8KBlock) -> [i32; 8] {
        lanes_scalar(w, a)
    }

    #[inline(always)]
    fn step(v: Variant, acc: &mut [f32; 8], wb: &[u8], ab: &Q8KBlock, i: &[i32; 8]) {
        lanes_step(v, acc, f16_at(wb, D), ab, i)
    }

    #[inline(always)]
    fn finish(v: Variant, acc: &[f32; 8]) -> f32 {
        lanes_finish(v, acc)
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
    unsafe fn ints_avx2(u: &avx2::Unpacked, a: &Q8KBlock) -> [i32; 8] {
        avx2::lanes_unpacked(u, a)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{scales, Q8KBlock, QS};

    /// A super-block unpacked for AVX2 as ggml splits it: per vector of 32 values
    /// (value order) the unsigned low parts and, apart, 4 where the high bit is
    /// clear (so `q = low - that`, both `maddubs`-able), and the scales of its two
    /// 16-value halves.
    pub(crate) struct Unpacked {
        low: [__m256i; 8],
        off: [__m256i; 8],
        sc: [__m256i; 8],
    }

    #[inline(always)]
    pub(super) unsafe fn unpack(w: &[u8]) -> Unpacked {
        let p = w.as_ptr();
        let m3 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        let mut hbits = _mm256_loadu_si256(p.cast());
        let mut u = Unpacked {
            low: [_mm256_setzero_si256(); 8],
            off: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
        };
        for h in 0..2 {
            let bits = _mm256_loadu_si256(p.add(QS + 32 * h).cast());
            u.low[4 * h] = _mm256_and_si256(bits, m3);
            u.low[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<2>(bits), m3);
            u.low[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m3);
            u.low[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16::<6>(bits), m3);
        }
        for off in u.off.iter_mut() {
            // The lowest remaining high bit, inverted, times 4.
            *off = _mm256_slli_epi16::<2>(_mm256_andnot_si256(hbits, one));
            hbits = _mm256_srli_epi16::<1>(hbits);
        }
        let sc = scales(w);
        for (c, s) in u.sc.iter_mut().enumerate() {
            *s = _mm256_set_m128i(
                _mm_set1_epi16(sc[2 * c + 1] as i16),
                _mm_set1_epi16(sc[2 * c] as i16),
            );
        }
        u
    }

    /// The lanes from an unpacked block: `maddubs(low, y) - maddubs(off, y)`
    /// (exact in i16), `madd` with the scales, as ggml computes them.
    #[inline(always)]
    pub(super) unsafe fn lanes_unpacked(u: &Unpacked, a: &Q8KBlock) -> [i32; 8] {
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * c).cast());
            let p = _mm256_sub_epi16(
                _mm256_maddubs_epi16(u.low[c], yv),
                _mm256_maddubs_epi16(u.off[c], yv),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(u.sc[c], p));
        }
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), sumi);
        out
    }
}
