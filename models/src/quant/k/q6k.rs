//! Q6_K: per 256 values 128 bytes of low 4 bits `ql`, 64 bytes of high 2 bits
//! `qh`, sixteen signed 8-bit scales (one per 16 values) and an f16 `d`; value
//! `j` is `d * sc[j / 16] * (q - 32)`. In each half of 128 values, `ql[l]` holds
//! values `l` (low nibble) and `l + 64` (high), `ql[l + 32]` values `l + 32` and
//! `l + 96`, and `qh[l]` the high bits of `l`, `l + 32`, `l + 64`, `l + 96`.
//!
//! llama.cpp runs `ggml_vec_dot_q6_K_q8_K` for every Q6_K weight on AVX2 (its
//! repack buffer takes Q6_K on ARM only). Its order: eight lanes, lane `l` the
//! scaled integer dot of the unsigned quants at values `4l .. 4l + 4` of every
//! run of 32, minus `32 * (bsum[2l] sc[2l] + bsum[2l+1] sc[2l+1])` for the offset;
//! per super-block `acc[l] = fma(d_x * d, lane, acc[l])`; result
//! `hsum_float_8(acc)`. From 8 activation rows ggml-cpu's tiled matmul runs
//! instead: per super-block `acc = fma(d * total, d_x, acc)`.

use super::q8k::Q8KBlock;
use super::superblock::{lanes_finish, lanes_step, SuperBlock};
use super::{f16_at, Variant, QK_K};

/// Bytes of one Q6_K super-block.
pub const BLOCK_BYTES: usize = 210;

/// The unsigned 6-bit quant (`q`, before the `- 32`) of value `j` of block `b`.
#[inline(always)]
pub fn quant(b: &[u8], j: usize) -> u8 {
    let (h, e) = (j / 128, j % 128);
    let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
    let (l, t) = (e % 32, e / 32);
    let low = match t {
        0 => ql[l] & 0xF,
        1 => ql[l + 32] & 0xF,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | (((qh[l] >> (2 * t)) & 3) << 4)
}

/// The sixteen scales.
#[inline(always)]
fn scales(b: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| b[192 + i] as i8)
}

/// ggml's `dequantize_row_q6_K` for one super-block: `(d * sc) * (q - 32)`.
pub fn dequantize_block(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    let sc = scales(b);
    for (j, o) in out[..QK_K].iter_mut().enumerate() {
        *o = d * sc[j / 16] as f32 * (quant(b, j) as i32 - 32) as f32;
    }
}

/// The eight exact integer lanes from a super-block's unpacked quants `q` and
/// scales `sc`, scalar.
#[inline(always)]
fn lanes_unpacked(q: &[u8; QK_K], sc: &[i8; 16], a: &Q8KBlock) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for j in 0..QK_K {
        lanes[(j % 32) / 4] += sc[j / 16] as i32 * q[j] as i32 * a.qs[j] as i32;
    }
    for (l, lane) in lanes.iter_mut().enumerate() {
        let s = a.bsums[2 * l] as i32 * sc[2 * l] as i32
            + a.bsums[2 * l + 1] as i32 * sc[2 * l + 1] as i32;
        *lane -= 32 * s;
    }
    lanes
}

/// A super-block's 6-bit quants, unpacked.
#[inline(always)]
fn unpack_scalar(w: &[u8]) -> [u8; QK_K] {
    std::array::from_fn(|j| quant(w, j))
}

/// The eight exact integer lanes of one super-block, scalar.
pub fn lanes_scalar(w: &[u8], a: &Q8KBlock) -> [i32; 8] {
    lanes_unpacked(&unpack_scalar(w), &scales(w), a)
}

/// Q6_K as the shared drivers see it ([`SuperBlock`]).
pub(crate) struct Format;

impl SuperBlock for Format {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    type Ints = [i32; 8];
    type Acc = [f32; 8];
    type Unpacked = ([u8; QK_K], [i8; 16]);

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
        lanes_step(v, acc, f16_at(wb, 208), ab, i)
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

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ints_one_avx2(w: &[u8], a: &Q8KBlock) -> [i32; 8] {
        avx2::lanes(w, a)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::Q8KBlock;

    /// The lanes with AVX2, as ggml computes them: 6-bit quants rebuilt from their
    /// nibble and 2-bit parts, `maddubs` with the activation quants, `madd` with
    /// the scales, and the offset subtracted through `bsums`.
    #[inline(always)]
    pub(super) unsafe fn lanes(w: &[u8], a: &Q8KBlock) -> [i32; 8] {
        let (ql, qh, sc) = (w.as_ptr(), w.as_ptr().add(128), w.as_ptr().add(192));
        let y = a.qs.as_ptr();
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let b1 = _mm256_loadu_si256(ql.add(64 * h).cast());
            let b2 = _mm256_loadu_si256(ql.add(64 * h + 32).cast());
            let bh = _mm256_loadu_si256(qh.add(32 * h).cast());
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(b1, m15),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(bh, m3)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(b2, m15),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(12))),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15),
                    _mm256_and_si256(bh, _mm256_set1_epi8(48)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15),
                    _mm256_srli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(-64))),
                ),
            ];
            for (t, &q) in q.iter().enumerate() {
                let c = 4 * h + t;
                let yv = _mm256_loadu_si256(y.add(32 * c).cast());
                let p = _mm256_maddubs_epi16(q, yv);
                let s = _mm256_set_m128i(
                    _mm_set1_epi16(*sc.add(2 * c + 1) as i8 as i16),
                    _mm_set1_epi16(*sc.add(2 * c) as i8 as i16),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
        }
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.cast()));
        let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_sub_epi32(sumi, sub));
        out
    }

    /// A super-block's 6-bit quants as eight vectors of 32 (values `32 c ..
    /// 32 c + 32` in vector `c`), from its low nibbles `ql` and high bits
    /// `qh`; shared with the fast kernels (`super::super::fast`).
    #[inline(always)]
    pub(crate) unsafe fn quants(ql: *const u8, qh: *const u8) -> [__m256i; 8] {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let b1 = _mm256_loadu_si256(ql.add(64 * h).cast());
            let b2 = _mm256_loadu_si256(ql.add(64 * h + 32).cast());
            let bh = _mm256_loadu_si256(qh.add(32 * h).cast());
            q[4 * h] = _mm256_or_si256(
                _mm256_and_si256(b1, m15),
                _mm256_slli_epi16::<4>(_mm256_and_si256(bh, m3)),
            );
            q[4 * h + 1] = _mm256_or_si256(
                _mm256_and_si256(b2, m15),
                _mm256_slli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(12))),
            );
            q[4 * h + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15),
                _mm256_and_si256(bh, _mm256_set1_epi8(48)),
            );
            q[4 * h + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15),
                _mm256_srli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(-64))),
            );
        }
        q
    }

    /// A super-block's 6-bit quants (eight vectors of 32) and scales (per vector,
    /// the pair for its two halves; all sixteen widened for the offset), once for
    /// many activation rows.
    pub(crate) struct Unpacked {
        q: [__m256i; 8],
        sc: [__m256i; 8],
        sc16: __m256i,
    }

    #[inline(always)]
    pub(super) unsafe fn unpack(w: &[u8]) -> Unpacked {
        let (ql, qh, sc) = (w.as_ptr(), w.as_ptr().add(128), w.as_ptr().add(192));
        let mut u = Unpacked {
            q: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
            sc16: _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.cast())),
        };
        u.q = quants(ql, qh);
        for c in 0..8 {
            u.sc[c] = _mm256_set_m128i(
                _mm_set1_epi16(*sc.add(2 * c + 1) as i8 as i16),
                _mm_set1_epi16(*sc.add(2 * c) as i8 as i16),
            );
        }
        u
    }

    /// The lanes from an unpacked block (the same exact integers).
    #[inline(always)]
    pub(super) unsafe fn lanes_unpacked(u: &Unpacked, a: &Q8KBlock) -> [i32; 8] {
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for c in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * c).cast());
            let p = _mm256_maddubs_epi16(u.q[c], yv);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(u.sc[c], p));
        }
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, u.sc16));
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_sub_epi32(sumi, sub));
        out
    }
}
