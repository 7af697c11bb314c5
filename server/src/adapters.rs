//! LoRA adapters loaded at run time (`POST /v1/load_lora_adapter`, vLLM's
//! shape) and addressed by name as a request's `model`: how a trainer hands
//! each update to a fleet of `tern serve` workers, and how one server serves
//! several fine-tunes of its base model.
//!
//! Off unless `tern serve --lora-dir DIR` is given; then only files under DIR
//! load (a client names a path, so the server reads nothing else), at most
//! `--max-loras` at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tern_models::{LoraSet, ModelConfig};

use crate::openai::error::ApiError;

/// Loaded adapters by name, and where they may be loaded from.
pub struct AdapterRegistry {
    /// The only directory adapters load from (canonical); `None`: loading is off.
    dir: Option<PathBuf>,
    /// Most adapters held at once.
    max: usize,
    loaded: RwLock<BTreeMap<String, Arc<LoraSet>>>,
}

/// Longest adapter name accepted.
const NAME_MAX: usize = 128;

impl AdapterRegistry {
    /// A registry loading from `dir` (none: the endpoints answer that loading
    /// is off), holding at most `max`.
    pub fn new(dir: Option<&Path>, max: usize) -> Self {
        Self {
            dir: dir.map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf())),
            max,
            loaded: RwLock::new(BTreeMap::new()),
        }
    }

    /// Whether loading at run time is on.
    pub fn enabled(&self) -> bool {
        self.dir.is_some()
    }

    /// The adapter directory, or a 403 saying loading is off.
    pub fn require_enabled(&self) -> Result<&Path, ApiError> {
        self.dir.as_deref().ok_or_else(|| {
            ApiError::forbidden(
                "loading LoRA adapters at run time is off; start tern serve with --lora-dir DIR to allow adapters under DIR",
            )
            .with_code("adapter_loading_disabled")
        })
    }

    /// The adapter named `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<Arc<LoraSet>> {
        self.read().get(name).cloned()
    }

    /// Names of the loaded adapters, sorted.
    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Most adapters held at once.
    pub fn max(&self) -> usize {
        self.max
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<LoraSet>>> {
        self.loaded.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks a load request before any file is read: loading is on, the
    /// name is usable and not the base model's, the path lies under the
    /// adapter directory, and there is room. Returns the canonical path.
    pub fn admit(&self, name: &str, path: &str, base_model: &str) -> Result<PathBuf, ApiError> {
        let dir = self.require_enabled()?;
        check_name(name)?;
        if name == base_model {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!("`{name}` is the base model's id; pick another name for the adapter"),
            ));
        }
        let requested = Path::new(path);
        let full = if requested.is_absolute() {
            requested.to_path_buf()
        } else {
            dir.join(requested)
        };
        let canonical = std::fs::canonicalize(&full)
            .map_err(|_| ApiError::not_found("lora_path", format!("no adapter at `{path}`")))?;
        if !canonical.starts_with(dir) {
            return Err(ApiError::forbidden(format!(
                "`{path}` is outside the adapter directory given to --lora-dir"
            ))
            .with_param("lora_path"));
        }
        let held = self.read();
        if !held.contains_key(name) && held.len() >= self.max {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!(
                    "{} adapters are loaded, the most --max-loras allows; unload one first",
                    held.len()
                ),
            ));
        }
        Ok(canonical)
    }

    /// Reads and checks the adapter at `path` against `model` (blocking: run
    /// it off the async threads).
    pub fn read_file(path: &Path, model: &ModelConfig) -> Result<LoraSet, ApiError> {
        tern_models::load_adapter(path, model)
            .map_err(|e| ApiError::invalid_param("lora_path", format!("not a usable adapter: {e}")))
    }

    /// Holds `set` as `name`, replacing an adapter of that name (a request
    /// already running keeps the one it started with).
    pub fn insert(&self, name: String, set: LoraSet) {
        let mut held = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        held.insert(name, Arc::new(set));
    }

    /// Drops the adapter `name`; false when none has that name.
    pub fn remove(&self, name: &str) -> bool {
        let mut held = self.loaded.write().unwrap_or_else(|p| p.into_inner());
        held.remove(name).is_some()
    }
}

/// Adapter names are what clients pass as `model`: 1 to 128 of
/// `A-Z a-z 0-9 . _ - : /`.
fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:/".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_param(
            "lora_name",
            format!("adapter names are 1 to {NAME_MAX} of A-Z a-z 0-9 . _ - : /"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_is_off_by_default_and_confined_to_the_directory() {
        let off = AdapterRegistry::new(None, 4);
        let e = off.admit("a", "/etc/passwd", "m").unwrap_err();
        assert_eq!(e.status.as_u16(), 403);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.safetensors"), b"x").unwrap();
        let on = AdapterRegistry::new(Some(dir.path()), 1);
        assert!(on.admit("a", "a.safetensors", "m").is_ok());
        let abs = dir.path().join("a.safetensors");
        assert!(on.admit("a", abs.to_str().unwrap(), "m").is_ok());
        // Outside the directory, through `..` or absolutely: refused.
        assert_eq!(on.admit("a", "../", "m").unwrap_err().status.as_u16(), 403);
        assert_eq!(on.admit("a", "/etc", "m").unwrap_err().status.as_u16(), 403);
        assert_eq!(on.admit("a", "nope", "m").unwrap_err().status.as_u16(), 404);
        // Names: not the base model's, not empty, no spaces.
        assert!(on.admit("m", "a.safetensors", "m").is_err());
        assert!(on.admit("", "a.safetensors", "m").is_err());
        assert!(on.admit("a b", "a.safetensors", "m").is_err());
        // Room for one: a second name waits for an unload.
        on.insert("a".into(), LoraSet::default());
        assert!(on.admit("b", "a.safetensors", "m").is_err());
        assert!(on.admit("a", "a.safetensors", "m").is_ok());
        assert!(on.remove("a"));
        assert!(!on.remove("a"));
        assert!(on.admit("b", "a.safetensors", "m").is_ok());
    }
}
