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
//! Tiling: with one activation row, four weight rows are dotted at once (four
//! independent FMA chains); with several, each weight row is dotted against up to
//! four activation rows, its block unpacked once, over a 16-row slab of weights that
//! stays in L1 while every activation row passes it.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use super::blocks::{PackedWeights, QuantizedActs, WeightFormat, QK};

/// Which implementation computes.
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
        Kernel::Avx2 => {
            // SAFETY: `Avx2` is only chosen after run-time detection of AVX2, FMA and
            // F16C (tests call it only on such CPUs), and the bounds were asserted.
            unsafe { avx2::quantize_rows(x, cols, rows, acts) }
        }
        _ => super::blocks::quantize_rows_ref(x, cols, rows, acts),
    }
}

/// Computes output columns `cols` (weight rows) for every activation row:
/// `out[r][c] = dot(w[c], acts[r])`.
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
    assert!(cols.end <= w.rows && acts.blocks == w.blocks_per_row());
    assert!(!w.format.needs_act_sums() || acts.s.len() == acts.d.len());
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            // SAFETY: the features were detected (see `quantize_rows`), the bounds
            // asserted above, and the output contract is the caller's.
            unsafe { avx2::gemm_range(w, acts, cols, out) }
        }
        _ => {
            // SAFETY: the output contract is the caller's.
            unsafe { scalar_gemm_range(w, acts, cols, out) }
        }
    }
}

/// `hsum_float_8`'s order: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
fn hsum8(a: &[f32; 8]) -> f32 {
    let r = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One weight row against one activation row, scalar, in ggml's AVX2 order.
fn scalar_dot(w: &PackedWeights, c: usize, acts: &QuantizedActs, r: usize) -> f32 {
    let nb = w.blocks_per_row();
    let fmt = w.format;
    let (qb, sw) = (fmt.quant_bytes(), fmt.scale_words());
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for b in 0..nb {
        let a = r * nb + b;
        let y = &acts.qs[a].0;
        let slot = w.slot(c, b);
        let ws = &w.scales[slot * sw..(slot + 1) * sw];
        let dw = half::f16::from_bits(ws[0]).to_f32();
        let dd = dw * acts.d[a];
        let q = &w.quants.as_slice()[slot * qb..(slot + 1) * qb];
        let wval = |e: usize| -> i32 {
            match fmt {
                WeightFormat::Q4_0 => {
                    (if e < 16 { q[e] & 0x0F } else { q[e - 16] >> 4 }) as i32 - 8
                }
                WeightFormat::Q4_1 => (if e < 16 { q[e] & 0x0F } else { q[e - 16] >> 4 }) as i32,
                WeightFormat::Q8_0 => q[e] as i8 as i32,
            }
        };
        for (lane, acc) in acc.iter_mut().enumerate() {
            let isum: i32 = (4 * lane..4 * lane + 4)
                .map(|e| wval(e) * y[e] as i32)
                .sum();
            *acc = dd.mul_add(isum as f32, *acc);
        }
        if fmt == WeightFormat::Q4_1 {
            let m = half::f16::from_bits(ws[1]).to_f32();
            summs = m.mul_add(acts.s[a], summs);
        }
    }
    hsum8(&acc) + summs
}

/// # Safety
/// As [`gemm_range`].
unsafe fn scalar_gemm_range(
    w: &PackedWeights,
    acts: &QuantizedActs,
    cols: Range<usize>,
    out: OutPtr,
) {
    for c in cols {
        for r in 0..acts.rows {
            let v = scalar_dot(w, c, acts, r);
            // SAFETY: `r < acts.rows` and `c < cols.end <= out.stride`, inside the
            // buffer, in a column only this call writes (the caller's contract).
            unsafe { *out.ptr.add(r * out.stride + c) = v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{OutPtr, QK};
    use crate::quant::blocks::{ActBlock, PackedWeights, QuantizedActs, WeightFormat, GROUP};

    const F_Q4_0: u8 = 0;
    const F_Q4_1: u8 = 1;
    const F_Q8_0: u8 = 2;
    /// Weight rows per slab in the several-activation-rows path.
    const SLAB: usize = 16;

    fn prefetch_ahead() -> usize {
        static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *V.get_or_init(|| {
            std::env::var("TERN_PF")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2048)
        })
    }

    /// ggml's `hsum_float_8`.
    #[inline(always)]
    unsafe fn hsum8(x: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// 16 bytes of packed nibbles to 32 bytes: low nibbles then high nibbles.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY (caller): `p` is 16-byte aligned with 16 readable bytes.
        let lo = _mm_load_si128(p.cast());
        let hi = _mm_srli_epi16::<4>(lo);
        _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0x0F))
    }

    /// A weight block ready for the pair product: `(multiplicand, sign source)`.
    /// Q4_1: (unsigned nibbles, unused); Q4_0 / Q8_0: (|q|, q), so that
    /// `maddubs(|q|, sign(y, q)) = q * y` pairwise, as ggml's `mul_sum_i8_pairs_float`.
    #[inline(always)]
    unsafe fn load_w<const F: u8>(p: *const u8) -> (__m256i, __m256i) {
        match F {
            F_Q4_1 => {
                let x = nibbles(p);
                (x, x)
            }
            F_Q4_0 => {
                let x = _mm256_sub_epi8(nibbles(p), _mm256_set1_epi8(8));
                (_mm256_sign_epi8(x, x), x)
            }
            _ => {
                let x = _mm256_load_si256(p.cast());
                (_mm256_sign_epi8(x, x), x)
            }
        }
    }

    /// Eight float lanes, each the integer dot of 4 consecutive quant pairs.
    #[inline(always)]
    unsafe fn pair<const F: u8>(w: (__m256i, __m256i), y: __m256i) -> __m256 {
        let dot = if F == F_Q4_1 {
            _mm256_maddubs_epi16(w.0, y)
        } else {
            _mm256_maddubs_epi16(w.0, _mm256_sign_epi8(y, w.1))
        };
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
    }

    /// `(d, m)` of the weight block in slot `slot` (`m` = 0 unless Q4_1).
    #[inline(always)]
    unsafe fn scales<const F: u8>(s: *const u16, slot: usize) -> (f32, f32) {
        if F == F_Q4_1 {
            let bits = s.add(2 * slot).cast::<i32>().read_unaligned();
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
        } else {
            let bits = *s.add(slot) as i32;
            (_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))), 0.0)
        }
    }

    const fn qbytes(f: u8) -> usize {
        if f == F_Q8_0 {
            32
        } else {
            16
        }
    }

    const fn swords(f: u8) -> usize {
        if f == F_Q4_1 {
            2
        } else {
            1
        }
    }

    /// `W` weight rows (from `c0`: a whole group if `W` is 4, else rows whose slots
    /// have the same stride) against `R` activation rows (from `r0`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; rows in bounds of `w` and `acts`.
    #[inline(always)]
    unsafe fn micro<const F: u8, const W: usize, const R: usize>(
        w: &PackedWeights,
        c0: usize,
        acts: &QuantizedActs,
        r0: usize,
    ) -> [[f32; R]; W] {
        let nb = acts.blocks;
        let (slot0, stride) = (w.slot(c0, 0), w.slot_stride(c0));
        let row_step = if W == 1 { 0 } else { w.slot(c0 + 1, 0) - slot0 };
        let wq = w.quants.as_slice().as_ptr().add(slot0 * qbytes(F));
        let ws = w.scales.as_ptr().add(slot0 * swords(F));
        let aq = acts.qs.as_ptr().add(r0 * nb);
        let ad = acts.d.as_ptr().add(r0 * nb);
        let asum = if F == F_Q4_1 {
            acts.s.as_ptr().add(r0 * nb)
        } else {
            ad
        };
        let mut acc = [[_mm256_setzero_ps(); R]; W];
        let mut summs = [[0f32; R]; W];
        let pf = prefetch_ahead();
        for b in 0..nb {
            if W == GROUP && pf > 0 {
                // One group block = GROUP * quant bytes, contiguous with the next group.
                let q = wq.wrapping_add(b * GROUP * qbytes(F) + pf);
                _mm_prefetch::<_MM_HINT_T0>(q.cast());
                if qbytes(F) * GROUP > 64 {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(64).cast());
                }
                if b % 4 == 0 {
                    let sp = ws.wrapping_add(b * GROUP * swords(F) + pf / 8).cast::<i8>();
                    _mm_prefetch::<_MM_HINT_T0>(sp);
                }
            }
            for wi in 0..W {
                let slot = b * stride + wi * row_step;
                let wv = load_w::<F>(wq.add(slot * qbytes(F)));
                let (dw, mw) = scales::<F>(ws, slot);
                let dwv = _mm256_set1_ps(dw);
                for ri in 0..R {
                    let a = ri * nb + b;
                    let y = _mm256_load_si256(aq.add(a).cast::<ActBlock>().cast());
                    let dd = _mm256_mul_ps(dwv, _mm256_broadcast_ss(&*ad.add(a)));
                    acc[wi][ri] = _mm256_fmadd_ps(dd, pair::<F>(wv, y), acc[wi][ri]);
                    if F == F_Q4_1 {
                        summs[wi][ri] = mw.mul_add(*asum.add(a), summs[wi][ri]);
                    }
                }
            }
        }
        let mut out = [[0f32; R]; W];
        for wi in 0..W {
            for ri in 0..R {
                out[wi][ri] = hsum8(acc[wi][ri]) + summs[wi][ri];
            }
        }
        out
    }

    #[inline(always)]
    unsafe fn store<const W: usize, const R: usize>(
        out: OutPtr,
        c0: usize,
        r0: usize,
        v: [[f32; R]; W],
    ) {
        for (wi, col) in v.iter().enumerate() {
            for (ri, &x) in col.iter().enumerate() {
                *out.ptr.add((r0 + ri) * out.stride + c0 + wi) = x;
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemm_fmt<const F: u8>(
        w: &PackedWeights,
        acts: &QuantizedActs,
        cols: Range<usize>,
        out: OutPtr,
    ) {
        if acts.rows == 1 {
            let mut c = cols.start;
            let grouped = w.grouped_rows().min(cols.end);
            while c % GROUP != 0 && c < cols.end {
                store::<1, 1>(out, c, 0, micro::<F, 1, 1>(w, c, acts, 0));
                c += 1;
            }
            while c + GROUP <= grouped {
                store::<GROUP, 1>(out, c, 0, micro::<F, GROUP, 1>(w, c, acts, 0));
                c += GROUP;
            }
            while c < cols.end {
                store::<1, 1>(out, c, 0, micro::<F, 1, 1>(w, c, acts, 0));
                c += 1;
            }
            return;
        }
        let mut slab = cols.start;
        while slab < cols.end {
            let slab_end = cols.end.min(slab + SLAB);
            let mut r = 0;
            while r + 4 <= acts.rows {
                for c in slab..slab_end {
                    store::<1, 4>(out, c, r, micro::<F, 1, 4>(w, c, acts, r));
                }
                r += 4;
            }
            for c in slab..slab_end {
                match acts.rows - r {
                    3 => store::<1, 3>(out, c, r, micro::<F, 1, 3>(w, c, acts, r)),
                    2 => store::<1, 2>(out, c, r, micro::<F, 1, 2>(w, c, acts, r)),
                    1 => store::<1, 1>(out, c, r, micro::<F, 1, 1>(w, c, acts, r)),
                    _ => {}
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
        cols: Range<usize>,
        out: OutPtr,
    ) {
        match w.format {
            WeightFormat::Q4_0 => gemm_fmt::<F_Q4_0>(w, acts, cols, out),
            WeightFormat::Q4_1 => gemm_fmt::<F_Q4_1>(w, acts, cols, out),
            WeightFormat::Q8_0 => gemm_fmt::<F_Q8_0>(w, acts, cols, out),
        }
    }

    /// ggml's AVX2 `quantize_row_q8_{0,1}` for one block.
    #[inline(always)]
    unsafe fn quantize_block(x: *const f32, q: *mut ActBlock, with_sum: bool) -> (f32, f32) {
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
        let p0 = _mm256_packs_epi32(i0, i1);
        let p1 = _mm256_packs_epi32(i2, i3);
        let p = _mm256_packs_epi16(p0, p1);
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
                let (d, s) =
                    quantize_block(x.as_ptr().add(r * cols + b * QK), &mut acts.qs[i], with_sum);
                acts.d[i] = d;
                if with_sum {
                    acts.s[i] = s;
                }
            }
        }
    }
}
