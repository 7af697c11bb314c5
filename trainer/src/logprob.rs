//! Log-probabilities of chosen tokens, and their gradients, computed over the
//! vocabulary in chunks so `[rows, vocab]` logits never sit in memory at once.
//!
//! For hidden states `h_t` and output matrix `W` (`[vocab, D]`),
//! `log p_t = h_t . W[y_t] - logsumexp_v(h_t . W_v)` and
//! `d log p_t / d h_t = W[y_t] - sum_v p_t(v) W_v`. Both need one pass over the
//! vocabulary for the log-sum-exp and (for the gradient) a second for the
//! expectation; each pass holds one `[rows, CHUNK]` block of logits.

use candle_core::{DType, Device, Tensor};
use tern_models::quant::QLinear;
use tern_runtime::sampler::{logprob_of, tempered_logprob_of};

use crate::error::Result;

/// Vocabulary rows per chunk: `[rows, 4096]` f32 logits at a time.
pub const CHUNK: usize = 4096;

/// Per row: `logsumexp` of its logits and the logit of its target.
pub struct RowStats {
    /// `logsumexp_v(h_t . W_v)` per row.
    pub lse: Vec<f64>,
    /// `h_t . W[y_t]` per row.
    pub target_logit: Vec<f64>,
}

impl RowStats {
    /// `log p_t` per row.
    pub fn logprobs(&self) -> Vec<f64> {
        self.target_logit
            .iter()
            .zip(&self.lse)
            .map(|(z, l)| z - l)
            .collect()
    }
}

/// Pass 1: the log-sum-exp and target logit of every row of `h` (`[R, D]`,
/// detached) against `w` (`[V, D]`), `targets` one per row.
pub fn row_stats(h: &Tensor, w: &Tensor, targets: &[u32]) -> Result<RowStats> {
    let rows = targets.len();
    let vocab = w.dim(0)?;
    let mut max = vec![f64::NEG_INFINITY; rows];
    let mut sum = vec![0f64; rows];
    let mut target_logit = vec![f64::NAN; rows];
    let mut start = 0;
    while start < vocab {
        let n = CHUNK.min(vocab - start);
        let logits = h.matmul(&w.narrow(0, start, n)?.t()?)?; // [R, n]
        let flat = logits
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        for r in 0..rows {
            let row = &flat[r * n..(r + 1) * n];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            if m > max[r] {
                sum[r] *= (max[r] - m).exp();
                max[r] = m;
            }
            sum[r] += row.iter().map(|&z| (z as f64 - max[r]).exp()).sum::<f64>();
            let y = targets[r] as usize;
            if (start..start + n).contains(&y) {
                target_logit[r] = row[y - start] as f64;
            }
        }
        start += n;
    }
    let lse = max.iter().zip(&sum).map(|(m, s)| m + s.ln()).collect();
    Ok(RowStats { lse, target_logit })
}

/// Pass 2: `coef_t * (W[y_t] - E_{p_t}[W])` per row, `[R, D]`: the gradient
/// of `sum_t coef_t log p_t` with respect to `h`.
pub fn grad_hidden(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    stats: &RowStats,
    coef: &[f64],
) -> Result<Tensor> {
    let (vocab, _) = w.dims2()?;
    let idx = Tensor::from_slice(targets, targets.len(), &Device::Cpu)?;
    let wy = w.index_select(&idx, 0)?;
    expectation_grad(
        h,
        vocab,
        |s, n| Ok(w.narrow(0, s, n)?),
        wy,
        stats,
        coef,
        1.0,
    )
}

/// `coef_t / T * (W[y_t] - E_{p_t}[W])` with `p_t = exp(h_t W^T / T - lse_t)`,
/// the weight read [`CHUNK`] rows at a time by `rows(start, n)`; `wy` holds
/// the targets' rows.
fn expectation_grad(
    h: &Tensor,
    vocab: usize,
    rows: impl Fn(usize, usize) -> Result<Tensor>,
    wy: Tensor,
    stats: &RowStats,
    coef: &[f64],
    temperature: f64,
) -> Result<Tensor> {
    let (r, d) = h.dims2()?;
    let dev = Device::Cpu;
    let inv = 1.0 / temperature;
    let lse = Tensor::from_vec(
        stats.lse.iter().map(|&l| l as f32).collect::<Vec<_>>(),
        (r, 1),
        &dev,
    )?;
    let mut expect = Tensor::zeros((r, d), DType::F32, &dev)?;
    let mut start = 0;
    while start < vocab {
        let n = CHUNK.min(vocab - start);
        let wc = rows(start, n)?; // [n, D]
        let z = h.matmul(&wc.t()?)?;
        let z = if inv == 1.0 { z } else { (z * inv)? };
        let p = z.broadcast_sub(&lse)?.exp()?; // [R, n]
        expect = (expect + p.matmul(&wc)?)?;
        start += n;
    }
    let c = Tensor::from_vec(
        coef.iter().map(|&c| (c * inv) as f32).collect::<Vec<_>>(),
        (r, 1),
        &dev,
    )?;
    Ok((wy - expect)?.broadcast_mul(&c)?)
}

/// Rows of hidden states projected at once on the quantized path: `[32, vocab]`
/// f32 logits at a time.
pub const ROW_CHUNK: usize = 32;

/// Pass 1 on the sampler's own output kernel: each row's logits are the
/// served logits bit for bit (`w` is the GGUF matrix on Tern's quantized
/// kernel), and at temperature 1 each `log p` is the sampler's own number
/// ([`tern_runtime::sampler::logprob_of`]); at another temperature the
/// sampler's tempered number ([`tern_runtime::sampler::tempered_logprob_of`]).
pub fn quant_row_stats(
    h: &Tensor,
    w: &QLinear,
    targets: &[u32],
    temperature: f64,
) -> Result<RowStats> {
    let rows = targets.len();
    let mut lse = Vec::with_capacity(rows);
    let mut target_logit = Vec::with_capacity(rows);
    let mut start = 0;
    while start < rows {
        let n = ROW_CHUNK.min(rows - start);
        let logits: Vec<Vec<f32>> = w.forward(&h.narrow(0, start, n)?)?.to_vec2()?;
        for (row, &y) in logits.iter().zip(&targets[start..start + n]) {
            if temperature == 1.0 {
                // The sampler's log p; expressed as (target logit, lse) with
                // the target logit exact, so `logprobs()` returns that number.
                let lp = logprob_of(row, y) as f64;
                let z = row.get(y as usize).copied().unwrap_or(f32::NAN) as f64;
                target_logit.push(z);
                lse.push(z - lp);
            } else {
                // The sampler's tempered log p (`tempered_logprobs`), as at
                // temperature 1: the scaled target logit exact, the lse from it.
                let t = temperature as f32;
                let lp = tempered_logprob_of(row, y, t) as f64;
                let z = row.get(y as usize).map_or(f32::NAN, |&z| z * (1.0 / t)) as f64;
                target_logit.push(z);
                lse.push(z - lp);
            }
        }
        start += n;
    }
    Ok(RowStats { lse, target_logit })
}

/// Pass 2 on the quantized output: `coef_t * d log p_t / d h_t`, `[R, D]`,
/// as [`grad_hidden`] computes it, over blocks of the weight dequantized
/// [`CHUNK`] vocabulary rows at a time (the weight is never whole in f32).
/// The probabilities are those of the dequantized weight: the served
/// logits differ from them only by the activations' 8-bit rounding, which,
/// like every rounding here, passes the gradient straight through.
pub fn quant_grad_hidden(
    h: &Tensor,
    w: &QLinear,
    targets: &[u32],
    stats: &RowStats,
    coef: &[f64],
    temperature: f64,
) -> Result<Tensor> {
    let rows = |s: usize, n: usize| -> Result<Tensor> {
        let ids: Vec<u32> = (s as u32..(s + n) as u32).collect();
        Ok(w.rows(&ids)?)
    };
    let wy = w.rows(targets)?;
    expectation_grad(h, w.out_dim(), rows, wy, stats, coef, temperature)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_tensor(rows: usize, cols: usize, seed: u64) -> Tensor {
        let mut s = seed;
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    }

    #[test]
    fn chunked_matches_full_log_softmax_and_its_gradient() {
        // A vocabulary spanning three chunks, one partial.
        let (r, d, v) = (3, 8, 2 * CHUNK + 37);
        let h = rand_tensor(r, d, 1);
        let w = (rand_tensor(v, d, 2) * 4.0).unwrap();
        let targets = [5u32, (CHUNK + 3) as u32, (2 * CHUNK + 36) as u32];
        let stats = row_stats(&h, &w, &targets).unwrap();
        let full = candle_core::Var::from_tensor(&h).unwrap();
        let logits = full.as_tensor().matmul(&w.t().unwrap()).unwrap();
        let lsm = {
            let m = logits.max_keepdim(1).unwrap();
            let z = logits.broadcast_sub(&m).unwrap();
            let lse = z.exp().unwrap().sum_keepdim(1).unwrap().log().unwrap();
            z.broadcast_sub(&lse).unwrap()
        };
        let want: Vec<Vec<f32>> = lsm.to_vec2().unwrap();
        for (i, lp) in stats.logprobs().iter().enumerate() {
            let w = want[i][targets[i] as usize] as f64;
            assert!((lp - w).abs() < 1e-4, "row {i}: {lp} vs {w}");
        }
        // Gradient of sum_t c_t log p_t by autograd vs the chunked formula.
        let coef = [0.5, -2.0, 1.0];
        let idx = Tensor::new(&targets, &Device::Cpu)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let picked = lsm.gather(&idx, 1).unwrap().squeeze(1).unwrap();
        let c = Tensor::new(&[0.5f32, -2.0, 1.0], &Device::Cpu).unwrap();
        let obj = (picked * c).unwrap().sum_all().unwrap();
        let grads = obj.backward().unwrap();
        let auto: Vec<Vec<f32>> = grads.get(full.as_tensor()).unwrap().to_vec2().unwrap();
        let ours: Vec<Vec<f32>> = grad_hidden(&h, &w, &targets, &stats, &coef)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (a, b) in auto.iter().flatten().zip(ours.iter().flatten()) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
