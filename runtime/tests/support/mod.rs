//! Support for the runtime's whole-model tests: the models crate's test
//! support (ggml and llama.cpp's quantizer in process, tiny generated models,
//! deterministic inputs), included rather than copied, and the real model
//! when it is there.

#[allow(dead_code)]
#[path = "../../../models/tests/support/ggml.rs"]
pub mod ggml;
#[allow(dead_code)]
#[path = "../../../models/tests/support/inputs.rs"]
mod inputs;
#[allow(dead_code)]
#[path = "../../../models/tests/support/quantize.rs"]
pub mod quantize;
#[allow(dead_code)]
#[path = "../../../models/tests/support/tiny.rs"]
pub mod tiny;
#[allow(dead_code)]
#[path = "../../../models/tests/support/tiny_quant.rs"]
pub mod tiny_quant;

#[allow(unused_imports)]
pub use inputs::values;

use std::path::PathBuf;

/// Threads for llama.cpp in process: one, as in the models crate's and the
/// root package's tests (ggml's workers spin at every barrier, which stalls a
/// small machine running two tests at once).
pub const LLAMA_THREADS: i32 = 1;

/// The repository root (this crate's parent).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The real model (SmolLM2-135M-Instruct Q4_1) under `TERN_HOME`, or
/// models/cache where scripts/test.sh pulls it. `None` when it is absent,
/// after printing `skipped: <why>`.
pub fn real_model(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TERN_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/cache"));
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        return Some(path);
    }
    eprintln!(
        "skipped: {test}: the real model is not at {} (`cargo run --release -- pull` fetches it)",
        path.display()
    );
    None
}
