//! What every response reports besides its text: OpenAI's `usage` and Tern's
//! `tern` extension object (KV policy and the bytes it kept, and what
//! adaptive length did when the request set a reasoning effort or budget).

use serde::Serialize;
use tern_runtime::reasoning::{Effort, LengthReport};

/// OpenAI's `usage`: token counts for the whole request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens in the prompt (once, however many completions share it).
    pub prompt_tokens: usize,
    /// Tokens generated over all completions.
    pub completion_tokens: usize,
    /// The sum of the two.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage for a prompt and the generated token count.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// The `tern` object: what the KV cache did for this request, so clients can
/// see the memory a policy saved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TernInfo {
    /// The policy's canonical spec string, e.g. `snapkv:budget=256,...`.
    pub kv_policy: String,
    /// Peak bytes of keys and values kept (the largest over the completions).
    pub kv_bytes: usize,
    /// Bytes a full cache would have held for the same tokens (largest over completions).
    pub kv_bytes_full: usize,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Adaptive length's probes and tokens spent and saved, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningInfo>,
}

/// What `reasoning_effort` / `thinking_budget_tokens` did for the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReasoningInfo {
    /// The effort asked for (`None` when only a budget was given).
    pub reasoning_effort: Option<Effort>,
    /// The cap, the probes, whether they stopped the reasoning early, and
    /// the tokens spent and saved.
    #[serde(flatten)]
    pub length: LengthReport,
}
