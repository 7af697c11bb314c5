//! Adaptive length on `POST /v1/chat/completions`: `reasoning_effort`
//! (`low`, `medium`, `high`, `auto`; a first-class openai SDK parameter) and
//! Tern's `thinking_budget_tokens` (sent with `extra_body`) become the
//! engine's thinking budget and answer probes; the `tern` object then reports
//! the probes and the tokens spent and saved (see `events::Tally`), for each
//! of the request's `n` choices: every choice reasons, and is probed, alone.

use tern_runtime::model::LoadedModel;
use tern_solve::reasoning::{
    closing_think_spec, think_spec, Effort, LengthPolicy, ANSWER_TOKENS, DEFAULT_PROBE_EVERY,
    MAX_THINKING_BUDGET,
};

use crate::events::Tally;
use crate::openai::error::ApiError;
use crate::params::Plan;

/// The request's reasoning fields, as sent.
pub struct ReasoningFields {
    /// `reasoning_effort`.
    pub effort: Option<String>,
    /// `thinking_budget_tokens`.
    pub budget: Option<i64>,
    /// Whether the client set `max_tokens` itself (otherwise the budget sets it).
    pub max_tokens_given: bool,
}

/// Validates the fields and, when either is set, gives `plan` a thinking
/// budget and `tally` the adaptive-length report, and returns the policy
/// fitted to the plan's `max_tokens` (best-of-N gives it to every candidate).
/// Does nothing otherwise.
pub fn apply(
    fields: ReasoningFields,
    model: &LoadedModel,
    plan: &mut Plan,
    tally: Tally,
) -> Result<(Tally, Option<LengthPolicy>), ApiError> {
    let effort: Option<Effort> = fields
        .effort
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: String| ApiError::invalid_param("reasoning_effort", e))?;
    let budget = match fields.budget {
        None => None,
        Some(b) if (1..=MAX_THINKING_BUDGET as i64).contains(&b) => Some(b as usize),
        Some(b) => {
            return Err(ApiError::invalid_param(
                "thinking_budget_tokens",
                format!(
                    "thinking_budget_tokens must be between 1 and {MAX_THINKING_BUDGET}, got {b}"
                ),
            ))
        }
    };
    let policy = LengthPolicy::new(effort, budget, DEFAULT_PROBE_EVERY)
        .map_err(|e| ApiError::from_runtime(e, "messages"))?;
    let Some(policy) = policy else {
        return Ok((tally, None));
    };
    if model.template.as_ref().is_some_and(|t| t.marks_reasoning()) {
        return Ok((close_think_block(model, plan, policy, tally, effort)?, None));
    }
    let mut think = think_spec(model, &policy).map_err(|e| ApiError::internal(e.to_string()))?;
    let ctx = model.config().context_length;
    let room = ctx.saturating_sub(plan.submit.prompt.len() + think.answer_suffix.len());
    // The client's max_tokens bounds reasoning and answer together (the cap
    // shrinks to leave the answer room); without one, the cap sets it.
    let limit = if fields.max_tokens_given {
        plan.submit.max_tokens.min(room)
    } else {
        (policy.cap + ANSWER_TOKENS).min(room)
    };
    let (policy, max_tokens) = policy.fit(limit);
    think.budget = policy.cap;
    plan.submit.max_tokens = max_tokens;
    plan.submit.think = Some(think);
    Ok((tally.with_reasoning(effort, policy.cap), Some(policy)))
}

/// The budget on a model whose template marks reasoning: it counts the
/// `<think>` block, which is closed for the model at the cap unless the model
/// closed it first; the answer after it is bounded only by `max_tokens`
/// (which leaves it at least [`ANSWER_TOKENS`] beside the cap). Best-of-N
/// gets no probe policy from it.
fn close_think_block(
    model: &LoadedModel,
    plan: &mut Plan,
    policy: LengthPolicy,
    tally: Tally,
    effort: Option<Effort>,
) -> Result<Tally, ApiError> {
    let ctx = model.config().context_length;
    let mut think =
        closing_think_spec(model, policy.cap, 0).map_err(|e| ApiError::internal(e.to_string()))?;
    let room = ctx.saturating_sub(plan.submit.prompt.len() + think.answer_suffix.len());
    let limit = plan.submit.max_tokens.min(room).max(1);
    let (fitted, _) = policy.fit(limit);
    think.budget = fitted.cap;
    think.answer_tokens = limit;
    plan.submit.max_tokens = limit;
    plan.submit.think = Some(think);
    Ok(tally.with_reasoning(effort, fitted.cap))
}
