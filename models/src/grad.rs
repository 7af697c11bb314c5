//! The sampler's own operations with gradients: each op's forward is the
//! exact serving computation ([`crate::exact`], [`crate::flash`], Tern's
//! quantized kernels), so a learner running them scores a sampled sequence
//! with the sampler's numbers, bit for bit wherever a kernel gives a row the
//! same result in a batch of any size; each backward is the plain f32
//! derivative of the real-valued function the op rounds (the rounding itself
//! passes gradients straight through, as quantization-aware training does).
//!
//! The model reaches for these only when an input carries a gradient
//! (`Tensor::track_op`); serving keeps its direct calls.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Device, Layout, Result, Shape, Tensor,
};

use crate::attention::CacheView;
use crate::flash::{self, FlashKernel, Queries};
use crate::quant::pool::Pool;
use crate::quant::QLinear;
use crate::visibility::Visibility;

/// The contiguous f32 values of an op input.
fn values<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(d) = s else {
        bail!("the learner's ops take f32 tensors");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("the learner's ops take contiguous tensors");
    };
    Ok(&d[a..b])
}

fn vec_of(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

fn out(v: Vec<f32>, shape: &Shape) -> Result<(CpuStorage, Shape)> {
    Ok((CpuStorage::F32(v), shape.clone()))
}

/// RMSNorm over the last dimension with a frozen weight, as
/// [`crate::exact::rms_norm`] rounds it.
pub(crate) struct RmsNorm {
    pub(crate) w: Vec<f32>,
    pub(crate) eps: f32,
}

impl CustomOp1 for RmsNorm {
    fn name(&self) -> &'static str {
        "exact-rms-norm"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        out(
            crate::exact::rms_norm(values(s, l)?, &self.w, self.eps),
            l.shape(),
        )
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        // y = x s w with s = (mean(x^2) + eps)^-1/2:
        // dx = s (g w) - x s^3 / D * sum(g w x).
        let (x, g) = (vec_of(arg)?, vec_of(g)?);
        let d = self.w.len();
        let mut dx = vec![0f32; x.len()];
        for ((xr, gr), dr) in x
            .chunks_exact(d)
            .zip(g.chunks_exact(d))
            .zip(dx.chunks_exact_mut(d))
        {
            let ms: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
            let s = 1.0 / (ms + self.eps as f64).sqrt();
            let dot: f64 = xr
                .iter()
                .zip(gr)
                .zip(&self.w)
                .map(|((&x, &g), &w)| (g * w) as f64 * x as f64)
                .sum();
            let k = s * s * s / d as f64 * dot;
            for (((o, &x), &g), &w) in dr.iter_mut().zip(xr).zip(gr).zip(&self.w) {
                *o = (s * (g * w) as f64 - x as f64 * k) as f32;
            }
        }
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

/// RoPE of rows `[T, heads * head_dim]` at the batch's angles (`[T, hd/2]`
/// each), as [`crate::exact`] rotates them.
pub(crate) struct Rope {
    pub(crate) cos: Arc<Vec<f32>>,
    pub(crate) sin: Arc<Vec<f32>>,
    pub(crate) head_dim: usize,
    pub(crate) neox: bool,
}

impl Rope {
    fn turn(&self, xs: &mut [f32], sin: &[f32]) {
        if self.neox {
            crate::exact::rope_neox(xs, self.head_dim, &self.cos, sin);
        } else {
            crate::exact::rope_pairs(xs, self.head_dim, &self.cos, sin);
        }
    }
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "exact-rope"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let mut xs = values(s, l)?.to_vec();
        self.turn(&mut xs, &self.sin);
        out(xs, l.shape())
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        // A rotation's transpose is the rotation by the opposite angle.
        let mut gs = vec_of(g)?;
        let neg: Vec<f32> = self.sin.iter().map(|&s| -s).collect();
        self.turn(&mut gs, &neg);
        Ok(Some(Tensor::from_vec(gs, arg.shape(), arg.device())?))
    }
}

/// `x * s` in f32 (Gemma's and Phi-3's query scale).
pub(crate) struct Scale(pub(crate) f32);

impl CustomOp1 for Scale {
    fn name(&self) -> &'static str {
        "exact-scale"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        out(
            values(s, l)?.iter().map(|&v| v * self.0).collect(),
            l.shape(),
        )
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let gs: Vec<f32> = vec_of(g)?.iter().map(|&v| v * self.0).collect();
        Ok(Some(Tensor::from_vec(gs, arg.shape(), arg.device())?))
    }
}

/// Rounding to f16 and back (the f16 KV cache's values), with the gradient
/// passed straight through in f32 (a cast's own backward would round the
/// gradient to f16 as well).
pub(crate) struct RoundF16;

impl CustomOp1 for RoundF16 {
    fn name(&self) -> &'static str {
        "round-f16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let v = values(s, l)?
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect();
        out(v, l.shape())
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.detach()))
    }
}

/// The gated MLP activation `act(gate) * up`, as [`crate::exact`] rounds it.
pub(crate) struct Glu {
    /// GELU (tanh form) rather than SiLU.
    pub(crate) gelu: bool,
}

impl Glu {
    /// `act(x)` and `act'(x)` in f32.
    fn act(&self, x: f32) -> (f32, f32) {
        if self.gelu {
            const C: f32 = 0.797_884_6; // sqrt(2 / pi)
            const A: f32 = 0.044_715;
            let u = C * (x + A * x * x * x);
            let t = u.tanh();
            let y = 0.5 * x * (1.0 + t);
            let dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3.0 * A * x * x);
            (y, dy)
        } else {
            let s = 1.0 / (1.0 + (-x).exp());
            (x * s, s * (1.0 + x * (1.0 - s)))
        }
    }
}

impl CustomOp2 for Glu {
    fn name(&self) -> &'static str {
        "exact-glu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, u) = (values(s1, l1)?, values(s2, l2)?);
        if g.len() != u.len() {
            bail!("gate and up differ in size");
        }
        let y = if self.gelu {
            crate::exact::geglu_tanh(g, u)
        } else {
            crate::exact::swiglu(g, u)
        };
        out(y, l1.shape())
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (gs, us, gr) = (vec_of(gate)?, vec_of(up)?, vec_of(g)?);
        let mut dg = Vec::with_capacity(gs.len());
        let mut du = Vec::with_capacity(gs.len());
        for ((&x, &u), &o) in gs.iter().zip(&us).zip(&gr) {
            let (a, da) = self.act(x);
            dg.push(o * u * da);
            du.push(o * a);
        }
        Ok((
            Some(Tensor::from_vec(dg, gate.shape(), gate.device())?),
            Some(Tensor::from_vec(du, up.shape(), up.device())?),
        ))
    }
}

/// `x W^T` on Tern's quantized kernels for a frozen weight; the backward
/// gives `x` its gradient from blocks dequantized a tile at a time.
pub(crate) struct QuantMatmul {
    pub(crate) w: Arc<QLinear>,
}

impl CustomOp1 for QuantMatmul {
    fn name(&self) -> &'static str {
        "quant-matmul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = Tensor::from_slice(values(s, l)?, l.shape(), &Device::Cpu)?;
        let y = self.w.forward(&x)?;
        let shape = y.shape().clone();
        out(vec_of(&y)?, &shape)
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let rows = arg.elem_count() / self.w.in_dim();
        let g2 = g.reshape((rows, self.w.out_dim()))?;
        Ok(Some(self.w.backward_input(&g2)?.reshape(arg.shape())?))
    }
}

/// `a . b` over equal-length slices in one fixed order (eight lanes, then
/// their sum), whatever else is computed beside it.
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s = x.mul_add(*y, s);
    }
    s
}

/// Rows of a LoRA delta one pool work item computes.
const LORA_ROWS_PER_ITEM: usize = 8;

/// A LoRA adapter's contribution `scale * (x A^T) B^T`, each output row
/// computed on its own in a fixed order: the same numbers whether a row is
/// decoded alone, beside others, or teacher-forced in a long pass (a general
/// matmul may block rows differently by their count).
pub(crate) struct LoraDelta {
    pub(crate) scale: f32,
}

impl CustomOp3 for LoraDelta {
    fn name(&self) -> &'static str {
        "lora-delta"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sa: &CpuStorage,
        la: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, a, b) = (values(sx, lx)?, values(sa, la)?, values(sb, lb)?);
        let (rank, inp) = la.shape().dims2()?;
        let (outp, rank_b) = lb.shape().dims2()?;
        if rank_b != rank || *lx.dims().last().unwrap_or(&0) != inp {
            bail!(
                "LoRA shapes disagree: x {:?}, A {:?}, B {:?}",
                lx.dims(),
                la.dims(),
                lb.dims()
            );
        }
        let rows = x.len() / inp.max(1);
        // B transposed, so each rank's column runs along the outputs and the
        // update below vectorizes across them; every output still sums its
        // rank terms in one fixed order.
        let mut bt = vec![0f32; rank * outp];
        for (o, row) in b.chunks_exact(rank).enumerate() {
            for (k, &v) in row.iter().enumerate() {
                bt[k * outp + o] = v;
            }
        }
        let mut y = vec![0f32; rows * outp];
        // Rows are independent: a long pass (prefill, the learner) splits
        // them across the pool, each row's numbers the same wherever it runs.
        let one_row = |xr: &[f32], yr: &mut [f32], h: &mut [f32]| {
            for (k, hk) in h.iter_mut().enumerate() {
                *hk = dot8(xr, &a[k * inp..(k + 1) * inp]);
            }
            for (k, &hk) in h.iter().enumerate() {
                for (yo, &bv) in yr.iter_mut().zip(&bt[k * outp..(k + 1) * outp]) {
                    *yo = hk.mul_add(bv, *yo);
                }
            }
            for yo in yr.iter_mut() {
                *yo *= self.scale;
            }
        };
        let items: Vec<Mutex<(&[f32], &mut [f32])>> = x
            .chunks(LORA_ROWS_PER_ITEM * inp)
            .zip(y.chunks_mut(LORA_ROWS_PER_ITEM * outp))
            .map(Mutex::new)
            .collect();
        let next = AtomicUsize::new(0);
        let job = || {
            let mut h = vec![0f32; rank];
            while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                let mut item = item.lock().unwrap_or_else(|e| e.into_inner());
                let (xs, ys) = &mut *item;
                for (xr, yr) in xs.chunks_exact(inp).zip(ys.chunks_exact_mut(outp)) {
                    one_row(xr, yr, &mut h);
                }
            }
        };
        if items.len() > 1 {
            Pool::global().run(&job);
        } else {
            job();
        }
        drop(items);
        let mut dims = lx.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = outp;
        }
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // Detached: a gradient must not carry (and keep alive) the graph of
        // the pass that produced it.
        let (x, a, b, g) = (x.detach(), a.detach(), b.detach(), g.detach());
        let inp = a.dim(1)?;
        let rows = x.elem_count() / inp;
        let x2 = x.reshape((rows, inp))?;
        let g2 = (g.reshape((rows, b.dim(0)?))? * self.scale as f64)?;
        let gb = g2.matmul(&b)?; // [T, r]
        let dx = gb.matmul(&a)?.reshape(x.shape())?;
        let da = gb.t()?.matmul(&x2)?; // [r, in]
        let h = x2.matmul(&a.t()?)?; // [T, r]
        let db = g2.t()?.matmul(&h)?; // [out, r]
        Ok((Some(dx), Some(da), Some(db)))
    }
}

/// One sequence's attention `[H, n, hd]` over its cache `[KV, C, hd]`, rows
/// rounded by the kernel the sampler ran for them ([`FlashKernel`]); the
/// backward recomputes the softmax in f32.
pub(crate) struct Attention {
    pub(crate) q_pos: Vec<u32>,
    /// Cached positions per KV head.
    pub(crate) k_pos: Vec<Vec<u32>>,
    pub(crate) replay: Option<(Arc<Visibility>, usize)>,
    pub(crate) window: Option<u32>,
    pub(crate) scale: f32,
    /// Runs of query rows and the kernel each ran on.
    pub(crate) segments: Vec<(Range<usize>, FlashKernel)>,
}

impl Attention {
    fn sees(&self, kvh: usize, q: u32, k: u32) -> bool {
        let seen = match &self.replay {
            None => k <= q,
            Some((vis, layer)) => vis.visible(*layer, kvh, q, k),
        };
        seen && self.window.is_none_or(|w| flash::in_window(q, k, w))
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "exact-attention"
    }

    fn cpu_fwd(
        &self,
        sq: &CpuStorage,
        lq: &Layout,
        sk: &CpuStorage,
        lk: &Layout,
        sv: &CpuStorage,
        lv: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let q = values(sq, lq)?;
        let (n_head, n, hd) = lq.shape().dims3()?;
        let (CpuStorage::F32(kd), CpuStorage::F32(vd)) = (sk, sv) else {
            bail!("attention takes f32 keys and values");
        };
        let (Some(kv), Some(vv)) = (CacheView::new(kd, lk), CacheView::new(vd, lv)) else {
            bail!("attention takes row-contiguous keys and values");
        };
        let n_kv = self.k_pos.len();
        if n != self.q_pos.len() || n_kv == 0 || n_head % n_kv != 0 {
            bail!("attention shapes disagree");
        }
        let k_pos: Vec<&[u32]> = self.k_pos.iter().map(|p| p.as_slice()).collect();
        let mut y = vec![0f32; n * n_head * hd];
        for (rows, kernel) in &self.segments {
            let m = rows.len();
            let mut qs = Vec::with_capacity(n_head * m * hd);
            for h in 0..n_head {
                qs.extend_from_slice(&q[(h * n + rows.start) * hd..(h * n + rows.end) * hd]);
            }
            let queries = Queries {
                q: &qs,
                pos: &self.q_pos[rows.clone()],
                group: n_head / n_kv,
                replay: self.replay.as_ref().map(|(v, l)| (&**v, *l)),
                window: self.window,
                kernel: *kernel,
            };
            let (o, _) = flash::attend(&queries, &kv, &vv, &k_pos, self.scale, false);
            y[rows.start * n_head * hd..rows.end * n_head * hd].copy_from_slice(&o);
        }
        out(y, &Shape::from((n, n_head * hd)))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // Plain softmax attention in f32, the heads of a group folded into
        // rows: S = scale Q K^T + mask, P = softmax(S), dV = P^T dO,
        // dS = P (dO V^T - rowsum(P dO V^T)), dQ = scale dS K, dK = scale dS^T Q.
        let (q, k, v, g) = (q.detach(), k.detach(), v.detach(), g.detach());
        let (n_head, n, hd) = q.dims3()?;
        let (n_kv, c, _) = k.dims3()?;
        let group = n_head / n_kv;
        let mut mask = vec![0f32; n_kv * n * c];
        for kvh in 0..n_kv {
            for (i, &qp) in self.q_pos.iter().enumerate() {
                let row = &mut mask[(kvh * n + i) * c..(kvh * n + i + 1) * c];
                for (m, &kp) in row.iter_mut().zip(&self.k_pos[kvh]) {
                    if !self.sees(kvh, qp, kp) {
                        *m = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let dev = q.device();
        let mask = Tensor::from_vec(mask, (n_kv, 1, n, c), dev)?;
        let (k, v) = (k.contiguous()?, v.contiguous()?);
        let qf = q.contiguous()?.reshape((n_kv, group * n, hd))?;
        let scores = (qf.matmul(&k.t()?)? * self.scale as f64)?
            .reshape((n_kv, group, n, c))?
            .broadcast_add(&mask)?
            .reshape((n_kv, group * n, c))?;
        let p = masked_softmax(&scores)?;
        let dout = g
            .reshape((n, n_head, hd))?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n_kv, group * n, hd))?;
        let dv = p.t()?.matmul(&dout)?;
        let dp = dout.matmul(&v.t()?)?;
        let row = (&dp * &p)?.sum_keepdim(2)?;
        let ds = (p * dp.broadcast_sub(&row)?)?;
        let dq = (ds.matmul(&k)? * self.scale as f64)?.reshape((n_head, n, hd))?;
        let dk = (ds.t()?.matmul(&qf)? * self.scale as f64)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// Softmax over the last dimension; a row with nothing visible is zero.
fn masked_softmax(s: &Tensor) -> Result<Tensor> {
    let max = s.max_keepdim(candle_core::D::Minus1)?;
    let max = max.ge(f32::MIN)?.where_cond(&max, &max.zeros_like()?)?;
    let e = s.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(candle_core::D::Minus1)?;
    let sum = (sum.clone() + sum.eq(0f32)?.to_dtype(candle_core::DType::F32)?)?;
    e.broadcast_div(&sum)
}
