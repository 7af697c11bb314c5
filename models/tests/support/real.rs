//! The real model for the tests of every crate that includes this file
//! (`models`, `runtime`, `kveval`): found where scripts/test.sh pulls it,
//! or skipped with the reason when it is absent.

use std::path::PathBuf;

/// The real model (SmolLM2-135M-Instruct Q4_1) under `TERN_HOME`, or the
/// repository's models/cache where scripts/test.sh pulls it. `None` when it
/// is absent, after printing `skipped: <why>`: the tests run without it.
pub fn real_model(test: &str) -> Option<PathBuf> {
    // Every including crate sits one level below the repository root.
    let dir = std::env::var_os("TERN_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"));
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
