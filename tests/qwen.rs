//! The two real models that can do Tern's jobs, Qwen2.5-Coder 0.5B and 1.5B
//! Instruct (Q4_K_M, as published), against llama.cpp in process: 256
//! teacher-forced positions bit-identical, perplexity equal to the digit,
//! greedy chat answers equal token for token, and the chat template from
//! each file rendered byte for byte as llama.cpp's `--jinja` path renders it
//! (system, multi-turn, tools, tool calls and tool results). CI pulls both
//! (`tern pull qwen2.5-coder-0.5b-instruct`, `... 1.5b-instruct` in
//! scripts/test.sh); a missing file fails loudly.
#![cfg(feature = "llama-cpp")]

use std::path::PathBuf;

use serde_json::{json, Value};
use tern_runtime::backend::{render_chat_llama_cpp, JinjaRequest};
use tern_runtime::chat::{ChatTemplate, RenderOptions};

use crate::support::{last_json, reference, repo_root, tern};

/// A pulled Qwen2.5-Coder file by its catalog name.
pub(crate) fn qwen(name: &str) -> PathBuf {
    let entry = tern_hub::lookup(name).expect("in the catalog");
    let dir = std::env::var_os("TERN_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/cache"));
    let path = dir.join(entry.file_name);
    assert!(
        path.is_file(),
        "{name} missing at {}: run `cargo run --release -- pull {name}` (the test script does this)",
        path.display()
    );
    path
}

const MODELS: [&str; 2] = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"];

#[test]
fn teacher_forced_logits_are_bit_identical() {
    for name in MODELS {
        let (identical, top1, max_diff, n) = crate::backend::file_agreement(&qwen(name), 256);
        eprintln!(
            "{name}: {identical}/{n} bit-identical, top-1 {top1}/{n}, max |diff| {max_diff:e}"
        );
        assert_eq!(
            identical, n,
            "{name}: max |diff| {max_diff:e}, top-1 {top1}/{n}"
        );
    }
}

#[test]
fn perplexity_equals_llama_cpp_to_the_digit() {
    // Two 512-token windows of the GPL.
    let text = std::fs::read_to_string(reference("gpl-3.txt")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("head.txt");
    std::fs::write(&file, &text[..5000]).unwrap();
    for name in MODELS {
        let model = qwen(name);
        let ppl = |backend: &str| {
            let out = tern(
                &[
                    "perplexity",
                    "-m",
                    model.to_str().unwrap(),
                    "-f",
                    file.to_str().unwrap(),
                    "--ctx",
                    "512",
                    "--json",
                    "--backend",
                    backend,
                ],
                None,
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let j = last_json(&out);
            assert!(j["chunks"].as_u64().unwrap() >= 2, "{j}");
            j["perplexity"].as_f64().unwrap()
        };
        let (ours, theirs) = (ppl("tern"), ppl("llama-cpp"));
        eprintln!("{name}: perplexity {ours} (tern) vs {theirs} (llama.cpp)");
        assert_eq!(ours.to_bits(), theirs.to_bits(), "{ours} vs {theirs}");
    }
}

/// Five chat prompts a user of a coding model would send.
const PROMPTS: [&str; 5] = [
    "Write a Python function is_prime(n).",
    "What does `git rebase -i HEAD~3` do? One sentence.",
    "Fix this code: def add(a, b) return a + b",
    "A shop sells pens at $1.25 each. How much do 12 pens cost?",
    "Name three sorting algorithms and their average time complexity.",
];

#[test]
fn greedy_chat_answers_equal_llama_cpp_token_for_token() {
    for name in MODELS {
        let model = qwen(name);
        for prompt in PROMPTS {
            let ids = |backend: &str| {
                let out = tern(
                    &[
                        "generate",
                        "-m",
                        model.to_str().unwrap(),
                        "--chat",
                        "-p",
                        prompt,
                        "--temperature",
                        "0",
                        "-n",
                        "32",
                        "--json",
                        "--backend",
                        backend,
                    ],
                    None,
                );
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let j = last_json(&out);
                (
                    j["token_ids"].clone(),
                    j["text"].as_str().unwrap().to_string(),
                )
            };
            let (ours, text) = ids("tern");
            let (theirs, _) = ids("llama-cpp");
            assert!(!text.is_empty(), "{name}: {prompt}: nothing generated");
            assert_eq!(ours, theirs, "{name}: {prompt}: {text:?}");
        }
    }
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "lookup_price",
            "description": "The unit price of an item, in dollars",
            "parameters": {"type": "object",
                "properties": {"item": {"type": "string", "description": "What to price"}},
                "required": ["item"]}}},
        {"type": "function", "function": {
            "name": "multiply", "description": "a times b",
            "parameters": {"type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"]}}},
    ])
}

#[test]
fn chat_templates_render_as_llama_cpp_jinja_does() {
    let conversations = [
        json!([{"role": "user", "content": "Hi there"}]),
        json!([{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "4"},
               {"role": "user", "content": "And 3+3? Ünïcödé, 中文 😀"}]),
        json!([
            {"role": "user", "content": "What do 12 widgets cost?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "lookup_price", "arguments": "{\"item\": \"widget\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "37.25"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_2", "type": "function",
                 "function": {"name": "multiply", "arguments": {"a": 37.25, "b": 12}}},
                {"id": "call_3", "type": "function",
                 "function": {"name": "lookup_price", "arguments": {"item": "box"}}}]},
            {"role": "tool", "tool_call_id": "call_2", "content": "447.0"},
            {"role": "tool", "tool_call_id": "call_3", "content": "2.5"},
            {"role": "assistant", "content": "12 widgets cost $447.00."},
            {"role": "user", "content": "Thanks"},
        ]),
    ];
    for name in MODELS {
        let file = tern_models::GgufFile::open(&qwen(name)).unwrap();
        let source = file.str("tokenizer.chat_template").unwrap().to_string();
        let (bos, eos) = ("<|endoftext|>", "<|im_end|>");
        let ours = ChatTemplate::new(&source, bos, eos).unwrap();
        let mut rendered = 0;
        for messages in &conversations {
            for with_tools in [false, true] {
                for add_generation_prompt in [true, false] {
                    let opts = RenderOptions {
                        add_generation_prompt,
                        tools: with_tools.then(tools),
                        ..RenderOptions::default()
                    };
                    let text = ours.render_conversation(messages, &opts).unwrap();
                    let req = JinjaRequest {
                        tools: opts.tools.as_ref(),
                        add_generation_prompt,
                        enable_thinking: opts.enable_thinking,
                    };
                    let theirs = render_chat_llama_cpp(&source, bos, eos, messages, &req).unwrap();
                    assert_eq!(text, theirs, "{name}: {messages} (tools: {with_tools})");
                    if with_tools {
                        assert!(text.contains("<tools>") && text.contains("lookup_price"));
                    }
                    rendered += 1;
                }
            }
        }
        let last = ours
            .render_conversation(
                &conversations[2],
                &RenderOptions {
                    tools: Some(tools()),
                    ..RenderOptions::default()
                },
            )
            .unwrap();
        assert!(
            last.contains("<tool_call>") && last.contains("<tool_response>\n447.0"),
            "{last}"
        );
        assert_eq!(rendered, 12);
    }
}
