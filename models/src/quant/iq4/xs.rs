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
use crate::quant::k::superblock::{lanes_finish, lanes_step, SuperBlock};
use crate::quant::k::{f16_at, Variant, QK_K};

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

/// IQ4_XS as the shared drivers see it ([`SuperBlock`]).
pub(crate) struct Format;

impl SuperBlock for Format {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    type Ints = [i32; 8];
    type Acc = [f32; 8];
    type Unpacked = ([i8; QK_K], [i32; 8]);

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
        lanes_step(v, acc, f16_at(wb, 0), ab, i)
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
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use super::{scales, Q8KBlock, KVALUES};

    /// A super-block's values (per sub-block `(|q|, q)` for ggml's sign trick)
    /// and scales broadcast, once for many activation rows.
    pub(crate) struct Unpacked {
        q: [(__m256i, __m256i); 8],
        sc: [__m256i; 8],
    }

    /// Looks the indices up as ggml does: `pshufb` of the table by each nibble,
    /// low nibbles in the lower 128 bits, high ones in the upper.
    #[inline(always)]
    pub(crate) unsafe fn unpack(w: &[u8]) -> Unpacked {
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
    /// `madd` with the sub-block's scale, summed over the sub-blocks; kept
    /// in a register for the drivers that accumulate in vectors.
    #[inline(always)]
    pub(crate) unsafe fn lanes_vec(u: &Unpacked, a: &Q8KBlock) -> __m256i {
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for s in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * s).cast());
            let p = _mm256_maddubs_epi16(u.q[s].0, _mm256_sign_epi8(yv, u.q[s].1));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(u.sc[s], p));
        }
        sumi
    }

    /// [`lanes_vec`] as an array.
    #[inline(always)]
    pub(super) unsafe fn lanes_unpacked(u: &Unpacked, a: &Q8KBlock) -> [i32; 8] {
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), lanes_vec(u, a));
        out
    }
}
