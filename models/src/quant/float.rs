//! F16 and BF16 weights, computed as llama.cpp's CPU backend computes them on an
//! AVX2 machine, our correctness reference.
//!
//! ggml rounds the activations to the weight's type first (F16: F16C's
//! round-to-nearest-even; BF16: `GGML_FP32_TO_BF16`, also nearest-even), then
//! every product `dot(w_row, x_row)` is a sum of exact f32 conversions of both,
//! in one of two orders, depending on the shape of the product:
//! - [`Order::TinyBlas`]: llamafile's `tinyBLAS` (ggml-cpu/llamafile/sgemm.cpp),
//!   which takes the product when there are at least two activation rows and the
//!   weight's row count is a multiple of 4: one 8-lane accumulator
//!   `fma(w, x, acc)` over groups of 8 values (a short last group zero-padded),
//!   then `hsum`: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
//! - [`Order::VecDot`]: `ggml_vec_dot_f16` / `ggml_vec_dot_bf16` otherwise (a
//!   decode step, or a row count such as a vocabulary's that is not a multiple
//!   of 4): four 8-lane accumulators over groups of 32 values, combined as
//!   `(s0+s2) + (s1+s3)` and reduced to one value (F16 with two `hadd`s:
//!   `(u0+u1)+(u2+u3)` of `u_i = s_i + s_{i+4}`; BF16 as `hsum`:
//!   `(u0+u2)+(u1+u3)`), then the values past the last group of 32 added one
//!   product at a time in f64, the result rounded to f32.
//!
//! The scalar kernel here defines these numbers; the AVX2 one repeats them.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::quantized::GgmlDType;

use super::dot::{best_kernel, Kernel};
use super::pool::Pool;

/// Below this many multiply-adds a product runs on the caller alone.
const PARALLEL_MIN_MACS: usize = 1 << 16;
/// Tasks per thread a product's weight rows are split into.
const TASKS_PER_THREAD: usize = 4;
/// Weight rows (of at most a few KiB each) a task walks against every
/// activation row before the next ones.
const COL_BLOCK: usize = 8;

/// A 16-bit float weight format [`super::QLinear`] runs with its own kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfFormat {
    /// IEEE half precision.
    F16,
    /// bfloat16: the top half of an f32.
    BF16,
}

impl HalfFormat {
    /// The format for a ggml dtype, if it is one of these.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::F16 => Some(Self::F16),
            GgmlDType::BF16 => Some(Self::BF16),
            _ => None,
        }
    }

    /// The exact f32 value of `bits`.
    #[inline(always)]
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            Self::F16 => half::f16::from_bits(bits).to_f32(),
            Self::BF16 => f32::from_bits((bits as u32) << 16),
        }
    }

    /// `x` rounded to this format as ggml rounds activations (nearest, ties to
    /// even; a BF16 NaN is kept quiet as `GGML_FP32_TO_BF16` does).
    #[inline(always)]
    pub fn round(self, x: f32) -> u16 {
        match self {
            Self::F16 => half::f16::from_f32(x).to_bits(),
            Self::BF16 => {
                let u = x.to_bits();
                if u & 0x7fff_ffff > 0x7f80_0000 {
                    ((u >> 16) | 64) as u16
                } else {
                    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
                }
            }
        }
    }
}

/// Which of llama.cpp's summation orders a product follows (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// llamafile's tinyBLAS.
    TinyBlas,
    /// `ggml_vec_dot_f16` / `ggml_vec_dot_bf16`.
    VecDot,
}

impl Order {
    /// The order llama.cpp uses for `act_rows` activation rows against a weight
    /// of `weight_rows` rows.
    pub fn for_shape(act_rows: usize, weight_rows: usize) -> Self {
        if act_rows >= 2 && weight_rows.is_multiple_of(4) {
            Self::TinyBlas
        } else {
            Self::VecDot
        }
    }
}

/// A `[rows, cols]` F16 or BF16 weight matrix, row-major as in the GGUF.
pub struct HalfWeights {
    /// The format.
    pub format: HalfFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// `rows * cols` values' bits.
    pub bits: Vec<u16>,
}

impl HalfWeights {
    /// Copies `data`, the GGUF bytes of a `[rows, cols]` matrix; fails on a size
    /// mismatch rather than trusting the file.
    pub fn from_ggml(
        format: HalfFormat,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Self, String> {
        let expected = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(2))
            .ok_or_else(|| format!("[{rows}, {cols}] overflows"))?;
        if data.len() != expected {
            return Err(format!(
                "expected {expected} bytes of {format:?} data for [{rows}, {cols}], found {}",
                data.len()
            ));
        }
        let bits = data
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok(Self {
            format,
            rows,
            cols,
            bits,
        })
    }

    /// Row `r` as f32 (exact), ggml's `get_rows`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let row = &self.bits[r * self.cols..(r + 1) * self.cols];
        for (o, &b) in out.iter_mut().zip(row) {
            *o = self.format.to_f32(b);
        }
    }

    /// `x` (`rows * cols` f32, row-major) times `self^T`: `rows * self.rows` f32,
    /// in llama.cpp's order for this shape.
    pub fn matmul(&self, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        let (n_out, cols) = (self.rows, self.cols);
        let mut out = vec![0f32; rows * n_out];
        if rows == 0 || n_out == 0 {
            return out;
        }
        let acts: Vec<u16> = x[..rows * cols]
            .iter()
            .map(|&v| self.format.round(v))
            .collect();
        // Inside `alone::scope` every row takes the one-row order.
        let order = if crate::quant::alone::active() {
            Order::VecDot
        } else {
            Order::for_shape(rows, n_out)
        };
        let out_ptr = SendPtr(out.as_mut_ptr());
        let run = |range: Range<usize>| {
            // A few weight rows meet every activation row while in cache.
            for c0 in range.clone().step_by(COL_BLOCK) {
                let c1 = range.end.min(c0 + COL_BLOCK);
                for r in 0..rows {
                    let a = &acts[r * cols..(r + 1) * cols];
                    for c in c0..c1 {
                        let w = &self.bits[c * cols..(c + 1) * cols];
                        let v = dot(kernel, self.format, order, w, a);
                        // SAFETY: `r * n_out + c < rows * n_out`, the buffer outlives
                        // the call, and each column range is written by one task only.
                        unsafe { *out_ptr.get().add(r * n_out + c) = v };
                    }
                }
            }
        };
        let pool = Pool::global();
        let threads = pool.threads();
        if threads == 1 || rows * n_out * cols < PARALLEL_MIN_MACS {
            run(0..n_out);
            return out;
        }
        let chunk = n_out.div_ceil(threads * TASKS_PER_THREAD).max(1);
        let n_tasks = n_out.div_ceil(chunk);
        let next = AtomicUsize::new(0);
        pool.run(&|| loop {
            let t = next.fetch_add(1, Ordering::Relaxed);
            if t >= n_tasks {
                break;
            }
            run(t * chunk..n_out.min((t + 1) * chunk));
        });
        out
    }
}

/// The output buffer, written by several pool threads at disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: only dereferenced in `HalfWeights::matmul`, whose tasks write disjoint
// elements of a buffer that outlives them.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// `dot(w, x)` of two equally long rows of `format` bits, in `order`.
pub fn dot(kernel: Kernel, format: HalfFormat, order: Order, w: &[u16], x: &[u16]) -> f32 {
    assert_eq!(w.len(), x.len());
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 if best_kernel() == Kernel::Avx2 => {
            // SAFETY: the guard checked (once, cached) that the CPU has AVX2, FMA and
            // F16C; the lengths are equal.
            unsafe { avx2::dot(format, order, w, x) }
        }
        _ => dot_ref(format, order, w, x),
    }
}

/// `hsum_float_8`'s order.
fn hsum8(a: &[f32; 8]) -> f32 {
    let u = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (u[0] + u[2]) + (u[1] + u[3])
}

/// The scalar reference of [`dot`].
pub fn dot_ref(format: HalfFormat, order: Order, w: &[u16], x: &[u16]) -> f32 {
    let f = |b: u16| format.to_f32(b);
    match order {
        Order::TinyBlas => {
            let mut acc = [0f32; 8];
            for (wc, xc) in w.chunks(8).zip(x.chunks(8)) {
                for (l, a) in acc.iter_mut().enumerate() {
                    // A short last group reads zeros, as `load_partial` does.
                    let (wv, xv) = match (wc.get(l), xc.get(l)) {
                        (Some(&wb), Some(&xb)) => (f(wb), f(xb)),
                        _ => (0.0, 0.0),
                    };
                    *a = wv.mul_add(xv, *a);
                }
            }
            hsum8(&acc)
        }
        Order::VecDot => {
            let n = w.len();
            let np = n & !31;
            let mut acc = [[0f32; 8]; 4];
            for i in (0..np).step_by(32) {
                for (j, a) in acc.iter_mut().enumerate() {
                    for (l, a) in a.iter_mut().enumerate() {
                        let k = i + 8 * j + l;
                        *a = f(w[k]).mul_add(f(x[k]), *a);
                    }
                }
            }
            let s: [f32; 8] =
                std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
            let r = match format {
                HalfFormat::F16 => {
                    let u = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
                    (u[0] + u[1]) + (u[2] + u[3])
                }
                HalfFormat::BF16 => hsum8(&s),
            };
            let mut sum = r as f64;
            for (&a, &b) in w[np..].iter().zip(&x[np..]) {
                sum += (f(a) * f(b)) as f64;
            }
            sum as f32
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{HalfFormat, Order};

    /// Eight values at `p` as f32.
    #[inline(always)]
    unsafe fn load(format: HalfFormat, p: *const u16) -> __m256 {
        let h = _mm_loadu_si128(p.cast());
        match format {
            HalfFormat::F16 => _mm256_cvtph_ps(h),
            HalfFormat::BF16 => {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
        }
    }

    /// ggml's `hsum_float_8` (and tinyBLAS's `hsum`).
    #[inline(always)]
    unsafe fn hsum8(x: __m256) -> f32 {
        let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }

    /// # Safety
    /// AVX2, FMA and F16C available; `w.len() == x.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(format: HalfFormat, order: Order, w: &[u16], x: &[u16]) -> f32 {
        let n = w.len();
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        match order {
            Order::TinyBlas => {
                let mut acc = _mm256_setzero_ps();
                let full = n & !7;
                for i in (0..full).step_by(8) {
                    acc = _mm256_fmadd_ps(load(format, wp.add(i)), load(format, xp.add(i)), acc);
                }
                if full < n {
                    let (mut wt, mut xt) = ([0u16; 8], [0u16; 8]);
                    wt[..n - full].copy_from_slice(&w[full..]);
                    xt[..n - full].copy_from_slice(&x[full..]);
                    acc =
                        _mm256_fmadd_ps(load(format, wt.as_ptr()), load(format, xt.as_ptr()), acc);
                }
                hsum8(acc)
            }
            Order::VecDot => {
                let np = n & !31;
                let mut s = [_mm256_setzero_ps(); 4];
                for i in (0..np).step_by(32) {
                    for (j, s) in s.iter_mut().enumerate() {
                        let k = i + 8 * j;
                        *s = _mm256_fmadd_ps(load(format, wp.add(k)), load(format, xp.add(k)), *s);
                    }
                }
                let c = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
                let r = match format {
                    HalfFormat::F16 => {
                        let t =
                            _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps::<1>(c));
                        let t = _mm_hadd_ps(t, t);
                        _mm_cvtss_f32(_mm_hadd_ps(t, t))
                    }
                    HalfFormat::BF16 => hsum8(c),
                };
                let mut sum = r as f64;
                for (&a, &b) in w[np..].iter().zip(&x[np..]) {
                    sum += (format.to_f32(a) * format.to_f32(b)) as f64;
                }
                sum as f32
            }
        }
    }
}
