//! `x W^T` for a weight that is not trained, as an op whose backward yields the
//! gradient for `x` only.
//!
//! Candle's matmul backward also computes (and keeps until the end of the
//! pass) a gradient for the weight even when nothing will read it: a full copy
//! of every frozen projection per micro-batch, and a third more work. Under
//! LoRA every base weight is frozen, so the learner routes them through here.

use candle_core::{bail, CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};

/// The op; holds the frozen weight `[out, in]`.
pub(crate) struct FrozenMatmul {
    pub(crate) w: Tensor,
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            bail!("frozen-matmul takes f32 activations");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("frozen-matmul takes contiguous activations");
        };
        let x = Tensor::from_slice(&data[start..end], layout.shape(), &Device::Cpu)?;
        let y = x.matmul(&self.w.t()?)?;
        let (storage, _) = y.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(s) => Ok((s.clone(), y.shape().clone())),
            _ => bail!("frozen-matmul runs on the CPU"),
        }
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.w)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    #[test]
    fn forward_and_input_gradient_match_a_plain_matmul() {
        let dev = Device::Cpu;
        let w = Tensor::new(&[[1f32, 2., 3.], [-1., 0., 4.]], &dev).unwrap(); // [2, 3]
        let x = Var::new(&[[0.5f32, -1., 2.], [1., 1., 1.]], &dev).unwrap(); // [2, 3]
        let ours = x
            .as_tensor()
            .apply_op1(FrozenMatmul { w: w.clone() })
            .unwrap();
        let plain = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
        assert_eq!(
            ours.to_vec2::<f32>().unwrap(),
            plain.to_vec2::<f32>().unwrap()
        );
        let g1 = ours.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = plain.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(
            g1.get(x.as_tensor()).unwrap().to_vec2::<f32>().unwrap(),
            g2.get(x.as_tensor()).unwrap().to_vec2::<f32>().unwrap()
        );
    }
}
