//! Best-of-N on `POST /v1/chat/completions` (Tern's `best_of` + `aggregate`
//! extension, sent with `extra_body` from the openai SDK): candidates share one
//! prefill, an aggregate (majority vote, synthesizer, unit-test reward) picks
//! or writes the answer, and the `tern` object lists what was done. With
//! `reasoning_effort` or `thinking_budget_tokens` every candidate reasons
//! under that budget and reports its probes (`candidates[i].reasoning`).

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::{EngineHandle, MAX_N};
use tern_solve::reasoning::{best_of_n_with, lacks_tests, Aggregate, BonRequest, ReasoningError};

use crate::openai::error::ApiError;
use crate::openai::ResponseMeta;
use crate::params::Plan;

/// Most `tests` one request may send: each runs once per candidate, in its
/// own sandbox.
pub const MAX_TESTS: usize = 32;
/// Longest one test may be, in bytes.
pub const MAX_TEST_BYTES: usize = 16 * 1024;

/// Validates the extension fields and builds the best-of-N request from the
/// already-validated generation plan. `allow_code` is the server's
/// `--allow-code-execution`: without it, client-written tests are a 403.
pub fn request(
    best_of: i64,
    aggregate: Option<String>,
    tests: Option<Vec<String>>,
    messages: Vec<ChatMessage>,
    plan: &Plan,
    allow_code: bool,
) -> Result<BonRequest, ApiError> {
    if !(1..=MAX_N as i64).contains(&best_of) {
        return Err(ApiError::invalid_param(
            "best_of",
            format!("best_of must be between 1 and {MAX_N}, got {best_of}"),
        ));
    }
    if plan.stream {
        return Err(ApiError::unsupported("stream", "streaming with best_of"));
    }
    if plan.submit.n != 1 {
        return Err(ApiError::invalid_param(
            "n",
            "n must be 1 with best_of (best_of returns one aggregated choice)",
        ));
    }
    let aggregate: Aggregate = match aggregate.as_deref() {
        None => Aggregate::Majority,
        Some(a) => a
            .parse()
            .map_err(|e: String| ApiError::invalid_param("aggregate", e))?,
    };
    let tests = tests.unwrap_or_default();
    if aggregate == Aggregate::Reward && !allow_code {
        return Err(ApiError::code_execution_disabled("tests"));
    }
    if lacks_tests(aggregate, &tests) {
        return Err(ApiError::invalid_param(
            "tests",
            "aggregate `reward` needs `tests`: a list of Python assertions",
        ));
    }
    if tests.len() > MAX_TESTS {
        return Err(ApiError::invalid_param(
            "tests",
            format!("at most {MAX_TESTS} tests per request, got {}", tests.len()),
        ));
    }
    if let Some(i) = tests.iter().position(|t| t.len() > MAX_TEST_BYTES) {
        return Err(ApiError::invalid_param(
            format!("tests[{i}]"),
            format!(
                "a test may be at most {MAX_TEST_BYTES} bytes, got {}",
                tests[i].len()
            ),
        ));
    }
    Ok(BonRequest {
        messages,
        n: best_of as usize,
        sampling: plan.submit.sampling.clone(),
        max_tokens: plan.submit.max_tokens,
        aggregate,
        adaptive: false,
        wave: 1,
        confidence: tern_solve::reasoning::DEFAULT_CONFIDENCE,
        kv_policy: plan.submit.kv_policy.clone(),
        tests,
        prelude: String::new(),
        length: None,
        cancel: Default::default(),
    })
}

/// Runs best-of-N off the async runtime and answers with one choice;
/// `synthesizer` writes the synthesis for `aggregate: synthesize`.
pub async fn respond(
    engine: EngineHandle,
    (synthesizer_model, synthesizer): (String, EngineHandle),
    req: BonRequest,
    meta: ResponseMeta,
    prompt_tokens: usize,
) -> Result<Response, ApiError> {
    let policy = req.kv_policy.to_string();
    // Dropped with this future when the client disconnects: the judge then
    // kills its running tests and starts no more.
    let _cancel_on_disconnect = req.cancel.on_drop();
    let res = tokio::task::spawn_blocking(move || best_of_n_with(&engine, &synthesizer, &req))
        .await
        .map_err(|e| ApiError::internal(format!("best_of failed: {e}")))?
        .map_err(|e| match e {
            ReasoningError::Submit(s) => ApiError::from_submit(s, "messages"),
            other => ApiError::internal(other.to_string()),
        })?;
    let candidates: Vec<_> = res
        .candidates
        .iter()
        .map(
            |c| json!({"text": c.text, "answer": c.answer, "tokens": c.tokens, "passed": c.passed, "reasoning": c.length}),
        )
        .collect();
    // Reasoning tokens that adaptive length's early stops did not spend.
    let tokens_saved: usize = res
        .candidates
        .iter()
        .filter_map(|c| c.length.as_ref())
        .map(|l| l.tokens_saved)
        .sum();
    let body = json!({
        "id": meta.id,
        "object": meta.object,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.system_fingerprint,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": res.text},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        // Every generated token is billed: candidates and synthesis.
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": res.tokens,
            "total_tokens": prompt_tokens + res.tokens,
        },
        "tern": {
            "kv_policy": policy,
            "best_of": res.candidates.len(),
            "aggregate": res.aggregate,
            "answer": res.answer,
            "chosen": res.chosen,
            "candidates": candidates,
            "tokens_spent": res.tokens,
            "tokens_saved": tokens_saved,
            "candidates_saved": res.candidates_saved,
            "tests_run": res.tests_run,
            // The synthesis stated no answer and was made to write one.
            "forced_answer": res.forced_answer,
            "synthesizer_model": (res.aggregate == Aggregate::Synthesize).then_some(synthesizer_model),
        },
    });
    Ok(Json(body).into_response())
}
