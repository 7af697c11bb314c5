//! The CLI on bad input: every failure is one clear line and a non-zero exit,
//! never a panic; and the happy paths on the tiny model.

use crate::support::tiny::{write_tiny_model, TinySpec};
use crate::support::{assert_clean_error, last_json, real_model, tern};

fn tiny_model(spec: TinySpec) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_model(&path, &spec);
    let p = path.to_str().unwrap().to_string();
    (dir, p)
}

#[test]
fn missing_model_path() {
    let out = tern(
        &["generate", "-m", "/nonexistent/model.gguf", "-p", "hi"],
        None,
    );
    assert_clean_error(&out, "not found");
    let out = tern(&["info", "-m", "no-such-model"], None);
    assert_clean_error(&out, "unknown model");
}

#[test]
fn truncated_and_corrupt_gguf() {
    let (dir, tiny) = tiny_model(TinySpec::default());
    let bytes = std::fs::read(&tiny).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = tern(
        &["generate", "-m", truncated.to_str().unwrap(), "-p", "hi"],
        None,
    );
    assert_clean_error(&out, "truncated");
    let header_only = dir.path().join("header.gguf");
    std::fs::write(&header_only, &bytes[..64]).unwrap();
    let out = tern(&["info", "-m", header_only.to_str().unwrap()], None);
    assert_clean_error(&out, "not a valid GGUF");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model at all, just text").unwrap();
    let out = tern(
        &["generate", "-m", garbage.to_str().unwrap(), "-p", "hi"],
        None,
    );
    assert_clean_error(&out, "not a valid GGUF");
}

#[test]
fn unsupported_architecture() {
    let (_d, m) = tiny_model(TinySpec {
        architecture: "mamba",
        ..TinySpec::default()
    });
    let out = tern(&["generate", "-m", &m, "-p", "hi"], None);
    let supported = tern_models::arch::SUPPORTED.join(", ");
    assert_clean_error(
        &out,
        &format!("unsupported architecture `mamba` (supported: {supported})"),
    );
    // `tern info` still says what the file holds.
    let out = tern(&["info", "-m", &m], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("runnable        no: unsupported architecture `mamba`")
            && text.contains("general.architecture = \"mamba\"")
            && text.contains("mamba.block_count = 2")
            && text.contains("tokenizer.ggml.tokens = ["),
        "{text}"
    );
    let j = last_json(&tern(&["info", "-m", &m, "--json"], None));
    assert_eq!(j["runnable"], false);
    assert_eq!(j["metadata"]["general.architecture"], "\"mamba\"");
}

#[test]
fn prompt_longer_than_context_and_empty_prompt() {
    let (_d, m) = tiny_model(TinySpec::default());
    let long = "word ".repeat(400);
    let out = tern(&["generate", "-m", &m, "-p", &long], None);
    assert_clean_error(&out, "context window is 256");
    let out = tern(&["generate", "-m", &m, "-p", ""], None);
    assert_clean_error(&out, "empty");
}

#[test]
fn prompt_from_a_file_or_stdin_is_the_same_prompt() {
    let model = real_model();
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    let prompt = "The capital of France is";
    // One trailing newline is dropped, as an editor leaves it.
    std::fs::write(&file, format!("{prompt}\n")).unwrap();
    let run = |source: &[&str], stdin: Option<&str>| {
        let mut args = vec![
            "generate",
            "-m",
            m,
            "-n",
            "8",
            "--temperature",
            "0",
            "--json",
        ];
        args.extend_from_slice(source);
        let out = tern(&args, stdin);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j = last_json(&out);
        (j["prompt_tokens"].clone(), j["text"].clone())
    };
    let direct = run(&["-p", prompt], None);
    assert_eq!(run(&["-f", file.to_str().unwrap()], None), direct);
    assert_eq!(run(&["-f", "-"], Some(prompt)), direct);
}

#[test]
fn bad_prompt_files() {
    let (d, m) = tiny_model(TinySpec::default());
    let out = tern(
        &["generate", "-m", &m, "-f", "/nonexistent/prompt.txt"],
        None,
    );
    assert_clean_error(&out, "reading the prompt from /nonexistent/prompt.txt");
    let out = tern(&["bon", "-m", &m, "-f", "/nonexistent/q.txt"], None);
    assert_clean_error(&out, "reading the prompt from /nonexistent/q.txt");
    // An error that prints its cause does not print it twice.
    let out = tern(
        &["eval", "-m", &m, "--task", "/nonexistent/tasks.jsonl"],
        None,
    );
    assert_clean_error(&out, "reading task file /nonexistent/tasks.jsonl");
    let line = String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert_eq!(line.matches("os error").count(), 1, "{line}");
    let empty = d.path().join("empty.txt");
    std::fs::write(&empty, "\n").unwrap();
    let out = tern(&["generate", "-m", &m, "-f", empty.to_str().unwrap()], None);
    assert_clean_error(&out, "is empty");
    let out = tern(&["generate", "-m", &m, "-f", "-"], Some(""));
    assert_clean_error(&out, "the prompt from standard input is empty");
    // One source, not two; and not none.
    let out = tern(&["generate", "-m", &m, "-p", "hi", "-f", "x"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let out = tern(&["generate", "-m", &m], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("required"));
}

#[test]
fn bad_sampling_parameters() {
    let (_d, m) = tiny_model(TinySpec::default());
    let out = tern(&["generate", "-m", &m, "-p", "hi", "--top-p", "1.5"], None);
    assert_clean_error(&out, "top_p");
    let out = tern(
        &["generate", "-m", &m, "-p", "hi", "--temperature", "-1"],
        None,
    );
    assert_clean_error(&out, "temperature");
}

#[test]
fn perplexity_on_a_too_short_file() {
    let (d, m) = tiny_model(TinySpec::default());
    let f = d.path().join("short.txt");
    std::fs::write(&f, "too short").unwrap();
    let out = tern(
        &[
            "perplexity",
            "-m",
            &m,
            "-f",
            f.to_str().unwrap(),
            "--ctx",
            "64",
        ],
        None,
    );
    assert_clean_error(&out, "at least ctx");
    let out = tern(&["perplexity", "-m", &m, "-f", "/nonexistent.txt"], None);
    assert_clean_error(&out, "cannot read");
}

#[test]
fn failed_pull_without_python_leaves_no_file() {
    let home = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tern"))
        .args(["pull"])
        .env("TERN_HOME", home.path())
        .env("PATH", empty_path.path())
        .output()
        .unwrap();
    assert_clean_error(&out, "python3");
    let left: Vec<_> = std::fs::read_dir(home.path()).unwrap().collect();
    assert!(left.is_empty(), "pull left files behind: {left:?}");
}

#[test]
fn tiny_model_generates_tokenizes_and_reports() {
    let (_d, m) = tiny_model(TinySpec::default());
    let out = tern(
        &[
            "generate",
            "-m",
            &m,
            "-p",
            "hello",
            "-n",
            "5",
            "--ignore-eos",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = last_json(&out);
    assert_eq!(j["completion_tokens"], 5);
    let out = tern(&["tokenize", "-m", &m, "--json"], Some("hello"));
    let j = last_json(&out);
    // "he" + "ll" merge into "hell" via the tiny merges, then "o".
    assert_eq!(j["ids"].as_array().unwrap().len(), 2, "{j}");
    let out = tern(&["info", "-m", &m, "--json"], None);
    let j = last_json(&out);
    assert_eq!(j["config"]["n_layer"], 2);
    assert_eq!(j["chat_template"], true);
}

#[test]
fn info_and_tokenize_on_the_real_model() {
    let model = real_model();
    let m = model.to_str().unwrap();
    let j = last_json(&tern(&["info", "-m", m, "--json"], None));
    assert_eq!(j["config"]["architecture"], "llama");
    assert_eq!(j["config"]["n_layer"], 30);
    assert_eq!(j["vocab_size"], 49152);
    assert_eq!(j["pre_tokenizer"], "smollm");
    assert!(j["quantization"]["Q4_1"]["tensors"].as_u64().unwrap() > 200);
    let j = last_json(&tern(
        &["tokenize", "-m", m, "--json"],
        Some("<|im_start|>Hello world! 123"),
    ));
    assert_eq!(
        j["ids"],
        serde_json::json!([1, 19556, 905, 17, 216, 33, 34, 35])
    );
}

#[test]
fn every_architecture_generates_under_every_kind_of_policy() {
    for arch in tern_models::arch::SUPPORTED {
        let (_d, m) = tiny_model(TinySpec::for_architecture(arch));
        let info = last_json(&tern(&["info", "-m", &m, "--json"], None));
        assert_eq!(info["config"]["architecture"], *arch);
        for policy in [
            "full",
            "streaming:budget=32,sink=4",
            "snapkv:budget=32,window=8",
        ] {
            let out = tern(
                &[
                    "generate",
                    "-m",
                    &m,
                    "-p",
                    "hello there",
                    "-n",
                    "48",
                    "--ignore-eos",
                    "--temperature",
                    "0",
                    "--kv-policy",
                    policy,
                    "--json",
                ],
                None,
            );
            assert!(
                out.status.success(),
                "{arch} {policy}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let j = last_json(&out);
            assert_eq!(j["completion_tokens"], 48, "{arch} {policy}: {j}");
        }
    }
}

#[test]
fn a_base_model_refuses_chat_with_a_way_out() {
    let (_d, m) = tiny_model(TinySpec {
        chat_template: false,
        ..TinySpec::default()
    });
    let out = tern(
        &["generate", "-m", &m, "--chat", "-p", "hi", "-n", "2"],
        None,
    );
    assert_clean_error(&out, "no chat template (a base model)");
    let out = tern(&["generate", "-m", &m, "-p", "hi", "-n", "2"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A phi3 file missing a tensor, or carrying one llama.cpp's phi3 would use
/// and Tern does not run, is refused in one line that names the tensor.
#[test]
fn phi3_missing_and_unsupported_tensors_are_named() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let (d, m) = tiny_model(TinySpec {
        architecture: "phi3",
        ..TinySpec::default()
    });
    let src = std::path::Path::new(&m);
    let broken = d.path().join("broken.gguf");
    let b = broken.to_str().unwrap();
    let generate = ["generate", "-m", b, "-p", "hi", "-n", "2"];
    crate::support::rewrite_gguf(src, &broken, |t| {
        t.retain(|(n, _)| n != "blk.1.ffn_up.weight")
    });
    assert_clean_error(&tern(&generate, None), "`blk.1.ffn_up.weight`: missing");
    crate::support::rewrite_gguf(src, &broken, |t| {
        let bias =
            candle_core::Tensor::zeros(128, candle_core::DType::F32, &candle_core::Device::Cpu);
        let bias = QTensor::quantize(&bias.unwrap(), GgmlDType::F32).unwrap();
        t.push(("blk.0.attn_qkv.bias".into(), bias));
    });
    assert_clean_error(&tern(&generate, None), "`blk.0.attn_qkv.bias`");
    // Gate and up must be one tensor of 2 n_ff rows.
    crate::support::rewrite_gguf(src, &broken, |t| {
        for (n, w) in t.iter_mut() {
            if n == "blk.0.ffn_up.weight" {
                let half = w
                    .dequantize(&candle_core::Device::Cpu)
                    .unwrap()
                    .narrow(0, 0, 128)
                    .unwrap();
                *w = QTensor::quantize(&half, GgmlDType::Q8_0).unwrap();
            }
        }
    });
    assert_clean_error(
        &tern(&generate, None),
        "`blk.0.ffn_up.weight`: expected shape [256, 64]",
    );
}

/// Patches the tensor directory entry of `name` in a GGUF file's bytes:
/// `f` gets its (ne0, ne1, type id) and returns the new ones.
fn patch_tensor(bytes: &mut [u8], name: &str, f: impl Fn(u64, u64, u32) -> (u64, u64, u32)) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("tensor entry")
        + key.len();
    assert_eq!(&bytes[at..at + 4], &2u32.to_le_bytes(), "a 2-D tensor");
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let (ne0, ne1) = (u64_at(bytes, at + 4), u64_at(bytes, at + 12));
    let t = u32::from_le_bytes(bytes[at + 20..at + 24].try_into().unwrap());
    let (ne0, ne1, t) = f(ne0, ne1, t);
    bytes[at + 4..at + 12].copy_from_slice(&ne0.to_le_bytes());
    bytes[at + 12..at + 20].copy_from_slice(&ne1.to_le_bytes());
    bytes[at + 20..at + 24].copy_from_slice(&t.to_le_bytes());
}

/// A tensor of a type Tern cannot read, one whose rows are not whole
/// blocks, and one whose data runs past the end: each refused naming the
/// tensor (and the type), by `generate` and by `info`, without a panic.
#[test]
fn bad_tensor_types_rows_and_data_are_named() {
    let (dir, tiny) = tiny_model(TinySpec::default());
    let bytes = std::fs::read(&tiny).unwrap();
    let name = "blk.1.attn_q.weight";
    let write = |file: &str, b: &[u8]| {
        let p = dir.path().join(file);
        std::fs::write(&p, b).unwrap();
        p.to_str().unwrap().to_string()
    };
    let mut iq = bytes.clone();
    patch_tensor(&mut iq, name, |a, b, _| (a, b, 16));
    let iq = write("iq2xxs.gguf", &iq);
    for args in [
        vec!["generate", "-m", &iq, "-p", "hi"],
        vec!["info", "-m", &iq],
    ] {
        let out = tern(&args, None);
        assert_clean_error(
            &out,
            "tensor blk.1.attn_q.weight is IQ2_XXS, a type Tern cannot read yet",
        );
    }
    let mut rows = bytes.clone();
    patch_tensor(&mut rows, name, |a, b, t| (16, a * b / 16, t));
    let rows = write("rows.gguf", &rows);
    let out = tern(&["generate", "-m", &rows, "-p", "hi"], None);
    assert_clean_error(
        &out,
        "tensor blk.1.attn_q.weight: row length 16 is not a multiple of the 32-value blocks",
    );
    let cut = write("cut.gguf", &bytes[..bytes.len() - 100]);
    let out = tern(&["generate", "-m", &cut, "-p", "hi"], None);
    assert_clean_error(&out, "truncated: tensor ");
}
