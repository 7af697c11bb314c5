//! Register-blocked AVX2 drivers for the K-quant products real models spend
//! their time in: Q4_K in llama.cpp's repacked order (`gemv` for a lone
//! activation row, `gemm` for rows in groups of four), and Q5_K, Q6_K and IQ4_XS in
//! `vec_dot` order (fewer than [`TILED_MIN_ROWS`] rows) or the tiled order
//! (from there). [`KWeights::matmul`] sends these weights here on an AVX2
//! machine; every other case runs the generic drivers.
//!
//! The generic drivers ([`super::superblock`]) compute one (weight row,
//! activation row) pair at a time through the format's `Ints` and `step`,
//! which costs stores and reloads of every integer part, scalar scale
//! unpacking and per-output dispatch. Here the integer parts stay in
//! registers and several outputs are reduced and accumulated at once:
//! - Q4_K `gemv` (decode): eight weight rows against one activation row; the
//!   eight per-row integer totals are reduced into one vector, and the eight
//!   outputs' `acc`/`accm` chains run as the lanes of one FMA each. The same
//!   super-block of the next eight rows is prefetched: eight short row
//!   streams are more than the hardware prefetcher follows.
//! - Q4_K `gemm` (prefill): one weight row against eight activation rows
//!   interleaved once per product ([`Groups8`]), four bytes of each row to a
//!   32-bit lane, so a broadcast 4-value weight chunk meets all eight in one
//!   `maddubs` and a sub-block's eight `maddubs` add up in 16 bits before one
//!   `madd` by its scale: no horizontal sums. A last group of four rows runs
//!   one weight row against four plain rows.
//! - Q5_K and Q6_K tiled: one weight row (unpacked once) against four
//!   activation rows; the four outputs' chains are the lanes of one 128-bit FMA.
//! - Q5_K, Q6_K and IQ4_XS `vec_dot`: one output, its eight position lanes
//!   kept in a register, two rows ahead prefetched (IQ4_XS tiled as Q6_K).
//!
//! Every integer part is exact (as in the format modules), and every float
//! operation is the one ggml performs for that output, in its order (see
//! [`super::q4k`], [`super::q5k`] and [`super::q6k`]): lanes of one SIMD FMA
//! are independent roundings, so vectorizing across outputs changes no bit.
//! The unit tests check these against the one-output kernels and the scalar
//! path; `models/tests/kquant.rs` and the root package's `tests/qwen.rs`
//! against llama.cpp itself.

use std::arch::x86_64::*;

use super::q8k::{Q8KActs, Q8KBlock};
use super::{hsum8, q4k, q5k, q6k, KFormat, KWeights, Order, QK_K, TILED_MIN_ROWS};
use crate::quant::iq4::xs;

/// Weight rows a task walks together against each group of activation rows
/// (they stay in L1/L2 while the activation groups stream past).
const COL_BLOCK: usize = 16;

/// Where a product's outputs go: output (activation row `r`, weight row
/// `c`) at `ptr + r * ld + (c - c0)`. The whole product's buffer (`ld` its
/// width, `c0` 0), or a task's tile of some columns (a fused product keeps
/// its two halves' tiles in cache instead of writing them out whole).
#[derive(Clone, Copy)]
pub(super) struct OutTile {
    /// Output `(0, c0)`.
    pub(super) ptr: *mut f32,
    /// Outputs a row.
    pub(super) ld: usize,
    /// The first column the tile holds.
    pub(super) c0: usize,
}

impl OutTile {
    /// Output `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` lies inside the tile.
    #[inline(always)]
    unsafe fn at(self, r: usize, c: usize) -> *mut f32 {
        self.ptr.add(r * self.ld + (c - self.c0))
    }
}

/// Whether [`run`] takes this weight's products (any number of activation
/// rows) on an AVX2 machine.
pub(super) fn supports(w: &KWeights) -> bool {
    match (w.format, w.order) {
        (KFormat::Q4K, Order::Repack) => w.rows.is_multiple_of(8),
        (KFormat::Q5K | KFormat::Q6K | KFormat::Iq4Xs, Order::VecDot) => true,
        _ => false,
    }
}

/// The outputs of weight rows `cols` (a range starting at a multiple of 8)
/// for every activation row, written through `out`.
///
/// # Safety
/// AVX2, FMA and F16C available; [`supports`] holds; `out` holds columns
/// `cols` of every activation row, which this call alone writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run(
    w: &KWeights,
    acts: &Q8KActs,
    groups: &Prepared,
    cols: std::ops::Range<usize>,
    out: OutTile,
) {
    let rows = acts.rows;
    let nb = w.blocks_per_row();
    let stride = nb * w.format.block_bytes();
    let base = w.data.as_slice().as_ptr();
    let act = |r: usize| acts.data.as_ptr().add(r * nb);
    match w.format {
        KFormat::Q4K => {
            let grouped = acts.grouped;
            let (g16, g8) = (&groups.g16, &groups.g8);
            for c0 in cols.clone().step_by(COL_BLOCK) {
                let c1 = cols.end.min(c0 + COL_BLOCK);
                if g16.groups > 0 {
                    wide_16_groups(KFormat::Q4K, base, stride, nb, g16, c0..c1, out);
                }
                for g in 0..g8.groups {
                    let ga = g8.group(g);
                    for c in c0..c1 {
                        let o = q4k_gemm_1x8(base.add(c * stride), ga, nb);
                        for (i, v) in o.into_iter().enumerate() {
                            *out.at(g8.start + 8 * g + i, c) = v;
                        }
                    }
                }
                for r0 in (g8.end().max(g16.end())..grouped).step_by(4) {
                    let a = [act(r0), act(r0 + 1), act(r0 + 2), act(r0 + 3)];
                    for c in c0..c1 {
                        let o = q4k_gemm_1x4(base.add(c * stride), a, nb);
                        for (i, v) in o.into_iter().enumerate() {
                            *out.at(r0 + i, c) = v;
                        }
                    }
                }
                // Rows past the groups (a lone decode row, or a verified
                // draft's rows in the one-row order): up to four at a time,
                // each with the one-row kernel's bits.
                let mut r = grouped;
                while r < rows {
                    let take = (rows - r).min(4);
                    for c in (c0..c1).step_by(8) {
                        let wc = base.add(c * stride);
                        let at = |i: usize| out.at(r + i, c);
                        match take {
                            4 => q4k_gemv_8xr::<4>(
                                wc,
                                stride,
                                [act(r), act(r + 1), act(r + 2), act(r + 3)],
                                nb,
                                [at(0), at(1), at(2), at(3)],
                            ),
                            3 => q4k_gemv_8xr::<3>(
                                wc,
                                stride,
                                [act(r), act(r + 1), act(r + 2)],
                                nb,
                                [at(0), at(1), at(2)],
                            ),
                            2 => q4k_gemv_8xr::<2>(
                                wc,
                                stride,
                                [act(r), act(r + 1)],
                                nb,
                                [at(0), at(1)],
                            ),
                            _ => q4k_gemv_8x1(wc, stride, act(r), nb, at(0)),
                        }
                    }
                    r += take;
                }
            }
        }
        KFormat::Q6K => {
            let g16 = &groups.g16;
            for c0 in cols.clone().step_by(COL_BLOCK) {
                if g16.groups > 0 {
                    wide_16_groups(
                        KFormat::Q6K,
                        base,
                        stride,
                        nb,
                        g16,
                        c0..cols.end.min(c0 + COL_BLOCK),
                        out,
                    );
                }
            }
            by_rows(
                acts,
                g16.end(),
                cols,
                |r, c| out.at(r, c),
                |c, r| q6k_vec_dot(base.add(c * stride), act(r), nb),
                |c, a| q6k_vec_dot_4(base.add(c * stride), a.map(act), nb),
                |c, a| q6k_tiled_1x4(base.add(c * stride), a.map(act), nb),
            )
        }
        KFormat::Iq4Xs => {
            // Groups of sixteen with AVX-512 VNNI, the rest as Q6_K's.
            let g16 = &groups.g16;
            for c0 in cols.clone().step_by(COL_BLOCK) {
                if g16.groups > 0 {
                    let c1 = cols.end.min(c0 + COL_BLOCK);
                    wide_16_groups(KFormat::Iq4Xs, base, stride, nb, g16, c0..c1, out);
                }
            }
            by_rows(
                acts,
                g16.end(),
                cols,
                |r, c| out.at(r, c),
                |c, r| iq4xs_vec_dot(base.add(c * stride), act(r), nb),
                |c, a| iq4xs_vec_dot_4(base.add(c * stride), a.map(act), nb),
                |c, a| iq4xs_tiled_1x4(base.add(c * stride), a.map(act), nb),
            )
        }
        KFormat::Q5K => by_rows(
            acts,
            0,
            cols,
            |r, c| out.at(r, c),
            |c, r| q5k_vec_dot(base.add(c * stride), act(r), nb),
            |c, a| a.map(|r| q5k_vec_dot(base.add(c * stride), act(r), nb)),
            |c, a| q5k_tiled_1x4(base.add(c * stride), a.map(act), nb),
        ),
        _ => unreachable!("fast::run on an unsupported weight"),
    }
}

/// The Q5_K, Q6_K and IQ4_XS products over columns `cols` and activation
/// rows `first..acts.rows`: `dot(c, r)` per output below [`TILED_MIN_ROWS`]
/// activation rows in all (ggml's `vec_dot` order) or for a product in the
/// one-row order ([`Q8KActs::alone`]), else `tiled(c, rows)` on groups of
/// four rows (its tiled matmul's order); a short last group repeats its last
/// row and the copies' outputs are dropped. `at(r, c)` is where output `(r,
/// c)` goes. Each block of [`COL_BLOCK`] weight rows meets every activation
/// row before the next is read.
#[inline(always)]
unsafe fn by_rows(
    acts: &Q8KActs,
    first: usize,
    cols: std::ops::Range<usize>,
    at: impl Fn(usize, usize) -> *mut f32,
    dot: impl Fn(usize, usize) -> f32,
    dot4: impl Fn(usize, [usize; 4]) -> [f32; 4],
    tiled: impl Fn(usize, [usize; 4]) -> [f32; 4],
) {
    let rows = acts.rows;
    if rows < TILED_MIN_ROWS || acts.alone {
        // `dot4`: four rows' `dot`s, bit for bit, the block unpacked once.
        for c0 in cols.clone().step_by(COL_BLOCK) {
            let c1 = cols.end.min(c0 + COL_BLOCK);
            let mut r = first;
            while r + 4 <= rows {
                for c in c0..c1 {
                    for (i, v) in dot4(c, [r, r + 1, r + 2, r + 3]).into_iter().enumerate() {
                        *at(r + i, c) = v;
                    }
                }
                r += 4;
            }
            for r in r..rows {
                for c in c0..c1 {
                    *at(r, c) = dot(c, r);
                }
            }
        }
        return;
    }
    for c0 in cols.clone().step_by(COL_BLOCK) {
        let c1 = cols.end.min(c0 + COL_BLOCK);
        for r0 in (first..rows).step_by(4) {
            let a = std::array::from_fn(|i| (r0 + i).min(rows - 1));
            let live = (rows - r0).min(4);
            for c in c0..c1 {
                for (i, &v) in tiled(c, a).iter().enumerate().take(live) {
                    *at(r0 + i, c) = v;
                }
            }
        }
    }
}

/// One super-block of `N` activation rows interleaved for the grouped Q4_K
/// kernels: vector `8 j + t` holds values `32 j + 4 t .. + 4` of each row
/// (row `a` in 32-bit lane `a`), so one broadcast 4-value weight chunk meets
/// all `N` rows in one `maddubs` (eight rows, AVX2) or `dpbusd` (sixteen,
/// AVX-512 VNNI).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct BlockN<const N: usize> {
    q: [[[i8; 4]; N]; 64],
    /// Per pair of sub-blocks `k`, lane `a`: row `a`'s sums of sub-blocks
    /// `2k` and `2k + 1` (16-bit each).
    sums: [[[i16; 2]; N]; 4],
    /// Per pair of runs of 16 `jj`, lane `a`: row `a`'s `bsums[2jj]` and
    /// `bsums[2jj + 1]` (the Q6_K offsets).
    sums16: [[[i16; 2]; N]; 8],
    /// Each row's scale.
    d: [f32; N],
}

/// Activation rows `start .. start + N * groups` of a repacked Q4_K product
/// in groups of `N` ([`BlockN`]s, group by group, block by block).
pub(super) struct Groups<const N: usize> {
    start: usize,
    groups: usize,
    blocks: usize,
    data: Vec<BlockN<N>>,
}

impl<const N: usize> Groups<N> {
    /// No groups (a product that takes none).
    pub(super) const NONE: Self = Self {
        start: 0,
        groups: 0,
        blocks: 0,
        data: Vec::new(),
    };

    /// `groups` groups of `acts`' rows from `start` on, interleaved.
    fn prepare(acts: &Q8KActs, start: usize, groups: usize) -> Self {
        let blocks = acts.blocks;
        let zero = BlockN {
            q: [[[0; 4]; N]; 64],
            sums: [[[0; 2]; N]; 4],
            sums16: [[[0; 2]; N]; 8],
            d: [0.0; N],
        };
        let mut data = vec![zero; groups * blocks];
        for (i, blk) in data.iter_mut().enumerate() {
            let (g, b) = (i / blocks, i % blocks);
            for a in 0..N {
                let src = &acts.row(start + N * g + a)[b];
                for (v, chunk) in src.qs.chunks_exact(4).enumerate() {
                    blk.q[v][a].copy_from_slice(chunk);
                }
                for j in 0..8 {
                    blk.sums[j / 2][a][j % 2] = src.bsums[2 * j] + src.bsums[2 * j + 1];
                    blk.sums16[j][a] = [src.bsums[2 * j], src.bsums[2 * j + 1]];
                }
                blk.d[a] = src.d;
            }
        }
        Self {
            start,
            groups,
            blocks,
            data,
        }
    }

    fn group(&self, g: usize) -> *const BlockN<N> {
        self.data[g * self.blocks..].as_ptr()
    }

    /// The first row after these groups.
    fn end(&self) -> usize {
        self.start + N * self.groups
    }
}

/// The interleaved activation groups of one product: sixteen rows at a time
/// where the CPU has AVX-512 VNNI (and the caller allows it), then at most
/// one group of eight.
pub(super) struct Prepared {
    g16: Groups<16>,
    g8: Groups<8>,
}

impl Prepared {
    /// The groups for `w`'s product over `acts`; `wide` allows the groups of
    /// sixteen (the caller checked [`crate::quant::dot::avx512_vnni`]).
    pub(super) fn new(w: &KWeights, acts: &Q8KActs, wide: bool) -> Self {
        if matches!(w.format, KFormat::Q6K | KFormat::Iq4Xs)
            && wide
            && acts.rows >= TILED_MIN_ROWS
            && !acts.alone
        {
            return Self {
                g16: Groups::prepare(acts, 0, acts.rows / 16),
                g8: Groups::NONE,
            };
        }
        if w.format != KFormat::Q4K || w.order != Order::Repack {
            return Self {
                g16: Groups::NONE,
                g8: Groups::NONE,
            };
        }
        let n16 = if wide { acts.grouped / 16 } else { 0 };
        let g16 = Groups::prepare(acts, 0, n16);
        let n8 = (acts.grouped - g16.end()) / 8;
        let g8 = Groups::prepare(acts, g16.end(), n8);
        Self { g16, g8 }
    }
}

/// The 32-bit lane of each half of `v` that `IMM` picks, in every lane of
/// that half.
#[inline(always)]
unsafe fn chunk<const IMM: i32>(v: __m256i) -> __m256i {
    _mm256_shuffle_epi32::<IMM>(v)
}

/// Sub-block `j`'s scaled integer dot with eight activation rows: its 32
/// quants `v` (bytes 0..32) against the interleaved rows; lane `a` for row `a`.
#[inline(always)]
unsafe fn q4k_sub_x8(v: __m256i, a: *const [[i8; 4]; 8], sc: __m256i) -> __m256i {
    let lo = _mm256_permute2x128_si256::<0x00>(v, v);
    let hi = _mm256_permute2x128_si256::<0x11>(v, v);
    let ld = |t: usize| _mm256_load_si256(a.add(t).cast());
    // Each 16-bit lane sums 16 products of at most 15 * 128: no overflow.
    let mut s = _mm256_maddubs_epi16(chunk::<0x00>(lo), ld(0));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0x55>(lo), ld(1)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0xAA>(lo), ld(2)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0xFF>(lo), ld(3)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0x00>(hi), ld(4)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0x55>(hi), ld(5)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0xAA>(hi), ld(6)));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(chunk::<0xFF>(hi), ld(7)));
    _mm256_madd_epi16(s, sc)
}

/// `ggml_gemm_q4_K_8x8_q8_K`'s outputs for weight row `w` against a group
/// of eight activation rows (`nb` [`Block8`]s): the order of
/// [`q4k_gemm_1x4`], eight rows to a vector.
#[inline(always)]
unsafe fn q4k_gemm_1x8(w: *const u8, a: *const BlockN<8>, nb: usize) -> [f32; 8] {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for b in 0..nb {
        let wb = w.add(b * q4k::BLOCK_BYTES);
        let ab = &*a.add(b);
        let sm = q4k_scales_mins(wb.add(4));
        let sc8 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let dx = _mm256_load_ps(ab.d.as_ptr());
        let dd = _mm256_mul_ps(_mm256_set1_ps(f16_ptr(wb)), dx);
        let ddm = _mm256_mul_ps(_mm256_set1_ps(f16_ptr(wb.add(2))), dx);
        let wq = wb.add(16);
        for k in 0..4 {
            let bits = _mm256_loadu_si256(wq.add(32 * k).cast());
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            let q = ab.q.as_ptr().add(16 * k);
            let pair = _mm256_add_epi32(
                q4k_sub_x8(lo, q, splat16(sc8, 2 * k)),
                q4k_sub_x8(hi, q.add(8), splat16(sc8, 2 * k + 1)),
            );
            // `(m[2k], m[2k+1])`, the 32-bit lane `4 + k` of `sm`, everywhere.
            let mk = _mm256_permutevar8x32_epi32(sm, _mm256_set1_epi32(4 + k as i32));
            let sums = _mm256_load_si256(ab.sums[k].as_ptr().cast());
            let mins = _mm256_madd_epi16(sums, mk);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair), dd, acc);
            accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), ddm, accm);
        }
    }
    let mut o = [0f32; 8];
    _mm256_storeu_ps(o.as_mut_ptr(), _mm256_sub_ps(acc, accm));
    o
}

/// The sixteen-row groups `g` against weight rows `cols`, two weight rows at
/// a time (`two(c, group)` gives rows `c` and `c + 1`, each activation load
/// serving both) and a last odd one alone (`one`), written through `out`.
#[inline(always)]
unsafe fn by_wide_groups(
    g: &Groups<16>,
    cols: std::ops::Range<usize>,
    out: OutTile,
    two: impl Fn(usize, *const BlockN<16>) -> [[f32; 16]; 2],
    one: impl Fn(usize, *const BlockN<16>) -> [f32; 16],
) {
    for gi in 0..g.groups {
        let ga = g.group(gi);
        let put = |c: usize, o: [f32; 16]| {
            for (i, v) in o.into_iter().enumerate() {
                *out.at(g.start + 16 * gi + i, c) = v;
            }
        };
        let mut c = cols.start;
        while c + 2 <= cols.end {
            let [o0, o1] = two(c, ga);
            put(c, o0);
            put(c + 1, o1);
            c += 2;
        }
        if c < cols.end {
            put(c, one(c, ga));
        }
    }
}

/// The sixteen-row groups `g` against weight rows `cols` of a `format`
/// weight (Q4_K repacked, Q6_K or IQ4_XS) at `base` (`stride` bytes a row,
/// `nb` super-blocks), two weight rows at a time ([`by_wide_groups`]),
/// written through `out`.
///
/// # Safety
/// AVX-512 F, BW and VNNI available ([`crate::quant::dot::avx512_vnni`]);
/// as [`run`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn wide_16_groups(
    format: KFormat,
    base: *const u8,
    stride: usize,
    nb: usize,
    g: &Groups<16>,
    cols: std::ops::Range<usize>,
    out: OutTile,
) {
    let w = |c: usize| base.add(c * stride);
    match format {
        KFormat::Q4K => by_wide_groups(
            g,
            cols,
            out,
            |c, ga| q4k_gemm_rx16::<2>(w(c), stride, ga, nb),
            |c, ga| q4k_gemm_rx16::<1>(w(c), stride, ga, nb)[0],
        ),
        KFormat::Q6K => by_wide_groups(
            g,
            cols,
            out,
            |c, ga| q6k_gemm_rx16::<2>(w(c), stride, ga, nb),
            |c, ga| q6k_gemm_rx16::<1>(w(c), stride, ga, nb)[0],
        ),
        KFormat::Iq4Xs => by_wide_groups(
            g,
            cols,
            out,
            |c, ga| iq4xs_gemm_rx16::<2>(w(c), stride, ga, nb),
            |c, ga| iq4xs_gemm_rx16::<1>(w(c), stride, ga, nb)[0],
        ),
        _ => unreachable!("no AVX-512 kernel for {format:?}"),
    }
}

/// `ggml_gemm_q4_K_8x8_q8_K`'s outputs for the `R` weight rows at `w`
/// (`stride` bytes apart) against a group of sixteen activation rows (`nb`
/// [`BlockN`]s), with AVX-512 VNNI: per weight row, the float operations of
/// [`q4k_gemm_1x8`], sixteen rows to a vector; each activation vector
/// loaded serves the `R` rows. The integer parts differ in how they are
/// formed, not in value: a sub-block's dot is one `dpbusd` chain in 32
/// bits, and its product with the 6-bit scale and the sum of a pair are
/// taken in f32, where every value is an integer below 2^24 (|dot| <= 32 *
/// 15 * 128, scale <= 63), so each is exact and `pair` equals the AVX2
/// kernel's converted total.
#[inline(always)]
unsafe fn q4k_gemm_rx16<const R: usize>(
    w: *const u8,
    stride: usize,
    a: *const BlockN<16>,
    nb: usize,
) -> [[f32; 16]; R] {
    let m4 = _mm256_set1_epi8(0xF);
    let idx: [__m512i; 8] = std::array::from_fn(|t| _mm512_set1_epi32(t as i32));
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let ab = &*a.add(b);
        let dx = _mm512_load_ps(ab.d.as_ptr());
        let wb: [*const u8; R] = std::array::from_fn(|r| w.add(r * stride + b * q4k::BLOCK_BYTES));
        let mut scf = [[0f32; 8]; R];
        let mut sm = [_mm512_setzero_si512(); R];
        let mut dd = [_mm512_setzero_ps(); R];
        let mut ddm = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let s = q4k_scales_mins(wb[r].add(4));
            _mm256_storeu_ps(
                scf[r].as_mut_ptr(),
                _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(s))),
            );
            sm[r] = _mm512_castsi256_si512(s);
            dd[r] = _mm512_mul_ps(_mm512_set1_ps(f16_ptr(wb[r])), dx);
            ddm[r] = _mm512_mul_ps(_mm512_set1_ps(f16_ptr(wb[r].add(2))), dx);
        }
        for k in 0..4 {
            let q = ab.q.as_ptr().add(16 * k);
            let mut lo = [_mm512_setzero_si512(); R];
            let mut hi = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let bits = _mm256_loadu_si256(wb[r].add(16 + 32 * k).cast());
                lo[r] = _mm512_castsi256_si512(_mm256_and_si256(bits, m4));
                hi[r] = _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4));
            }
            let mut s0 = [_mm512_setzero_si512(); R];
            let mut s1 = [_mm512_setzero_si512(); R];
            for (t, &ix) in idx.iter().enumerate() {
                let y0 = _mm512_load_si512(q.add(t).cast());
                let y1 = _mm512_load_si512(q.add(8 + t).cast());
                for r in 0..R {
                    s0[r] = _mm512_dpbusd_epi32(s0[r], _mm512_permutexvar_epi32(ix, lo[r]), y0);
                    s1[r] = _mm512_dpbusd_epi32(s1[r], _mm512_permutexvar_epi32(ix, hi[r]), y1);
                }
            }
            let sums = _mm512_load_si512(ab.sums[k].as_ptr().cast());
            for r in 0..R {
                let pair = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(s1[r]),
                    _mm512_set1_ps(scf[r][2 * k + 1]),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(s0[r]), _mm512_set1_ps(scf[r][2 * k])),
                );
                // `(m[2k], m[2k+1])`, the 32-bit lane `4 + k` of `sm`, everywhere.
                let mk = _mm512_permutexvar_epi32(_mm512_set1_epi32(4 + k as i32), sm[r]);
                let mins = _mm512_madd_epi16(sums, mk);
                acc[r] = _mm512_fmadd_ps(pair, dd[r], acc[r]);
                accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), ddm[r], accm[r]);
            }
        }
    }
    let mut o = [[0f32; 16]; R];
    for r in 0..R {
        _mm512_storeu_ps(o[r].as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r]));
    }
    o
}

/// A weight row's super-block unpacked to unsigned bytes, four to a `u32`
/// (for broadcasts), with what [`tiled_rx16`] needs besides.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Unpacked {
    q: [u32; 64],
    /// Each run's integer scale (runs of `256 / RUNS` values).
    sc: [i32; 16],
    /// Per activation row, what the unsigned offset added to the total:
    /// subtracted at the end.
    off: __m512i,
    /// The super-block's scale.
    d: f32,
}

/// ggml-cpu's tiled matmul for formats whose total is a sum of scaled runs
/// (Q6_K, IQ4_XS), for `R` weight rows against a group of sixteen
/// activation rows with AVX-512 VNNI. `unpack(r, b, act_block, into)` fills
/// weight row `r`'s super-block `b`. Per output the super-block's integer
/// total is exact (each run's dot by `dpbusd`, two chains, times its scale by
/// `mullo`, less `off`), then `acc = fma(d * total, d_x, acc)`, as the AVX2
/// tiled kernels do ([`q6k_tiled_1x4`]).
// Indices keep the run, weight row and lane arithmetic visible.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tiled_rx16<const R: usize, const RUNS: usize>(
    a: *const BlockN<16>,
    nb: usize,
    unpack: impl Fn(usize, usize, &BlockN<16>, &mut Unpacked),
) -> [[f32; 16]; R] {
    let per_run = 64 / RUNS;
    let mut acc = [_mm512_setzero_ps(); R];
    let mut u = [Unpacked {
        q: [0; 64],
        sc: [0; 16],
        off: _mm512_setzero_si512(),
        d: 0.0,
    }; R];
    for b in 0..nb {
        let ab = &*a.add(b);
        for r in 0..R {
            unpack(r, b, ab, &mut u[r]);
        }
        let mut tot = [_mm512_setzero_si512(); R];
        for j in 0..RUNS {
            let mut d0 = [_mm512_setzero_si512(); R];
            let mut d1 = [_mm512_setzero_si512(); R];
            for t in (0..per_run).step_by(2) {
                let v = per_run * j + t;
                let y0 = _mm512_load_si512(ab.q.as_ptr().add(v).cast());
                let y1 = _mm512_load_si512(ab.q.as_ptr().add(v + 1).cast());
                for r in 0..R {
                    let w0 = _mm512_set1_epi32(u[r].q[v] as i32);
                    let w1 = _mm512_set1_epi32(u[r].q[v + 1] as i32);
                    d0[r] = _mm512_dpbusd_epi32(d0[r], w0, y0);
                    d1[r] = _mm512_dpbusd_epi32(d1[r], w1, y1);
                }
            }
            for r in 0..R {
                let run = _mm512_add_epi32(d0[r], d1[r]);
                let scaled = _mm512_mullo_epi32(run, _mm512_set1_epi32(u[r].sc[j]));
                tot[r] = _mm512_add_epi32(tot[r], scaled);
            }
        }
        let dx = _mm512_load_ps(ab.d.as_ptr());
        for r in 0..R {
            let total = _mm512_sub_epi32(tot[r], u[r].off);
            let res = _mm512_mul_ps(_mm512_set1_ps(u[r].d), _mm512_cvtepi32_ps(total));
            acc[r] = _mm512_fmadd_ps(res, dx, acc[r]);
        }
    }
    let mut o = [[0f32; 16]; R];
    for r in 0..R {
        _mm512_storeu_ps(o[r].as_mut_ptr(), acc[r]);
    }
    o
}

/// ggml-cpu's tiled Q6_K matmul ([`q6k_tiled_1x4`]) for the `R` weight rows
/// at `w` (`stride` bytes apart) against a group of sixteen activation rows
/// ([`tiled_rx16`]): sixteen runs of 16 values, each 6-bit quant unsigned as
/// ggml keeps it, the offset `32 * sum(scale * bsum)`.
#[inline(always)]
unsafe fn q6k_gemm_rx16<const R: usize>(
    w: *const u8,
    stride: usize,
    a: *const BlockN<16>,
    nb: usize,
) -> [[f32; 16]; R] {
    tiled_rx16::<R, 16>(a, nb, |r, b, ab, u| {
        let wb = w.add(r * stride + b * q6k::BLOCK_BYTES);
        let q = q6k::avx2::quants(wb, wb.add(128));
        for (c, v) in q.iter().enumerate() {
            _mm256_store_si256(u.q.as_mut_ptr().add(8 * c).cast(), *v);
        }
        let s8 = _mm_loadu_si128(wb.add(192).cast());
        _mm512_storeu_si512(u.sc.as_mut_ptr().cast(), _mm512_cvtepi8_epi32(s8));
        // `sum_j sc_j * bsum_j` per activation row, pairs of runs at a time.
        let s16z = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(s8));
        let mut off = _mm512_setzero_si512();
        for jj in 0..8 {
            let pair = _mm512_permutexvar_epi32(_mm512_set1_epi32(jj as i32), s16z);
            let sums = _mm512_load_si512(ab.sums16[jj].as_ptr().cast());
            off = _mm512_add_epi32(off, _mm512_madd_epi16(sums, pair));
        }
        u.off = _mm512_slli_epi32::<5>(off);
        u.d = f16_ptr(wb.add(208));
    })
}

/// ggml-cpu's tiled IQ4_XS matmul (see [`crate::quant::iq4::xs`]) for the
/// `R` weight rows at `w` against a group of sixteen activation rows
/// ([`tiled_rx16`]): eight runs of 32 table values offset to unsigned (`+
/// 128`), the offset `128 * sum(ls * run sums)`. Q8_K activations never
/// reach -128, so ggml's sign trick gives the true products and this equals
/// it.
#[inline(always)]
unsafe fn iq4xs_gemm_rx16<const R: usize>(
    w: *const u8,
    stride: usize,
    a: *const BlockN<16>,
    nb: usize,
) -> [[f32; 16]; R] {
    let table = _mm_xor_si128(
        _mm_loadu_si128(crate::quant::iq4::KVALUES.as_ptr().cast()),
        _mm_set1_epi8(-128),
    );
    let m4 = _mm_set1_epi8(0xF);
    tiled_rx16::<R, 8>(a, nb, |r, b, ab, u| {
        let wb = w.add(r * stride + b * crate::quant::iq4::xs::BLOCK_BYTES);
        let qs = wb.add(8);
        for s in 0..8 {
            let bits = _mm_loadu_si128(qs.add(16 * s).cast());
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(bits, m4));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4));
            let dst = u.q.as_mut_ptr().add(8 * s);
            _mm_store_si128(dst.cast(), lo);
            _mm_store_si128(dst.add(4).cast(), hi);
        }
        let sc = crate::quant::iq4::xs::scales(std::slice::from_raw_parts(wb, 8));
        u.sc[..8].copy_from_slice(&sc);
        // `sum_s ls_s * S_s` per activation row, pairs of runs at a time.
        let mut off = _mm512_setzero_si512();
        for k in 0..4 {
            let pair = (sc[2 * k] as u16 as u32 | ((sc[2 * k + 1] as u16 as u32) << 16)) as i32;
            let sums = _mm512_load_si512(ab.sums[k].as_ptr().cast());
            off = _mm512_add_epi32(off, _mm512_madd_epi16(sums, _mm512_set1_epi32(pair)));
        }
        u.off = _mm512_slli_epi32::<7>(off);
        u.d = f16_ptr(wb);
    })
}

/// Weight rows ahead the one-row Q6_K product prefetches.
const Q6_PREFETCH_ROWS: usize = 2;

/// Asks for the cache lines of the `N` bytes at `p` (a hint: any address is
/// allowed, none is dereferenced).
#[inline(always)]
unsafe fn prefetch_block<const N: usize>(p: *const u8) {
    let mut off = 0;
    while off < N {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(N - 1).cast());
}

/// The f16 at `p` as f32.
#[inline(always)]
unsafe fn f16_ptr(p: *const u8) -> f32 {
    half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32()
}

/// A Q4_K super-block's eight 6-bit scales and minimums (`get_scale_min_k4`)
/// from its 12 packed bytes at `p`, as 16 bit lanes: `[sc0..sc7 | m0..m7]`.
#[inline(always)]
unsafe fn q4k_scales_mins(p: *const u8) -> __m256i {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let w0 = p.cast::<u32>().read_unaligned();
    let w1 = p.add(4).cast::<u32>().read_unaligned();
    let w2 = p.add(8).cast::<u32>().read_unaligned();
    // Scales 0..4 and minimums 0..4 are the low six bits of bytes 0..4 and
    // 4..8; scales 4..8 take their low nibble from bytes 8..12 and their top
    // two bits from the top of bytes 0..4, minimums 4..8 the high nibbles of
    // bytes 8..12 and the top of bytes 4..8.
    let sc_lo = w0 & LOW6;
    let m_lo = w1 & LOW6;
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let m_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    _mm256_cvtepu8_epi16(_mm_set_epi32(
        m_hi as i32,
        m_lo as i32,
        sc_hi as i32,
        sc_lo as i32,
    ))
}

/// Sub-block `j`'s scale (16-bit lane `j` of `sc8`, the eight scales in each
/// half) in every 16-bit lane.
#[inline(always)]
unsafe fn splat16(sc8: __m256i, j: usize) -> __m256i {
    let b = (2 * j) as i16 | (((2 * j + 1) as i16) << 8);
    _mm256_shuffle_epi8(sc8, _mm256_set1_epi16(b))
}

/// The sums of each run of 32 activation quants (sub-blocks of Q4_K), from
/// the 16 sums of 16: `[s0..s7]` as 16-bit lanes.
#[inline(always)]
unsafe fn sub_sums32(a: &Q8KBlock) -> __m128i {
    let bs = _mm256_load_si256(a.bsums.as_ptr().cast());
    _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    )
}

/// Eight vectors of eight i32 reduced to their eight totals, in order.
#[inline(always)]
unsafe fn reduce8(t: &[__m256i; 8]) -> __m256i {
    let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(t[0], t[1]), _mm256_hadd_epi32(t[2], t[3]));
    let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(t[4], t[5]), _mm256_hadd_epi32(t[6], t[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(q0, q1),
        _mm256_permute2x128_si256::<0x31>(q0, q1),
    )
}

/// Four vectors of eight i32 reduced to their four totals, in order.
#[inline(always)]
unsafe fn reduce4(t0: __m256i, t1: __m256i, t2: __m256i, t3: __m256i) -> __m128i {
    let q = _mm256_hadd_epi32(_mm256_hadd_epi32(t0, t1), _mm256_hadd_epi32(t2, t3));
    _mm_add_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q))
}

/// The scaled integer dot of the two sub-blocks of pair `k` (quant bytes at
/// `wq`, activation quants at `y`): eight i32 lanes.
#[inline(always)]
unsafe fn q4k_pair(wq: *const u8, sc8: __m256i, y: *const i8, k: usize) -> __m256i {
    let m4 = _mm256_set1_epi8(0xF);
    let bits = _mm256_loadu_si256(wq.add(32 * k).cast());
    let lo = _mm256_and_si256(bits, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
    let yl = _mm256_load_si256(y.add(64 * k).cast());
    let yh = _mm256_load_si256(y.add(64 * k + 32).cast());
    _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, yl), splat16(sc8, 2 * k)),
        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yh), splat16(sc8, 2 * k + 1)),
    )
}

/// `ggml_gemv_q4_K_8x8_q8_K`'s outputs for the eight weight rows at `w`
/// (`stride` bytes apart) against activation row `a` (`nb` blocks), into
/// `out[0..8]`: per super-block `acc = fma(total, d * d_x, acc)`, `accm =
/// fma(total_min, dmin * d_x, accm)`; then `acc - accm`.
#[inline(always)]
unsafe fn q4k_gemv_8x1(w: *const u8, stride: usize, a: *const Q8KBlock, nb: usize, out: *mut f32) {
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for b in 0..nb {
        let ab = &*a.add(b);
        let y = ab.qs.as_ptr();
        let sx = sub_sums32(ab);
        let mut tot = [_mm256_setzero_si256(); 8];
        let mut mins = [_mm_setzero_si128(); 8];
        let mut d = [0u16; 8];
        let mut dm = [0u16; 8];
        for r in 0..8 {
            let wb = w.add(r * stride + b * q4k::BLOCK_BYTES);
            // The same super-block of the next group of eight rows: eight
            // short streams defeat the hardware prefetcher.
            prefetch_block::<{ q4k::BLOCK_BYTES }>(wb.wrapping_add(8 * stride));
            d[r] = wb.cast::<u16>().read_unaligned();
            dm[r] = wb.add(2).cast::<u16>().read_unaligned();
            let sm = q4k_scales_mins(wb.add(4));
            let sc8 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
            let wq = wb.add(16);
            let p01 = _mm256_add_epi32(q4k_pair(wq, sc8, y, 0), q4k_pair(wq, sc8, y, 1));
            let p23 = _mm256_add_epi32(q4k_pair(wq, sc8, y, 2), q4k_pair(wq, sc8, y, 3));
            tot[r] = _mm256_add_epi32(p01, p23);
            mins[r] = _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), sx);
        }
        let t = _mm256_cvtepi32_ps(reduce8(&tot));
        let m03 = _mm_hadd_epi32(
            _mm_hadd_epi32(mins[0], mins[1]),
            _mm_hadd_epi32(mins[2], mins[3]),
        );
        let m47 = _mm_hadd_epi32(
            _mm_hadd_epi32(mins[4], mins[5]),
            _mm_hadd_epi32(mins[6], mins[7]),
        );
        let m = _mm256_cvtepi32_ps(_mm256_set_m128i(m47, m03));
        let dx = _mm256_set1_ps(ab.d);
        let dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast())), dx);
        let ddm = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(dm.as_ptr().cast())), dx);
        acc = _mm256_fmadd_ps(t, dd, acc);
        accm = _mm256_fmadd_ps(m, ddm, accm);
    }
    _mm256_storeu_ps(out, _mm256_sub_ps(acc, accm));
}

/// [`q4k_gemv_8x1`] for `R` activation rows `a` at once, into `out[i][0..8]`:
/// each row's outputs are the one-row kernel's bit for bit (the integer sums
/// are exact in any order, and each row's float accumulation runs as there),
/// while a weight super-block's scales and unpacked quants are made once for
/// all `R` rows, not once per row (a verified draft's rows, which take the
/// one-row order: `crate::quant::alone`).
#[inline(always)]
unsafe fn q4k_gemv_8xr<const R: usize>(
    w: *const u8,
    stride: usize,
    a: [*const Q8KBlock; R],
    nb: usize,
    out: [*mut f32; R],
) {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let blocks: [&Q8KBlock; R] = std::array::from_fn(|i| &*a[i].add(b));
        let sx: [__m128i; R] = std::array::from_fn(|i| sub_sums32(blocks[i]));
        let mut tot = [[_mm256_setzero_si256(); 8]; R];
        let mut mins = [[_mm_setzero_si128(); 8]; R];
        let mut d = [0u16; 8];
        let mut dm = [0u16; 8];
        for r in 0..8 {
            let wb = w.add(r * stride + b * q4k::BLOCK_BYTES);
            prefetch_block::<{ q4k::BLOCK_BYTES }>(wb.wrapping_add(8 * stride));
            d[r] = wb.cast::<u16>().read_unaligned();
            dm[r] = wb.add(2).cast::<u16>().read_unaligned();
            let sm = q4k_scales_mins(wb.add(4));
            let sc8 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
            let sc: [__m256i; 8] = std::array::from_fn(|j| splat16(sc8, j));
            let mn = _mm256_extracti128_si256::<1>(sm);
            let wq = wb.add(16);
            let mut lo = [_mm256_setzero_si256(); 4];
            let mut hi = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let bits = _mm256_loadu_si256(wq.add(32 * k).cast());
                lo[k] = _mm256_and_si256(bits, m4);
                hi[k] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            }
            for i in 0..R {
                let y = blocks[i].qs.as_ptr();
                let pair = |k: usize| {
                    let yl = _mm256_load_si256(y.add(64 * k).cast());
                    let yh = _mm256_load_si256(y.add(64 * k + 32).cast());
                    _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo[k], yl), sc[2 * k]),
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi[k], yh), sc[2 * k + 1]),
                    )
                };
                tot[i][r] = _mm256_add_epi32(
                    _mm256_add_epi32(pair(0), pair(1)),
                    _mm256_add_epi32(pair(2), pair(3)),
                );
                mins[i][r] = _mm_madd_epi16(mn, sx[i]);
            }
        }
        let d16 = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast()));
        let dm16 = _mm256_cvtph_ps(_mm_loadu_si128(dm.as_ptr().cast()));
        for i in 0..R {
            let t = _mm256_cvtepi32_ps(reduce8(&tot[i]));
            let mi = &mins[i];
            let m03 = _mm_hadd_epi32(_mm_hadd_epi32(mi[0], mi[1]), _mm_hadd_epi32(mi[2], mi[3]));
            let m47 = _mm_hadd_epi32(_mm_hadd_epi32(mi[4], mi[5]), _mm_hadd_epi32(mi[6], mi[7]));
            let m = _mm256_cvtepi32_ps(_mm256_set_m128i(m47, m03));
            let dx = _mm256_set1_ps(blocks[i].d);
            let dd = _mm256_mul_ps(d16, dx);
            let ddm = _mm256_mul_ps(dm16, dx);
            acc[i] = _mm256_fmadd_ps(t, dd, acc[i]);
            accm[i] = _mm256_fmadd_ps(m, ddm, accm[i]);
        }
    }
    for i in 0..R {
        _mm256_storeu_ps(out[i], _mm256_sub_ps(acc[i], accm[i]));
    }
}

/// `ggml_gemm_q4_K_8x8_q8_K`'s outputs for weight row `w` against the four
/// activation rows `a` (`nb` blocks each): per super-block and pair of
/// sub-blocks `k`, `acc = fma(pair_k, d * d_x, acc)` and `accm = fma(min_k,
/// dmin * d_x, accm)`; then `acc - accm`.
#[inline(always)]
unsafe fn q4k_gemm_1x4(w: *const u8, a: [*const Q8KBlock; 4], nb: usize) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
    for b in 0..nb {
        let wb = w.add(b * q4k::BLOCK_BYTES);
        let ab: [&Q8KBlock; 4] = std::array::from_fn(|i| &*a[i].add(b));
        let sm = q4k_scales_mins(wb.add(4));
        let sc8 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let m16 = _mm256_extracti128_si256::<1>(sm);
        let wq = wb.add(16);
        // Per pair `k`, the four activation rows' totals, lanes `[k0 | k1]`
        // and `[k2 | k3]`.
        let mut x = [_mm256_setzero_si256(); 4];
        for (k, x) in x.iter_mut().enumerate() {
            let p: [__m256i; 4] = std::array::from_fn(|i| q4k_pair(wq, sc8, ab[i].qs.as_ptr(), k));
            *x = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        }
        let k01 = _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(x[0], x[1]),
            _mm256_permute2x128_si256::<0x31>(x[0], x[1]),
        ));
        let k23 = _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(x[2], x[3]),
            _mm256_permute2x128_si256::<0x31>(x[2], x[3]),
        ));
        // The minimum terms: row `i` gives `[k0..k3]`; transposed to per-`k`
        // vectors over the rows.
        let mi: [__m128i; 4] = std::array::from_fn(|i| _mm_madd_epi16(m16, sub_sums32(ab[i])));
        let t0 = _mm_unpacklo_epi32(mi[0], mi[1]);
        let t1 = _mm_unpacklo_epi32(mi[2], mi[3]);
        let t2 = _mm_unpackhi_epi32(mi[0], mi[1]);
        let t3 = _mm_unpackhi_epi32(mi[2], mi[3]);
        let mk = [
            _mm_cvtepi32_ps(_mm_unpacklo_epi64(t0, t1)),
            _mm_cvtepi32_ps(_mm_unpackhi_epi64(t0, t1)),
            _mm_cvtepi32_ps(_mm_unpacklo_epi64(t2, t3)),
            _mm_cvtepi32_ps(_mm_unpackhi_epi64(t2, t3)),
        ];
        let dx = _mm_set_ps(ab[3].d, ab[2].d, ab[1].d, ab[0].d);
        let dd = _mm_mul_ps(_mm_set1_ps(f16_ptr(wb)), dx);
        let ddm = _mm_mul_ps(_mm_set1_ps(f16_ptr(wb.add(2))), dx);
        let pk = [
            _mm256_castps256_ps128(k01),
            _mm256_extractf128_ps::<1>(k01),
            _mm256_castps256_ps128(k23),
            _mm256_extractf128_ps::<1>(k23),
        ];
        for k in 0..4 {
            acc = _mm_fmadd_ps(pk[k], dd, acc);
            accm = _mm_fmadd_ps(mk[k], ddm, accm);
        }
    }
    let mut o = [0f32; 4];
    _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc, accm));
    o
}

/// A Q6_K super-block unpacked: its 6-bit quants as eight vectors of 32, per
/// vector the scales of its two halves (16-bit lanes), and all sixteen scales
/// widened for the offset.
struct Q6Unpacked {
    q: [__m256i; 8],
    sc: [__m256i; 8],
    sc16: __m256i,
}

#[inline(always)]
unsafe fn q6k_unpack(w: *const u8) -> Q6Unpacked {
    let (ql, qh, sc) = (w, w.add(128), w.add(192));
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.cast()));
    let mut u = Q6Unpacked {
        q: [_mm256_setzero_si256(); 8],
        sc: [_mm256_setzero_si256(); 8],
        sc16,
    };
    u.q = q6k::avx2::quants(ql, qh);
    // Vector `c` covers values `32 c .. 32 c + 32`: scale `2c` on its low
    // half, `2c + 1` on its high one.
    let lo = _mm256_permute2x128_si256::<0x00>(sc16, sc16);
    let hi = _mm256_permute2x128_si256::<0x11>(sc16, sc16);
    for c in 0..8 {
        let src = if c < 4 { lo } else { hi };
        let j = 2 * (c % 4);
        let b_lo = (2 * j) as i8;
        let b_hi = (2 * j + 2) as i8;
        let mask = _mm256_setr_epi8(
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_lo,
            b_lo + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
            b_hi,
            b_hi + 1,
        );
        u.sc[c] = _mm256_shuffle_epi8(src, mask);
    }
    u
}

/// The eight exact integer lanes of `ggml_vec_dot_q6_K_q8_K` for an unpacked
/// super-block against activation block `a` (offset taken out through `bsums`).
#[inline(always)]
unsafe fn q6k_lanes(u: &Q6Unpacked, a: &Q8KBlock) -> __m256i {
    let y = a.qs.as_ptr();
    let mut s0 = _mm256_setzero_si256();
    let mut s1 = _mm256_setzero_si256();
    for c in (0..8).step_by(2) {
        let y0 = _mm256_load_si256(y.add(32 * c).cast());
        let y1 = _mm256_load_si256(y.add(32 * c + 32).cast());
        s0 = _mm256_add_epi32(
            s0,
            _mm256_madd_epi16(u.sc[c], _mm256_maddubs_epi16(u.q[c], y0)),
        );
        s1 = _mm256_add_epi32(
            s1,
            _mm256_madd_epi16(u.sc[c + 1], _mm256_maddubs_epi16(u.q[c + 1], y1)),
        );
    }
    let bsums = _mm256_load_si256(a.bsums.as_ptr().cast());
    let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, u.sc16));
    _mm256_sub_epi32(_mm256_add_epi32(s0, s1), off)
}

/// `ggml_vec_dot_q6_K_q8_K` for weight row `w` against activation row `a`:
/// `acc[l] = fma(d_x * d, lane l, acc[l])` per super-block, then `hsum_float_8`.
#[inline(always)]
unsafe fn q6k_vec_dot(w: *const u8, a: *const Q8KBlock, nb: usize) -> f32 {
    lanes_vec_dot::<{ q6k::BLOCK_BYTES }, _>(
        w,
        a,
        nb,
        208,
        |wb| q6k_unpack(wb),
        |u, a| q6k_lanes(u, a),
    )
}

/// [`q6k_vec_dot`] of weight row `w` against four activation rows, each
/// row's bits the one-row kernel's, the super-block unpacked once.
#[inline(always)]
unsafe fn q6k_vec_dot_4(w: *const u8, a: [*const Q8KBlock; 4], nb: usize) -> [f32; 4] {
    lanes_vec_dot_4::<{ q6k::BLOCK_BYTES }, _>(
        w,
        a,
        nb,
        208,
        |wb| q6k_unpack(wb),
        |u, a| q6k_lanes(u, a),
    )
}

/// ggml-cpu's tiled matmul for weight row `w` against four activation rows:
/// per super-block `acc = fma(d * total, d_x, acc)`.
#[inline(always)]
unsafe fn q6k_tiled_1x4(w: *const u8, a: [*const Q8KBlock; 4], nb: usize) -> [f32; 4] {
    lanes_tiled_1x4::<{ q6k::BLOCK_BYTES }, _>(
        w,
        a,
        nb,
        208,
        |wb| q6k_unpack(wb),
        |u, a| q6k_lanes(u, a),
    )
}

/// The `vec_dot` order of the formats whose super-block product is eight
/// exact integer position lanes and one f16 scale at byte `d_at` (Q6_K,
/// IQ4_XS): `acc[l] = fma(d_x * d, lane l, acc[l])` per super-block, then
/// `hsum_float_8`; two rows ahead prefetched.
#[inline(always)]
unsafe fn lanes_vec_dot<const BYTES: usize, U>(
    w: *const u8,
    a: *const Q8KBlock,
    nb: usize,
    d_at: usize,
    unpack: impl Fn(*const u8) -> U,
    lanes: impl Fn(&U, &Q8KBlock) -> __m256i,
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        let wb = w.add(b * BYTES);
        let ab = &*a.add(b);
        prefetch_block::<BYTES>(wb.wrapping_add(Q6_PREFETCH_ROWS * nb * BYTES));
        let l = lanes(&unpack(wb), ab);
        let d = _mm256_set1_ps(ab.d * f16_ptr(wb.add(d_at)));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(l), acc);
    }
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    hsum8(&l)
}

/// [`lanes_vec_dot`] for four activation rows at once: each row's
/// accumulation exactly the one-row order's, the weight super-block
/// unpacked once for the four (a verified draft's rows).
#[inline(always)]
unsafe fn lanes_vec_dot_4<const BYTES: usize, U>(
    w: *const u8,
    a: [*const Q8KBlock; 4],
    nb: usize,
    d_at: usize,
    unpack: impl Fn(*const u8) -> U,
    lanes: impl Fn(&U, &Q8KBlock) -> __m256i,
) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        let wb = w.add(b * BYTES);
        prefetch_block::<BYTES>(wb.wrapping_add(Q6_PREFETCH_ROWS * nb * BYTES));
        let u = unpack(wb);
        let dw = f16_ptr(wb.add(d_at));
        for i in 0..4 {
            let ab = &*a[i].add(b);
            let l = lanes(&u, ab);
            let d = _mm256_set1_ps(ab.d * dw);
            acc[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(l), acc[i]);
        }
    }
    acc.map(|v| {
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), v);
        hsum8(&l)
    })
}

/// The tiled order of the same formats against four activation rows, the
/// block unpacked once: per super-block `acc = fma(d * total, d_x, acc)`.
#[inline(always)]
unsafe fn lanes_tiled_1x4<const BYTES: usize, U>(
    w: *const u8,
    a: [*const Q8KBlock; 4],
    nb: usize,
    d_at: usize,
    unpack: impl Fn(*const u8) -> U,
    lanes: impl Fn(&U, &Q8KBlock) -> __m256i,
) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    for b in 0..nb {
        let wb = w.add(b * BYTES);
        let ab: [&Q8KBlock; 4] = std::array::from_fn(|i| &*a[i].add(b));
        let u = unpack(wb);
        let t = reduce4(
            lanes(&u, ab[0]),
            lanes(&u, ab[1]),
            lanes(&u, ab[2]),
            lanes(&u, ab[3]),
        );
        let res = _mm_mul_ps(_mm_set1_ps(f16_ptr(wb.add(d_at))), _mm_cvtepi32_ps(t));
        let dx = _mm_set_ps(ab[3].d, ab[2].d, ab[1].d, ab[0].d);
        acc = _mm_fmadd_ps(res, dx, acc);
    }
    let mut o = [0f32; 4];
    _mm_storeu_ps(o.as_mut_ptr(), acc);
    o
}

/// A Q5_K super-block's eight 5-bit sub-blocks (nibble plus fifth bit), its
/// scales (eight in each half) and minimums (16-bit lanes).
#[inline(always)]
unsafe fn q5k_unpack(wb: *const u8) -> ([__m256i; 8], __m256i, __m128i) {
    let sm = q4k_scales_mins(wb.add(4));
    let sc8 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
    let m16 = _mm256_extracti128_si256::<1>(sm);
    let qh = _mm256_loadu_si256(wb.add(16).cast());
    let m4 = _mm256_set1_epi8(0xF);
    let sixteen = _mm256_set1_epi8(16);
    let mut q = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        let bits = _mm256_loadu_si256(wb.add(48 + 32 * k).cast());
        let nib = [
            _mm256_and_si256(bits, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
        ];
        for (h, nib) in nib.into_iter().enumerate() {
            let j = 2 * k + h;
            let bit = _mm256_set1_epi8((1u8 << j) as i8);
            let high = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
            q[j] = _mm256_or_si256(nib, _mm256_and_si256(high, sixteen));
        }
    }
    (q, sc8, m16)
}

/// The eight position lanes of a Q5_K super-block product (as Q4_K's) and
/// the exact minimum total.
#[inline(always)]
unsafe fn q5k_ints(
    q: &[__m256i; 8],
    sc8: __m256i,
    m16: __m128i,
    a: &Q8KBlock,
) -> (__m256i, __m128i) {
    let y = a.qs.as_ptr();
    let mut s0 = _mm256_setzero_si256();
    let mut s1 = _mm256_setzero_si256();
    for j in (0..8).step_by(2) {
        let y0 = _mm256_load_si256(y.add(32 * j).cast());
        let y1 = _mm256_load_si256(y.add(32 * j + 32).cast());
        s0 = _mm256_add_epi32(
            s0,
            _mm256_madd_epi16(splat16(sc8, j), _mm256_maddubs_epi16(q[j], y0)),
        );
        s1 = _mm256_add_epi32(
            s1,
            _mm256_madd_epi16(splat16(sc8, j + 1), _mm256_maddubs_epi16(q[j + 1], y1)),
        );
    }
    (_mm256_add_epi32(s0, s1), _mm_madd_epi16(m16, sub_sums32(a)))
}

/// `ggml_vec_dot_q5_K_q8_K`: `acc[l] = fma(d_x * d, lane l, acc[l])` and
/// `summs = fma(-d_x * dmin, total_min, summs)` per super-block, then
/// `hsum_float_8(acc) + summs`.
#[inline(always)]
unsafe fn q5k_vec_dot(w: *const u8, a: *const Q8KBlock, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for b in 0..nb {
        let wb = w.add(b * q5k::BLOCK_BYTES);
        let ab = &*a.add(b);
        prefetch_block::<{ q5k::BLOCK_BYTES }>(
            wb.wrapping_add(Q6_PREFETCH_ROWS * nb * q5k::BLOCK_BYTES),
        );
        let (q, sc8, m16) = q5k_unpack(wb);
        let (lanes, mins) = q5k_ints(&q, sc8, m16, ab);
        let mins = _mm_hadd_epi32(mins, mins);
        let s2 = _mm_cvtsi128_si32(_mm_hadd_epi32(mins, mins));
        let d = ab.d * f16_ptr(wb);
        let dmin = -ab.d * f16_ptr(wb.add(2));
        summs = dmin.mul_add(s2 as f32, summs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
    }
    let mut l = [0f32; 8];
    _mm256_storeu_ps(l.as_mut_ptr(), acc);
    hsum8(&l) + summs
}

/// ggml-cpu's tiled matmul for a Q5_K weight row against four activation
/// rows: per super-block `res = fma(-dmin, total_min, d * total)`, `acc =
/// fma(res, d_x, acc)`.
#[inline(always)]
unsafe fn q5k_tiled_1x4(w: *const u8, a: [*const Q8KBlock; 4], nb: usize) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    for b in 0..nb {
        let wb = w.add(b * q5k::BLOCK_BYTES);
        let ab: [&Q8KBlock; 4] = std::array::from_fn(|i| &*a[i].add(b));
        let (q, sc8, m16) = q5k_unpack(wb);
        let i: [(__m256i, __m128i); 4] = std::array::from_fn(|i| q5k_ints(&q, sc8, m16, ab[i]));
        let s1 = reduce4(i[0].0, i[1].0, i[2].0, i[3].0);
        let s2 = _mm_hadd_epi32(
            _mm_hadd_epi32(i[0].1, i[1].1),
            _mm_hadd_epi32(i[2].1, i[3].1),
        );
        let res = _mm_mul_ps(_mm_set1_ps(f16_ptr(wb)), _mm_cvtepi32_ps(s1));
        let res = _mm_fmadd_ps(_mm_set1_ps(-f16_ptr(wb.add(2))), _mm_cvtepi32_ps(s2), res);
        let dx = _mm_set_ps(ab[3].d, ab[2].d, ab[1].d, ab[0].d);
        acc = _mm_fmadd_ps(res, dx, acc);
    }
    let mut o = [0f32; 4];
    _mm_storeu_ps(o.as_mut_ptr(), acc);
    o
}

/// An IQ4_XS super-block unpacked for many activation rows.
#[inline(always)]
unsafe fn iq4xs_unpack(wb: *const u8) -> xs::avx2::Unpacked {
    xs::avx2::unpack(std::slice::from_raw_parts(wb, xs::BLOCK_BYTES))
}

/// `ggml_vec_dot_iq4_xs_q8_K` for weight row `w` against activation row `a`:
/// `acc[l] = fma(d * d_x, lane l, acc[l])` per super-block, then
/// `hsum_float_8`.
#[inline(always)]
unsafe fn iq4xs_vec_dot(w: *const u8, a: *const Q8KBlock, nb: usize) -> f32 {
    lanes_vec_dot::<{ xs::BLOCK_BYTES }, _>(
        w,
        a,
        nb,
        0,
        |wb| iq4xs_unpack(wb),
        |u, a| xs::avx2::lanes_vec(u, a),
    )
}

/// [`iq4xs_vec_dot`] against four activation rows, bit for bit, the
/// super-block unpacked once.
#[inline(always)]
unsafe fn iq4xs_vec_dot_4(w: *const u8, a: [*const Q8KBlock; 4], nb: usize) -> [f32; 4] {
    lanes_vec_dot_4::<{ xs::BLOCK_BYTES }, _>(
        w,
        a,
        nb,
        0,
        |wb| iq4xs_unpack(wb),
        |u, a| xs::avx2::lanes_vec(u, a),
    )
}

/// ggml-cpu's tiled matmul for an IQ4_XS weight row against four activation
/// rows: per super-block `acc = fma(d * total, d_x, acc)`.
#[inline(always)]
unsafe fn iq4xs_tiled_1x4(w: *const u8, a: [*const Q8KBlock; 4], nb: usize) -> [f32; 4] {
    lanes_tiled_1x4::<{ xs::BLOCK_BYTES }, _>(
        w,
        a,
        nb,
        0,
        |wb| iq4xs_unpack(wb),
        |u, a| xs::avx2::lanes_vec(u, a),
    )
}

const _: () = assert!(QK_K == 256);
