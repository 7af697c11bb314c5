//! `--backend`: which implementation runs the forward pass. `tern` is Tern's
//! own (always built; `candle`, its former name, is still accepted); `llama-cpp` is llama.cpp through llama-cpp-2, present
//! when the binary is built with `--features llama-cpp`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use tern_runtime::backend::{Backend, TernBackend};
use tern_runtime::LoadedModel;

/// A backend name as given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Tern's own kernels over candle tensors; every KV policy.
    #[value(alias = "candle")]
    Tern,
    /// llama.cpp (build with `--features llama-cpp`); full and streaming policies.
    LlamaCpp,
}

/// Sizing for a llama.cpp context (ignored by Tern's own backend).
#[cfg_attr(not(feature = "llama-cpp"), allow(dead_code))]
pub struct Sizing {
    /// KV cells (tokens) all sequences may hold together.
    pub n_ctx: usize,
    /// Sequences held at once.
    pub n_seq: usize,
    /// How llama.cpp's cache stores keys and values (Tern's is per sequence).
    pub kv_dtype: tern_runtime::kv::KvDtype,
}

/// Builds the backend `kind` for the model at `path`; `model` is Tern's load of
/// the same file (Tern's backend runs it; llama.cpp takes only its shape facts).
pub fn open(
    kind: BackendKind,
    path: &Path,
    model: &Arc<LoadedModel>,
    sizing: &Sizing,
) -> Result<Box<dyn Backend>> {
    match kind {
        BackendKind::Tern => Ok(Box::new(TernBackend::new(Arc::clone(model)))),
        BackendKind::LlamaCpp => open_llama_cpp(path, model, sizing),
    }
}

#[cfg(feature = "llama-cpp")]
fn open_llama_cpp(
    path: &Path,
    model: &Arc<LoadedModel>,
    sizing: &Sizing,
) -> Result<Box<dyn Backend>> {
    use tern_runtime::backend::{LlamaCppBackend, LlamaCppOptions};
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let opts = LlamaCppOptions {
        n_ctx: sizing.n_ctx.min(u32::MAX as usize) as u32,
        n_seq_max: sizing.n_seq.clamp(1, 256) as u32,
        n_threads: threads,
        kv_dtype: sizing.kv_dtype,
    };
    Ok(Box::new(LlamaCppBackend::load(
        path,
        model.config(),
        &opts,
    )?))
}

#[cfg(not(feature = "llama-cpp"))]
fn open_llama_cpp(
    _path: &Path,
    _model: &Arc<LoadedModel>,
    _sizing: &Sizing,
) -> Result<Box<dyn Backend>> {
    anyhow::bail!(
        "this tern was built without llama.cpp; rebuild with `cargo build --release --features llama-cpp`"
    )
}
