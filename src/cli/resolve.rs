//! `--model` resolution: a path to a GGUF file, or a registry name pulled on
//! first use.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use anyhow::{Context, Result};
use tern_hub as registry;
use tern_models::ModelError;
use tern_runtime::engine::{DraftModel, EngineConfig, EngineHandle, Speculative};
use tern_runtime::LoadedModel;

/// The GGUF path `--model` refers to, fetching a registry model if it is missing.
pub fn model_path(spec: &str) -> Result<PathBuf> {
    let as_path = Path::new(spec);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    if registry::lookup(spec).is_none() && (spec.ends_with(".gguf") || spec.contains('/')) {
        return Err(ModelError::NotFound(as_path.to_path_buf()).into());
    }
    let entry = registry::entry(spec)?;
    let dir = registry::model_dir();
    let path = dir.join(entry.file_name);
    if path.is_file() {
        return Ok(path);
    }
    eprintln!(
        "model `{}` is not in {}; pulling it now (tern pull {})",
        entry.name,
        dir.display(),
        entry.name
    );
    Ok(registry::pull(entry, &dir, true)?)
}

/// Resolves and loads a model, saying where it came from on stderr.
pub fn load(spec: &str) -> Result<LoadedModel> {
    let path = model_path(spec)?;
    Ok(LoadedModel::load(&path)?)
}

/// The `--draft-model` beside `target`, if one is given: loaded and checked
/// against the target's vocabulary (a mismatch is a one-line error naming
/// both files).
pub fn draft_model(spec: Option<&str>, target: &LoadedModel) -> Result<Option<DraftModel>> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let draft = load(spec).with_context(|| format!("loading --draft-model {spec}"))?;
    Ok(Some(DraftModel::new(target, Arc::new(draft))?))
}

/// The speculation `--speculative` asks for, `draft` when it is not given
/// and a draft model is; `draft` without one is an error.
pub fn speculative(asked: Option<Speculative>, has_draft: bool) -> Result<Speculative> {
    match asked {
        Some(Speculative::Draft { .. }) if !has_draft => {
            anyhow::bail!("--speculative draft needs --draft-model PATH (a smaller model of the same vocabulary)")
        }
        Some(s) => Ok(s),
        None if has_draft => Ok(Speculative::Draft {
            max_draft: tern_runtime::engine::DEFAULT_MAX_DRAFT,
        }),
        None => Ok(Speculative::Off),
    }
}

/// The engine of `--synthesizer-model`, if one is given: its own model and
/// thread beside the candidates' engine. A model that fails to load is an
/// error naming the flag.
pub fn synthesizer(spec: Option<&str>) -> Result<Option<EngineHandle>> {
    second_engine(spec, "--synthesizer-model")
}

/// The engine of `--test-model`, if one is given: the model that writes
/// unit tests for `--generate-tests` / `reward@N:tests=K`.
pub fn tester(spec: Option<&str>) -> Result<Option<EngineHandle>> {
    second_engine(spec, "--test-model")
}

/// A second model's engine, beside the candidates'; a load failure names `flag`.
fn second_engine(spec: Option<&str>, flag: &str) -> Result<Option<EngineHandle>> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let model = load(spec).with_context(|| format!("loading {flag} {spec}"))?;
    Ok(Some(EngineHandle::spawn(
        Arc::new(model),
        EngineConfig::default(),
    )))
}
