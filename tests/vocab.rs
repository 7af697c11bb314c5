//! Real vocabularies on generated models: Qwen's (`qwen2` pre-tokenizer) and
//! Llama 3's (`llama-bpe`) byte-level BPE, written into tiny random-weight
//! GGUFs of their architectures, tokenized by Tern and by the in-process
//! llama.cpp, which must agree id for id on every text.

use std::path::Path;

use serde_json::Value;
use tern_runtime::backend::{LlamaCppBackend, LlamaCppOptions};
use tern_runtime::LoadedModel;

use crate::support::tiny::{write_tiny_model_with, TinySpec, TinyVocab};
use crate::support::{real_vocab, reference, LLAMA_THREADS};

/// `tokenizer.json` as a GGUF vocabulary: tokens by id (added ones too),
/// control tokens typed 3, other added tokens 4, merges as `"a b"`.
fn vocab_from(path: &Path, pre: &'static str, bos: &str, eos: &str, add_bos: bool) -> TinyVocab {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut by_id: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, text: &str, kind: i32| {
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some((text.to_string(), kind));
    };
    for (text, id) in json["model"]["vocab"].as_object().unwrap() {
        put(id.as_u64().unwrap() as usize, text, 1);
    }
    for t in json["added_tokens"].as_array().unwrap() {
        let kind = if t["special"].as_bool().unwrap_or(false) {
            3
        } else {
            4
        };
        put(
            t["id"].as_u64().unwrap() as usize,
            t["content"].as_str().unwrap(),
            kind,
        );
    }
    let (tokens, types): (Vec<String>, Vec<i32>) = by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| (format!("[UNUSED_{i}]"), 4)))
        .unzip();
    let merges = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(pair) => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
            other => panic!("merge {other}"),
        })
        .collect();
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    TinyVocab {
        bos: id(bos),
        eos: id(eos),
        add_bos,
        merges,
        pre,
        types,
        tokens,
        meta: Vec::new(),
    }
}

/// Llama 3.2's vocabulary as its GGUFs declare it.
pub(crate) fn llama3_vocab() -> TinyVocab {
    vocab_from(
        &real_vocab("llama3"),
        "llama-bpe",
        "<|begin_of_text|>",
        "<|eot_id|>",
        true,
    )
}

/// Texts both tokenizers must split alike: the reference token file's, and
/// multilingual, code and emoji text.
pub fn texts() -> Vec<String> {
    let mut texts: Vec<String> = std::fs::read_to_string(reference("tokens.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    texts.extend(
        [
            "Grüße aus München! Ça va? ¿Qué tal? Привет, мир. Γειά σου κόσμε.",
            "日本語のテキストと中文文本，还有한국어 텍스트。",
            "مرحبا بالعالم — नमस्ते दुनिया — שלום עולם",
            "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
            "def f(a, b=3):\n\treturn a**b  # 12345678 digits 1234567\n\n\n",
            "Emoji 😀🎉👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, ZWJ and ✔️ marks",
            "I'm sure they'd've said it's THEY'LL WE'VE don't",
            "   many    spaces\t\ttabs \r\n\r\n  crlf   ",
            "1,234,567.89 + 0.000001 = 2026-12-02T07:45:00Z",
        ]
        .map(String::from),
    );
    texts
}

/// Writes a tiny `arch` model with `vocab`, then checks its tokenization
/// against llama.cpp's.
fn check(arch: &'static str, vocab: &TinyVocab, special_text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-real-vocab.gguf");
    let spec = TinySpec {
        architecture: arch,
        context_length: 256,
        ..TinySpec::default()
    };
    write_tiny_model_with(&path, &spec, Some(vocab));
    let model = LoadedModel::load(&path).unwrap();
    let opts = LlamaCppOptions {
        n_ctx: 256,
        n_seq_max: 1,
        n_threads: LLAMA_THREADS,
        kv_dtype: Default::default(),
    };
    let llama = LlamaCppBackend::load(&path, model.config(), &opts).unwrap();
    let mut differ = Vec::new();
    for text in texts() {
        let ours = model.tokenizer.encode(&text, false, false).unwrap();
        let theirs = llama.tokenize(&text, false, false);
        if ours != theirs {
            differ.push(format!("{text:?}\n  tern  {ours:?}\n  llama {theirs:?}"));
        }
    }
    // BOS as the GGUF asks, and control tokens parsed out of a rendered prompt.
    let ours = model.tokenizer.encode(special_text, true, true).unwrap();
    let theirs = llama.tokenize(special_text, true, true);
    if ours != theirs {
        differ.push(format!(
            "{special_text:?} (special)\n  tern  {ours:?}\n  llama {theirs:?}"
        ));
    }
    assert!(
        differ.is_empty(),
        "{arch}: tokenization differs:\n{}",
        differ.join("\n")
    );
}

#[test]
fn qwen_vocabulary_tokenizes_as_llama_cpp_does() {
    let vocab = vocab_from(
        &real_vocab("qwen"),
        "qwen2",
        "<|endoftext|>",
        "<|im_end|>",
        false,
    );
    assert_eq!(vocab.tokens.len(), 151_669);
    check(
        "qwen2",
        &vocab,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi 123!<|im_end|>\n<|im_start|>assistant\n",
    );
}

#[test]
fn llama3_vocabulary_tokenizes_as_llama_cpp_does() {
    let vocab = llama3_vocab();
    assert!(vocab.tokens.len() >= 128_256, "{}", vocab.tokens.len());
    check(
        "llama",
        &vocab,
        "<|start_header_id|>user<|end_header_id|>\n\nHi 12345!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    );
}

#[test]
fn every_end_of_generation_token_stops() {
    // Llama 3: the declared EOS (<|eot_id|> here) and the family's others.
    let vocab = llama3_vocab();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-llama3.gguf");
    write_tiny_model_with(&path, &TinySpec::default(), Some(&vocab));
    let model = LoadedModel::load(&path).unwrap();
    let stops = model.stop_tokens();
    for t in ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"] {
        let id = model.tokenizer.token_id(t).unwrap();
        assert!(stops.contains(&id), "{t} ({id}) does not stop: {stops:?}");
    }
    assert!(!stops.contains(&model.tokenizer.token_id("<|begin_of_text|>").unwrap()));
}

#[test]
fn qwen3s_own_chat_template_renders_system_and_turns() {
    use tern_runtime::chat::{ChatMessage, ChatTemplate};
    let config = real_vocab("qwen").with_file_name("tokenizer_config.json");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let source = config["chat_template"].as_str().unwrap();
    let template = ChatTemplate::new(source, "", "<|im_end|>").unwrap();
    let m = |role: &str, content: &str| ChatMessage::new(role, content);
    // An earlier assistant turn's thinking is dropped from the history, as
    // Qwen3's template says; the last turn asks for the answer.
    let messages = [
        m("system", "You are terse."),
        m("user", "What is 2+2?"),
        m("assistant", "<think>\nadd them\n</think>\n\n4"),
        m("user", "And 3+3?"),
    ];
    let got = template.render(&messages, true).unwrap();
    assert_eq!(
        got,
        "<|im_start|>system\nYou are terse.<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // No system message: none is invented.
    let got = template.render(&[m("user", "Hi")], true).unwrap();
    assert_eq!(
        got,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}
