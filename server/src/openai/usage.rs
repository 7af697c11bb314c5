//! What every response reports besides its text: OpenAI's `usage` and Tern's
//! `tern` extension object (KV policy and the bytes it kept, and what
//! adaptive length did when the request set a reasoning effort or budget).

use serde::Serialize;
use tern_solve::reasoning::{Effort, LengthReport};

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
    /// How the cache stored keys and values (`f16`, `q8_0`, ...).
    pub kv_dtype: String,
    /// Peak bytes of keys and values kept (the largest over the completions).
    pub kv_bytes: usize,
    /// Bytes a full cache would have held for the same tokens (largest over completions).
    pub kv_bytes_full: usize,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// What `context_overflow` did: the prompt tokens `shift` dropped
    /// (absent when nothing was), or what a KV policy evicted past the
    /// context (always present under one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_overflow: Option<crate::overflow::Overflowed>,
    /// With `n > 1`, each completion's own KV figures, by index (a trainer
    /// records them per rollout).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<ChoiceKv>,
    /// Adaptive length's probes and tokens spent and saved, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningInfo>,
    /// Speculative decoding's draft tokens proposed and accepted, summed
    /// over the completions (or why it was off), when the request speculated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<tern_runtime::engine::SpecStats>,
}

/// One completion's KV figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChoiceKv {
    /// Peak bytes of keys and values it kept.
    pub kv_bytes: usize,
    /// Bytes a full cache would have held for its tokens.
    pub kv_bytes_full: usize,
}

/// What `reasoning_effort` / `thinking_budget_tokens` did for the request.
/// With one completion its report is this object's own fields; with `n > 1`
/// each choice's report is in `choices` (by index), with the totals beside.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReasoningInfo {
    /// The effort asked for (`None` when only a budget was given).
    pub reasoning_effort: Option<Effort>,
    /// `n = 1`: the cap, the probes, whether they stopped the reasoning early,
    /// and the tokens spent and saved.
    #[serde(flatten)]
    pub length: Option<LengthReport>,
    /// `n > 1`: each choice's report, in choice order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<LengthReport>,
    /// `n > 1`: tokens spent over all choices, probes included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_spent: Option<usize>,
    /// `n > 1`: reasoning tokens the early stops saved, over all choices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_saved: Option<usize>,
}

impl ReasoningInfo {
    /// The report of a request whose completions reported `reports`.
    pub fn new(reasoning_effort: Option<Effort>, mut reports: Vec<LengthReport>) -> Self {
        if reports.len() == 1 {
            return Self {
                reasoning_effort,
                length: reports.pop(),
                choices: Vec::new(),
                tokens_spent: None,
                tokens_saved: None,
            };
        }
        Self {
            reasoning_effort,
            length: None,
            tokens_spent: Some(reports.iter().map(|r| r.tokens_spent).sum()),
            tokens_saved: Some(reports.iter().map(|r| r.tokens_saved).sum()),
            choices: reports,
        }
    }
}
