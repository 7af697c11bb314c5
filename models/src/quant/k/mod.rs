//! The K-quant weight formats (256-value super-blocks dotted against Q8_K
//! activations), computed as llama.cpp's CPU backend computes them on an AVX2
//! machine, bit for bit.
//!
//! Which ggml kernel runs decides the floating-point order, so it decides the
//! bits. In-process llama.cpp loads with `use_extra_bufts` on, and on AVX2 (no
//! AVX-512) ggml-cpu's repack buffer (`ggml_repack_get_optimal_repack_type`)
//! takes exactly one K-quant: Q4_K weights with a row count divisible by 8
//! (`q4_K_8x8_q8_K`; its Q2_K repack needs AVX-512). llamafile's sgemm takes no
//! K-quant. So:
//! - [`Order::VecDot`]: every other case (all Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS). A product
//!   of 8 or more activation rows runs ggml-cpu's tiled K-quant matmul
//!   (`ggml_compute_forward_mul_mat_tiled`, on by default,
//!   `tiled/tiled-kernel.cpp`): per super-block the exact scaled integer dot `s1`,
//!   `res = d * s1`, for the formats with minimums (Q2_K, Q4_K, Q5_K) `res =
//!   fma(-dmin, s2, res)` with `s2` the exact minimum sum, then `acc = fma(res,
//!   d_x, acc)` (Q3_K's and Q6_K's offsets are taken out in the integers). Fewer
//!   rows run `ggml_vec_dot_<fmt>_q8_K` per output, each format in its own order
//!   (see the format modules). Activations come from `quantize_row_q8_K` either
//!   way.
//! - [`Order::Repack`]: the repacked Q4_K product. Activation rows in whole groups
//!   of four (the first `rows - rows % 4`) are quantized by
//!   `ggml_quantize_mat_q8_K_4x8` and run `ggml_gemm_q4_K_8x8_q8_K`, which
//!   accumulates once per pair of 32-value sub-blocks; the remaining rows are
//!   quantized by `quantize_row_q8_K` and run `ggml_gemv_q4_K_8x8_q8_K`, which
//!   accumulates once per super-block. See [`q4k`].
//!
//! Each format module has the block layout, ggml's reference dequantization, the
//! integer parts of a super-block product in a scalar and an AVX2 version (the
//! integer parts are exact, so any method gives the same integers), and the
//! floating-point combination in ggml's order, shared by both kernels; it says
//! so through [`superblock::SuperBlock`], and the drivers that walk a row
//! (`superblock::dot`, `superblock::dot_rows`) are written once over that trait.
//! A new super-block format is one file implementing it. On AVX2, Q4_K
//! (repacked), Q5_K and Q6_K products skip those drivers for register-blocked
//! ones in `fast.rs` (the same orders, several outputs per vector).

#[cfg(target_arch = "x86_64")]
mod fast;
pub mod q2k;
pub mod q3k;
pub mod q4k;
pub mod q5k;
pub mod q6k;
pub mod q8k;
pub(crate) mod superblock;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::quantized::GgmlDType;

use super::blocks::AlignedBytes;
use super::dot::{best_kernel, Kernel};
use super::iq4::xs;
use super::pool::Pool;
use q8k::Q8KActs;

/// Values per super-block in every K-quant format.
pub const QK_K: usize = 256;

/// Below this many (output, super-block, row) products a call runs on the caller
/// alone.
const PARALLEL_MIN_BLOCK_DOTS: usize = 256;
/// Tasks per thread the output columns are split into.
const TASKS_PER_THREAD: usize = 4;
/// Activation rows each unpacked weight super-block is dotted against in turn
/// (the most a format's `dot_rows` keeps running sums for at once).
pub(crate) const ROWS_AT_ONCE: usize = 32;
/// Activation rows kept in cache across a task's column range.
const ROW_TILE: usize = ROWS_AT_ONCE;

/// A K-quant weight format Tern computes natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KFormat {
    /// 2-bit quants, 16 sub-blocks of 16 with 4-bit scales and minimums.
    Q2K,
    /// 3-bit quants (2 low bits plus a plane of high bits), 16 sub-blocks of 16
    /// with 6-bit signed scales.
    Q3K,
    /// 4-bit quants, 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q4K,
    /// 5-bit quants, laid out as Q4_K plus a plane of fifth bits.
    Q5K,
    /// 6-bit quants, 16 sub-blocks of 16 with 8-bit scales.
    Q6K,
    /// IQ4_XS: 4-bit indices into IQ4_NL's value table, 8 sub-blocks of 32
    /// with 6-bit scales (see [`crate::quant::iq4::xs`]; candle has no such
    /// dtype, so [`KFormat::from_ggml`] never gives it).
    Iq4Xs,
}

impl KFormat {
    /// The native K-quant format for a ggml dtype, if there is one.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q2K => Some(Self::Q2K),
            GgmlDType::Q3K => Some(Self::Q3K),
            GgmlDType::Q4K => Some(Self::Q4K),
            GgmlDType::Q5K => Some(Self::Q5K),
            GgmlDType::Q6K => Some(Self::Q6K),
            _ => None,
        }
    }

    /// Bytes of one super-block in ggml's layout.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q2K => q2k::BLOCK_BYTES,
            Self::Q3K => q3k::BLOCK_BYTES,
            Self::Q4K => q4k::BLOCK_BYTES,
            Self::Q5K => q5k::BLOCK_BYTES,
            Self::Q6K => q6k::BLOCK_BYTES,
            Self::Iq4Xs => xs::BLOCK_BYTES,
        }
    }
}

/// The floating-point order a product runs in (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The plain buffer: `ggml_vec_dot_*_q8_K` below [`TILED_MIN_ROWS`]
    /// activation rows, ggml-cpu's tiled matmul from there.
    VecDot,
    /// ggml-cpu's repacked Q4_K gemm (rows in groups of four) and gemv (the rest).
    Repack,
}

/// What one output's product follows: the order and, for [`Order::Repack`],
/// which of its two kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `ggml_vec_dot_*_q8_K`.
    VecDot,
    /// `ggml_gemv_q4_K_8x8_q8_K`.
    Gemv,
    /// `ggml_gemm_q4_K_8x8_q8_K`.
    Gemm,
    /// ggml-cpu's tiled K-quant matmul (`tiled_run_microtile`).
    Tiled,
}

/// From this many activation rows on, ggml-cpu runs its tiled K-quant matmul
/// instead of `ggml_vec_dot` (`ggml_tiled_min_batch`).
pub const TILED_MIN_ROWS: usize = 8;

/// The order llama.cpp's CPU backend runs a K-quant weight's products in: its
/// repack buffer takes Q4_K matrices whose row count is a multiple of 8. (A tied
/// output is no exception: llama.cpp loads the token embedding a second time as
/// the output, a MUL_MAT weight, while lookups read the plain copy.)
pub fn llama_cpp_order(format: KFormat, rows: usize) -> Order {
    if format == KFormat::Q4K && rows.is_multiple_of(8) {
        Order::Repack
    } else {
        Order::VecDot
    }
}

/// A K-quant weight matrix `[rows, cols]`: ggml's super-blocks, row-major, in
/// 64-byte aligned storage.
pub struct KWeights {
    /// The format.
    pub format: KFormat,
    /// Output features.
    pub rows: usize,
    /// Input features, a multiple of 256.
    pub cols: usize,
    /// The order its products follow.
    pub order: Order,
    data: AlignedBytes,
}

impl KWeights {
    /// Copies `data`, the ggml serialization of a `[rows, cols]` matrix, failing on
    /// a row length that is not whole super-blocks or a size mismatch.
    pub fn from_ggml(
        format: KFormat,
        rows: usize,
        cols: usize,
        data: &[u8],
        order: Order,
    ) -> Result<Self, String> {
        if !cols.is_multiple_of(QK_K) {
            return Err(format!(
                "{format:?} row length {cols} is not a multiple of {QK_K}"
            ));
        }
        let expected = rows
            .checked_mul(cols / QK_K * format.block_bytes())
            .ok_or_else(|| format!("[{rows}, {cols}] overflows"))?;
        if data.len() != expected {
            return Err(format!(
                "expected {expected} bytes of {format:?} data for [{rows}, {cols}], found {}",
                data.len()
            ));
        }
        let mut stored = AlignedBytes::zeroed(expected);
        stored.as_mut_slice().copy_from_slice(data);
        Ok(Self {
            format,
            rows,
            cols,
            order,
            data: stored,
        })
    }

    /// Super-blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK_K
    }

    /// Row `r`'s bytes.
    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.blocks_per_row() * self.format.block_bytes();
        &self.data.as_slice()[r * n..(r + 1) * n]
    }

    /// Dequantizes row `r` into `out` (`cols` values) as ggml's `dequantize_row_*`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let bb = self.format.block_bytes();
        for (blk, o) in self.row(r).chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
            match self.format {
                KFormat::Q2K => q2k::dequantize_block(blk, o),
                KFormat::Q3K => q3k::dequantize_block(blk, o),
                KFormat::Q4K => q4k::dequantize_block(blk, o),
                KFormat::Q5K => q5k::dequantize_block(blk, o),
                KFormat::Q6K => q6k::dequantize_block(blk, o),
                KFormat::Iq4Xs => xs::dequantize_block(blk, o),
            }
        }
    }

    /// How many leading activation rows of an `n`-row product take the grouped
    /// (gemm) path, quantized by [`q8k::quantize_block_x4`].
    pub fn grouped_rows(&self, n: usize) -> usize {
        match self.order {
            Order::Repack => n - n % 4,
            Order::VecDot => 0,
        }
    }

    /// The activations of an `n`-row product, quantized as its kernels take
    /// them: in the one-row order inside [`crate::quant::alone::scope`]
    /// (read here, on the calling thread).
    fn quantize_acts(&self, x: &[f32], n: usize) -> Q8KActs {
        if crate::quant::alone::active() {
            Q8KActs::quantize_alone(x, self.cols, n)
        } else {
            Q8KActs::quantize(x, self.cols, n, self.grouped_rows(n))
        }
    }

    /// The kernel variant for activation row `r` of acts `a`.
    pub fn variant(&self, acts: &Q8KActs, r: usize) -> Variant {
        match self.order {
            Order::VecDot if acts.rows >= TILED_MIN_ROWS && !acts.alone => Variant::Tiled,
            Order::VecDot => Variant::VecDot,
            Order::Repack if r < acts.grouped => Variant::Gemm,
            Order::Repack => Variant::Gemv,
        }
    }

    /// One output: weight row `c` against activation row `r`.
    pub fn dot(&self, kernel: Kernel, acts: &Q8KActs, c: usize, r: usize) -> f32 {
        let (w, a, v) = (self.row(c), acts.row(r), self.variant(acts, r));
        let avx2 = kernel == Kernel::Avx2 && best_kernel() == Kernel::Avx2;
        match self.format {
            KFormat::Q2K => superblock::dot::<q2k::Format>(avx2, v, w, a),
            KFormat::Q3K => superblock::dot::<q3k::Format>(avx2, v, w, a),
            KFormat::Q4K => superblock::dot::<q4k::Format>(avx2, v, w, a),
            KFormat::Q5K => superblock::dot::<q5k::Format>(avx2, v, w, a),
            KFormat::Q6K => superblock::dot::<q6k::Format>(avx2, v, w, a),
            KFormat::Iq4Xs => superblock::dot::<xs::Format>(avx2, v, w, a),
        }
    }

    /// `x` (`rows * cols` f32, row-major) times the transpose: `rows * self.rows`
    /// f32, on the pool.
    pub fn matmul(&self, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        self.matmul_with(x, rows, kernel, true)
    }

    /// [`Self::matmul`], where `wide: false` keeps to the AVX2 kernels on a
    /// CPU with AVX-512 VNNI (the two give the same bits; tests compare them).
    pub(crate) fn matmul_with(
        &self,
        x: &[f32],
        rows: usize,
        kernel: Kernel,
        wide: bool,
    ) -> Vec<f32> {
        let n = self.rows;
        if rows == 0 || n == 0 {
            return vec![0f32; rows * n];
        }
        let acts = self.quantize_acts(x, rows);
        let pool = Pool::global();
        let work = rows * n * self.blocks_per_row();
        let avx2 = kernel == Kernel::Avx2 && best_kernel() == Kernel::Avx2;
        #[cfg(target_arch = "x86_64")]
        let wide = wide && crate::quant::dot::avx512_vnni();
        #[cfg(target_arch = "x86_64")]
        if avx2 && fast::supports(self) {
            // Not zeroed first: the fast kernels write every output (a
            // prefill's output is megabytes, zeroed on one thread).
            let mut out = Vec::with_capacity(rows * n);
            let out_ptr = SharedOut(out.as_mut_ptr());
            // SAFETY: AVX2, FMA and F16C were detected (`best_kernel`); each
            // column range is claimed by one task only.
            let groups = fast::Prepared::new(self, &acts, wide);
            let run = |cols: std::ops::Range<usize>| unsafe {
                let out = fast::OutTile {
                    ptr: out_ptr.get(),
                    ld: n,
                    c0: 0,
                };
                fast::run(self, &acts, &groups, cols, out)
            };
            // Task boundaries on whole groups of eight weight rows.
            split_columns(pool, n, work, 8, &run);
            // SAFETY: the tasks covered columns `0..n`, and `fast::run`
            // writes every activation row of its columns.
            unsafe { out.set_len(rows * n) };
            return out;
        }
        let mut out = vec![0f32; rows * n];
        let out_ptr = SharedOut(out.as_mut_ptr());
        let variants: Vec<Variant> = (0..rows).map(|r| self.variant(&acts, r)).collect();
        let act_rows: Vec<&[q8k::Q8KBlock]> = (0..rows).map(|r| acts.row(r)).collect();
        let run = |cols: std::ops::Range<usize>| {
            let mut col = [0f32; ROW_TILE];
            // A tile of activation rows stays in cache across the column range;
            // each weight super-block is unpacked once per tile.
            for r0 in (0..rows).step_by(ROW_TILE) {
                let r1 = rows.min(r0 + ROW_TILE);
                let (v, a, o) = (&variants[r0..r1], &act_rows[r0..r1], &mut col[..r1 - r0]);
                for c in cols.clone() {
                    let w = self.row(c);
                    match self.format {
                        KFormat::Q2K => superblock::dot_rows::<q2k::Format>(avx2, v, w, a, o),
                        KFormat::Q3K => superblock::dot_rows::<q3k::Format>(avx2, v, w, a, o),
                        KFormat::Q4K => superblock::dot_rows::<q4k::Format>(avx2, v, w, a, o),
                        KFormat::Q5K => superblock::dot_rows::<q5k::Format>(avx2, v, w, a, o),
                        KFormat::Q6K => superblock::dot_rows::<q6k::Format>(avx2, v, w, a, o),
                        KFormat::Iq4Xs => superblock::dot_rows::<xs::Format>(avx2, v, w, a, o),
                    }
                    for (i, &val) in o.iter().enumerate() {
                        // SAFETY: `(r0 + i) * n + c < rows * n`, the buffer's
                        // length, and each column range is claimed by one task only.
                        unsafe { *out_ptr.get().add((r0 + i) * n + c) = val };
                    }
                }
            }
        };
        split_columns(pool, n, work, 1, &run);
        out
    }
}

impl KWeights {
    /// `glu(x G^T, x U^T)` for the gate `self` and `up`: the activations
    /// quantized once, and each task's gate and up outputs kept in a tile of
    /// [`GLU_TILE_VALUES`] that `glu` (called per activation row with the
    /// tile's gate values, up values and output slice) reads while in cache,
    /// instead of two `rows * self.rows` buffers written out and read back.
    /// Every output has the bits of the two products and `glu` run apart.
    /// `None` where the fast kernels do not take both weights alike (other
    /// formats, orders or shapes): the caller runs them apart.
    pub fn matmul_glu(
        &self,
        up: &KWeights,
        x: &[f32],
        rows: usize,
        glu: &GluFn,
    ) -> Option<Vec<f32>> {
        if !self.fuses_with(up, rows) {
            return None;
        }
        self.glu_fast(up, x, rows, glu)
    }

    /// Whether [`Self::matmul_glu`] fuses this gate with `up` over `rows`
    /// activation rows on this machine.
    pub fn fuses_with(&self, up: &KWeights, rows: usize) -> bool {
        let alike = self.format == up.format
            && self.order == up.order
            && (self.rows, self.cols) == (up.rows, up.cols);
        #[cfg(target_arch = "x86_64")]
        let fast = fast::supports(self);
        #[cfg(not(target_arch = "x86_64"))]
        let fast = false;
        alike && rows > 0 && best_kernel() == Kernel::Avx2 && fast
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn glu_fast(&self, _: &KWeights, _: &[f32], _: usize, _: &GluFn) -> Option<Vec<f32>> {
        None
    }

    #[cfg(target_arch = "x86_64")]
    fn glu_fast(&self, up: &KWeights, x: &[f32], rows: usize, glu: &GluFn) -> Option<Vec<f32>> {
        let acts = self.quantize_acts(x, rows);
        let wide = crate::quant::dot::avx512_vnni();
        let groups = fast::Prepared::new(self, &acts, wide);
        let n = self.rows;
        // Not zeroed first: every output is written below.
        let mut out = Vec::with_capacity(rows * n);
        let out_ptr = SharedOut(out.as_mut_ptr());
        // Columns a tile holds: a multiple of 8 (the kernels' unit).
        let tile = (GLU_TILE_VALUES / rows).clamp(8, GLU_TILE_MAX_COLS) / 8 * 8;
        let run = |cols: std::ops::Range<usize>| {
            GLU_SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                scratch.resize(2 * rows * tile, 0.0);
                let (gt, ut) = scratch.split_at_mut(rows * tile);
                for c0 in cols.clone().step_by(tile) {
                    let c1 = cols.end.min(c0 + tile);
                    let at = |t: &mut [f32]| fast::OutTile {
                        ptr: t.as_mut_ptr(),
                        ld: tile,
                        c0,
                    };
                    // SAFETY: AVX2, FMA and F16C were detected (`best_kernel`);
                    // `supports` holds for both weights (same format, order
                    // and shape); each tile holds columns `c0..c1` of every
                    // row and is this thread's alone.
                    unsafe {
                        fast::run(self, &acts, &groups, c0..c1, at(gt));
                        fast::run(up, &acts, &groups, c0..c1, at(ut));
                    }
                    let w = c1 - c0;
                    let mut row = [0f32; GLU_TILE_MAX_COLS];
                    for r in 0..rows {
                        let t = r * tile..r * tile + w;
                        glu(&gt[t.clone()], &ut[t], &mut row[..w]);
                        // SAFETY: `r * n + c0 + w <= rows * n`, the buffer's
                        // capacity, and each column range is claimed by one
                        // task only.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                row.as_ptr(),
                                out_ptr.get().add(r * n + c0),
                                w,
                            )
                        };
                    }
                }
            })
        };
        let work = 2 * rows * n * self.blocks_per_row();
        split_columns(Pool::global(), n, work, 8, &run);
        // SAFETY: the tasks covered columns `0..n`, and each wrote every
        // row of its columns' tiles.
        unsafe { out.set_len(rows * n) };
        Some(out)
    }
}

/// A gated unit's activation over one row's gate and up values, into its
/// output slice (all three of one length).
pub type GluFn = dyn Fn(&[f32], &[f32], &mut [f32]) + Sync;

/// Columns a fused gated unit's tile holds at most.
const GLU_TILE_MAX_COLS: usize = 256;

/// Gate and up values a task's tile holds each (256 KB of f32: both
/// tiles stay in a core's L2 beside the weight rows).
const GLU_TILE_VALUES: usize = 1 << 16;

thread_local! {
    /// Each pool thread's gate and up tiles for [`KWeights::matmul_glu`].
    static GLU_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The output buffer, written by several pool threads at disjoint elements.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: only used inside `KWeights::matmul`, whose tasks write disjoint
// elements of a buffer that outlives the pool job.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// `hsum_float_8`'s order: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    let r = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// The f16 at `b[i..i + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Runs `run` over the output columns `0..n`: on the caller alone for a small
/// product (`work` block dots under [`PARALLEL_MIN_BLOCK_DOTS`]) or one
/// thread, else as tasks the pool's threads claim in turn, each a range
/// starting on a multiple of `align` columns.
fn split_columns(
    pool: &Pool,
    n: usize,
    work: usize,
    align: usize,
    run: &(dyn Fn(std::ops::Range<usize>) + Sync),
) {
    let threads = pool.threads();
    if threads == 1 || work < PARALLEL_MIN_BLOCK_DOTS {
        run(0..n);
        return;
    }
    let chunk = n
        .div_ceil(threads * TASKS_PER_THREAD)
        .div_ceil(align)
        .max(1)
        * align;
    let n_tasks = n.div_ceil(chunk);
    let next = AtomicUsize::new(0);
    pool.run(&|| loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= n_tasks {
            break;
        }
        run(t * chunk..n.min((t + 1) * chunk));
    });
}
