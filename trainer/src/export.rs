//! The check after exporting a checkpoint (merged by [`crate::merge`], written
//! by `tern_models::export`): the export's logits against the base model run
//! under the checkpoint's adapters.

use std::path::Path;
use std::sync::Arc;

use tern_models::{KvStore, LogitsWanted, Precision, SeqBatch};
use tern_runtime::kv::SeqCache;
use tern_runtime::LoadedModel;

use crate::checkpoint::Checkpoint;
use crate::error::{Result, TrainError};

/// How far an export's logits are from the trained model's.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportCheck {
    /// Largest |logit difference| over every position and vocabulary entry.
    pub max_diff: f32,
    /// Largest |logit| of the trained model, to read `max_diff` against.
    pub largest: f32,
    /// Positions compared.
    pub tokens: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

/// A short chat exchange whose every position is compared.
const CHECK_TEXT: &str =
    "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n7 + 5 = 12";

/// Compares the trained model before export (`base` with `ck`'s adapters)
/// against the export at `exported`, both dequantized to f32, so the check
/// sees the merge and the export's rounding, not the serving kernels'
/// activation quantization.
pub fn check_export(ck: &Checkpoint, base: &Path, exported: &Path) -> Result<ExportCheck> {
    let served = LoadedModel::load_as(base, Precision::DenseF32)?;
    if let Some(scale) = ck.state.lora_scale {
        let set = tern_models::LoraSet::from_named(ck.params.clone(), scale)?;
        served.arch.set_adapters(Some(Arc::new(set)));
    }
    let exported = LoadedModel::load_as(exported, Precision::DenseF32)?;
    let ids = served.tokenizer.encode(CHECK_TEXT, true, true)?;
    let logits = |m: &LoadedModel| -> Result<Vec<f32>> {
        let mut cache = SeqCache::new(m.config());
        let mut batch = [SeqBatch {
            tokens: &ids,
            start_pos: 0,
            cache: &mut cache as &mut dyn KvStore,
            logits: LogitsWanted::All,
        }];
        let out = m.arch.forward(&mut batch)?;
        let row = out[0]
            .as_ref()
            .ok_or_else(|| TrainError::Rollout("the export check got no logits".into()))?;
        Ok(row.flatten_all()?.to_vec1::<f32>()?)
    };
    let (x, y) = (logits(&served)?, logits(&exported)?);
    let max_diff = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let largest = x.iter().map(|a| a.abs()).fold(0f32, f32::max);
    Ok(ExportCheck {
        max_diff,
        largest,
        tokens: ids.len(),
        vocab: served.config().vocab_size,
    })
}
