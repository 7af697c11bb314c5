//! Export on the real model: SmolLM2-135M-Instruct (Q4_1) written back as q8_0
//! and q4_0 by `tern_models::export_gguf` loads and generates with `tern
//! generate` on Tern's kernels and on llama.cpp (feature `llama-cpp`), and its
//! perplexity on a short text stays close to the source's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tern_models::{export_gguf, ExportQuant};

use crate::support::{last_json, real_model, reference, tern};

/// The first 6000 characters of the GPL text in ../shared (about 1300 tokens):
/// enough for several 256-token windows, short enough to score in seconds.
fn short_text(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(reference("gpl-3.txt")).unwrap();
    let cut = text.char_indices().nth(6000).map_or(text.len(), |(i, _)| i);
    let path = dir.join("short.txt");
    std::fs::write(&path, &text[..cut]).unwrap();
    path
}

/// Exports the real model at `quant` into `dir` with no replacements.
fn export(dir: &Path, quant: ExportQuant) -> PathBuf {
    let out = dir.join(format!("smollm2-{quant}.gguf"));
    let report = export_gguf(&real_model(), &out, &HashMap::new(), quant).unwrap();
    assert_eq!(report.tensors, 272);
    eprintln!(
        "{quant}: {} tensors, {} bytes",
        report.tensors, report.bytes
    );
    out
}

/// Runs `tern` with `args` plus `--backend backend --json`; returns its report.
fn tern_json(args: &[&str], backend: &str) -> serde_json::Value {
    let args: Vec<&str> = [args, &["--backend", backend, "--json"]].concat();
    let out = tern(&args, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tern {args:?}: {stderr}");
    last_json(&out)
}

/// `tern perplexity` over `text` with 256-token windows.
fn perplexity(model: &Path, text: &Path, backend: &str) -> f64 {
    let (m, f) = (model.to_str().unwrap(), text.to_str().unwrap());
    let j = tern_json(&["perplexity", "-m", m, "-f", f, "--ctx", "256"], backend);
    j["perplexity"].as_f64().unwrap()
}

/// Greedy `tern generate` of 16 tokens for a fixed chat prompt; returns the text.
fn generate(model: &Path, backend: &str) -> String {
    let prompt = "Write a haiku about the sea.";
    let m = model.to_str().unwrap();
    let greedy = ["--temperature", "0", "-n", "16"];
    let j = tern_json(
        &[&["generate", "-m", m, "--chat", "-p", prompt][..], &greedy].concat(),
        backend,
    );
    assert!(j["completion_tokens"].as_u64().unwrap() > 0, "{j}");
    j["text"].as_str().unwrap().to_string()
}

/// Runs the checks on one backend and returns (source, q8_0, q4_0) perplexity.
fn check_backend(backend: &str) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path());
    let src = real_model();
    let base = perplexity(&src, &text, backend);
    eprintln!(
        "{backend}: source: ppl {base:.4}, {:?}",
        generate(&src, backend)
    );
    let mut got = Vec::new();
    for quant in [ExportQuant::Q8_0, ExportQuant::Q4_0] {
        let out = export(dir.path(), quant);
        let ppl = perplexity(&out, &text, backend);
        let answer = generate(&out, backend);
        eprintln!(
            "{backend}: {quant}: ppl {ppl:.4} ({:+.2}%), {answer:?}",
            (ppl / base - 1.0) * 100.0
        );
        // Text, not garbage: a broken export decodes to junk or nothing.
        // (Quality itself is judged by perplexity; 16 greedy tokens of a 135M
        // model at 4 bits may wander into lists or digits.)
        let words = answer
            .split_whitespace()
            .filter(|w| w.chars().any(char::is_alphabetic))
            .count();
        assert!(
            words >= 3 && !answer.contains('\u{fffd}'),
            "{backend} {quant} answered {answer:?}"
        );
        got.push(ppl);
    }
    (base, got[0], got[1])
}

/// Perplexity bounds, relative to the Q4_1 source, on a text short enough
/// that ~2% is noise (q8_0 scored 1.5% *below* the source). q8_0 re-quantizes
/// every matrix finer: within 3%. q4_0 rounds the Q4_1 values a second time
/// onto a grid without offsets, which this small model feels (+17% measured,
/// with the tied embedding kept at Q8_0; +26% without): within 25%.
fn assert_close(backend: &str, (base, q8, q4): (f64, f64, f64)) {
    assert!(
        (q8 / base - 1.0).abs() < 0.03,
        "{backend}: q8_0 ppl {q8} vs source {base}"
    );
    assert!(
        (q4 / base - 1.0).abs() < 0.25,
        "{backend}: q4_0 ppl {q4} vs source {base}"
    );
}

#[test]
fn exported_real_model_generates_with_close_perplexity() {
    assert_close("tern", check_backend("tern"));
}

#[test]
#[cfg(feature = "llama-cpp")]
fn llama_cpp_loads_and_runs_the_exported_real_model() {
    assert_close("llama-cpp", check_backend("llama-cpp"));
}

/// A LoRA trained on a tiny phi3 model, whose GGUF fuses Q/K/V into
/// `attn_qkv` and gate/up into `ffn_up`, exports with the Q/K/V and gate/up
/// adapters merged back into those fused tensors: the file holds the
/// source's tensors and no others, it computes what the base model with the
/// adapters computes (`tern export`'s own check), and llama.cpp loads it and
/// generates what Tern generates from it.
#[test]
#[cfg(feature = "llama-cpp")]
fn phi3_lora_export_fuses_back_and_llama_cpp_runs_it() {
    use crate::support::tiny::{write_tiny_model, TinySpec};
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("phi3.gguf");
    let spec = TinySpec {
        architecture: "phi3",
        ..TinySpec::default()
    };
    write_tiny_model(&base, &spec);
    let (b, run) = (base.to_str().unwrap(), dir.path().join("run"));
    let r = run.to_str().unwrap();
    let task = "arithmetic:count=10,seed=1";
    let out = tern(
        &[
            "train",
            "--model",
            b,
            "--task",
            task,
            "--algorithm",
            "sft",
            "--steps",
            "2",
            "--lr",
            "0.01",
            "--lora-rank",
            "4",
            "--prompts-per-step",
            "2",
            "--out",
            r,
            "--checkpoint-every",
            "2",
            "--seed",
            "3",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tern train: {stderr}");
    // `tern export` checks the export against the base model with the
    // adapters (both in f32): at f16 only the merge can make them differ.
    let export = |quant: &str| -> (PathBuf, f64) {
        let merged = dir.path().join(format!("merged-{quant}.gguf"));
        let m = merged.to_str().unwrap();
        let out = tern(
            &["export", "--checkpoint", r, "--out", m, "--quant", quant],
            None,
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "tern export: {stderr}");
        eprintln!("{stdout}");
        // Every projection of both blocks adapted ("all" targets): per block
        // the fused attn_qkv, attn_output, the fused ffn_up and ffn_down.
        assert!(stdout.contains(", 8 merged,"), "{stdout}");
        let diff: f64 = stdout
            .split("max |logit difference| ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no check line: {stdout}"));
        (merged, diff)
    };
    let (_, diff) = export("f16");
    assert!(diff < 0.05, "merged logits differ by {diff} at f16");
    let (merged, _) = export("q8_0");
    let m = merged.to_str().unwrap();
    let names = |p: &Path| -> Vec<String> {
        let f = tern_models::GgufFile::open(p).unwrap();
        f.tensor_names().into_iter().map(String::from).collect()
    };
    assert_eq!(names(&merged), names(&base));
    // Greedy generation on both backends: llama.cpp loads the fused file
    // and, Tern's phi3 being bit-exact with it, picks the same tokens.
    let args = [
        "generate",
        "-m",
        m,
        "-p",
        "hello there",
        "-n",
        "24",
        "--ignore-eos",
        "--temperature",
        "0",
    ];
    let (ours, theirs) = (tern_json(&args, "tern"), tern_json(&args, "llama-cpp"));
    assert_eq!(ours["completion_tokens"], 24, "{ours}");
    assert_eq!(theirs["completion_tokens"], 24, "{theirs}");
    assert_eq!(ours["text"], theirs["text"]);
}
