//! `/v1/chat/completions` wire types: the request's chat-only fields, the
//! `chat.completion` response, its stream chunks and OpenAI's chat logprobs.

use serde::{Deserialize, Serialize};

use super::usage::{TernInfo, Usage};
use super::ResponseMeta;

/// The fields only chat requests have; the shared ones are in
/// [`super::request::GenerationFields`], read from the same body.
#[derive(Debug, Default, Deserialize)]
pub struct ChatFields {
    /// The conversation; required and non-empty.
    pub messages: Option<Vec<WireMessage>>,
    /// OpenAI's newer name for `max_tokens`; wins when both are set.
    pub max_completion_tokens: Option<i64>,
    /// Return the log-probability of each output token.
    pub logprobs: Option<bool>,
    /// Alternatives per token, `0..=20` (requires `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Tool definitions (`{"type": "function", "function": {...}}`).
    pub tools: Option<Vec<serde_json::Value>>,
    /// `none`, `auto` (default), `required` or `{"type": "function",
    /// "function": {"name": ...}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Whether one answer may hold several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Legacy function definitions; not supported.
    pub functions: Option<Vec<serde_json::Value>>,
    /// Tern extension: sample this many candidates (1-16) and return the
    /// aggregate's answer as the one choice.
    pub best_of: Option<i64>,
    /// Tern extension: how `best_of` candidates are aggregated: `majority`
    /// (default), `synthesize` or `reward` (`tests`, or tests the model
    /// writes).
    pub aggregate: Option<String>,
    /// Tern extension: Python unit tests for `aggregate: reward`.
    pub tests: Option<Vec<String>>,
    /// Tern extension: with `aggregate: reward` and no `tests`, how many
    /// unit tests the served model writes to judge the candidates by
    /// (1-64, default 8; the CodeRM setting, docs/REASONING.md).
    pub generate_tests: Option<i64>,
    /// How much to reason before answering: `low`, `medium`, `high` (fixed
    /// caps) or Tern's `auto` (stop once answer probes agree).
    pub reasoning_effort: Option<String>,
    /// Tern extension: the reasoning cap in tokens (replaces the effort's).
    pub thinking_budget_tokens: Option<i64>,
    /// llama-server's `none`, `deepseek` or `auto`: whether a reasoning
    /// model's `<think>` block comes back as `reasoning_content` (see
    /// `crate::think`); the server's `--reasoning-format` when absent.
    pub reasoning_format: Option<String>,
    /// `error`, `shift` or `shift:keep=N`: what a prompt too long for the
    /// context gets (see `crate::overflow`); the server's
    /// `--context-overflow` when absent.
    pub context_overflow: Option<String>,
    /// Tern extension: which loaded model writes the synthesis for
    /// `aggregate: synthesize` (the served model or `--synthesizer-model`).
    pub synthesizer_model: Option<String>,
    /// Tern extension: the spreadsheet setting (`workbooks`,
    /// `answer_position`, `instruction_type`, `rounds`; read by
    /// `routes::spreadsheet`): the model writes openpyxl programs run on the
    /// client's workbooks.
    pub spreadsheet: Option<serde_json::Value>,
}

/// One message as sent; `content` is checked in `prompt.rs` (string, list of
/// text parts, or null for an assistant turn).
#[derive(Debug, Deserialize)]
pub struct WireMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The text, or a list of `{"type": "text", "text": ...}` parts.
    #[serde(default)]
    pub content: serde_json::Value,
}

/// A non-streamed chat answer.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    /// id, object (`chat.completion`), created, model, fingerprint.
    #[serde(flatten)]
    pub meta: ResponseMeta,
    /// One per completion, in index order.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// What the KV cache did.
    pub tern: TernInfo,
}

/// One finished completion.
#[derive(Debug, Serialize)]
pub struct ChatChoice {
    /// Which of the `n` completions.
    pub index: usize,
    /// The assistant's message.
    pub message: AssistantMessage,
    /// Per-token log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: &'static str,
}

/// The generated message.
#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (`null` when the answer is only tool calls).
    pub content: Option<String>,
    /// A reasoning model's think block, split out of `content`
    /// (llama-server's and vLLM's field; absent when there was none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls the answer makes, when it makes some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::tools::ToolCallOut>>,
}

/// One `chat.completion.chunk` of a stream.
#[derive(Debug, Serialize)]
pub struct ChatChunk {
    /// id, object (`chat.completion.chunk`), created, model, fingerprint.
    #[serde(flatten)]
    pub meta: ResponseMeta,
    /// The choices this chunk updates (empty in the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// Absent without `include_usage`; `null` on every chunk but the usage one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// On the stream's last chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<TernInfo>,
}

/// One choice's update in a chunk.
#[derive(Debug, Serialize)]
pub struct ChunkChoice {
    /// Which completion.
    pub index: usize,
    /// What is new: the role first, then content.
    pub delta: Delta,
    /// Log-probabilities of this chunk's tokens, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on exactly one chunk per choice, its last.
    pub finish_reason: Option<&'static str>,
}

/// A message delta.
#[derive(Debug, Default, Serialize)]
pub struct Delta {
    /// `assistant`, in a choice's first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text (a reasoning model's think block, streamed apart
    /// from `content`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls, each whole in one delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::tools::ToolCallDelta>>,
}

/// OpenAI's chat logprobs: `{"content": [...]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    /// One entry per output token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One output token with its log-probability and alternatives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text (lossy where it is part of a character).
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f32,
    /// Its UTF-8 bytes, exact.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative at a position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}
