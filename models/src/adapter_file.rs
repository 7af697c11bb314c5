//! A LoRA adapter on disk: one safetensors file holding every `A` and `B`
//! (named as [`LoraSet::tensor_name`] names them) and the scale, so the
//! trainer can hand an update to a serving process by path (`tern serve`'s
//! `/v1/load_lora_adapter`) without a merge or an export.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::lora::{LoraSet, LoraTarget};
use crate::ModelConfig;

/// The file an adapter directory holds.
pub const ADAPTER_FILE: &str = "tern-adapter.safetensors";

/// The tensor holding `alpha / rank` (one f64).
const SCALE_TENSOR: &str = "lora_scale";

/// Where the adapter at `path` is: `path` itself when it names a file, else
/// [`ADAPTER_FILE`] inside the directory `path`.
pub fn adapter_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(ADAPTER_FILE)
    } else {
        path.to_path_buf()
    }
}

/// Writes `set` (scale `alpha / rank` in each adapter) into directory `dir`,
/// created if missing; the file is renamed into place whole, so a reader
/// never sees half an adapter. Returns the file's path.
pub fn save_adapter(set: &LoraSet, dir: &Path) -> Result<PathBuf> {
    let io = |source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let scale = set.adapters.values().next().map_or(1.0, |a| a.scale);
    let mut tensors = set.named_tensors()?;
    tensors.push((
        SCALE_TENSOR.into(),
        Tensor::new(&[scale], &Device::Cpu)?.to_dtype(DType::F64)?,
    ));
    let path = dir.join(ADAPTER_FILE);
    let tmp = dir.join(format!("{ADAPTER_FILE}.tmp"));
    candle_core::safetensors::save(&tensors.into_iter().collect(), &tmp)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

/// Reads the adapter at `path` (a file or a directory holding
/// [`ADAPTER_FILE`]) and checks it against the model it will run on: every
/// block index exists and every `A` `[rank, in]` / `B` `[out, rank]` fits its
/// projection. A file that is not an adapter is an error naming the problem.
pub fn load_adapter(path: &Path, model: &ModelConfig) -> Result<LoraSet> {
    let file = adapter_path(path);
    if !file.is_file() {
        return Err(ModelError::NotFound(file));
    }
    let tensors =
        candle_core::safetensors::load(&file, &Device::Cpu).map_err(|e| ModelError::BadTensor {
            name: file.display().to_string(),
            reason: format!("not a readable safetensors file: {e}"),
        })?;
    let mut scale = None;
    let mut named = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if name == SCALE_TENSOR {
            let v = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
            scale = v.first().copied().filter(|s| s.is_finite());
        } else {
            named.push((name, t.to_dtype(DType::F32)?));
        }
    }
    let scale = scale.ok_or_else(|| ModelError::BadTensor {
        name: SCALE_TENSOR.into(),
        reason: format!("{} has no finite `{SCALE_TENSOR}`", file.display()),
    })?;
    let set = LoraSet::from_named(named, scale)?;
    check_fits(&set, model)?;
    Ok(set)
}

/// Every adapter of `set` fits a projection of `model`.
fn check_fits(set: &LoraSet, model: &ModelConfig) -> Result<()> {
    if set.adapters.is_empty() {
        return Err(ModelError::BadTensor {
            name: "adapter".into(),
            reason: "the file holds no LoRA tensors".into(),
        });
    }
    for (&(layer, target), ad) in &set.adapters {
        let name = LoraSet::tensor_name(layer, target, 'a');
        if layer >= model.n_layer {
            return Err(ModelError::BadTensor {
                name,
                reason: format!("block {layer}, but the model has {}", model.n_layer),
            });
        }
        let (out, inp) = LoraTarget::shape(target, model);
        let (a, b) = (ad.a.dims(), ad.b.dims());
        let fits = a.len() == 2 && b.len() == 2 && a[1] == inp && b[0] == out && a[0] == b[1];
        if !fits || a[0] == 0 {
            return Err(ModelError::BadTensor {
                name,
                reason: format!(
                    "A {a:?} and B {b:?} do not fit a [{out}, {inp}] projection (A [rank, {inp}], B [{out}, rank])"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::LoraAdapter;

    fn config() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            name: None,
            n_layer: 2,
            n_embd: 8,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 4,
            n_ff: 16,
            vocab_size: 16,
            context_length: 64,
            rope_base: 10000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
            sliding: None,
        }
    }

    #[test]
    fn an_adapter_round_trips_and_a_misfit_is_refused() {
        let c = config();
        let (out, inp) = LoraTarget::Q.shape(&c);
        let dev = Device::Cpu;
        let a = Tensor::ones((2, inp), DType::F32, &dev).unwrap();
        let b = Tensor::ones((out, 2), DType::F32, &dev).unwrap();
        let mut set = LoraSet::default();
        set.adapters
            .insert((1, LoraTarget::Q), LoraAdapter { a, b, scale: 8.0 });
        let dir = tempfile::tempdir().unwrap();
        save_adapter(&set, dir.path()).unwrap();
        let back = load_adapter(dir.path(), &c).unwrap();
        let ad = back.get(1, LoraTarget::Q).unwrap();
        assert_eq!(ad.scale, 8.0);
        assert_eq!(ad.a.dims(), &[2, inp]);
        // The same file named directly.
        assert!(load_adapter(&dir.path().join(ADAPTER_FILE), &c).is_ok());
        // A model with one block has no block 1.
        let mut small = c.clone();
        small.n_layer = 1;
        let e = load_adapter(dir.path(), &small).unwrap_err().to_string();
        assert!(e.contains("block 1"), "{e}");
        // A model of another width does not fit.
        let mut wide = c.clone();
        wide.n_embd *= 2;
        let e = load_adapter(dir.path(), &wide).unwrap_err().to_string();
        assert!(e.contains("do not fit"), "{e}");
        // Not an adapter at all.
        std::fs::write(dir.path().join("x.safetensors"), b"nonsense").unwrap();
        assert!(load_adapter(&dir.path().join("x.safetensors"), &c).is_err());
        assert!(load_adapter(&dir.path().join("missing"), &c).is_err());
    }
}
