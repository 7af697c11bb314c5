//! Attention of one new token over a long cache (512 positions or more; below
//! that `flash` repeats llama.cpp's kernel exactly), read in place.
//!
//! Decode is one query row per head against every cached key. Done with
//! tensor ops, that step allocates and fills a scores tensor, a softmax, an
//! f16-rounded copy and an output per layer per sequence, and hands candle's
//! GEMM (built for large tiles) a 3-row problem; at a few thousand cached
//! tokens it cost more than all the weights. Here the cache's keys and values
//! are read straight from its buffers (a [`CacheView`] over the storage, no
//! copy, whatever slice of the buffer the policy keeps), each key row once for
//! the query heads that share it.
//!
//! Numbers: the same operations as the tensor path (scores `q.k * scale`,
//! softmax as `exp(s - max) / sum`, weights rounded to f16 as llama.cpp's f16
//! V product does, then `sum w v`); only the order inside each 64-element dot
//! product differs, so results agree to float rounding.

use candle_core::{CpuStorage, Layout, Storage, Tensor, D};
use half::f16;

use crate::error::Result;
use crate::kv_dtype::{dequantize_row, KvDtype};

/// The rows behind a [`CacheView`], in the cache's storage type.
#[derive(Clone, Copy)]
enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// ggml quant blocks of this type, addressed in bytes.
    Blocks(KvDtype, &'a [u8]),
}

/// A read-only `[heads, len, head_dim]` view of a cache tensor's storage, in
/// whatever type the cache stores ([`KvDtype`]), read in place.
pub struct CacheView<'a> {
    data: Rows<'a>,
    offset: usize,
    head_stride: usize,
    pos_stride: usize,
    /// Cached positions.
    pub len: usize,
    head_dim: usize,
    /// Rows `gap_at..gap_at + gap_len` of the storage are skipped: row `i`
    /// of the view is storage row `i`, or `i + gap_len` from `gap_at` on (a
    /// speculative draft's row, which must not see what plain decoding had
    /// evicted before it).
    gap_at: usize,
    gap_len: usize,
}

impl<'a> CacheView<'a> {
    /// The view of f32 `data` laid out as `layout` (`[heads, len, head_dim]`);
    /// `None` unless each row is contiguous.
    pub fn new(data: &'a [f32], layout: &Layout) -> Option<Self> {
        Self::over(
            Rows::F32(data),
            data.len(),
            layout,
            layout.dims().get(2).copied()?,
        )
    }

    /// The view of a cache tensor's storage holding rows of `dtype` with
    /// `head_dim` values each; `None` when the storage is not what `dtype`
    /// keeps or a row is not contiguous.
    pub fn of(
        storage: &'a Storage,
        layout: &Layout,
        dtype: KvDtype,
        head_dim: usize,
    ) -> Option<Self> {
        let (rows, n) = match (storage, dtype) {
            (Storage::Cpu(CpuStorage::F32(v)), KvDtype::F32) => (Rows::F32(v.as_slice()), v.len()),
            (Storage::Cpu(CpuStorage::F16(v)), KvDtype::F16) => (Rows::F16(v.as_slice()), v.len()),
            (Storage::Cpu(CpuStorage::U8(v)), KvDtype::Q8_0 | KvDtype::Q4_0) => {
                if layout.dims().get(2) != Some(&dtype.row_bytes(head_dim)) {
                    return None;
                }
                (Rows::Blocks(dtype, v.as_slice()), v.len())
            }
            _ => return None,
        };
        if !matches!(rows, Rows::Blocks(..)) && layout.dims().get(2) != Some(&head_dim) {
            return None;
        }
        Self::over(rows, n, layout, head_dim)
    }

    fn over(data: Rows<'a>, n: usize, layout: &Layout, head_dim: usize) -> Option<Self> {
        let dims = layout.dims();
        let stride = layout.stride();
        if dims.len() != 3 || stride[2] != 1 {
            return None;
        }
        let view = Self {
            data,
            offset: layout.start_offset(),
            head_stride: stride[0],
            pos_stride: stride[1],
            len: dims[1],
            head_dim,
            gap_at: usize::MAX,
            gap_len: 0,
        };
        // The last element must lie inside the buffer.
        let last = view.offset
            + (dims[0].max(1) - 1) * view.head_stride
            + (dims[1].max(1) - 1) * view.pos_stride
            + dims[2];
        (last <= n).then_some(view)
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The storage type of the rows.
    pub fn dtype(&self) -> KvDtype {
        match self.data {
            Rows::F32(_) => KvDtype::F32,
            Rows::F16(_) => KvDtype::F16,
            Rows::Blocks(d, _) => d,
        }
    }

    /// The view without storage rows `gap` (clamped to the view): the
    /// rows after it move down, the length shrinks by what was skipped.
    pub fn skipping(mut self, gap: std::ops::Range<usize>) -> Self {
        let start = gap.start.min(self.len);
        let len = gap.end.min(self.len).saturating_sub(start);
        if len > 0 {
            self.gap_at = start;
            self.gap_len = len;
            self.len -= len;
        }
        self
    }

    #[inline]
    fn at(&self, head: usize, pos: usize) -> usize {
        let pos = if pos >= self.gap_at {
            pos + self.gap_len
        } else {
            pos
        };
        self.offset + head * self.head_stride + pos * self.pos_stride
    }

    /// Row `pos` of head `head` as f32: the stored row itself for f32, else
    /// widened or dequantized into `scratch` (`head_dim` long).
    #[inline]
    pub(crate) fn row<'s>(&'s self, head: usize, pos: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        let at = self.at(head, pos);
        let hd = self.head_dim;
        match self.data {
            Rows::F32(d) => &d[at..at + hd],
            Rows::F16(d) => {
                widen(&d[at..at + hd], &mut scratch[..hd]);
                &scratch[..hd]
            }
            Rows::Blocks(dtype, d) => {
                dequantize_row(dtype, &d[at..at + dtype.row_bytes(hd)], &mut scratch[..hd]);
                &scratch[..hd]
            }
        }
    }

    /// The stored bytes of row `pos` of head `head` (quantized types only).
    #[inline]
    pub(crate) fn blocks(&self, head: usize, pos: usize) -> &[u8] {
        match self.data {
            Rows::Blocks(dtype, d) => {
                let at = self.at(head, pos);
                &d[at..at + dtype.row_bytes(self.head_dim)]
            }
            _ => &[],
        }
    }
}

/// f16 values widened to f32 (exact), eight at a time with F16C where the
/// build has it.
#[inline]
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "f16c",
        target_feature = "avx"
    ))]
    if src.len() == dst.len() {
        use std::arch::x86_64::*;
        let chunks = src.len() / 8;
        // SAFETY: F16C and AVX are enabled at compile time; each load reads 8
        // halves and each store writes 8 floats inside the equal-length slices.
        unsafe {
            for i in 0..chunks {
                let h = _mm_loadu_si128(src.as_ptr().add(8 * i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(8 * i), _mm256_cvtph_ps(h));
            }
        }
        for i in 8 * chunks..src.len() {
            dst[i] = src[i].to_f32();
        }
        return;
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Attention of one token's query heads over a cache.
///
/// `q`: `n_kv_head * group * head_dim` (query head `h * group + j` uses KV
/// head `h`). Returns the output `[H * head_dim]` in head order and, when
/// `want_weights`, the softmax rows `[KV, group, len]` before f16 rounding
/// (what a scoring policy observes).
pub fn decode(
    q: &[f32],
    k: &CacheView<'_>,
    v: &CacheView<'_>,
    group: usize,
    scale: f32,
    want_weights: bool,
) -> Decoded {
    let hd = k.head_dim;
    let n_kv = q.len() / (group * hd);
    let len = k.len;
    let mut out = vec![0f32; q.len()];
    let mut observed = want_weights.then(|| Vec::with_capacity(n_kv * group * len));
    let mut w = vec![0f32; group * len];
    let mut scratch = vec![0f32; hd];
    for h in 0..n_kv {
        let qh = &q[h * group * hd..(h + 1) * group * hd];
        // Scores: each key row read once for the group's query heads.
        for pos in 0..len {
            let key = k.row(h, pos, &mut scratch);
            for j in 0..group {
                w[j * len + pos] = dot(&qh[j * hd..(j + 1) * hd], key) * scale;
            }
        }
        for row in w.chunks_exact_mut(len) {
            softmax(row);
        }
        if let Some(obs) = observed.as_mut() {
            obs.extend_from_slice(&w);
        }
        for x in w.iter_mut() {
            *x = f16::from_f32(*x).to_f32();
        }
        // Output: each value row read once for the group.
        let oh = &mut out[h * group * hd..(h + 1) * group * hd];
        for pos in 0..len {
            let value = v.row(h, pos, &mut scratch);
            for j in 0..group {
                axpy(w[j * len + pos], value, &mut oh[j * hd..(j + 1) * hd]);
            }
        }
    }
    (out, observed)
}

/// Dot product in eight independent lanes (vectorized by the compiler).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let r = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (r[0] + r[2]) + (r[1] + r[3]) + tail
}

/// `y += a * x`.
#[inline]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(xi, *yi);
    }
}

/// In-place softmax: `exp(x - max) / sum`.
fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for x in row.iter_mut() {
        *x = exp_nonpositive(*x - max);
    }
    let sum: f32 = row.iter().sum();
    for x in row.iter_mut() {
        *x /= sum;
    }
}

/// `e^x` for `x <= 0` (a softmax's shifted scores), within 2 ulp of libm's,
/// branch-free so a row of them vectorizes (libm's `expf` is a call per
/// element, which dominated long-context decode).
#[inline]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    // Below this e^x is under f32's normal range; the f16-rounded weight it
    // becomes is 0 either way.
    let x = x.max(-87.0);
    // e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2 (Cody-Waite split).
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = n.mul_add(-0.693_145_75, x);
    let r = n.mul_add(-1.428_606_8e-6, r);
    // Degree-6 Taylor polynomial of e^r on |r| <= 0.347 (truncation < 3e-8).
    let mut p: f32 = 1.0 / 720.0;
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// What [`decode`] returns: the output and, when asked, the softmax rows.
pub type Decoded = (Vec<f32>, Option<Vec<f32>>);

/// Runs [`decode`] on cache tensors `k`, `v` (`[KV, C, hd]` views of
/// `dtype` storage) for query `q` (`[H, 1, hd]`). `None` when a tensor is not
/// a CPU view this path reads in place (the caller then takes the tensor path).
/// `gap`: stored entries read as if absent ([`CacheView::skipping`]).
#[allow(clippy::too_many_arguments)]
pub fn decode_tensors(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dtype: KvDtype,
    group: usize,
    scale: f32,
    want_weights: bool,
    gap: Option<std::ops::Range<usize>>,
) -> Result<Option<Decoded>> {
    let hd = q.dim(D::Minus1)?;
    let q: Vec<f32> = q.flatten_all()?.to_vec1()?;
    Ok(with_views(k, v, dtype, hd, gap, |kv, vv| {
        let fits = kv.len == vv.len
            && kv.head_dim == vv.head_dim
            && q.len().is_multiple_of(group * kv.head_dim);
        fits.then(|| decode(&q, kv, vv, group, scale, want_weights))
    })
    .flatten())
}

/// Runs `f` on in-place views of the cache tensors `k`, `v` holding rows of
/// `head_dim` values stored as `dtype`, without rows `gap` when given
/// ([`CacheView::skipping`]); `None` unless both are CPU tensors of that
/// storage with contiguous rows.
pub fn with_views<R>(
    k: &Tensor,
    v: &Tensor,
    dtype: KvDtype,
    head_dim: usize,
    gap: Option<std::ops::Range<usize>>,
    f: impl FnOnce(&CacheView<'_>, &CacheView<'_>) -> R,
) -> Option<R> {
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let mut kv = CacheView::of(&ks, kl, dtype, head_dim)?;
    let mut vv = CacheView::of(&vs, vl, dtype, head_dim)?;
    if let Some(gap) = gap {
        kv = kv.skipping(gap.clone());
        vv = vv.skipping(gap);
    }
    Some(f(&kv, &vv))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, D};

    /// The tensor path's decode attention, as `Decoder::attention` computes it.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, group: usize, scale: f64) -> Vec<f32> {
        let (n_kv, _, hd) = k.dims3().unwrap();
        let q = q.reshape((n_kv, group, hd)).unwrap();
        let s = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
        let w = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
        let w = w
            .to_dtype(candle_core::DType::F16)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap();
        w.matmul(&v.contiguous().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn matches_the_tensor_path_on_a_view_of_a_larger_buffer() {
        let dev = Device::Cpu;
        let (n_kv, group, hd, cap, len) = (3, 3, 64, 300, 217);
        // A cache buffer with room to spare, viewed as its first `len` rows.
        let kb = Tensor::randn(0f32, 1.0, (n_kv, cap, hd), &dev).unwrap();
        let vb = Tensor::randn(0f32, 1.0, (n_kv, cap, hd), &dev).unwrap();
        let k = kb.narrow(1, 0, len).unwrap();
        let v = vb.narrow(1, 0, len).unwrap();
        let q = Tensor::randn(0f32, 1.0, (n_kv * group, 1, hd), &dev).unwrap();
        let scale = 1.0 / (hd as f64).sqrt();
        let (got, w) = decode_tensors(&q, &k, &v, KvDtype::F32, group, scale as f32, true, None)
            .unwrap()
            .expect("a CPU f32 view is read in place");
        let want = reference(&q, &k, &v, group, scale);
        // Both paths round the weights to f16, so a last-bit difference in a
        // score can move one weight by an f16 ulp (2^-11 relative): errors are
        // measured against the output's scale.
        let scale_out = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let max_err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            max_err <= 1e-3 * scale_out,
            "max error {max_err} at output scale {scale_out}"
        );
        let w = w.unwrap();
        assert_eq!(w.len(), n_kv * group * len);
        for row in w.chunks(len) {
            let s: f32 = row.iter().sum();
            assert!((s - 1.0).abs() < 1e-5, "{s}");
        }
    }

    #[test]
    fn a_view_skipping_rows_reads_as_the_cache_without_them() {
        // A draft's row past a streaming window's evictions: the stored rows
        // it must not see are skipped in place, bit for bit as if gone.
        let dev = Device::Cpu;
        let (n_kv, group, hd, len) = (2, 3, 64, 40);
        let k = Tensor::randn(0f32, 1.0, (n_kv, len, hd), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (n_kv, len, hd), &dev).unwrap();
        let q = Tensor::randn(0f32, 1.0, (n_kv * group, 1, hd), &dev).unwrap();
        let without = |t: &Tensor| {
            Tensor::cat(
                &[t.narrow(1, 0, 4).unwrap(), t.narrow(1, 9, len - 9).unwrap()],
                1,
            )
            .unwrap()
        };
        let run = |k: &Tensor, v: &Tensor, gap| {
            decode_tensors(&q, k, v, KvDtype::F32, group, 0.125, true, gap)
                .unwrap()
                .unwrap()
        };
        let (skipped, w) = run(&k, &v, Some(4..9));
        let (gone, w_gone) = run(&without(&k), &without(&v), None);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&skipped), bits(&gone));
        assert_eq!(bits(&w.unwrap()), bits(&w_gone.unwrap()));
        let (all, _) = run(&k, &v, None);
        assert_ne!(bits(&all), bits(&gone), "the skipped rows mattered");
    }

    #[test]
    fn exp_matches_libm_over_the_softmax_range() {
        let mut worst = 0f32;
        let mut x = 0f32;
        while x > -87.0 {
            let (got, want) = (exp_nonpositive(x), x.exp());
            worst = worst.max((got - want).abs() / want);
            x -= 0.001_3;
        }
        assert!(worst < 5e-7, "max relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-200.0) < 1e-37);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn a_view_outside_its_buffer_is_refused() {
        let data = vec![0f32; 100];
        let layout = Layout::contiguous((2, 10, 8));
        assert!(CacheView::new(&data, &layout).is_none());
        assert!(CacheView::new(&data, &Layout::contiguous((1, 10, 8))).is_some());
    }
}
