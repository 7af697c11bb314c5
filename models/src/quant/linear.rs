//! [`QLinear`], Tern's quantized linear layer: `y = x W^T` with `W` a GGUF weight
//! matrix `[out, in]`.
//!
//! Q4_0, Q4_1 and Q8_0 weights are repacked into Tern-owned aligned storage and run
//! on Tern's kernels ([`super::dot`]) over Tern's thread pool ([`super::pool`]):
//! activations are quantized once per call, then the output columns are split into
//! tasks that idle pool threads pull from a shared counter. The K-quants run on
//! [`super::k`] in the order llama.cpp's kernel for the case has. F32/F16/BF16
//! run through candle's `QMatMul`, inside the same type, so callers never branch;
//! any other dtype is refused when the layer is built.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Module, Result, Shape, Tensor};

use super::blocks::{BlockOrder, PackedWeights, QuantizedActs, WeightFormat, GROUP, QK};
use super::dot::{self, Kernel, OutPtr};
use super::float::{HalfFormat, HalfWeights};
use super::k::{llama_cpp_order, GluFn, KFormat, KWeights};
use super::pool::Pool;
use crate::gguf_types::OwnType;

/// Below this many (output, block, row) products a call runs on the caller alone:
/// waking the pool would cost more than it saves.
const PARALLEL_MIN_BLOCK_DOTS: usize = 2048;
/// Tasks per thread a call's output columns are split into, so a thread that was
/// descheduled mid-call costs the others little.
const TASKS_PER_THREAD: usize = 4;
/// Weight rows dequantized at a time by [`QLinear::backward_input`] when
/// the weight is larger than [`BACKWARD_WHOLE_VALUES`].
const BACKWARD_TILE_ROWS: usize = 256;
/// Up to this many values (16 MB of f32) a weight is dequantized whole for
/// its backward.
const BACKWARD_WHOLE_VALUES: usize = 4 << 20;

/// A weight's stored type: one candle knows, or one Tern reads past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightType {
    /// A type of candle's `GgmlDType`.
    Ggml(GgmlDType),
    /// IQ4_NL or IQ4_XS (see [`super::iq4`]).
    Own(OwnType),
}

impl WeightType {
    /// Values per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::Ggml(t) => t.block_size(),
            Self::Own(t) => t.block_values(),
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::Ggml(t) => t.type_size(),
            Self::Own(t) => t.block_bytes(),
        }
    }
}

impl From<GgmlDType> for WeightType {
    fn from(t: GgmlDType) -> Self {
        Self::Ggml(t)
    }
}

/// A quantized linear layer (no bias) over a GGUF weight `[out, in]`.
pub struct QLinear {
    out_dim: usize,
    in_dim: usize,
    dtype: WeightType,
    imp: Imp,
}

enum Imp {
    Native(PackedWeights),
    Half(HalfWeights),
    K(KWeights),
    Candle(QMatMul),
}

impl std::fmt::Debug for QLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QLinear")
            .field("out_dim", &self.out_dim)
            .field("in_dim", &self.in_dim)
            .field("dtype", &self.dtype)
            .field("native", &self.is_native())
            .finish()
    }
}

impl QLinear {
    /// Builds the layer from a weight tensor `[out, in]`, copying Q4_0/Q4_1/Q8_0
    /// blocks into Tern's layout (the tensor can be dropped afterwards).
    pub fn from_qtensor(weight: QTensor) -> Result<Self> {
        Self::from_arc(Arc::new(weight))
    }

    /// As [`QLinear::from_qtensor`], for a weight shared with other users (e.g. a
    /// tied embedding): native dtypes copy it, others keep a reference.
    pub fn from_arc(weight: Arc<QTensor>) -> Result<Self> {
        let (out_dim, in_dim) = match weight.shape().dims() {
            &[o, i] => (o, i),
            d => bail!("QLinear needs a 2-D weight [out, in], got shape {d:?}"),
        };
        let dtype = weight.dtype();
        let cpu = weight.device().is_cpu();
        let native = WeightFormat::from_ggml(dtype).filter(|_| cpu && in_dim.is_multiple_of(QK));
        let imp = if let Some(format) = native {
            let data = weight.data()?;
            let order = BlockOrder::llama_cpp(format, out_dim);
            Imp::Native(
                PackedWeights::from_ggml(format, out_dim, in_dim, &data, order)
                    .map_err(candle_core::Error::msg)?,
            )
        } else if let Some(format) = KFormat::from_ggml(dtype).filter(|_| cpu) {
            let order = llama_cpp_order(format, out_dim);
            let data = weight.data()?;
            Imp::K(
                KWeights::from_ggml(format, out_dim, in_dim, &data, order)
                    .map_err(candle_core::Error::msg)?,
            )
        } else if let Some(format) = HalfFormat::from_ggml(dtype).filter(|_| cpu) {
            let data = weight.data()?;
            Imp::Half(
                HalfWeights::from_ggml(format, out_dim, in_dim, &data)
                    .map_err(candle_core::Error::msg)?,
            )
        } else if matches!(dtype, GgmlDType::F32) || !cpu {
            Imp::Candle(QMatMul::from_arc(weight)?)
        } else {
            // Never a silent fallback: candle's kernels would not round as
            // llama.cpp does.
            bail!("no Tern kernel for GGUF type {dtype:?} (weight [{out_dim}, {in_dim}])")
        };
        Ok(Self {
            out_dim,
            in_dim,
            dtype: WeightType::Ggml(dtype),
            imp,
        })
    }

    /// Builds the layer from the bytes of an IQ4_NL or IQ4_XS matrix
    /// `[out_dim, in_dim]` in ggml's layout (copied; the caller's buffer can
    /// go), in the order llama.cpp runs it in. The one place such a weight's
    /// bytes become a Tern weight.
    pub fn from_own(ty: OwnType, out_dim: usize, in_dim: usize, data: &[u8]) -> Result<Self> {
        let imp = match ty {
            OwnType::Iq4Nl => {
                let order = BlockOrder::llama_cpp(WeightFormat::Iq4Nl, out_dim);
                Imp::Native(
                    PackedWeights::from_ggml(WeightFormat::Iq4Nl, out_dim, in_dim, data, order)
                        .map_err(candle_core::Error::msg)?,
                )
            }
            OwnType::Iq4Xs => {
                let order = llama_cpp_order(KFormat::Iq4Xs, out_dim);
                Imp::K(
                    KWeights::from_ggml(KFormat::Iq4Xs, out_dim, in_dim, data, order)
                        .map_err(candle_core::Error::msg)?,
                )
            }
        };
        Ok(Self {
            out_dim,
            in_dim,
            dtype: WeightType::Own(ty),
            imp,
        })
    }

    /// Output features (rows of the weight).
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Input features (columns of the weight).
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// The weight's stored type.
    pub fn dtype(&self) -> WeightType {
        self.dtype
    }

    /// Whether Tern's kernels run this layer (false: candle's `QMatMul` does).
    pub fn is_native(&self) -> bool {
        matches!(self.imp, Imp::Native(_) | Imp::Half(_) | Imp::K(_))
    }

    /// Rows `ids` of the weight, dequantized to `[ids.len(), in]` f32: the token
    /// embedding lookup, so a tied embedding/output matrix is held once.
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        match &self.imp {
            Imp::Native(_) | Imp::Half(_) | Imp::K(_) => {
                let mut out = vec![0f32; ids.len() * self.in_dim];
                for (row, &id) in out.chunks_exact_mut(self.in_dim).zip(ids) {
                    if id as usize >= self.out_dim {
                        bail!("row {id} is outside the matrix ({} rows)", self.out_dim);
                    }
                    match &self.imp {
                        Imp::Native(w) => w.dequantize_row(id as usize, row),
                        Imp::Half(w) => w.dequantize_row(id as usize, row),
                        Imp::K(w) => w.dequantize_row(id as usize, row),
                        Imp::Candle(_) => unreachable!("matched above"),
                    }
                }
                Tensor::from_vec(out, (ids.len(), self.in_dim), &candle_core::Device::Cpu)
            }
            Imp::Candle(m) => {
                let ids = Tensor::from_vec(ids.to_vec(), ids.len(), &candle_core::Device::Cpu)?;
                m.embedding(&ids)
            }
        }
    }

    /// The whole weight as f32 `[out, in]`, every value as the kernels and
    /// [`QLinear::rows`] see it.
    pub fn to_dense(&self) -> Result<Tensor> {
        let ids: Vec<u32> = (0..self.out_dim as u32).collect();
        self.rows(&ids)
    }

    /// `g W` for `g` `[T, out]`: the gradient of `x W^T` with respect to `x`,
    /// from blocks dequantized a tile of rows at a time, so a frozen
    /// quantized weight is never held as f32 whole (the learner's backward).
    pub fn backward_input(&self, g: &Tensor) -> Result<Tensor> {
        let (t, out) = g.dims2()?;
        if out != self.out_dim {
            bail!(
                "QLinear [{}, {}] backward given a gradient of shape {:?}",
                self.out_dim,
                self.in_dim,
                g.dims()
            );
        }
        let g = g.to_dtype(DType::F32)?;
        if t == 0 {
            return Tensor::zeros((0, self.in_dim), DType::F32, &candle_core::Device::Cpu);
        }
        // A projection's weight dequantized whole is a few MB and one
        // matmul; a vocabulary-sized one goes a tile of rows at a time.
        let tile = if out * self.in_dim <= BACKWARD_WHOLE_VALUES {
            out
        } else {
            BACKWARD_TILE_ROWS
        };
        let mut acc: Option<Tensor> = None;
        let mut start = 0;
        while start < out {
            let n = tile.min(out - start);
            let ids: Vec<u32> = (start as u32..(start + n) as u32).collect();
            let w = self.rows(&ids)?; // [n, in]
            let gs = if n == out {
                g.clone()
            } else {
                g.narrow(1, start, n)?.contiguous()?
            };
            let part = gs.matmul(&w)?; // [T, in]
            acc = Some(match acc {
                Some(a) => (a + part)?,
                None => part,
            });
            start += n;
        }
        acc.ok_or_else(|| candle_core::Error::Msg("empty weight".into()))
    }

    /// `x W^T` for `x` `[.., in]` (any float dtype, computed in f32): returns
    /// `[.., out]` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, dot::best_kernel())
    }

    /// [`QLinear::forward`] on a chosen kernel (tests compare them).
    pub(crate) fn forward_with(&self, x: &Tensor, kernel: Kernel) -> Result<Tensor> {
        match x.dims().last() {
            Some(&n) if n == self.in_dim => {}
            _ => bail!(
                "QLinear [{}, {}] applied to input of shape {:?}",
                self.out_dim,
                self.in_dim,
                x.dims()
            ),
        }
        match &self.imp {
            Imp::Candle(mm) => mm.forward(x)?.to_dtype(DType::F32),
            Imp::Native(w) => self.product(x, &|x, rows| w.matmul(x, rows, kernel)),
            Imp::Half(w) => self.product(x, &|x, rows| w.matmul(x, rows, kernel)),
            Imp::K(w) => self.product(x, &|x, rows| w.matmul(x, rows, kernel)),
        }
    }

    /// `run` over `x` as f32 in one contiguous piece ([`ProductOp`]).
    fn product(
        &self,
        x: &Tensor,
        run: &(dyn Fn(&[f32], usize) -> Vec<f32> + Sync),
    ) -> Result<Tensor> {
        let op = ProductOp {
            in_dim: self.in_dim,
            out_dim: self.out_dim,
            run,
        };
        x.to_dtype(DType::F32)?.contiguous()?.apply_op1_no_bwd(&op)
    }
}

/// A gated unit's two projections of one input, `act(x G^T) * (x U^T)`
/// with SiLU (`gelu: false`) or GELU's tanh form as activation: one fused
/// pass where both are K-quant weights the fast kernels take alike
/// ([`KWeights::matmul_glu`]), with the bits of the two products and
/// [`crate::exact::swiglu`] / [`crate::exact::geglu_tanh`] run apart;
/// `None` otherwise (the caller runs them apart).
pub fn glu(gate: &QLinear, up: &QLinear, x: &Tensor, gelu: bool) -> Result<Option<Tensor>> {
    let (Imp::K(g), Imp::K(u)) = (&gate.imp, &up.imp) else {
        return Ok(None);
    };
    let Some(&cols) = x.dims().last() else {
        return Ok(None);
    };
    if cols != gate.in_dim || !g.fuses_with(u, x.elem_count() / cols) {
        return Ok(None);
    }
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    Ok(Some(x.apply_op1_no_bwd(&GluOp {
        gate: g,
        up: u,
        gelu,
    })?))
}

/// [`glu`] as a candle op, over the input's storage in place.
struct GluOp<'a> {
    gate: &'a KWeights,
    up: &'a KWeights,
    gelu: bool,
}

impl CustomOp1 for GluOp<'_> {
    fn name(&self) -> &'static str {
        "tern-glu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            bail!("tern-glu expects f32 input");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("tern-glu expects a contiguous input");
        };
        let dims = layout.shape().dims();
        let rows = (end - start) / self.gate.cols;
        let act: &GluFn = if self.gelu {
            &crate::exact::geglu_tanh_into
        } else {
            &crate::exact::swiglu_into
        };
        let Some(out) = self.gate.matmul_glu(self.up, &data[start..end], rows, act) else {
            bail!("tern-glu: the kernels do not fuse this pair");
        };
        let mut out_dims = dims[..dims.len() - 1].to_vec();
        out_dims.push(self.gate.rows);
        Ok((CpuStorage::F32(out), Shape::from(out_dims)))
    }
}

impl Module for QLinear {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        QLinear::forward(self, xs)
    }
}

/// A GGUF matrix `[out, in]` as f32 with exactly the values Tern's kernels
/// and embedding lookups use: for the types they run, ggml's
/// `dequantize_row_*` bit for bit. A dense copy of a weight (the learner's) is
/// so the served weight by construction, not by a second implementation
/// (candle's) happening to agree. Other types go to candle.
pub fn dequantize(weight: QTensor) -> Result<Tensor> {
    let weight = Arc::new(weight);
    if weight.shape().rank() == 2 {
        if let Ok(layer) = QLinear::from_arc(Arc::clone(&weight)) {
            if layer.is_native() {
                return layer.to_dense();
            }
        }
    }
    weight.dequantize(&candle_core::Device::Cpu)
}

/// An IQ4_NL or IQ4_XS matrix `[rows, cols]` (ggml's bytes) as f32, ggml's
/// `dequantize_row_iq4_*` bit for bit: the values [`QLinear::from_own`]'s
/// kernels and lookups use.
pub fn dequantize_own(ty: OwnType, rows: usize, cols: usize, data: &[u8]) -> Result<Tensor> {
    QLinear::from_own(ty, rows, cols, data)?.to_dense()
}

/// Tern's product `x W^T` as a candle custom op, which hands it the input's
/// CPU slice in place (a prefill's activations are megabytes: no copy).
/// `run(x, rows)` multiplies `rows` rows of `in_dim` values.
struct ProductOp<'a> {
    in_dim: usize,
    out_dim: usize,
    run: &'a (dyn Fn(&[f32], usize) -> Vec<f32> + Sync),
}

impl CustomOp1 for ProductOp<'_> {
    fn name(&self) -> &'static str {
        "tern-qlinear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            bail!("tern-qlinear expects f32 input");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("tern-qlinear expects a contiguous input");
        };
        let dims = layout.shape().dims();
        let rows = (end - start) / self.in_dim;
        let out = (self.run)(&data[start..end], rows);
        let mut out_dims = dims[..dims.len() - 1].to_vec();
        out_dims.push(self.out_dim);
        Ok((CpuStorage::F32(out), Shape::from(out_dims)))
    }
}

impl PackedWeights {
    /// `x` (`rows * self.cols` f32, row-major) times the transpose:
    /// `rows * self.rows` f32, on the pool, in the weight's [`BlockOrder`].
    pub fn matmul(&self, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        matmul(self, x, rows, kernel)
    }
}

/// `x` (`rows * w.cols` f32, row-major) times `w^T`: `rows * w.rows` f32.
fn matmul(w: &PackedWeights, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
    let (out_dim, nb) = (w.rows, w.blocks_per_row());
    if rows == 0 || out_dim == 0 {
        return vec![0f32; rows * out_dim];
    }
    if rows > 1
        && w.format == WeightFormat::Iq4Nl
        && w.order == BlockOrder::VecDot
        && super::alone::active()
    {
        // The one packed format whose order changes with the row count
        // (`ggml_vec_dot_iq4_nl_q8_0` for one row, tinyBLAS from two): its
        // rows one at a time.
        return x[..rows * w.cols]
            .chunks_exact(w.cols)
            .flat_map(|row| matmul(w, row, 1, kernel))
            .collect();
    }
    // Not zeroed first: `gemm_range` writes every row of its columns, and
    // the columns below cover `0..out_dim` (a prefill's output is
    // megabytes, zeroed on one thread).
    let mut out: Vec<f32> = Vec::with_capacity(rows * out_dim);
    let mut acts = QuantizedActs::zeroed(rows, nb, w.format.needs_act_sums());
    dot::quantize_rows(kernel, x, w.cols, 0..rows, &mut acts);
    let acts = &acts;
    #[cfg(target_arch = "x86_64")]
    let wide = dot::wide_acts(kernel, w, acts);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as `dot::gemm_range`, whose contract the callers below keep.
    let gemm = |cols: std::ops::Range<usize>, optr: OutPtr| unsafe {
        dot::gemm_range_with(kernel, w, acts, wide.as_ref(), cols, optr)
    };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as above.
    let gemm = |cols: std::ops::Range<usize>, optr: OutPtr| unsafe {
        dot::gemm_range(kernel, w, acts, cols, optr)
    };
    let optr = OutPtr {
        ptr: out.as_mut_ptr(),
        stride: out_dim,
    };
    let pool = Pool::global();
    let threads = pool.threads();
    if threads == 1 || rows * out_dim * nb < PARALLEL_MIN_BLOCK_DOTS {
        // `out` holds `rows * out_dim` f32 and this thread alone writes it.
        gemm(0..out_dim, optr);
        // SAFETY: every row of columns `0..out_dim` was written.
        unsafe { out.set_len(rows * out_dim) };
        return out;
    }
    // Task boundaries on the kernels' tiles: whole row groups for decode, slabs of
    // 16 weight rows when several activation rows share each weight row.
    let unit = if rows == 1 { GROUP } else { 4 * GROUP };
    let chunk = out_dim
        .div_ceil(threads * TASKS_PER_THREAD)
        .div_ceil(unit)
        .max(1)
        * unit;
    let n_tasks = out_dim.div_ceil(chunk);
    let next = AtomicUsize::new(0);
    pool.run(&|| loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= n_tasks {
            break;
        }
        let cols = t * chunk..out_dim.min((t + 1) * chunk);
        // `out` holds `rows * out_dim` f32 and outlives `pool.run`; each task
        // index is claimed exactly once, so each column range has one writer.
        gemm(cols, optr);
    });
    // SAFETY: the tasks covered columns `0..out_dim`, each writing every row.
    unsafe { out.set_len(rows * out_dim) };
    out
}
