//! Folding a checkpoint into full weights: LoRA adapters merged as
//! `W + (alpha / r) B A` into the base GGUF's projections, or a full
//! fine-tune's tensors taken as they are. The result is the replacement set a
//! GGUF export writes over the base model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use tern_models::arch::{fuse_replacements, projection_weight};
use tern_models::{GgufFile, LoraSet, ModelConfig};

use crate::checkpoint::Checkpoint;
use crate::error::{Result, TrainError};

/// The f32 tensors (by GGUF name) that replace the base model's to make the
/// checkpoint's model. Projections a GGUF stores fused (Phi-3's `attn_qkv`
/// and `ffn_up`) are written back into the fused tensor.
pub fn merged_tensors(ckpt: &Checkpoint, base: &Path) -> Result<HashMap<String, Tensor>> {
    let file = GgufFile::open(base)?;
    let Some(scale) = ckpt.state.lora_scale else {
        // Full fine-tuning: the checkpoint holds the weights themselves.
        return Ok(fuse_replacements(&file, ckpt.params.clone())?);
    };
    let set = LoraSet::from_named(
        ckpt.params.iter().map(|(k, v)| (k.clone(), v.clone())),
        scale,
    )?;
    let config = ModelConfig::from_gguf(&file)?;
    let mut out = HashMap::new();
    for (&(layer, target), ad) in &set.adapters {
        let name = format!("blk.{layer}.{}.weight", target.gguf_stem());
        // The projection as the model computes with it (its rows of a fused tensor).
        let w = projection_weight(&file, &config, layer, target)?;
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
    Ok(fuse_replacements(&file, out)?)
}
