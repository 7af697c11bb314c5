//! AVX-512 VNNI products for the formats stored one signed byte per value
//! (Q8_0, Q5_0 and IQ4_NL, in Q8_0's order) from sixteen activation rows on:
//! the prefill-sized products of the models that ship them (Qwen2.5-Coder
//! 0.5B and Gemma 3 spend most of a prefill in Q5_0).
//!
//! The AVX2 kernel ([`super::avx2`]) gives each (weight row, activation row)
//! pair eight float lanes, each lane `fma(d_w * d_x, lane_dot, acc)` per
//! block, where `lane_dot` is the exact integer dot of four consecutive
//! quant pairs (`maddubs(|w|, sign(y, w))` then `madd` by ones), and sums
//! the lanes at the end in `hsum_float_8`'s order. Here a 512-bit vector
//! holds two activation rows' eight lanes, so one `dpbusd` forms sixteen
//! lane dots. It needs an unsigned operand: the weight bytes offset by 128
//! (`w ^ 0x80`), so each lane is `sum (w + 128) y`, and `128 * sum y` per
//! lane, computed once per activation block, is where the sum starts. Both are
//! exact integers, so every lane equals the AVX2 kernel's (its `sign` trick
//! is exact too, as Q8_0 activations never hold -128), and the float
//! operations are the same ones in the same order: the outputs agree bit for
//! bit. Two weight rows run at a time, sharing each activation load.
//!
//! IQ4_NL in llama.cpp's repacked order ([`BlockOrder::Repack`]) totals each
//! block's 32 products exactly before one `fma(total, d_w * d_x, acc)` per
//! output; there a vector holds sixteen activation rows, one per lane, and a
//! block's total is eight `dpbusd` against each 4-byte chunk of the weight
//! block broadcast to every lane (the same offset taken out), so sixteen
//! outputs' chains run as the lanes of one FMA.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::blocks::{BlockOrder, PackedWeights, QuantizedActs, WeightFormat, GROUP, QK};
use super::OutPtr;

/// Activation rows per chunk: eight vectors of two rows each.
pub const ROWS: usize = 16;

/// Weight rows a task walks together against each chunk (they stay in L1
/// while the chunks pass).
const SLAB: usize = 16;

/// One block of two activation rows as the kernel reads it.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PairBlock {
    /// The two rows' 32 quants, the first row's in the low half.
    y: [i8; 64],
    /// Per lane, `-128 * (sum of the lane's four quants)`: where `dpbusd`
    /// starts, so the offset leaves with no extra operation.
    off: [i32; 16],
    /// Each row's scale, in its eight lanes.
    dx: [f32; 16],
}

/// One block of sixteen activation rows for the repacked order: vector `t`
/// holds quants `4 t .. 4 t + 4` of every row, row `a` in lane `a`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct RowsBlock {
    y: [[[i8; 4]; ROWS]; 8],
    /// Per row, `-128 * (sum of its 32 quants)`.
    off: [i32; ROWS],
    /// Per row, its scale.
    dx: [f32; ROWS],
}

/// The chunks in the layout their product's order wants.
enum Layout {
    /// Q8_0's order: [`PairBlock`]s, chunk by chunk, block by block, pair by pair.
    Lanes(Vec<PairBlock>),
    /// The repacked order: [`RowsBlock`]s, chunk by chunk, block by block.
    Totals(Vec<RowsBlock>),
}

/// The leading `16 * chunks` activation rows of a product, laid out for the
/// kernel of the weight's order.
pub struct Acts16 {
    chunks: usize,
    blocks: usize,
    layout: Layout,
}

impl Acts16 {
    /// The chunks of `acts`' rows (`rows / 16` of them) for a product with
    /// `w`, on the kernel pool; `None` where no kernel here takes `w`.
    pub fn prepare(w: &PackedWeights, acts: &QuantizedActs) -> Option<Self> {
        let (chunks, blocks) = (acts.rows / ROWS, acts.blocks);
        let pool = super::super::pool::Pool::global();
        let sum = |q: &[i8]| -> i32 { q.iter().map(|&v| v as i32).sum() };
        let layout = match (w.format, w.order) {
            (WeightFormat::Q8_0 | WeightFormat::Q5_0, _)
            | (WeightFormat::Iq4Nl, BlockOrder::VecDot) => {
                let zero = PairBlock {
                    y: [0; 64],
                    off: [0; 16],
                    dx: [0.0; 16],
                };
                let mut data = vec![zero; chunks * blocks * ROWS / 2];
                pool.fill_chunks(&mut data, 64, &|start, part| {
                    for (i, pb) in part.iter_mut().enumerate() {
                        let i = start + i;
                        let (c, b, p) = (i / (blocks * 8), (i / 8) % blocks, i % 8);
                        for h in 0..2 {
                            let a = (ROWS * c + 2 * p + h) * blocks + b;
                            let q = &acts.qs[a].0;
                            pb.y[32 * h..32 * h + 32].copy_from_slice(q);
                            for l in 0..8 {
                                pb.off[8 * h + l] = -128 * sum(&q[4 * l..4 * l + 4]);
                                pb.dx[8 * h + l] = acts.d[a];
                            }
                        }
                    }
                });
                Layout::Lanes(data)
            }
            (WeightFormat::Iq4Nl, BlockOrder::Repack) => {
                let zero = RowsBlock {
                    y: [[[0; 4]; ROWS]; 8],
                    off: [0; ROWS],
                    dx: [0.0; ROWS],
                };
                let mut data = vec![zero; chunks * blocks];
                pool.fill_chunks(&mut data, 16, &|start, part| {
                    for (i, rb) in part.iter_mut().enumerate() {
                        let (c, b) = ((start + i) / blocks, (start + i) % blocks);
                        for r in 0..ROWS {
                            let a = (ROWS * c + r) * blocks + b;
                            let q = &acts.qs[a].0;
                            for (t, v) in q.chunks_exact(4).enumerate() {
                                rb.y[t][r].copy_from_slice(v);
                            }
                            rb.off[r] = -128 * sum(q);
                            rb.dx[r] = acts.d[a];
                        }
                    }
                });
                Layout::Totals(data)
            }
            _ => return None,
        };
        Some(Self {
            chunks,
            blocks,
            layout,
        })
    }

    /// How many leading rows these chunks cover.
    pub fn rows(&self) -> usize {
        ROWS * self.chunks
    }
}

/// Outputs of weight rows `cols` (starting on a multiple of [`GROUP`]) for
/// the rows `a` covers.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F, BW and VNNI available; `w` one of the
/// signed-byte formats `a` was prepared for, with its block count; `out` as
/// [`super::gemm_range`] asks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn gemm_range(w: &PackedWeights, a: &Acts16, cols: Range<usize>, out: OutPtr) {
    assert!(
        cols.end <= w.rows && cols.start.is_multiple_of(GROUP) && a.blocks == w.blocks_per_row()
    );
    let nb = a.blocks;
    for s0 in cols.clone().step_by(SLAB) {
        let s1 = cols.end.min(s0 + SLAB);
        for ch in 0..a.chunks {
            let mut c = s0;
            while c < s1 {
                let two = c + 2 <= s1;
                match &a.layout {
                    Layout::Lanes(d) => {
                        let blk = d.as_ptr().add(ch * nb * 8);
                        if two {
                            store(out, ch, c, &rows_x16::<2>(w, c, blk, nb));
                        } else {
                            store(out, ch, c, &rows_x16::<1>(w, c, blk, nb));
                        }
                    }
                    Layout::Totals(d) => {
                        let blk = d.as_ptr().add(ch * nb);
                        if two {
                            store(out, ch, c, &totals_x16::<2>(w, c, blk, nb));
                        } else {
                            store(out, ch, c, &totals_x16::<1>(w, c, blk, nb));
                        }
                    }
                }
                c += if two { 2 } else { 1 };
            }
        }
    }
}

/// Where weight rows `c..c + R`'s blocks (`nb` a row) and scales begin.
#[inline(always)]
unsafe fn weight_rows<const R: usize>(
    w: &PackedWeights,
    c: usize,
    nb: usize,
) -> ([*const u8; R], [*const u16; R]) {
    let wq = std::array::from_fn(|r| {
        let (g, k) = ((c + r) / GROUP, (c + r) % GROUP);
        w.quants
            .as_slice()
            .as_ptr()
            .add(g * nb * GROUP * QK + k * QK)
    });
    let ws = std::array::from_fn(|r| {
        let (g, k) = ((c + r) / GROUP, (c + r) % GROUP);
        w.scales.as_ptr().add(g * nb * GROUP + k)
    });
    (wq, ws)
}

/// An f16 bit pattern as f32.
#[inline(always)]
unsafe fn f16_bits(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Weight rows `c..c + R` in the repacked order against one chunk (`nb`
/// [`RowsBlock`]s at `blk`): per block, each row's exact total, then
/// `acc = fma(total, d_w * d_x, acc)`, sixteen activation rows to a vector.
// Indices keep the weight row and chunk arithmetic visible.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn totals_x16<const R: usize>(
    w: &PackedWeights,
    c: usize,
    blk: *const RowsBlock,
    nb: usize,
) -> [[f32; ROWS]; R] {
    let flip = _mm256_set1_epi8(-128);
    let idx: [__m512i; 8] = std::array::from_fn(|t| _mm512_set1_epi32(t as i32));
    let (wq, ws) = weight_rows::<R>(w, c, nb);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let rb = &*blk.add(b);
        let mut wz = [_mm512_setzero_si512(); R];
        let mut t0 = [_mm512_load_si512(rb.off.as_ptr().cast()); R];
        let mut t1 = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let q = _mm256_load_si256(wq[r].add(b * GROUP * QK).cast());
            wz[r] = _mm512_castsi256_si512(_mm256_xor_si256(q, flip));
        }
        for t in (0..8).step_by(2) {
            let y0 = _mm512_load_si512(rb.y[t].as_ptr().cast());
            let y1 = _mm512_load_si512(rb.y[t + 1].as_ptr().cast());
            for r in 0..R {
                t0[r] = _mm512_dpbusd_epi32(t0[r], _mm512_permutexvar_epi32(idx[t], wz[r]), y0);
                t1[r] = _mm512_dpbusd_epi32(t1[r], _mm512_permutexvar_epi32(idx[t + 1], wz[r]), y1);
            }
        }
        let dx = _mm512_load_ps(rb.dx.as_ptr());
        for r in 0..R {
            let total = _mm512_cvtepi32_ps(_mm512_add_epi32(t0[r], t1[r]));
            let dd = _mm512_mul_ps(_mm512_set1_ps(f16_bits(*ws[r].add(b * GROUP))), dx);
            acc[r] = _mm512_fmadd_ps(total, dd, acc[r]);
        }
    }
    let mut o = [[0f32; ROWS]; R];
    for r in 0..R {
        _mm512_storeu_ps(o[r].as_mut_ptr(), acc[r]);
    }
    o
}

/// Writes weight rows `c..c + R`'s outputs for chunk `ch`.
#[inline(always)]
unsafe fn store<const R: usize>(out: OutPtr, ch: usize, c: usize, o: &[[f32; ROWS]; R]) {
    for (r, o) in o.iter().enumerate() {
        for (i, &v) in o.iter().enumerate() {
            *out.ptr.add((ROWS * ch + i) * out.stride + c + r) = v;
        }
    }
}

/// Weight rows `c..c + R` against one chunk (`nb` blocks of eight pairs at
/// `blk`): per row and pair, the AVX2 kernel's eight lanes per row.
// Indices keep the weight row, pair and lane arithmetic visible.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn rows_x16<const R: usize>(
    w: &PackedWeights,
    c: usize,
    blk: *const PairBlock,
    nb: usize,
) -> [[f32; ROWS]; R] {
    let qstep = GROUP * QK;
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let (wq, ws) = weight_rows::<R>(w, c, nb);
    for b in 0..nb {
        let mut wv = [_mm512_setzero_si512(); R];
        let mut dw = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let q = _mm256_load_si256(wq[r].add(b * qstep).cast());
            wv[r] = _mm512_broadcast_i64x4(_mm256_xor_si256(q, flip));
            dw[r] = _mm512_set1_ps(f16_bits(*ws[r].add(b * GROUP)));
        }
        let pb = blk.add(b * 8);
        for p in 0..8 {
            let pb = &*pb.add(p);
            let y = _mm512_load_si512(pb.y.as_ptr().cast());
            let off = _mm512_load_si512(pb.off.as_ptr().cast());
            let dx = _mm512_load_ps(pb.dx.as_ptr());
            for r in 0..R {
                let lanes = _mm512_dpbusd_epi32(off, wv[r], y);
                let dd = _mm512_mul_ps(dw[r], dx);
                acc[r][p] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lanes), acc[r][p]);
            }
        }
    }
    let mut o = [[0f32; ROWS]; R];
    for r in 0..R {
        for p in 0..8 {
            o[r][2 * p] = super::avx2::hsum8(_mm512_castps512_ps256(acc[r][p]));
            o[r][2 * p + 1] = super::avx2::hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(acc[r][p]),
            )));
        }
    }
    o
}
