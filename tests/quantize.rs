//! `tern quantize` end to end: files it writes run in Tern and in llama.cpp
//! with bit-identical logits, and the CLI's errors and warning. (Its bytes
//! against llama.cpp's quantizer: the models crate's
//! `models/tests/quantize.rs`.)
#![cfg(feature = "llama-cpp")]

use candle_core::quantized::GgmlDType;
use tern_models::{quantize_gguf, QuantType};

use crate::backend::file_agreement;
use crate::support::tiny::write_tiny_model;
use crate::support::tiny_quant::wide;
use crate::support::{assert_clean_error, tern};

/// Files written by `tern quantize` run in Tern and in llama.cpp with
/// bit-identical teacher-forced logits at all 256 positions.
#[test]
fn tern_quantized_files_run_identically_in_tern_and_llama_cpp() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, q) in [
        ("llama", QuantType::Q4KM),
        ("gemma3", QuantType::Q6K),
        ("llama", QuantType::Q8_0),
        ("llama", QuantType::Q4_0),
        ("llama", QuantType::Iq4Nl),
        ("gemma3", QuantType::Iq4Xs),
    ] {
        let spec = wide(arch, 2);
        let src = dir.path().join(format!("{arch}-f32.gguf"));
        write_tiny_model(&src, &spec);
        let out = dir.path().join(format!("{arch}-{q}.gguf"));
        quantize_gguf(&src, &out, q, &mut |_, _, _| {}).unwrap();
        let (identical, top1, max_diff, n) = file_agreement(&out, spec.context_length);
        eprintln!(
            "{arch} {q}: {identical}/{n} bit-identical, top-1 {top1}/{n}, max |diff| {max_diff:e}"
        );
        assert_eq!(identical, n, "{arch} {q}: max |diff| {max_diff:e}");
    }
}

/// The CLI: a working run prints what it wrote; an unknown type lists the
/// valid ones; a missing input says so; a quantized input is requantized with
/// a warning.
#[test]
fn quantize_cli_reports_and_refuses_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f32.gguf");
    write_tiny_model(&src, &wide("llama", 2));
    let out = dir.path().join("out.gguf");
    let (s, o) = (src.to_str().unwrap(), out.to_str().unwrap());

    let run = tern(
        &["quantize", "--model", s, "--out", o, "--type", "Q4_K_M"],
        None,
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("q4_k_m"), "{stdout}");
    assert!(!String::from_utf8_lossy(&run.stderr).contains("warning"));
    let file = tern_models::GgufFile::open(&out).unwrap();
    assert_eq!(
        file.tensor_dtype("blk.0.attn_q.weight"),
        Some(GgmlDType::Q4K)
    );

    let bad = tern(
        &["quantize", "--model", s, "--out", o, "--type", "q3_k"],
        None,
    );
    assert_clean_error(&bad, "unknown quantization type `q3_k`");
    let line = String::from_utf8_lossy(&bad.stderr).to_string();
    for q in QuantType::ALL {
        assert!(line.contains(q.name()), "{q} not listed: {line}");
    }

    let missing = dir.path().join("nope.gguf");
    let gone = tern(
        &[
            "quantize",
            "--model",
            missing.to_str().unwrap(),
            "--out",
            o,
            "--type",
            "q8_0",
        ],
        None,
    );
    assert_clean_error(&gone, "nope.gguf");

    let again = dir.path().join("again.gguf");
    let re = tern(
        &[
            "quantize",
            "--model",
            o,
            "--out",
            again.to_str().unwrap(),
            "--type",
            "q8_0",
        ],
        None,
    );
    assert!(
        re.status.success(),
        "{}",
        String::from_utf8_lossy(&re.stderr)
    );
    let stderr = String::from_utf8_lossy(&re.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("requantiz"),
        "no requantize warning: {stderr}"
    );
}
