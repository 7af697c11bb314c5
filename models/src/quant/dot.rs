//! The dot-product kernels behind [`super::QLinear`]: quantized weight rows against
//! quantized activation rows, in an AVX2+FMA version and a portable scalar one.
//!
//! Both follow ggml's x86 kernels (`ggml_vec_dot_q4_0_q8_0`, `ggml_vec_dot_q4_1_q8_1`,
//! `ggml_vec_dot_q8_0_q8_0`) operation for operation: per block, the integer dot of
//! each group of 4 consecutive quants goes to one of 8 float lanes, each lane
//! accumulates `fma(d_w * d_x, lane_sum, acc)` over the blocks, the lanes are summed
//! in `hsum_float_8`'s order, and Q4_1 adds `sum(m_w * s_x)` accumulated by scalar
//! FMAs. The scalar kernel mirrors the same order, so the two agree bit for bit and
//! with llama.cpp's CPU path up to its compiler's choices.
//!
//! Q4_0 and IQ4_NL weights that llama.cpp repacks ([`BlockOrder::Repack`])
//! follow its `q4_0_8x8_q8_0` / `iq4_nl_8x8_q8_0` gemm/gemv instead: the same
//! exact lane sums, totalled per block (`hadd`s across several outputs at once),
//! then one FMA per block and output, `fma(isum, d_w * d_x, acc)`, with no final
//! horizontal sum. IQ4_NL not repacked runs Q8_0's order (llamafile's
//! `tinyBLAS_Q0_AVX`) from two activation rows on, and for one row
//! `ggml_vec_dot_iq4_nl_q8_0`'s own (see [`super::iq4::nl`]).
//!
//! Tiling: for one to three activation rows the kernel dots one group of four
//! interleaved weight rows (see [`PackedWeights`]) against one or two activation rows
//! at a time, so it reads the weights as one sequential stream (prefetched a few KiB
//! ahead) with four or eight independent FMA chains. From four rows on (a batched
//! decode step, a prefill chunk) it dots one weight row against up to eight
//! activation rows: the block's unpacking is shared by eight pairs, every block's
//! `d_w * d_x` for the eight rows is one multiply done before the dot loop, and each
//! pair then costs the integer dot, one conversion, one broadcast load and one FMA
//! (about 25% faster per pair than the group kernel at eight rows on the 2-core
//! EPYC VM). The weights are walked in slabs of a few groups that stay in L1 while
//! every activation row passes them, the next slab prefetched.
//!
//! Q4_0 in the repacked order has its own kernel from four activation rows on
//! ([`tiles`]): 8 weight rows transposed once so that one `maddubs` gives all
//! eight rows' partial dots, with no horizontal sums (about twice as fast as
//! the row-against-8-rows path, the same floats).

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use super::blocks::{BlockOrder, PackedWeights, QuantizedActs, WeightFormat, GROUP, QK};

/// Which implementation computes. Asking for `Avx2` on a CPU without it gets the
/// scalar kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX2 + FMA + F16C intrinsics (x86-64 only, checked at run time).
    Avx2,
    /// Portable scalar code, same numbers in the same order.
    Scalar,
}

/// The fastest kernel this CPU runs, detected once.
pub fn best_kernel() -> Kernel {
    static CACHED: AtomicU8 = AtomicU8::new(0);
    match CACHED.load(Ordering::Relaxed) {
        1 => Kernel::Avx2,
        2 => Kernel::Scalar,
        _ => {
            let k = detect();
            CACHED.store(if k == Kernel::Avx2 { 1 } else { 2 }, Ordering::Relaxed);
            k
        }
    }
}

fn detect() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Kernel::Avx2;
        }
    }
    Kernel::Scalar
}

/// Whether this CPU runs the AVX-512 VNNI prefill kernels (AVX-512 F, BW
/// and VNNI, beside AVX2), detected once; `TERN_AVX512=0` turns them off (to
/// compare, or to rule them out). Their outputs equal the AVX2 kernels' bit
/// for bit.
pub fn avx512_vnni() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            best_kernel() == Kernel::Avx2
                && std::env::var("TERN_AVX512").map_or(true, |v| v != "0")
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// A raw view of the `[act_rows, out_cols]` f32 output that several threads fill,
/// each a disjoint range of columns.
#[derive(Clone, Copy)]
pub struct OutPtr {
    /// First element of the output.
    pub ptr: *mut f32,
    /// Elements per output row (the weight matrix's row count).
    pub stride: usize,
}

// SAFETY: an `OutPtr` is only dereferenced by `gemm_range`, whose contract makes
// concurrent callers write disjoint elements of a buffer that outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Quantizes rows `rows` of `x` (`cols` f32 per row) into `acts` (ggml's AVX2
/// semantics, see [`super::blocks`]).
pub fn quantize_rows(
    kernel: Kernel,
    x: &[f32],
    cols: usize,
    rows: Range<usize>,
    acts: &mut QuantizedActs,
) {
    assert!(rows.end * cols <= x.len() && rows.end <= acts.rows && cols == acts.blocks * QK);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 if best_kernel() == Kernel::Avx2 => {
            // SAFETY: the guard checked (once, cached) that the CPU has AVX2, FMA and
            // F16C, and the bounds were asserted.
            unsafe { avx2::quantize_rows(x, cols, rows, acts) }
        }
        _ => super::blocks::quantize_rows_ref(x, cols, rows, acts),
    }
}

/// Computes output columns `cols` (weight rows) for every activation row:
/// `out[r][c] = dot(w[c], acts[r])`. `cols.start` must be a multiple of [`GROUP`].
///
/// # Safety
/// `out.ptr` must point to `acts.rows * out.stride` writable f32 with
/// `out.stride >= cols.end`, and no other thread may access the elements of columns
/// `cols` while this runs.
pub unsafe fn gemm_range(
    kernel: Kernel,
    w: &PackedWeights,
    acts: &QuantizedActs,
    cols: Range<usize>,
    out: OutPtr,
) {
    assert!(cols.end <= w.rows && cols.start.is_multiple_of(GROUP));
    assert!(acts.blocks == w.blocks_per_row());
    assert!(!w.format.needs_act_sums() || acts.s.len() == acts.d.len());
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 if best_kernel() == Kernel::Avx2 => {
            // SAFETY: the guard checked the CPU features, the bounds were asserted
            // above, and the output contract is the caller's.
            unsafe { avx2::gemm_range(w, acts, 0, cols, out) }
        }
        _ => {
            // SAFETY: the output contract is the caller's.
            unsafe { scalar_gemm_range(w, acts, cols, out) }
        }
    }
}

/// The activation rows of a product laid out for the AVX-512 VNNI kernels
/// ([`wide`]), where they apply: an AVX2 product on a CPU with AVX-512 VNNI
/// ([`avx512_vnni`]), of a format stored one signed byte per value (Q8_0,
/// Q5_0, IQ4_NL in either order), with sixteen rows or more.
#[cfg(target_arch = "x86_64")]
pub fn wide_acts(kernel: Kernel, w: &PackedWeights, acts: &QuantizedActs) -> Option<wide::Acts16> {
    if kernel != Kernel::Avx2 || acts.rows < wide::ROWS || !avx512_vnni() {
        return None;
    }
    wide::Acts16::prepare(w, acts)
}

/// [`gemm_range`], the leading rows by the AVX-512 VNNI kernel where `wide`
/// holds them ([`wide_acts`]), the rest by the AVX2 one: the same outputs.
///
/// # Safety
/// As [`gemm_range`]; `wide` made by [`wide_acts`] from `acts` for `w`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn gemm_range_with(
    kernel: Kernel,
    w: &PackedWeights,
    acts: &QuantizedActs,
    wide: Option<&wide::Acts16>,
    cols: Range<usize>,
    out: OutPtr,
) {
    let Some(a16) = wide else {
        // SAFETY: the caller's contract.
        return unsafe { gemm_range(kernel, w, acts, cols, out) };
    };
    assert!(cols.end <= w.rows && cols.start.is_multiple_of(GROUP));
    // SAFETY: `wide_acts` checked the CPU (AVX2 and AVX-512 VNNI) and the
    // format; the output contract is the caller's.
    unsafe {
        wide::gemm_range(w, a16, cols.clone(), out);
        if a16.rows() < acts.rows {
            avx2::gemm_range(w, acts, a16.rows(), cols, out);
        }
    }
}

/// `hsum_float_8`'s order: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
fn hsum8(a: &[f32; 8]) -> f32 {
    let r = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// # Safety
/// As [`gemm_range`].
unsafe fn scalar_gemm_range(
    w: &PackedWeights,
    acts: &QuantizedActs,
    cols: Range<usize>,
    out: OutPtr,
) {
    let nb = w.blocks_per_row();
    for g in cols.start / GROUP..cols.end.div_ceil(GROUP) {
        let blocks: Vec<_> = (0..nb).map(|b| w.group_block(g, b)).collect();
        if w.order == BlockOrder::Repack {
            // SAFETY: the caller's contract, passed on.
            unsafe { scalar_repacked_group(&blocks, g, acts, cols.end, out) };
            continue;
        }
        if iq4_nl_single(w, acts) {
            for k in 0..GROUP.min(cols.end - g * GROUP) {
                let dd: Vec<f32> = blocks
                    .iter()
                    .enumerate()
                    .map(|(b, blk)| blk.d[k] * acts.d[b])
                    .collect();
                let lanes: Vec<[i32; 8]> = blocks
                    .iter()
                    .enumerate()
                    .map(|(b, blk)| {
                        std::array::from_fn(|l| {
                            (4 * l..4 * l + 4)
                                .map(|j| blk.q[k][j] as i32 * acts.qs[b].0[j] as i32)
                                .sum()
                        })
                    })
                    .collect();
                let v = super::iq4::nl::vec_dot_order(&dd, &lanes);
                // SAFETY: one activation row; `g * GROUP + k < cols.end <= out.stride`,
                // in a column only this call writes (the caller's contract).
                unsafe { *out.ptr.add(g * GROUP + k) = v };
            }
            continue;
        }
        for r in 0..acts.rows {
            // Per row of the group, ggml's AVX2 order: 8 lanes of 4-quant integer
            // dots, each lane `fma(d_w * d_x, lane, acc)` over the blocks, then
            // `hsum_float_8(acc) + summs` with `summs` = sum of `fma(m_w, s_x, .)`.
            let mut acc = [[0f32; 8]; GROUP];
            let mut summs = [0f32; GROUP];
            for (b, blk) in blocks.iter().enumerate() {
                let a = r * nb + b;
                let y = &acts.qs[a].0;
                for k in 0..GROUP {
                    let dd = blk.d[k] * acts.d[a];
                    for (lane, acc) in acc[k].iter_mut().enumerate() {
                        let isum: i32 = (4 * lane..4 * lane + 4)
                            .map(|j| blk.q[k][j] as i32 * y[j] as i32)
                            .sum();
                        *acc = dd.mul_add(isum as f32, *acc);
                    }
                    if w.format.needs_act_sums() {
                        summs[k] = blk.m[k].mul_add(acts.s[a], summs[k]);
                    }
                }
            }
            for k in 0..GROUP.min(cols.end - g * GROUP) {
                let v = hsum8(&acc[k]) + summs[k];
                // SAFETY: `r < acts.rows` and `g * GROUP + k < cols.end <= out.stride`,
                // inside the buffer, in a column only this call writes (the caller's
                // contract).
                unsafe { *out.ptr.add(r * out.stride + g * GROUP + k) = v };
            }
        }
    }
}

/// Whether a product runs `ggml_vec_dot_iq4_nl_q8_0`'s order: an IQ4_NL
/// matrix llama.cpp does not repack, against a single activation row.
fn iq4_nl_single(w: &PackedWeights, acts: &QuantizedActs) -> bool {
    w.format == WeightFormat::Iq4Nl && w.order == BlockOrder::VecDot && acts.rows == 1
}

/// Group `g`'s rows (unpacked `blocks`) against every activation row in
/// [`BlockOrder::Repack`]'s order: per output one chain over the blocks,
/// `acc = fma(isum, d_w * d_x, acc)`, `isum` the block's exact integer dot.
///
/// # Safety
/// As [`gemm_range`], for the group's columns below `cols_end`.
unsafe fn scalar_repacked_group(
    blocks: &[super::blocks::GroupBlock],
    g: usize,
    acts: &QuantizedActs,
    cols_end: usize,
    out: OutPtr,
) {
    let nb = blocks.len();
    for r in 0..acts.rows {
        for k in 0..GROUP.min(cols_end - g * GROUP) {
            let mut acc = 0f32;
            for (b, blk) in blocks.iter().enumerate() {
                let a = r * nb + b;
                let isum: i32 = blk.q[k]
                    .iter()
                    .zip(&acts.qs[a].0)
                    .map(|(&w, &y)| w as i32 * y as i32)
                    .sum();
                acc = (isum as f32).mul_add(blk.d[k] * acts.d[a], acc);
            }
            // SAFETY: `r < acts.rows` and `g * GROUP + k < cols_end <= out.stride`,
            // in a column only this call writes (the caller's contract).
            unsafe { *out.ptr.add(r * out.stride + g * GROUP + k) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod tiles;
#[cfg(target_arch = "x86_64")]
pub mod wide;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{OutPtr, QK};
    use crate::quant::blocks::{BlockOrder, PackedWeights, QuantizedActs, WeightFormat, GROUP};

    const F_Q4_0: u8 = 0;
    const F_Q4_1: u8 = 1;
    /// Q8_0, and Q5_0 (packed as the same signed bytes).
    const F_Q8_0: u8 = 2;
    /// Q5_1: unsigned bytes with Q4_1's offset arithmetic.
    const F_Q5_1: u8 = 3;
    /// Q4_0 in [`BlockOrder::Repack`]'s order: Q4_0's integer dots, each
    /// block's summed whole before its one FMA.
    const F_Q4_0_REPACK: u8 = 4;
    /// Signed bytes (IQ4_NL) in [`BlockOrder::Repack`]'s order.
    const F_Q8_0_REPACK: u8 = 5;
    /// Signed bytes (IQ4_NL) in `ggml_vec_dot_iq4_nl_q8_0`'s order: even and
    /// odd blocks in two accumulators, a last odd block added on its own. Used
    /// for a single activation row only.
    const F_IQ4_NL_VEC: u8 = 6;
    /// Groups per slab in the several-activation-rows path (16 weight rows: a few
    /// KiB that stay in L1 while every activation row passes them).
    const SLAB_GROUPS: usize = 4;
    /// From this many activation rows on, the kernel runs one weight row against
    /// up to 8 activation rows ([`row_chunk`]); below, a weight group against one
    /// or two ([`group`]), which pays less set-up per block.
    const ROW_CHUNK_MIN: usize = 4;
    /// How far ahead of the kernel the weight stream is prefetched, in bytes.
    const PREFETCH_BYTES: usize = 4096;

    /// Whether the format's quants are Q4_0's (in either order).
    const fn is_q4_0(f: u8) -> bool {
        f == F_Q4_0 || f == F_Q4_0_REPACK
    }

    /// Whether the quants are one signed byte per value (in any order).
    const fn signed_bytes(f: u8) -> bool {
        f == F_Q8_0 || f == F_Q8_0_REPACK || f == F_IQ4_NL_VEC
    }

    /// Whether the products follow [`BlockOrder::Repack`].
    const fn is_repack(f: u8) -> bool {
        f == F_Q4_0_REPACK || f == F_Q8_0_REPACK
    }

    const fn quant_bytes(f: u8) -> usize {
        if signed_bytes(f) || f == F_Q5_1 {
            32
        } else {
            16
        }
    }

    /// Whether the format has the offset `m` (and the activations' sums `s`).
    const fn has_m(f: u8) -> bool {
        f == F_Q4_1 || f == F_Q5_1
    }

    const fn scale_words(f: u8) -> usize {
        if has_m(f) {
            2
        } else {
            1
        }
    }

    /// ggml's `hsum_float_8`.
    #[inline(always)]
    pub(super) unsafe fn hsum8(x: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// Lane `i` of `v`.
    #[inline(always)]
    unsafe fn lane(v: __m256, i: usize) -> f32 {
        let mut a = [0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), v);
        a[i]
    }

    /// The four rows of one group block, ready for [`pair`]: Q4_1, Q4_0 and Q5_1
    /// the unsigned values; Q8_0 `(|q|, q)` so that `maddubs(|q|, sign(y, q))`
    /// is `q * y` pairwise (ggml's `mul_sum_i8_pairs_float`).
    #[inline(always)]
    unsafe fn unpack<const F: u8>(q: *const u8) -> [(__m256i, __m256i); GROUP] {
        if F == F_Q5_1 {
            let mut out = [(_mm256_setzero_si256(), _mm256_setzero_si256()); GROUP];
            for (k, o) in out.iter_mut().enumerate() {
                let x = _mm256_load_si256(q.add(k * QK).cast());
                *o = (x, x);
            }
            out
        } else if signed_bytes(F) {
            let mut out = [(_mm256_setzero_si256(), _mm256_setzero_si256()); GROUP];
            for (k, o) in out.iter_mut().enumerate() {
                let x = _mm256_load_si256(q.add(k * QK).cast());
                *o = (_mm256_sign_epi8(x, x), x);
            }
            out
        } else {
            let m = _mm256_set1_epi8(0x0F);
            let p0 = _mm256_load_si256(q.cast());
            let p1 = _mm256_load_si256(q.add(QK).cast());
            let r0 = _mm256_and_si256(p0, m);
            let r1 = _mm256_and_si256(_mm256_srli_epi16::<4>(p0), m);
            let r2 = _mm256_and_si256(p1, m);
            let r3 = _mm256_and_si256(_mm256_srli_epi16::<4>(p1), m);
            [(r0, r0), (r1, r1), (r2, r2), (r3, r3)]
        }
    }

    /// Per activation block, what every pair product with it shares: the quants, and
    /// for Q4_0 `8 * (sum of each group of 4 quants)`, the `- 8` offset's share.
    #[inline(always)]
    unsafe fn act<const F: u8>(y: *const u8) -> (__m256i, __m256i) {
        let y = _mm256_load_si256(y.cast());
        if is_q4_0(F) {
            let s = _mm256_maddubs_epi16(_mm256_set1_epi8(1), y);
            let s = _mm256_madd_epi16(_mm256_set1_epi16(1), s);
            (y, _mm256_slli_epi32::<3>(s))
        } else {
            (y, y)
        }
    }

    /// Eight float lanes, each the exact integer dot of 4 consecutive quant pairs.
    #[inline(always)]
    unsafe fn pair<const F: u8>(w: (__m256i, __m256i), y: (__m256i, __m256i)) -> __m256 {
        _mm256_cvtepi32_ps(pair_int::<F>(w, y))
    }

    /// [`pair`]'s lanes as integers.
    #[inline(always)]
    unsafe fn pair_int<const F: u8>(w: (__m256i, __m256i), y: (__m256i, __m256i)) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        if is_q4_0(F) {
            // (q - 8) . y = q . y - 8 * sum(y), lane by lane, exactly.
            return _mm256_sub_epi32(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(w.0, y.0)), y.1);
        }
        match F {
            F_Q4_1 | F_Q5_1 => _mm256_madd_epi16(ones, _mm256_maddubs_epi16(w.0, y.0)),
            _ => _mm256_madd_epi16(ones, _mm256_maddubs_epi16(w.0, _mm256_sign_epi8(y.0, w.1))),
        }
    }

    /// The lane totals of four vectors, `[sum p0, sum p1, sum p2, sum p3]` (exact).
    #[inline(always)]
    unsafe fn totals4(p: [__m256i; 4]) -> __m128i {
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
    }

    /// The lane totals of eight vectors, `[sum p0, .., sum p7]` (exact).
    #[inline(always)]
    unsafe fn totals8(p: [__m256i; 8]) -> __m256i {
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    }

    /// The f16 scales of one group block as f32: Q4_1 and Q5_1
    /// `[d0 m0 d1 m1 d2 m2 d3 m3]`, others `[d0 d1 d2 d3 0 0 0 0]`.
    #[inline(always)]
    unsafe fn scales<const F: u8>(s: *const u16) -> __m256 {
        if has_m(F) {
            _mm256_cvtph_ps(_mm_loadu_si128(s.cast()))
        } else {
            _mm256_cvtph_ps(_mm_loadl_epi64(s.cast()))
        }
    }

    /// Group `g` (weight rows `4g..4g + 4`) against activation rows `r0..r0 + R`:
    /// `out[ri][k] = dot(row 4g + k, act row r0 + ri)`, in ggml's order per pair.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `g` and the activation rows in bounds.
    #[inline(always)]
    unsafe fn group<const F: u8, const R: usize, const PREFETCH: bool>(
        w: &PackedWeights,
        g: usize,
        acts: &QuantizedActs,
        r0: usize,
    ) -> [[f32; GROUP]; R] {
        let nb = acts.blocks;
        let (qstep, sstep) = (GROUP * quant_bytes(F), GROUP * scale_words(F));
        let wq = w.quants.as_slice().as_ptr().add(g * nb * qstep);
        let ws = w.scales.as_ptr().add(g * nb * sstep);
        let aq = acts.qs.as_ptr().add(r0 * nb).cast::<u8>();
        let ad = acts.d.as_ptr().add(r0 * nb);
        let asum = if has_m(F) {
            acts.s.as_ptr().add(r0 * nb)
        } else {
            ad
        };
        // Row k's scale `d` is lane `k` (Q4_1: `2k`; its `m` is lane `2k + 1`).
        let d_lane = |k: usize| if has_m(F) { 2 * k as i32 } else { k as i32 };
        let mut acc = [[_mm256_setzero_ps(); GROUP]; R];
        // `ggml_vec_dot_iq4_nl_q8_0`'s odd blocks, and its unpaired last block's
        // `(d_w * d_x, isum)` per row.
        let mut acc_odd = [[_mm256_setzero_ps(); GROUP]; R];
        let mut tail = [[(0f32, 0i32); GROUP]; R];
        // The repacked order's accumulators: lane `k` for row `4g + k`.
        let mut acc_rep = [_mm_setzero_ps(); R];
        let mut summs = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            if PREFETCH {
                // Pointers only: `wrapping_add` may run past the end, which a
                // prefetch tolerates.
                let q = wq.wrapping_add(b * qstep + PREFETCH_BYTES);
                _mm_prefetch::<_MM_HINT_T0>(q.cast());
                if qstep > 64 {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64).cast());
                }
                if b % 4 == 0 {
                    let ahead = PREFETCH_BYTES * sstep * 2 / qstep;
                    let s = ws.wrapping_add(b * sstep).cast::<u8>().wrapping_add(ahead);
                    _mm_prefetch::<_MM_HINT_T0>(s.cast());
                }
            }
            let wv = unpack::<F>(wq.add(b * qstep));
            let sv = scales::<F>(ws.add(b * sstep));
            for ri in 0..R {
                let a = ri * nb + b;
                let y = act::<F>(aq.add(a * QK));
                // d_w * d_x for each row at once, then broadcast row by row: the same
                // products ggml forms one at a time.
                let dv = _mm256_mul_ps(sv, _mm256_broadcast_ss(&*ad.add(a)));
                if F == F_IQ4_NL_VEC {
                    for k in 0..GROUP {
                        let dd = _mm256_permutevar8x32_ps(dv, _mm256_set1_epi32(k as i32));
                        if b % 2 == 1 {
                            acc_odd[ri][k] =
                                _mm256_fmadd_ps(dd, pair::<F>(wv[k], y), acc_odd[ri][k]);
                        } else if b + 1 < nb {
                            acc[ri][k] = _mm256_fmadd_ps(dd, pair::<F>(wv[k], y), acc[ri][k]);
                        } else {
                            let t = totals4([
                                pair_int::<F>(wv[k], y),
                                _mm256_setzero_si256(),
                                _mm256_setzero_si256(),
                                _mm256_setzero_si256(),
                            ]);
                            tail[ri][k] = (lane(dv, k), _mm_cvtsi128_si32(t));
                        }
                    }
                    continue;
                }
                if is_repack(F) {
                    // Lanes 0..4 of `dv` are the four rows' `d_w * d_x`.
                    let t = totals4(std::array::from_fn(|k| pair_int::<F>(wv[k], y)));
                    let dd = _mm256_castps256_ps128(dv);
                    acc_rep[ri] = _mm_fmadd_ps(_mm_cvtepi32_ps(t), dd, acc_rep[ri]);
                    continue;
                }
                for k in 0..GROUP {
                    let dd = _mm256_permutevar8x32_ps(dv, _mm256_set1_epi32(d_lane(k)));
                    acc[ri][k] = _mm256_fmadd_ps(dd, pair::<F>(wv[k], y), acc[ri][k]);
                }
                if has_m(F) {
                    // Lane 2k + 1: fma(m_k, s_x, summs_k), ggml's scalar `summs`.
                    summs[ri] = _mm256_fmadd_ps(sv, _mm256_broadcast_ss(&*asum.add(a)), summs[ri]);
                }
            }
        }
        let mut out = [[0f32; GROUP]; R];
        if is_repack(F) {
            for (o, a) in out.iter_mut().zip(&acc_rep) {
                _mm_storeu_ps(o.as_mut_ptr(), *a);
            }
            return out;
        }
        if F == F_IQ4_NL_VEC {
            for ri in 0..R {
                for k in 0..GROUP {
                    let s = hsum8(_mm256_add_ps(acc[ri][k], acc_odd[ri][k]));
                    let (dd, isum) = tail[ri][k];
                    out[ri][k] = if nb % 2 == 1 {
                        dd.mul_add(isum as f32, s)
                    } else {
                        s
                    };
                }
            }
            return out;
        }
        for ri in 0..R {
            for k in 0..GROUP {
                let m = if has_m(F) {
                    lane(summs[ri], 2 * k + 1)
                } else {
                    0.0
                };
                out[ri][k] = hsum8(acc[ri][k]) + m;
            }
        }
        out
    }

    /// Writes a group's results for activation rows `r0..`, skipping padding rows.
    #[inline(always)]
    unsafe fn store<const R: usize>(
        out: OutPtr,
        c0: usize,
        c_end: usize,
        r0: usize,
        v: [[f32; GROUP]; R],
    ) {
        for (ri, row) in v.iter().enumerate() {
            for (k, &x) in row.iter().enumerate().take(c_end - c0) {
                *out.ptr.add((r0 + ri) * out.stride + c0 + k) = x;
            }
        }
    }

    /// One weight row's block as [`pair`] wants it (see [`unpack`]).
    #[inline(always)]
    unsafe fn unpack_row<const F: u8>(q: *const u8, k: usize) -> (__m256i, __m256i) {
        if signed_bytes(F) {
            let x = _mm256_load_si256(q.add(k * QK).cast());
            (_mm256_sign_epi8(x, x), x)
        } else if F == F_Q5_1 {
            let x = _mm256_load_si256(q.add(k * QK).cast());
            (x, x)
        } else {
            let p = _mm256_load_si256(q.add((k / 2) * QK).cast());
            let p = if k % 2 == 1 {
                _mm256_srli_epi16::<4>(p)
            } else {
                p
            };
            let r = _mm256_and_si256(p, _mm256_set1_epi8(0x0F));
            (r, r)
        }
    }

    /// An f16 bit pattern as f32.
    #[inline(always)]
    unsafe fn f16_bits(h: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// What [`row_chunk`] reads about a chunk of up to 8 activation rows, laid out
    /// block-major so that one load gives a block's value for every row of the chunk.
    struct Chunk {
        /// First activation row.
        r0: usize,
        /// `[block][8]`: the rows' `d` (zero past the chunk's end).
        d: Vec<f32>,
        /// `[block][8]`: the rows' Q8_1 `s` (Q4_1 only).
        s: Vec<f32>,
        /// `[row][block]`: Q4_0's `8 * (sum of each group of 4 quants)` lanes.
        offsets: Vec<__m256i>,
    }

    impl Chunk {
        #[inline(always)]
        unsafe fn new<const F: u8>(acts: &QuantizedActs, r0: usize, rows: usize) -> Self {
            let nb = acts.blocks;
            let mut d = vec![0f32; nb * 8];
            let mut s = vec![0f32; if has_m(F) { nb * 8 } else { 0 }];
            let mut offsets = Vec::new();
            for r in 0..rows {
                for b in 0..nb {
                    let a = (r0 + r) * nb + b;
                    d[b * 8 + r] = acts.d[a];
                    if has_m(F) {
                        s[b * 8 + r] = acts.s[a];
                    }
                    if is_q4_0(F) {
                        offsets.push(act::<F>(acts.qs[a].0.as_ptr().cast()).1);
                    }
                }
            }
            Self { r0, d, s, offsets }
        }
    }

    /// Weight row `4g + k` against the `R` activation rows of `chunk`, in ggml's
    /// order per pair (the same operations as [`group`], arranged so that no pair
    /// pays for a shuffle): first every block's `d_w * d_x` for all rows with one
    /// multiply into `dd` (and Q4_1's `summs` as 8 scalar chains side by side), then
    /// per block one unpack shared by the rows, each pair broadcasting its scale
    /// from `dd`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `g`, `k < GROUP` and the chunk in bounds;
    /// `dd` holds `8 * blocks` floats.
    #[inline(always)]
    unsafe fn row_chunk<const F: u8, const R: usize, const PREFETCH: bool>(
        w: &PackedWeights,
        g: usize,
        k: usize,
        acts: &QuantizedActs,
        chunk: &Chunk,
        dd: &mut [f32],
    ) -> [f32; R] {
        let nb = acts.blocks;
        let (qstep, sstep) = (GROUP * quant_bytes(F), GROUP * scale_words(F));
        let wq = w.quants.as_slice().as_ptr().add(g * nb * qstep);
        let ws = w.scales.as_ptr().add(g * nb * sstep + k * scale_words(F));
        let mut summs = _mm256_setzero_ps();
        for b in 0..nb {
            let dw = _mm256_set1_ps(f16_bits(*ws.add(b * sstep)));
            let dv = _mm256_mul_ps(dw, _mm256_loadu_ps(chunk.d.as_ptr().add(b * 8)));
            _mm256_storeu_ps(dd.as_mut_ptr().add(b * 8), dv);
            if has_m(F) {
                let m = _mm256_set1_ps(f16_bits(*ws.add(b * sstep + 1)));
                let s = _mm256_loadu_ps(chunk.s.as_ptr().add(b * 8));
                summs = _mm256_fmadd_ps(m, s, summs);
            }
        }
        let aq = acts.qs.as_ptr().add(chunk.r0 * nb).cast::<u8>();
        let mut acc = [_mm256_setzero_ps(); R];
        // The repacked order's accumulator: lane `r` for activation row `r`.
        let mut acc_rep = _mm256_setzero_ps();
        for b in 0..nb {
            if PREFETCH && k == 0 {
                // The same block of the group a slab ahead: by the time the kernel
                // gets there it is in L1 (pointers only; a prefetch past the end is
                // harmless).
                let q = wq.wrapping_add(b * qstep + SLAB_GROUPS * nb * qstep);
                _mm_prefetch::<_MM_HINT_T0>(q.cast());
                if qstep > 64 {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64).cast());
                }
                if b % 4 == 0 {
                    let s = ws.wrapping_add(b * sstep + SLAB_GROUPS * nb * sstep);
                    _mm_prefetch::<_MM_HINT_T0>(s.cast());
                }
            }
            let wv = unpack_row::<F>(wq.add(b * qstep), k);
            if is_repack(F) {
                let mut p = [_mm256_setzero_si256(); 8];
                for (r, p) in p.iter_mut().enumerate().take(R) {
                    let a = r * nb + b;
                    let y = _mm256_load_si256(aq.add(a * QK).cast());
                    let off = if is_q4_0(F) {
                        *chunk.offsets.as_ptr().add(a)
                    } else {
                        y
                    };
                    *p = pair_int::<F>(wv, (y, off));
                }
                let dd = _mm256_loadu_ps(dd.as_ptr().add(b * 8));
                acc_rep = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals8(p)), dd, acc_rep);
                continue;
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = r * nb + b;
                let y = _mm256_load_si256(aq.add(a * QK).cast());
                let off = if is_q4_0(F) {
                    *chunk.offsets.as_ptr().add(a)
                } else {
                    y
                };
                let scale = _mm256_broadcast_ss(&*dd.as_ptr().add(b * 8 + r));
                *acc = _mm256_fmadd_ps(scale, pair::<F>(wv, (y, off)), *acc);
            }
        }
        let mut m = [0f32; 8];
        if is_repack(F) {
            _mm256_storeu_ps(m.as_mut_ptr(), acc_rep);
            return std::array::from_fn(|r| m[r]);
        }
        _mm256_storeu_ps(m.as_mut_ptr(), summs);
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum8(acc[r]) + if has_m(F) { m[r] } else { 0.0 };
        }
        out
    }

    /// Every row of `chunk` against weight rows `cols` of the slab's groups.
    #[inline(always)]
    unsafe fn chunk_slab<const F: u8, const R: usize>(
        w: &PackedWeights,
        groups: Range<usize>,
        cols_end: usize,
        acts: &QuantizedActs,
        chunk: &Chunk,
        dd: &mut [f32],
        out: OutPtr,
    ) {
        for g in groups {
            for k in 0..GROUP.min(cols_end - g * GROUP) {
                let v = if chunk.r0 == 0 {
                    row_chunk::<F, R, true>(w, g, k, acts, chunk, dd)
                } else {
                    row_chunk::<F, R, false>(w, g, k, acts, chunk, dd)
                };
                for (r, x) in v.into_iter().enumerate() {
                    *out.ptr.add((chunk.r0 + r) * out.stride + g * GROUP + k) = x;
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemm_fmt<const F: u8>(
        w: &PackedWeights,
        acts: &QuantizedActs,
        first: usize,
        cols: Range<usize>,
        out: OutPtr,
    ) {
        let (g0, g1) = (cols.start / GROUP, cols.end.div_ceil(GROUP));
        let c_end = |g: usize| cols.end.min((g + 1) * GROUP);
        if acts.rows == 1 {
            // The kernel prefetches a fixed distance ahead; start the stream here.
            let nb = acts.blocks;
            let (qstep, sstep) = (GROUP * quant_bytes(F), GROUP * scale_words(F));
            let q0 = w.quants.as_slice().as_ptr().wrapping_add(g0 * nb * qstep);
            let s0 = w.scales.as_ptr().wrapping_add(g0 * nb * sstep).cast::<u8>();
            for off in (0..PREFETCH_BYTES).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(q0.wrapping_add(off).cast());
            }
            for off in (0..PREFETCH_BYTES * sstep * 2 / qstep).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(s0.wrapping_add(off).cast());
            }
            for g in g0..g1 {
                store::<1>(
                    out,
                    g * GROUP,
                    c_end(g),
                    0,
                    group::<F, 1, true>(w, g, acts, 0),
                );
            }
            return;
        }
        if acts.rows < ROW_CHUNK_MIN {
            let mut slab = g0;
            while slab < g1 {
                let slab_end = g1.min(slab + SLAB_GROUPS);
                let mut r = 0;
                while r + 2 <= acts.rows {
                    for g in slab..slab_end {
                        let v = if r == 0 {
                            group::<F, 2, true>(w, g, acts, r)
                        } else {
                            group::<F, 2, false>(w, g, acts, r)
                        };
                        store::<2>(out, g * GROUP, c_end(g), r, v);
                    }
                    r += 2;
                }
                if r < acts.rows {
                    for g in slab..slab_end {
                        let v = group::<F, 1, false>(w, g, acts, r);
                        store::<1>(out, g * GROUP, c_end(g), r, v);
                    }
                }
                slab = slab_end;
            }
            return;
        }
        let chunks: Vec<Chunk> = (first..acts.rows)
            .step_by(8)
            .map(|r0| Chunk::new::<F>(acts, r0, (acts.rows - r0).min(8)))
            .collect();
        let mut dd = vec![0f32; acts.blocks * 8];
        let mut slab = g0;
        while slab < g1 {
            let slab_end = g1.min(slab + SLAB_GROUPS);
            for chunk in &chunks {
                let (gs, dd) = (slab..slab_end, dd.as_mut_slice());
                match acts.rows - chunk.r0 {
                    1 => chunk_slab::<F, 1>(w, gs, cols.end, acts, chunk, dd, out),
                    2 => chunk_slab::<F, 2>(w, gs, cols.end, acts, chunk, dd, out),
                    3 => chunk_slab::<F, 3>(w, gs, cols.end, acts, chunk, dd, out),
                    4 => chunk_slab::<F, 4>(w, gs, cols.end, acts, chunk, dd, out),
                    5 => chunk_slab::<F, 5>(w, gs, cols.end, acts, chunk, dd, out),
                    6 => chunk_slab::<F, 6>(w, gs, cols.end, acts, chunk, dd, out),
                    7 => chunk_slab::<F, 7>(w, gs, cols.end, acts, chunk, dd, out),
                    _ => chunk_slab::<F, 8>(w, gs, cols.end, acts, chunk, dd, out),
                }
            }
            slab = slab_end;
        }
    }

    /// # Safety
    /// As [`super::gemm_range`], plus AVX2, FMA and F16C available.
    pub unsafe fn gemm_range(
        w: &PackedWeights,
        acts: &QuantizedActs,
        first: usize,
        cols: Range<usize>,
        out: OutPtr,
    ) {
        if first > 0 {
            // The rows after those the AVX-512 kernel took.
            assert!(first < acts.rows && first.is_multiple_of(8) && acts.rows >= ROW_CHUNK_MIN);
            return match (w.format, w.order) {
                (WeightFormat::Iq4Nl, BlockOrder::Repack) => {
                    gemm_fmt::<F_Q8_0_REPACK>(w, acts, first, cols, out)
                }
                (WeightFormat::Q8_0 | WeightFormat::Q5_0 | WeightFormat::Iq4Nl, _) => {
                    gemm_fmt::<F_Q8_0>(w, acts, first, cols, out)
                }
                _ => panic!("rows past the AVX-512 kernel's for {:?}", w.format),
            };
        }
        match w.format {
            WeightFormat::Q4_0
                if w.order == BlockOrder::Repack && acts.rows >= super::tiles::MIN_ROWS =>
            {
                super::tiles::q4_0(w, acts, cols, out)
            }
            WeightFormat::Q4_0 if w.order == BlockOrder::Repack => {
                gemm_fmt::<F_Q4_0_REPACK>(w, acts, 0, cols, out)
            }
            WeightFormat::Q4_0 => gemm_fmt::<F_Q4_0>(w, acts, 0, cols, out),
            WeightFormat::Q4_1 => gemm_fmt::<F_Q4_1>(w, acts, 0, cols, out),
            WeightFormat::Q8_0 | WeightFormat::Q5_0 => gemm_fmt::<F_Q8_0>(w, acts, 0, cols, out),
            WeightFormat::Q5_1 => gemm_fmt::<F_Q5_1>(w, acts, 0, cols, out),
            WeightFormat::Iq4Nl if w.order == BlockOrder::Repack => {
                gemm_fmt::<F_Q8_0_REPACK>(w, acts, 0, cols, out)
            }
            WeightFormat::Iq4Nl if acts.rows == 1 => {
                gemm_fmt::<F_IQ4_NL_VEC>(w, acts, 0, cols, out)
            }
            WeightFormat::Iq4Nl => gemm_fmt::<F_Q8_0>(w, acts, 0, cols, out),
        }
    }

    /// ggml's AVX2 `quantize_row_q8_{0,1}` for one block.
    #[inline(always)]
    unsafe fn quantize_block(x: *const f32, q: *mut u8, with_sum: bool) -> (f32, f32) {
        let v = [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[1]));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[2]));
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[3]));
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mul = _mm256_set1_ps(id);
        const RND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let i0 = _mm256_cvtps_epi32(_mm256_round_ps::<RND>(_mm256_mul_ps(v[0], mul)));
        let i1 = _mm256_cvtps_epi32(_mm256_round_ps::<RND>(_mm256_mul_ps(v[1], mul)));
        let i2 = _mm256_cvtps_epi32(_mm256_round_ps::<RND>(_mm256_mul_ps(v[2], mul)));
        let i3 = _mm256_cvtps_epi32(_mm256_round_ps::<RND>(_mm256_mul_ps(v[3], mul)));
        let s = if with_sum {
            let t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            let t = _mm_add_epi32(_mm256_extracti128_si256::<1>(t), _mm256_castsi256_si128(t));
            let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
            let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01>(t));
            f16_round(d * _mm_cvtsi128_si32(t) as f32)
        } else {
            0.0
        };
        // Saturating packs, then undo their lane interleaving.
        let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_store_si256(q.cast(), p);
        (f16_round(d), s)
    }

    /// `x` rounded to the nearest f16 (ties to even), as f32.
    #[inline(always)]
    unsafe fn f16_round(x: f32) -> f32 {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x));
        _mm_cvtss_f32(_mm_cvtph_ps(h))
    }

    /// # Safety
    /// AVX2, FMA and F16C available; `rows.end * cols <= x.len()`,
    /// `rows.end <= acts.rows`, `cols == acts.blocks * 32`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_rows(
        x: &[f32],
        cols: usize,
        rows: Range<usize>,
        acts: &mut QuantizedActs,
    ) {
        let nb = cols / QK;
        let with_sum = !acts.s.is_empty();
        for r in rows {
            for b in 0..nb {
                let i = r * nb + b;
                let src = x.as_ptr().add(r * cols + b * QK);
                let (d, s) = quantize_block(src, acts.qs[i].0.as_mut_ptr().cast(), with_sum);
                acts.d[i] = d;
                if with_sum {
                    acts.s[i] = s;
                }
            }
        }
    }
}
