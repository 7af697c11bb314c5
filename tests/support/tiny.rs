//! The tiny generated model: written by the models crate's test support
//! (`models/tests/support/tiny.rs`, shared with its kernel tests, not
//! copied) and loaded here through the runtime.

#[path = "../../models/tests/support/tiny.rs"]
mod gguf;

pub use gguf::*;

/// Writes the default tiny model to a temporary directory and loads it; keep
/// the directory alive as long as the model's path is used.
pub fn load_tiny() -> (tempfile::TempDir, tern_runtime::LoadedModel) {
    load_tiny_spec(&TinySpec::default())
}

/// As [`load_tiny`], with the given shape.
pub fn load_tiny_spec(spec: &TinySpec) -> (tempfile::TempDir, tern_runtime::LoadedModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, spec);
    let model = tern_runtime::LoadedModel::load(&path).expect("load tiny model");
    (dir, model)
}
