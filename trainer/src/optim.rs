//! AdamW (Loshchilov & Hutter 2019) with its moments in the open, so a
//! checkpoint can save and restore them and a resumed run continues exactly.

use candle_core::{Tensor, Var};

use crate::error::Result;

/// AdamW state for a fixed list of parameters.
pub struct AdamW {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator guard.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Updates taken so far.
    pub t: u64,
    /// First moments, one per parameter.
    pub m: Vec<Tensor>,
    /// Second moments, one per parameter.
    pub v: Vec<Tensor>,
}

impl AdamW {
    /// Zero moments shaped like `params`.
    pub fn new(params: &[&Var], weight_decay: f64) -> Result<AdamW> {
        let zeros = |p: &&Var| p.as_tensor().zeros_like();
        Ok(AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            t: 0,
            m: params
                .iter()
                .map(zeros)
                .collect::<candle_core::Result<_>>()?,
            v: params
                .iter()
                .map(zeros)
                .collect::<candle_core::Result<_>>()?,
        })
    }

    /// One update of every parameter with its gradient at learning rate `lr`.
    pub fn step(&mut self, params: &[&Var], grads: &[Tensor], lr: f64) -> Result<()> {
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let m = ((&self.m[i] * self.beta1)? + (g * (1.0 - self.beta1))?)?;
            let v = ((&self.v[i] * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
            let mhat = (&m / bc1)?;
            let vhat = (&v / bc2)?;
            let step = (mhat / (vhat.sqrt()? + self.eps)?)?;
            let theta = p.as_tensor().detach();
            let decayed = (&theta * (1.0 - lr * self.weight_decay))?;
            p.set(&(decayed - (step * lr)?)?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }
}

/// Scales `grads` in place so their global L2 norm is at most `max_norm`
/// (0 disables); returns the norm before clipping.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads.iter() {
        sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    }
    let norm = sq.sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let s = max_norm / (norm + 1e-12);
        for g in grads.iter_mut() {
            *g = (&*g * s)?;
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn first_step_moves_each_weight_by_lr_against_its_gradient_sign() {
        let p = Var::new(&[1.0f32, -2.0], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(&[&p], 0.0).unwrap();
        let g = Tensor::new(&[0.5f32, -3.0], &Device::Cpu).unwrap();
        opt.step(&[&p], &[g], 0.1).unwrap();
        // Bias-corrected first step: m/sqrt(v) = sign(g).
        let got = p.as_tensor().to_vec1::<f32>().unwrap();
        assert!(
            (got[0] - 0.9).abs() < 1e-5 && (got[1] + 1.9).abs() < 1e-5,
            "{got:?}"
        );
    }

    #[test]
    fn clipping_caps_the_global_norm() {
        let mut g = vec![
            Tensor::new(&[3.0f32], &Device::Cpu).unwrap(),
            Tensor::new(&[4.0f32], &Device::Cpu).unwrap(),
        ];
        assert!((clip_grad_norm(&mut g, 1.0).unwrap() - 5.0).abs() < 1e-6);
        let a = g[0].to_vec1::<f32>().unwrap()[0];
        assert!((a - 0.6).abs() < 1e-5);
    }
}
