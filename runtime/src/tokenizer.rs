//! The tokenizer, built from a GGUF file's vocabulary (and merges).
//!
//! Two tokenizer models, as `tokenizer.ggml.model` names them:
//! - `gpt2`: byte-level BPE through the `tokenizers` crate, with the
//!   pre-tokenizer the GGUF declares (`tokenizer.ggml.pre`). For `smollm` that
//!   is llama.cpp's rule: every digit split off on its own, then the GPT-2
//!   byte-level pattern, no prefix space. Control tokens (`<|im_start|>` ...)
//!   are added as special tokens so they can be parsed out of rendered chat
//!   prompts.
//! - `llama`: SentencePiece-style merging by token score with `<0xXX>` byte
//!   fallback (Gemma, Llama 2), Tern's own code in [`spm`], written to give
//!   llama.cpp's ids.
//!
//! Decoding uses a per-token byte table built once at load, so streaming can
//! emit text as soon as it forms complete UTF-8 characters ([`StreamDecoder`]).

mod spm;

use std::collections::HashMap;

use tern_models::GgufFile;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Result, RuntimeError};

/// GGUF token type of control tokens (llama.cpp's LLAMA_TOKEN_TYPE_CONTROL).
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens, also matched whole in text.
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Tokenizer models (`tokenizer.ggml.model`) Tern builds, as errors list them.
pub const SUPPORTED_MODELS: &str = "gpt2 (byte-level BPE), llama (SentencePiece)";

/// How text becomes ids: one per tokenizer model.
enum Encoder {
    /// Byte-level BPE.
    Bpe {
        inner: Box<tokenizers::Tokenizer>,
        /// The same tokenizer with special-token parsing off (control text
        /// stays text).
        plain: Box<tokenizers::Tokenizer>,
    },
    /// SentencePiece-style merging by score, after cutting out special tokens.
    Spm {
        spm: spm::Spm,
        specials: spm::Specials,
        /// A space before text that starts the prompt or follows a special
        /// token (`tokenizer.ggml.add_space_prefix`).
        add_space_prefix: bool,
    },
}

/// Text <-> token ids for one model.
pub struct Tokenizer {
    encoder: Encoder,
    /// Bytes each token stands for (literal text for control tokens).
    token_bytes: Vec<Vec<u8>>,
    /// Whether each token is a control token (hidden from generated text).
    is_control: Vec<bool>,
    /// Whether each token is matched whole in text when control-token text
    /// is parsed (control and user-defined tokens, such as `<|im_end|>`
    /// and Qwen's `<tool_call>`).
    is_special: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    /// Whether EOS ends every encoded text (`tokenizer.ggml.add_eos_token`).
    add_eos: bool,
    by_text: HashMap<String, u32>,
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` keys.
    /// Only the metadata is read: a file whose weights Tern cannot run still
    /// has a usable tokenizer.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let err = |m: String| RuntimeError::Tokenizer(m);
        let model = file
            .str("tokenizer.ggml.model")
            .map_err(|e| err(e.to_string()))?;
        match model {
            "gpt2" => Self::bpe_from_gguf(file),
            "llama" => Self::spm_from_gguf(file),
            other => Err(err(format!(
                "tokenizer model `{other}` is not supported (supported: {SUPPORTED_MODELS})"
            ))),
        }
    }

    /// A `llama` (SentencePiece) vocabulary: tokens, scores and types, with
    /// llama.cpp's defaults where the GGUF is silent (BOS 1, EOS 2, BOS added,
    /// a space prefix).
    fn spm_from_gguf(file: &GgufFile) -> Result<Self> {
        let err = |m: String| RuntimeError::Tokenizer(m);
        let tokens = file
            .str_array("tokenizer.ggml.tokens")
            .map_err(|e| err(e.to_string()))?;
        // llama.cpp renames an empty token so that every text is unique.
        let tokens: Vec<String> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    t.to_string()
                }
            })
            .collect();
        let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let types = file
            .i32_array("tokenizer.ggml.token_type")
            .unwrap_or_else(|_| vec![1; tokens.len()]);
        let scores = match file.get("tokenizer.ggml.scores") {
            Some(v) => scores_of(v, tokens.len())?,
            None => vec![0.0; tokens.len()],
        };
        let mut by_text = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if by_text.insert(t.clone(), i as u32).is_some() {
                return Err(err(format!(
                    "token text {t:?} appears twice in the vocabulary"
                )));
            }
        }
        let attrs = spm::attributes(
            &token_refs,
            &types,
            &by_text,
            |k| file.get(k).is_some(),
            file.str("general.name").unwrap_or(""),
        );
        let specials = spm::Specials::new(&token_refs, &attrs)?;
        let token_bytes = tokens
            .iter()
            .zip(&attrs)
            .map(|(t, &a)| spm::piece(t, a))
            .collect();
        let hidden = spm::attr::CONTROL | spm::attr::UNKNOWN;
        let n = tokens.len();
        // A declared id out of range keeps the default, as in llama.cpp.
        let id = |key: &str, default: u32| {
            let default = Some(default).filter(|&d| (d as usize) < n);
            match file.u32(key) {
                Ok(i) if (i as usize) < n => Some(i),
                _ => default,
            }
        };
        let bos = id("tokenizer.ggml.bos_token_id", 1);
        let eos = id("tokenizer.ggml.eos_token_id", 2);
        let add_bos = file
            .bool_opt("tokenizer.ggml.add_bos_token")
            .unwrap_or(true);
        let add_eos = file
            .bool_opt("tokenizer.ggml.add_eos_token")
            .unwrap_or(false);
        if (add_bos && bos.is_none()) || (add_eos && eos.is_none()) {
            return Err(err(
                "the GGUF asks for BOS/EOS to be added but declares no such token".into(),
            ));
        }
        Ok(Self {
            encoder: Encoder::Spm {
                spm: spm::Spm::new(scores, &by_text),
                specials,
                add_space_prefix: file
                    .bool_opt("tokenizer.ggml.add_space_prefix")
                    .unwrap_or(true),
            },
            token_bytes,
            is_control: attrs.iter().map(|&a| a & hidden != 0).collect(),
            is_special: attrs
                .iter()
                .map(|&a| a & (hidden | spm::attr::USER_DEFINED) != 0)
                .collect(),
            bos,
            eos,
            add_bos,
            add_eos,
            by_text,
        })
    }

    /// A `gpt2` (byte-level BPE) vocabulary and its merges.
    fn bpe_from_gguf(file: &GgufFile) -> Result<Self> {
        let err = |m: String| RuntimeError::Tokenizer(m);
        let tokens = file
            .str_array("tokenizer.ggml.tokens")
            .map_err(|e| err(e.to_string()))?;
        let types = file
            .i32_array("tokenizer.ggml.token_type")
            .unwrap_or_else(|_| vec![1; tokens.len()]);
        let merges: Vec<(String, String)> = match file.str_array("tokenizer.ggml.merges") {
            Ok(m) => m
                .iter()
                .map(|s| {
                    s.split_once(' ')
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .ok_or_else(|| err(format!("malformed merge `{s}`")))
                })
                .collect::<Result<_>>()?,
            Err(_) => Vec::new(),
        };
        let vocab: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let pre = file.str("tokenizer.ggml.pre").unwrap_or("default");
        let bpe = BPE::builder()
            // Llama 3 takes a word that is itself a token whole, before any merge.
            .ignore_merges(ignores_merges(pre))
            .vocab_and_merges(
                vocab
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect::<Vocab>(),
                merges,
            )
            .build()
            .map_err(|e| err(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(s, _)| AddedToken::from(s.to_string(), true))
            .collect();
        inner.add_special_tokens(&special);
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);

        let byte_of = unicode_to_byte();
        let token_bytes = tokens
            .iter()
            .zip(&types)
            .map(|(t, &ty)| {
                if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                    t.as_bytes().to_vec()
                } else {
                    t.chars()
                        .map(|c| byte_of.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| t.as_bytes().to_vec())
                }
            })
            .collect();
        let id = |k: &str| file.u32(k).ok().filter(|&i| (i as usize) < tokens.len());
        Ok(Self {
            encoder: Encoder::Bpe {
                inner: Box::new(inner),
                plain: Box::new(plain),
            },
            token_bytes,
            is_control: types.iter().map(|&t| t == TOKEN_TYPE_CONTROL).collect(),
            is_special: types
                .iter()
                .map(|&t| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
                .collect(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_bos: file
                .bool_opt("tokenizer.ggml.add_bos_token")
                .unwrap_or(false),
            add_eos: file
                .bool_opt("tokenizer.ggml.add_eos_token")
                .unwrap_or(false),
            by_text: vocab,
        })
    }

    /// Encodes `text`. With `parse_special`, control-token text such as
    /// `<|im_start|>` becomes that one token; without it, it is ordinary text.
    /// With `add_bos` (llama.cpp's `add_special`), BOS starts the ids and EOS
    /// ends them, each only when the model asks for it.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_bos && self.add_bos {
            ids.extend(self.bos);
        }
        match &self.encoder {
            Encoder::Bpe { inner, plain } => {
                if !text.is_empty() {
                    let tok = if parse_special { inner } else { plain };
                    let enc = tok
                        .encode_fast(text, false)
                        .map_err(|e| RuntimeError::Tokenizer(e.to_string()))?;
                    ids.extend_from_slice(enc.get_ids());
                }
            }
            Encoder::Spm {
                spm,
                specials,
                add_space_prefix,
            } => {
                // Text that starts the prompt or follows a special token gets
                // the space prefix.
                let mut after_special = true;
                for frag in specials.partition(text, parse_special) {
                    match frag {
                        spm::Fragment::Token(id) => {
                            ids.push(id);
                            after_special = true;
                        }
                        spm::Fragment::Text(start, end) => {
                            let mut piece = String::with_capacity(end - start + 4);
                            if *add_space_prefix && after_special {
                                piece.push('\u{2581}');
                            }
                            for c in text[start..end].chars() {
                                piece.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm.encode(&piece, &self.by_text, &mut ids)?;
                            after_special = false;
                        }
                    }
                }
            }
        }
        if add_bos && self.add_eos {
            ids.extend(self.eos);
        }
        Ok(ids)
    }

    /// Decodes ids to text, each token's bytes in turn as generation streams
    /// them; control tokens are dropped unless `keep_special`. Invalid UTF-8
    /// (a split character at the end) is replaced, not an error.
    pub fn decode(&self, ids: &[u32], keep_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.bytes_of(id, keep_special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The text `ids` stand for, as llama.cpp's `llama_detokenize` gives it:
    /// with `remove_special`, a leading BOS and trailing EOS the model adds
    /// are dropped; control tokens are shown only with `unparse_special`; and
    /// where encoding added a space prefix, the first token loses one leading
    /// space (unless a BOS was dropped before it), so encoding then
    /// detokenizing gives the text back.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut strip_space = matches!(
            self.encoder,
            Encoder::Spm {
                add_space_prefix: true,
                ..
            }
        );
        if remove_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.bos {
            strip_space = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && !ids.is_empty() && ids.last().copied() == self.eos {
            ids = &ids[..ids.len() - 1];
        }
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self.bytes_of(id, unparse_special);
            let piece = match piece.split_first() {
                Some((b' ', rest)) if strip_space => rest,
                _ => piece,
            };
            bytes.extend_from_slice(piece);
            strip_space = false;
        }
        bytes
    }

    /// The bytes token `id` stands for (empty for hidden control tokens or
    /// out-of-range ids).
    pub fn bytes_of(&self, id: u32, keep_special: bool) -> &[u8] {
        let i = id as usize;
        match self.token_bytes.get(i) {
            Some(_) if !keep_special && self.is_control[i] => &[],
            Some(b) => b,
            None => &[],
        }
    }

    /// Where `other`'s vocabulary first differs from this one (size, a
    /// token's text, or whether it is a control token), in words; `None`
    /// when every id stands for the same token in both. A draft model must
    /// share its target's vocabulary id for id, not only its size.
    pub fn vocabulary_difference(&self, other: &Tokenizer) -> Option<String> {
        if self.vocab_size() != other.vocab_size() {
            return Some(format!(
                "{} tokens against {}",
                self.vocab_size(),
                other.vocab_size()
            ));
        }
        let shown = |b: &[u8]| String::from_utf8_lossy(b).escape_debug().to_string();
        (0..self.token_bytes.len()).find_map(|i| {
            let (a, b) = (&self.token_bytes[i], &other.token_bytes[i]);
            if a != b {
                Some(format!(
                    "token {i} is `{}` against `{}`",
                    shown(a),
                    shown(b)
                ))
            } else if self.is_control[i] != other.is_control[i] {
                Some(format!(
                    "token {i} (`{}`) is a control token in only one",
                    shown(a)
                ))
            } else {
                None
            }
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The end-of-sequence token, if the model declares one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The beginning-of-sequence token, if the model declares one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether the model wants BOS prepended to prompts.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether the model wants EOS appended to encoded text.
    pub fn adds_eos(&self) -> bool {
        self.add_eos
    }

    /// The tokenizer model, as `tokenizer.ggml.model` names it.
    pub fn model_name(&self) -> &'static str {
        match self.encoder {
            Encoder::Bpe { .. } => "gpt2",
            Encoder::Spm { .. } => "llama",
        }
    }

    /// The id of a token given its exact vocabulary text (e.g. `<|im_end|>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// Whether `id` is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.is_control.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether `id` is a token that text is cut at when control-token text
    /// is parsed (a control or user-defined token).
    pub fn is_special(&self, id: u32) -> bool {
        self.is_special.get(id as usize).copied().unwrap_or(false)
    }
}

/// Llama 3's split: contractions, letters with one leading non-letter,
/// digits in runs of up to three, punctuation runs, newlines, spaces
/// (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with every digit on its own (`..._QWEN2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizer names Tern builds, as `tern info` and errors list them.
pub const SUPPORTED_PRE_TOKENIZERS: &str = "smollm, starcoder, refact, gpt2, llama-bpe, qwen2";

/// Whether the `tokenizer.ggml.pre` family looks a whole word up before
/// merging (llama.cpp sets `ignore_merges` for Llama 3).
fn ignores_merges(name: &str) -> bool {
    matches!(name, "llama-bpe" | "llama3")
}

/// The pre-tokenizer llama.cpp applies for a GGUF `tokenizer.ggml.pre` name.
fn pre_tokenizer(name: &str) -> Result<PreTokenizerWrapper> {
    let byte_level = ByteLevel::new(false, false, true);
    // A regex split, then byte-level mapping without its own GPT-2 regex.
    let split_then_bytes = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| RuntimeError::Tokenizer(format!("pre-tokenizer `{name}`: {e}")))?;
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])
        .into())
    };
    Ok(match name {
        // Digits one by one, then the GPT-2 pattern.
        "smollm" | "starcoder" | "refact" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
        "gpt2" | "gpt-2" | "default" => byte_level.into(),
        "llama-bpe" | "llama3" => split_then_bytes(LLAMA3_SPLIT)?,
        "qwen2" => split_then_bytes(QWEN2_SPLIT)?,
        other => {
            return Err(RuntimeError::Tokenizer(format!(
                "pre-tokenizer `{other}` is not supported (supported: {SUPPORTED_PRE_TOKENIZERS})"
            )))
        }
    })
}

/// The inverse of GPT-2's byte -> printable-unicode map used by byte-level BPE.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .filter_map(|(b, c)| Some((char::from_u32(c)?, b as u8)))
        .collect()
}

/// `tokenizer.ggml.scores` as f32s, one per token.
fn scores_of(v: &candle_core::quantized::gguf_file::Value, n: usize) -> Result<Vec<f32>> {
    use candle_core::quantized::gguf_file::Value;
    let err = |m: String| RuntimeError::Tokenizer(format!("tokenizer.ggml.scores: {m}"));
    let Value::Array(items) = v else {
        return Err(err("not an array".into()));
    };
    if items.len() != n {
        return Err(err(format!("{} scores for {n} tokens", items.len())));
    }
    items
        .iter()
        .map(|x| match x {
            Value::F32(f) => Ok(*f),
            Value::F64(f) => Ok(*f as f32),
            Value::I32(i) => Ok(*i as f32),
            other => Err(err(format!("a score of type {:?}", other.value_type()))),
        })
        .collect()
}

/// Incremental detokenizer for streaming: feed ids, get back only text made of
/// complete UTF-8 characters, never half of one.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text that became complete (maybe empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending
            .extend_from_slice(tokenizer.bytes_of(id, false));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An incomplete character at the end waits for more bytes; a byte
            // sequence that can never be valid is emitted lossily.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => {
                let text = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return text;
            }
        };
        let rest = self.pending.split_off(valid);
        String::from_utf8(std::mem::replace(&mut self.pending, rest)).unwrap_or_default()
    }

    /// Flushes whatever is left at the end of generation (lossily).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}
