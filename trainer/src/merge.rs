//! Folding a checkpoint into full weights: LoRA adapters merged as
//! `W + (alpha / r) B A` into the base GGUF's projections, or a full
//! fine-tune's tensors taken as they are. The result is the replacement set a
//! GGUF export writes over the base model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use tern_models::{GgufFile, LoraSet};

use crate::checkpoint::Checkpoint;
use crate::error::{Result, TrainError};

/// The f32 tensors (by GGUF name) that replace the base model's to make the
/// checkpoint's model.
pub fn merged_tensors(ckpt: &Checkpoint, base: &Path) -> Result<HashMap<String, Tensor>> {
    let Some(scale) = ckpt.state.lora_scale else {
        // Full fine-tuning: the checkpoint holds the weights themselves.
        return Ok(ckpt.params.clone());
    };
    let set = LoraSet::from_named(
        ckpt.params.iter().map(|(k, v)| (k.clone(), v.clone())),
        scale,
    )?;
    let file = GgufFile::open(base)?;
    let mut out = HashMap::new();
    for (&(layer, target), ad) in &set.adapters {
        let name = format!("blk.{layer}.{}.weight", target.gguf_stem());
        let w = file
            .tensor(&name)?
            .dequantize(&Device::Cpu)?
            .to_dtype(DType::F32)?;
        let delta = ad.merged_delta()?;
        if w.dims() != delta.dims() {
            return Err(TrainError::Checkpoint {
                path: name,
                reason: format!(
                    "adapter shape {:?} does not fit the base weight {:?}: wrong base model?",
                    delta.dims(),
                    w.dims()
                ),
            });
        }
        out.insert(name, (w + delta)?);
    }
    Ok(out)
}
