//! `/v1/completions` wire types (OpenAI's legacy text completions): the
//! request's own fields, the `text_completion` response and stream chunks, and
//! the legacy logprobs shape.

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use super::usage::{TernInfo, Usage};
use super::ResponseMeta;

/// The fields only completion requests have; the shared ones are in
/// [`super::request::GenerationFields`].
#[derive(Debug, Default, Deserialize)]
pub struct CompletionFields {
    /// A string, a list of one string, or a list of token ids; checked in `prompt.rs`.
    #[serde(default)]
    pub prompt: serde_json::Value,
    /// Alternatives per token, `0..=5`; present means log-probabilities are returned.
    pub logprobs: Option<i64>,
    /// Echo the prompt before the completion; not supported.
    pub echo: Option<bool>,
    /// Text after the insertion point; not supported.
    pub suffix: Option<String>,
    /// Server-side best-of; not supported yet.
    pub best_of: Option<i64>,
}

/// A non-streamed completion answer, and (with `usage` null) a stream chunk.
#[derive(Debug, Serialize)]
pub struct TextCompletion {
    /// id, object (`text_completion`), created, model, fingerprint.
    #[serde(flatten)]
    pub meta: ResponseMeta,
    /// One per completion (stream chunks: the ones this chunk updates).
    pub choices: Vec<CompletionChoice>,
    /// Token counts; in a stream absent without `include_usage`, else `null`
    /// but in the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// What the KV cache did (stream: on the last chunk only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<TernInfo>,
}

/// One completion's text (or, in a stream, its new text).
#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    /// Which of the `n` completions.
    pub index: usize,
    /// The generated text.
    pub text: String,
    /// Legacy log-probabilities, when asked for.
    pub logprobs: Option<LegacyLogprobs>,
    /// `stop` or `length` when the completion ended, else null.
    pub finish_reason: Option<&'static str>,
}

/// The legacy logprobs object: parallel lists, one entry per token.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LegacyLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's natural-log probability.
    pub token_logprobs: Vec<f32>,
    /// Per token: the most likely tokens (and the chosen one) to their log-probabilities.
    pub top_logprobs: Vec<TopTokens>,
    /// Per token: its character offset in the completion text.
    pub text_offset: Vec<usize>,
}

/// `{token_text: logprob, ...}` in descending probability, order kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopTokens(pub Vec<(String, f32)>);

impl Serialize for TopTokens {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}
