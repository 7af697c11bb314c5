//! The SentencePiece tokenizer (`tokenizer.ggml.model = llama`) on Gemma 3's
//! real vocabulary (262,144 tokens, read from the pulled Gemma 3 270M GGUF):
//! Tern's ids equal the in-process llama.cpp backend's, with and without BOS
//! and special-token parsing, and detokenization gives llama.cpp's bytes.
//!
//! The vocabulary's metadata is copied verbatim into a tiny random-weight
//! `llama` GGUF, so both Tern and llama.cpp load it as a whole model (Tern's
//! Gemma 3 forward is not what this checks).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use tern_models::GgufFile;
use tern_runtime::backend::{LlamaCppBackend, LlamaCppOptions};
use tern_runtime::tokenizer::Tokenizer;
use tern_runtime::LoadedModel;

use crate::support::tiny::{write_tiny_model_with, TinySpec, TinyVocab};
use crate::support::{real_gemma, LLAMA_THREADS};

/// The real Gemma file's vocabulary and every `tokenizer.*` key it has.
fn gemma_vocab(file: &GgufFile) -> TinyVocab {
    let tokens: Vec<String> = file
        .str_array("tokenizer.ggml.tokens")
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let types = file.i32_array("tokenizer.ggml.token_type").unwrap();
    let meta = file
        .metadata()
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    TinyVocab {
        bos: file.u32("tokenizer.ggml.bos_token_id").unwrap(),
        eos: file.u32("tokenizer.ggml.eos_token_id").unwrap(),
        add_bos: true,
        merges: Vec::new(),
        pre: "default",
        types,
        tokens,
        meta,
    }
}

/// Writes the tiny model with Gemma's vocabulary (no chat template: the
/// real file has none) into `dir`.
fn write_tiny_gemma(dir: &Path) -> std::path::PathBuf {
    write_tiny_gemma_with(dir, Vec::new())
}

/// [`write_tiny_gemma`] with some `tokenizer.*` keys changed.
fn write_tiny_gemma_with(dir: &Path, changes: Vec<(String, Value)>) -> std::path::PathBuf {
    write_tiny_vocab_model(dir, "llama", changes)
}

/// A tiny `architecture` model carrying Gemma's vocabulary, some
/// `tokenizer.*` keys changed.
fn write_tiny_vocab_model(
    dir: &Path,
    architecture: &'static str,
    changes: Vec<(String, Value)>,
) -> std::path::PathBuf {
    let file = GgufFile::open(&real_gemma()).unwrap();
    let path = dir.join("tiny-gemma-vocab.gguf");
    let spec = TinySpec {
        architecture,
        n_embd: 32,
        n_head: 2,
        n_kv_head: 1,
        n_ff: 64,
        n_layer: 1,
        chat_template: false,
        ..TinySpec::default()
    };
    let mut vocab = gemma_vocab(&file);
    vocab
        .meta
        .retain(|(k, _)| !changes.iter().any(|(c, _)| c == k));
    vocab.meta.extend(changes);
    write_tiny_model_with(&path, &spec, Some(&vocab));
    path
}

/// The reference texts and vocab.rs's multilingual/code/emoji ones, then
/// what a SentencePiece vocabulary makes hard: whitespace runs (Gemma has
/// user-defined tokens for runs of spaces, tabs and newlines), characters
/// outside the vocabulary (byte fallback), literal special-token and
/// byte-token text, HTML tags Gemma keeps whole, leading spaces.
fn texts() -> Vec<String> {
    let mut texts = crate::vocab::texts();
    texts.extend(
        [
            "",
            " ",
            "  ",
            " leading space",
            "trailing space ",
            "a  b   c    d                                      e",
            "\t\t\tindented\n\t\t\t\tmore\n\n\n\nparagraphs\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nend",
            " \n \t \r\n\u{a0}\u{3000}mixed whitespace\u{2028}",
            "\u{1}\u{7}\u{7f} control characters \u{e000}\u{f8ff} private use",
            "rare CJK 𠀀𠀁𪜀 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and ꙮ",
            "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
            "<bos><eos><pad><unk><mask><unused0><unused6241>[multimodal]",
            "<0x41><0xFF> literal byte-token text",
            "<table><tr><td>cell</td></tr></table><h1>x</h1> <b>bold</b>",
            "▁already▁escaped▁ and ▁▁",
            "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ and ﬁ ligature and e\u{301} combining",
            "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘😗☺️😚😙🥲",
            "x = {'a': [1, 2, 3], \"b\": None}  # comment\r\n\tif x:\n\t\tpass\n",
        ]
        .map(String::from),
    );
    texts
}

#[test]
fn gemma_vocabulary_tokenizes_as_llama_cpp_does() {
    let dir = tempfile::tempdir().unwrap();
    let not_round = check_against_llama_cpp(&write_tiny_gemma(dir.path()));
    // Only the text that spells U+2581 itself does not come back.
    assert_eq!(
        not_round,
        vec![("▁already▁escaped▁ and ▁▁".to_string(), false)],
        "texts that do not round-trip"
    );
}

#[test]
fn with_a_space_prefix_as_llama_2_has_it_still_tokenizes_as_llama_cpp_does() {
    // The same vocabulary with `add_space_prefix` on: a space before text
    // that starts the prompt or follows a special token, and one taken off
    // the first piece when detokenizing.
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_gemma_with(
        dir.path(),
        vec![("tokenizer.ggml.add_space_prefix".into(), Value::Bool(true))],
    );
    let not_round = check_against_llama_cpp(&path);
    // Text after a user-defined token (Gemma's whitespace runs and HTML
    // tags) gets a space prefix that detokenizing keeps, in llama.cpp as in
    // Tern; apart from those and the literal U+2581, text comes back.
    let other: Vec<_> = not_round
        .iter()
        .filter(|(t, cut)| !cut && !t.contains('▁'))
        .collect();
    assert!(other.is_empty(), "{other:?}");
    assert!(not_round.len() < 25, "{}", not_round.len());
}

/// Phi-3's tokenizer is SentencePiece with a space prefix (`tokenizer.ggml.model
/// = llama`, `add_space_prefix` on); no real Phi-3 vocabulary ships here, so a
/// tiny `phi3` model carries Gemma's with the prefix on (named neutrally, as
/// llama.cpp applies Phi-3 token rules by `general.name`): ids and bytes as
/// llama.cpp's.
#[test]
fn a_phi3_model_with_a_sentencepiece_vocabulary_tokenizes_as_llama_cpp_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_vocab_model(
        dir.path(),
        "phi3",
        vec![("tokenizer.ggml.add_space_prefix".into(), Value::Bool(true))],
    );
    let model = LoadedModel::load(&path).unwrap();
    assert_eq!(model.config().architecture, "phi3");
    let not_round = check_against_llama_cpp(&path);
    let other: Vec<_> = not_round
        .iter()
        .filter(|(t, cut)| !cut && !t.contains('▁'))
        .collect();
    assert!(other.is_empty(), "{other:?}");
}

/// Every text, with and without BOS and special-token parsing, encoded by
/// Tern and by llama.cpp (equal ids), then detokenized by both (equal bytes).
/// Returns the texts that do not come back from detokenizing, each with
/// whether a user-defined token was cut out of it.
fn check_against_llama_cpp(path: &Path) -> Vec<(String, bool)> {
    let path = path.to_path_buf();
    let model = LoadedModel::load(&path).unwrap();
    let tok = &model.tokenizer;
    assert_eq!(tok.model_name(), "llama");
    assert_eq!(tok.vocab_size(), 262_144);
    let opts = LlamaCppOptions {
        n_ctx: 256,
        n_seq_max: 1,
        n_threads: LLAMA_THREADS,
        kv_dtype: Default::default(),
    };
    let llama = LlamaCppBackend::load(&path, model.config(), &opts).unwrap();

    let file = GgufFile::open(&path).unwrap();
    let types = file.i32_array("tokenizer.ggml.token_type").unwrap();
    let (mut checked, mut byte_tokens, mut user_defined) = (0, 0, 0);
    let mut differ = Vec::new();
    let (mut round_trips, mut not_round) = (0, Vec::new());
    let texts = texts();
    for text in &texts {
        for (add_special, parse_special) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let ours = tok.encode(text, add_special, parse_special).unwrap();
            let theirs = llama.tokenize(text, add_special, parse_special);
            checked += 1;
            if ours != theirs {
                differ.push(format!(
                    "{text:?} (bos {add_special}, special {parse_special})\n  tern  {ours:?}\n  llama {theirs:?}"
                ));
                continue;
            }
            byte_tokens += theirs.iter().filter(|&&i| types[i as usize] == 6).count();
            user_defined += theirs.iter().filter(|&&i| types[i as usize] == 4).count();
            if theirs.is_empty() {
                continue;
            }
            // Detokenizing: llama.cpp's bytes for every flag combination.
            for (remove_special, unparse_special) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                let ours = tok.detokenize(&theirs, remove_special, unparse_special);
                let want = llama.detokenize(&theirs, remove_special, unparse_special);
                if ours != want {
                    differ.push(format!(
                        "{text:?} detokenized (remove {remove_special}, unparse {unparse_special})\n  tern  {:?}\n  llama {:?}",
                        String::from_utf8_lossy(&ours),
                        String::from_utf8_lossy(&want)
                    ));
                }
            }
        }
        // Round trip: text comes back from Tern exactly when it does from
        // llama.cpp (a literal U+2581 comes back as a space from both). No
        // BOS: llama.cpp keeps the prefix space after a removed BOS.
        let ids = llama.tokenize(text, false, false);
        let back = tok.detokenize(&ids, false, false);
        if back == text.as_bytes() {
            round_trips += 1;
        } else {
            let cut = ids.iter().any(|&i| types[i as usize] == 4);
            not_round.push((text.clone(), cut));
        }
        assert_eq!(
            back,
            llama.detokenize(&ids, false, false),
            "round trip of {text:?}"
        );
    }
    assert!(
        differ.is_empty(),
        "{} of {checked} encodings differ from llama.cpp:\n{}",
        differ.len(),
        differ.join("\n")
    );
    // The byte fallback and the whole-matched user-defined tokens were used.
    assert!(byte_tokens >= 20, "only {byte_tokens} byte tokens");
    assert!(
        user_defined >= 20,
        "only {user_defined} user-defined tokens"
    );
    assert!(checked >= 4 * 40, "only {checked} encodings");
    eprintln!(
        "{checked} encodings of {} texts equal llama.cpp's ({byte_tokens} byte tokens, \
         {user_defined} user-defined); {round_trips} texts round-trip",
        texts.len()
    );
    not_round
}

#[test]
fn gemma_stops_on_end_of_turn_and_eos_and_refuses_chat() {
    let dir = tempfile::tempdir().unwrap();
    let model = LoadedModel::load(&write_tiny_gemma(dir.path())).unwrap();
    let tok = &model.tokenizer;
    let stops = model.stop_tokens();
    for t in ["<end_of_turn>", "<eos>"] {
        let id = tok.token_id(t).unwrap();
        assert!(stops.contains(&id), "{t} ({id}) does not stop: {stops:?}");
        assert!(tok.is_control(id), "{t} is not a control token");
    }
    assert!(!stops.contains(&tok.bos().unwrap()));
    // BOS as the GGUF asks (add_bos_token = true, no space prefix).
    assert!(tok.adds_bos() && !tok.adds_eos());
    assert_eq!(
        tok.encode("Hi", true, false).unwrap()[0],
        tok.bos().unwrap()
    );
    // A base model: no template, so chat is refused with the clear error.
    let err = model
        .chat_template()
        .err()
        .expect("a base model has no template")
        .to_string();
    assert!(err.contains("no chat template"), "{err}");
    // Control tokens are hidden from generated text, kept on request.
    let ids = tok
        .encode("<start_of_turn>model\nHi<end_of_turn>", false, true)
        .unwrap();
    assert_eq!(ids[0], tok.token_id("<start_of_turn>").unwrap());
    assert_eq!(tok.decode(&ids, false), "model\nHi");
    assert_eq!(
        tok.decode(&ids, true),
        "<start_of_turn>model\nHi<end_of_turn>"
    );
}

#[test]
fn real_gemma_file_gives_the_same_tokenizer_without_runnable_weights() {
    // Straight from the pulled file: only metadata is read.
    let real = GgufFile::open(&real_gemma()).unwrap();
    assert_eq!(real.str("tokenizer.ggml.model").unwrap(), "llama");
    assert!(
        real.str("tokenizer.chat_template").is_err(),
        "Gemma 3 270M base is expected to have no chat template"
    );
    let ours = Tokenizer::from_gguf(&real).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tiny =
        Tokenizer::from_gguf(&GgufFile::open(&write_tiny_gemma(dir.path())).unwrap()).unwrap();
    for text in texts() {
        assert_eq!(
            ours.encode(&text, true, true).unwrap(),
            tiny.encode(&text, true, true).unwrap(),
            "{text:?}"
        );
    }
    assert_eq!(ours.bos(), Some(2));
    assert_eq!(ours.eos(), Some(1));
}

#[test]
fn an_unknown_tokenizer_model_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bert-vocab.gguf");
    let vocab = TinyVocab {
        tokens: vec!["[CLS]".into(), "[SEP]".into(), "a".into()],
        types: vec![3, 3, 1],
        merges: Vec::new(),
        pre: "default",
        bos: 0,
        eos: 1,
        add_bos: false,
        meta: vec![("tokenizer.ggml.model".into(), Value::String("bert".into()))],
    };
    write_tiny_model_with(&path, &TinySpec::default(), Some(&vocab));
    let err = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .err()
        .expect("bert is not built")
        .to_string();
    assert!(err.contains("`bert`") && err.contains("llama"), "{err}");
}
