//! `POST /v1/embeddings` wire types: OpenAI's request fields and its
//! `{"object": "list", "data": [...], "model", "usage"}` answer.
//!
//! Wire types only: `input` stays a JSON value because it takes four shapes
//! (a string, strings, token ids, lists of token ids) that `embedding.rs`
//! tells apart with errors naming the field.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of an embeddings request; unknown ones (`user`) are ignored.
#[derive(Debug, Default, Deserialize)]
pub struct EmbeddingFields {
    /// Which model; must be the one this server serves.
    pub model: Option<String>,
    /// What to embed: a string, a list of strings, a list of token ids, or a
    /// list of token-id lists.
    #[serde(default)]
    pub input: Value,
    /// `float` (default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Keep only the first `dimensions` values (renormalised to unit length).
    pub dimensions: Option<i64>,
}

/// The answer: one embedding per input, in input order.
#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingList {
    /// Always `list`.
    pub object: &'static str,
    /// The embeddings.
    pub data: Vec<EmbeddingData>,
    /// The served model id.
    pub model: String,
    /// Tokens read.
    pub usage: EmbeddingUsage,
}

/// One input's embedding.
#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingData {
    /// Always `embedding`.
    pub object: &'static str,
    /// Position of the input in the request.
    pub index: usize,
    /// The vector, as floats or base64 text.
    pub embedding: EmbeddingVector,
}

/// A vector as the request's `encoding_format` asked for it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// A JSON array of numbers (`float`).
    Float(Vec<f32>),
    /// Base64 of the little-endian f32 bytes (`base64`).
    Base64(String),
}

/// OpenAI's embeddings `usage`: no completion tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EmbeddingUsage {
    /// Tokens over all inputs.
    pub prompt_tokens: usize,
    /// The same number (nothing is generated).
    pub total_tokens: usize,
}
