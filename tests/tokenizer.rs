//! Tokenizer on the real model: llama.cpp's ids for every reference text,
//! round-trips, and streaming detokenization that never splits a character.

use tern_models::GgufFile;
use tern_runtime::tokenizer::{StreamDecoder, Tokenizer};

use crate::support::{real_model, reference};

fn real_tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(&real_model()).unwrap()).unwrap()
}

#[test]
fn matches_llama_cpp_on_every_reference_text() {
    let tok = real_tokenizer();
    let text = std::fs::read_to_string(reference("tokens.jsonl")).unwrap();
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let input = v["text"].as_str().unwrap();
        let want: Vec<u32> = v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(input, true, true).unwrap();
        assert_eq!(got, want, "text {input:?}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} reference lines");
}

const SAMPLES: &[&str] = &[
    "plain ascii, with punctuation!",
    "naïve café — déjà vu: ½ ≠ ∞",
    "日本語のテキストと中文字符",
    "emoji 🦀🚀 and families 👨‍👩‍👧 and flags 🇫🇷",
    "  leading and trailing   \n\ttabs\r\n",
    "digits 1234567890 and 3.14159",
];

#[test]
fn round_trips_multibyte_text() {
    let tok = real_tokenizer();
    for s in SAMPLES {
        let ids = tok.encode(s, false, false).unwrap();
        assert_eq!(tok.decode(&ids, false), *s);
    }
}

#[test]
fn streaming_never_emits_a_split_character() {
    let tok = real_tokenizer();
    for s in SAMPLES {
        let ids = tok.encode(s, false, false).unwrap();
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        let mut held_back = false;
        for &id in &ids {
            let piece = dec.push(&tok, id);
            assert!(
                !piece.contains('\u{FFFD}'),
                "replacement char in {piece:?} for {s:?}"
            );
            if piece.is_empty() && !tok.bytes_of(id, false).is_empty() {
                held_back = true;
            }
            out.push_str(&piece);
        }
        out.push_str(&dec.finish());
        assert_eq!(out, *s);
        if s.contains('🦀') {
            assert!(
                held_back,
                "an emoji spanning tokens should be held back once"
            );
        }
    }
}

#[test]
fn special_tokens_parse_only_when_asked() {
    let tok = real_tokenizer();
    let text = "<|im_start|>user\nhi<|im_end|>";
    let parsed = tok.encode(text, false, true).unwrap();
    assert_eq!(parsed[0], 1);
    assert_eq!(*parsed.last().unwrap(), 2);
    let plain = tok.encode(text, false, false).unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2));
    assert!(plain.len() > parsed.len());
    // Control tokens are hidden from generated text but kept on request.
    assert_eq!(tok.decode(&parsed, false), "user\nhi");
    assert_eq!(tok.decode(&parsed, true), text);
}
