//! Checkpoints: trainable tensors and AdamW moments (safetensors) plus the step
//! and the run's configuration (JSON), in a directory that appears whole or not
//! at all (written under a temporary name, then renamed), with a `latest` file
//! (also replaced by rename) naming the newest.
//!
//! Every random choice of a step derives from (seed, step), so the step, the
//! parameters and the moments are all a resumed run needs to continue exactly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::error::{Result, TrainError};

/// `state.json` of a checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    /// Steps completed (the next step to run).
    pub step: usize,
    /// AdamW updates taken.
    pub adam_t: u64,
    /// The configuration of the run that wrote it.
    pub config: TrainConfig,
    /// The base model's path (export merges into it).
    pub model_path: PathBuf,
    /// `alpha / rank` when the tensors are LoRA adapters.
    pub lora_scale: Option<f64>,
    /// Pass rates and replay buffer.
    #[serde(default)]
    pub data: crate::data::DataState,
}

/// A checkpoint in memory.
pub struct Checkpoint {
    /// Its state.
    pub state: State,
    /// Trainable tensors by name.
    pub params: HashMap<String, Tensor>,
    /// AdamW first moments by parameter name.
    pub m: HashMap<String, Tensor>,
    /// AdamW second moments by parameter name.
    pub v: HashMap<String, Tensor>,
}

fn err(path: &Path, reason: impl ToString) -> TrainError {
    TrainError::Checkpoint {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Name of the directory of the checkpoint after `step` steps.
pub fn dir_name(step: usize) -> String {
    format!("step-{step:06}")
}

/// Writes `ckpt` under `out` atomically, points `out/latest` at it and keeps
/// only the newest `keep` checkpoints. Returns its directory.
pub fn save(out: &Path, ckpt: &Checkpoint, keep: usize) -> Result<PathBuf> {
    let name = dir_name(ckpt.state.step);
    let final_dir = out.join(&name);
    let tmp = out.join(format!(".{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| err(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| err(&tmp, e))?;
    candle_core::safetensors::save(&ckpt.params, tmp.join("params.safetensors"))
        .map_err(|e| err(&tmp, e))?;
    let mut moments = HashMap::new();
    for (k, t) in &ckpt.m {
        moments.insert(format!("m.{k}"), t.clone());
    }
    for (k, t) in &ckpt.v {
        moments.insert(format!("v.{k}"), t.clone());
    }
    candle_core::safetensors::save(&moments, tmp.join("optimizer.safetensors"))
        .map_err(|e| err(&tmp, e))?;
    let state = serde_json::to_string_pretty(&ckpt.state).map_err(|e| err(&tmp, e))?;
    std::fs::write(tmp.join("state.json"), state).map_err(|e| err(&tmp, e))?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(|e| err(&final_dir, e))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(|e| err(&final_dir, e))?;
    let latest_tmp = out.join(".latest.tmp");
    std::fs::write(&latest_tmp, &name).map_err(|e| err(&latest_tmp, e))?;
    std::fs::rename(&latest_tmp, out.join("latest")).map_err(|e| err(out, e))?;
    // Older checkpoints beyond `keep`.
    let mut dirs: Vec<String> = std::fs::read_dir(out)
        .map_err(|e| err(out, e))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    dirs.sort();
    let excess = dirs.len().saturating_sub(keep.max(1));
    for old in &dirs[..excess] {
        let _ = std::fs::remove_dir_all(out.join(old));
    }
    Ok(final_dir)
}

/// The checkpoint directory `path` names: a checkpoint itself, or a run's
/// output directory (its `latest`).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join("state.json").is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join("latest");
    let name = std::fs::read_to_string(&latest).map_err(|_| {
        err(
            path,
            "not a checkpoint (no state.json) nor a run directory (no `latest`)",
        )
    })?;
    let dir = path.join(name.trim());
    if !dir.join("state.json").is_file() {
        return Err(err(&dir, "`latest` names a checkpoint that is missing"));
    }
    Ok(dir)
}

/// Reads the checkpoint at `path` (see [`resolve`]).
pub fn load(path: &Path) -> Result<Checkpoint> {
    let dir = resolve(path)?;
    let state: State = serde_json::from_str(
        &std::fs::read_to_string(dir.join("state.json")).map_err(|e| err(&dir, e))?,
    )
    .map_err(|e| err(&dir, format!("state.json: {e}")))?;
    let params = candle_core::safetensors::load(dir.join("params.safetensors"), &Device::Cpu)
        .map_err(|e| err(&dir, e))?;
    let moments = candle_core::safetensors::load(dir.join("optimizer.safetensors"), &Device::Cpu)
        .map_err(|e| err(&dir, e))?;
    let (mut m, mut v) = (HashMap::new(), HashMap::new());
    for (k, t) in moments {
        if let Some(n) = k.strip_prefix("m.") {
            m.insert(n.to_string(), t);
        } else if let Some(n) = k.strip_prefix("v.") {
            v.insert(n.to_string(), t);
        }
    }
    Ok(Checkpoint {
        state,
        params,
        m,
        v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_latest_and_pruning() {
        let dir = tempfile::tempdir().unwrap();
        let t = |x: f32| Tensor::new(&[x, x + 1.0], &Device::Cpu).unwrap();
        for step in [2, 4, 6] {
            let ckpt = Checkpoint {
                state: State {
                    step,
                    adam_t: step as u64,
                    config: TrainConfig::default(),
                    model_path: "m.gguf".into(),
                    lora_scale: Some(2.0),
                    data: Default::default(),
                },
                params: HashMap::from([("w".to_string(), t(step as f32))]),
                m: HashMap::from([("w".to_string(), t(0.5))]),
                v: HashMap::from([("w".to_string(), t(0.25))]),
            };
            save(dir.path(), &ckpt, 2).unwrap();
        }
        let back = load(dir.path()).unwrap();
        assert_eq!(back.state.step, 6);
        assert_eq!(back.params["w"].to_vec1::<f32>().unwrap(), vec![6.0, 7.0]);
        assert_eq!(back.v["w"].to_vec1::<f32>().unwrap(), vec![0.25, 1.25]);
        assert!(!dir.path().join(dir_name(2)).exists());
        assert!(dir.path().join(dir_name(4)).exists());
        assert!(load(&dir.path().join("nothing")).is_err());
    }
}
