//! Q4_0 in llama.cpp's repacked order against many activation rows (a prefill
//! chunk), computed tile by tile with no horizontal sums.
//!
//! A tile is 8 weight rows by up to 4 activation rows. For each weight tile the
//! kernel first transposes the rows' unpacked quants so that one 32-byte vector
//! holds the same 4 values of all 8 rows (`[row 0: q 4j..4j+4, row 1: ..., row
//! 7: ...]`), once per call, then every activation row quad passes over that
//! scratch: an activation's 4 values are broadcast straight from memory, one
//! `maddubs` per 4 values gives all 8 rows' partial dots at once, eight of them
//! add up in 16 bits (each at most 8 x 2 x 15 x 127 in magnitude, so exact),
//! and one `madd` turns the sum into each row's exact block dot, lane by lane.
//!
//! The floats are those of [`super::avx2`]'s repacked path and of ggml's
//! `q4_0_8x8` gemm: per block `fma(isum - 8 * sum(y), d_w * d_x, acc)`, blocks
//! in order, no final sum; so the outputs are bit-identical to the other
//! kernels'. Only the work per exact integer dot changes: about 2.5 vector
//! operations per weight row, activation row and block here, against about 6
//! when each row pair's lanes are summed horizontally.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{OutPtr, QK};
use crate::quant::blocks::{PackedWeights, QuantizedActs, GROUP};

/// From this many activation rows on, Q4_0's repacked order runs here: below
/// it the transposition costs more than it saves (`cargo bench --bench quant`).
pub(super) const MIN_ROWS: usize = 4;

/// Weight rows per tile: one `__m256i` lane of 32 bits each.
const TILE: usize = 8;

/// Output columns `cols` of `out` for every activation row: Q4_0 weights in
/// [`crate::quant::blocks::BlockOrder::Repack`]'s order, `cols.start` a
/// multiple of [`GROUP`].
///
/// # Safety
/// AVX2, FMA and F16C available; as [`super::gemm_range`] otherwise.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0(
    w: &PackedWeights,
    acts: &QuantizedActs,
    cols: Range<usize>,
    out: OutPtr,
) {
    let nb = acts.blocks;
    // 8 * (sum of the block's quants), per activation row and block: the
    // share of Q4_0's `- 8` offset, exact in i32.
    let offsets: Vec<i32> = acts
        .qs
        .iter()
        .map(|b| 8 * b.0.iter().map(|&q| i32::from(q)).sum::<i32>())
        .collect();
    let mut quants = vec![_mm256_setzero_si256(); nb * TILE];
    let mut scales = vec![_mm256_setzero_ps(); nb];
    let mut c0 = cols.start;
    while c0 < cols.end {
        let width = (cols.end - c0).min(TILE);
        transpose(
            w,
            c0 / GROUP,
            width.div_ceil(GROUP),
            &mut quants,
            &mut scales,
        );
        let mut r0 = 0;
        while r0 < acts.rows {
            match acts.rows - r0 {
                1 => quad::<1>(acts, &offsets, &quants, &scales, r0, c0, width, out),
                2 => quad::<2>(acts, &offsets, &quants, &scales, r0, c0, width, out),
                3 => quad::<3>(acts, &offsets, &quants, &scales, r0, c0, width, out),
                _ => quad::<4>(acts, &offsets, &quants, &scales, r0, c0, width, out),
            }
            r0 += 4;
        }
        c0 += width;
    }
}

/// Unpacks groups `g..g + groups` (one or two: 4 or 8 weight rows) into
/// `quants[b * 8 + j]` = values `4j..4j + 4` of each row, row `k` in lane
/// `k`, and `scales[b]` = the rows' `d` as f32; lanes of a missing second
/// group are zero.
#[inline(always)]
unsafe fn transpose(
    w: &PackedWeights,
    g: usize,
    groups: usize,
    quants: &mut [__m256i],
    scales: &mut [__m256],
) {
    let nb = w.blocks_per_row();
    let (qstep, sstep) = (GROUP * QK / 2, GROUP);
    let mask = _mm256_set1_epi8(0x0F);
    for b in 0..nb {
        let mut rows = [_mm256_setzero_si256(); TILE];
        let mut d = [0u16; TILE];
        for h in 0..groups {
            let gb = (g + h) * nb + b;
            let q = w.quants.as_slice().as_ptr().add(gb * qstep);
            let p0 = _mm256_load_si256(q.cast());
            let p1 = _mm256_load_si256(q.add(QK).cast());
            rows[4 * h] = _mm256_and_si256(p0, mask);
            rows[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(p0), mask);
            rows[4 * h + 2] = _mm256_and_si256(p1, mask);
            rows[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16::<4>(p1), mask);
            d[4 * h..4 * h + 4].copy_from_slice(&w.scales[gb * sstep..gb * sstep + 4]);
        }
        let t: [__m256i; TILE] = std::array::from_fn(|i| {
            let (a, c) = (rows[2 * (i / 2) % TILE], rows[(2 * (i / 2) + 1) % TILE]);
            // t[2p] / t[2p + 1]: rows 2p and 2p + 1 interleaved by 32 bits.
            if i % 2 == 0 {
                _mm256_unpacklo_epi32(a, c)
            } else {
                _mm256_unpackhi_epi32(a, c)
            }
        });
        // u[4h + m]: values `m` (lanes 0..4) and `m + 4` (lanes 4..8) of rows
        // 4h..4h + 4.
        let u: [__m256i; TILE] = std::array::from_fn(|i| {
            let h = i / 4;
            let (lo, hi) = (t[4 * h + (i % 4) / 2], t[4 * h + 2 + (i % 4) / 2]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi64(lo, hi)
            } else {
                _mm256_unpackhi_epi64(lo, hi)
            }
        });
        let dst = &mut quants[b * TILE..(b + 1) * TILE];
        for m in 0..4 {
            dst[m] = _mm256_permute2x128_si256::<0x20>(u[m], u[4 + m]);
            dst[m + 4] = _mm256_permute2x128_si256::<0x31>(u[m], u[4 + m]);
        }
        scales[b] = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast()));
    }
}

/// Activation rows `r0..r0 + R` against the transposed tile at columns
/// `c0..c0 + width`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn quad<const R: usize>(
    acts: &QuantizedActs,
    offsets: &[i32],
    quants: &[__m256i],
    scales: &[__m256],
    r0: usize,
    c0: usize,
    width: usize,
    out: OutPtr,
) {
    let nb = acts.blocks;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let wq = quants.as_ptr().add(b * TILE);
        let dw = *scales.as_ptr().add(b);
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = (r0 + r) * nb + b;
            let y = acts.qs.as_ptr().add(a).cast::<i32>();
            let mut s = _mm256_maddubs_epi16(*wq, _mm256_set1_epi32(*y));
            for j in 1..TILE {
                let p = _mm256_maddubs_epi16(*wq.add(j), _mm256_set1_epi32(*y.add(j)));
                s = _mm256_add_epi16(s, p);
            }
            let isum = _mm256_sub_epi32(
                _mm256_madd_epi16(s, ones),
                _mm256_set1_epi32(*offsets.as_ptr().add(a)),
            );
            let dd = _mm256_mul_ps(dw, _mm256_set1_ps(*acts.d.as_ptr().add(a)));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, *acc);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let row = out.ptr.add((r0 + r) * out.stride + c0);
        if width == TILE {
            _mm256_storeu_ps(row, *acc);
        } else {
            let mut v = [0f32; TILE];
            _mm256_storeu_ps(v.as_mut_ptr(), *acc);
            std::ptr::copy_nonoverlapping(v.as_ptr(), row, width);
        }
    }
}
