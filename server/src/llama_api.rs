//! llama-server's wire types for `POST /tokenize` and `POST /detokenize`, the
//! shapes its clients (and tools built on it) already send and read.
//!
//! Wire types only; the handlers in `routes/tokenize.rs` validate them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /tokenize`'s fields; unknown ones are ignored.
#[derive(Debug, Default, Deserialize)]
pub struct TokenizeFields {
    /// The text to tokenize.
    pub content: Option<String>,
    /// Add BOS (and EOS) where the model asks for them (default false).
    pub add_special: Option<bool>,
    /// Read control-token text such as `<|im_start|>` as that token (default
    /// true, as llama-server does).
    pub parse_special: Option<bool>,
    /// Answer each token with its text (default false).
    pub with_pieces: Option<bool>,
    /// Whose tokenizer, on a server of several models (llama-server's
    /// router takes `model` the same way); ignored with one model.
    pub model: Option<String>,
}

/// `{"tokens": [...]}`: ids, or ids with their pieces.
#[derive(Clone, Debug, Serialize)]
pub struct Tokenized {
    /// The tokens in order.
    pub tokens: Vec<TokenEntry>,
}

/// One token of a `/tokenize` answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TokenEntry {
    /// The bare id (`with_pieces` false).
    Id(u32),
    /// The id and its text (`with_pieces` true).
    WithPiece {
        /// The token id.
        id: u32,
        /// Its text; a list of byte values when it is not valid UTF-8 on
        /// its own (part of a multi-byte character), as llama-server does.
        piece: Value,
    },
}

/// `POST /detokenize`'s fields.
#[derive(Debug, Default, Deserialize)]
pub struct DetokenizeFields {
    /// Token ids; checked by the handler so a bad one names the field.
    #[serde(default)]
    pub tokens: Value,
    /// Whose tokenizer, on a server of several models; ignored with one.
    pub model: Option<String>,
}

/// `{"content": "..."}`.
#[derive(Clone, Debug, Serialize)]
pub struct Detokenized {
    /// The tokens' text, control tokens written out.
    pub content: String,
}
