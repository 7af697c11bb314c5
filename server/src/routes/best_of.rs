//! Best-of-N on `POST /v1/chat/completions` (Tern's `best_of` + `aggregate`
//! extension, sent with `extra_body` from the openai SDK): candidates share one
//! prefill, an aggregate (majority vote, synthesizer, unit-test reward) picks
//! or writes the answer, and the `tern` object lists what was done. With
//! `reasoning_effort` or `thinking_budget_tokens` every candidate reasons
//! under that budget and reports its probes (`candidates[i].reasoning`).
//! `aggregate: "reward"` without `tests` has the served model write
//! `generate_tests` unit tests (default [`DEFAULT_GENERATED_TESTS`]) and
//! chooses by their pass matrix, through the same solve-layer function as
//! `tern bon --generate-tests` ([`best_of_n_generated_tests`]); the `tern`
//! object then carries the tests and the matrix (`generated_tests`).

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::{EngineHandle, MAX_N};
use tern_solve::reasoning::{
    best_of_n_generated_tests, best_of_n_with, Aggregate, BonRequest, ReasoningError, TestGenError,
    TestSpec, MAX_GENERATED_TESTS,
};

use crate::openai::error::ApiError;
use crate::openai::ResponseMeta;
use crate::params::Plan;

/// Most `tests` one request may send: each runs once per candidate, in its
/// own sandbox.
pub const MAX_TESTS: usize = 32;
/// Longest one test may be, in bytes.
pub const MAX_TEST_BYTES: usize = 16 * 1024;
/// Tests the model writes for `aggregate: "reward"` without `tests` when the
/// request names no `generate_tests` (at most [`MAX_GENERATED_TESTS`], the
/// CLI's cap).
pub const DEFAULT_GENERATED_TESTS: usize = 8;

/// The extension fields of a best-of-N request, as sent.
#[derive(Debug, Default)]
pub struct Extension {
    /// `best_of`: candidates.
    pub best_of: i64,
    /// `aggregate`: `majority` (default), `synthesize` or `reward`.
    pub aggregate: Option<String>,
    /// `tests`: client-written Python tests for `reward`.
    pub tests: Option<Vec<String>>,
    /// `generate_tests`: for `reward` without `tests`, how many tests the
    /// served model writes.
    pub generate_tests: Option<i64>,
}

/// Validates the extension fields and builds the best-of-N request from the
/// already-validated generation plan, with the test writer's spec when the
/// model is to write the tests (`aggregate: reward`, no `tests`).
/// `allow_code` is the server's `--allow-code-execution`: without it, any
/// `reward` (client-written or generated tests) is a 403.
pub fn request(
    ext: Extension,
    messages: Vec<ChatMessage>,
    plan: &Plan,
    allow_code: bool,
) -> Result<(BonRequest, Option<TestSpec>), ApiError> {
    let Extension {
        best_of,
        aggregate,
        tests,
        generate_tests,
    } = ext;
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
    if generate_tests.is_some() && aggregate != Aggregate::Reward {
        return Err(ApiError::invalid_param(
            "generate_tests",
            "generate_tests writes unit tests for `aggregate: \"reward\"`",
        ));
    }
    if aggregate == Aggregate::Reward && !allow_code {
        let param = if tests.is_empty() {
            "aggregate"
        } else {
            "tests"
        };
        return Err(ApiError::code_execution_disabled(param));
    }
    if generate_tests.is_some() && !tests.is_empty() {
        return Err(ApiError::invalid_param(
            "generate_tests",
            "send `tests` or `generate_tests`, not both (generate_tests has the model write them)",
        ));
    }
    // `reward` without tests: the served model writes them.
    let generate = if aggregate == Aggregate::Reward && tests.is_empty() {
        let k = generate_tests.unwrap_or(DEFAULT_GENERATED_TESTS as i64);
        if !(1..=MAX_GENERATED_TESTS as i64).contains(&k) {
            return Err(ApiError::invalid_param(
                "generate_tests",
                format!("generate_tests must be between 1 and {MAX_GENERATED_TESTS}, got {k}"),
            ));
        }
        // Sampled as the candidates are (their temperature, nucleus and
        // cap), from the test writer's own seeds.
        Some(TestSpec {
            k: k as usize,
            max_tokens: plan.submit.max_tokens,
            temperature: plan.submit.sampling.temperature,
            top_p: plan.submit.sampling.top_p,
        })
    } else {
        None
    };
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
    let req = BonRequest {
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
    };
    Ok((req, generate))
}

/// Runs best-of-N off the async runtime and answers with one choice;
/// `synthesizer` writes the synthesis for `aggregate: synthesize`; with
/// `generate`, the served model writes the tests that choose.
pub async fn respond(
    engine: EngineHandle,
    (synthesizer_model, synthesizer): (String, EngineHandle),
    (req, generate): (BonRequest, Option<TestSpec>),
    meta: ResponseMeta,
    prompt_tokens: usize,
) -> Result<Response, ApiError> {
    let policy = req.kv_policy.to_string();
    // Dropped with this future when the client disconnects: the judge then
    // kills its running tests and starts no more.
    let _cancel_on_disconnect = req.cancel.on_drop();
    let res = tokio::task::spawn_blocking(move || match &generate {
        Some(spec) => best_of_n_generated_tests(&engine, &engine, &req, spec),
        None => best_of_n_with(&engine, &synthesizer, &req),
    })
    .await
    .map_err(|e| ApiError::internal(format!("best_of failed: {e}")))?
    .map_err(|e| match e {
        ReasoningError::Submit(s) => ApiError::from_submit(s, "messages"),
        // The test writer's prompt (the problem inside its request for
        // tests) is refused as the candidates' would be.
        ReasoningError::Tests(TestGenError::Submit(s)) => ApiError::from_submit(s, "messages"),
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
    // Every generated token is billed: candidates and synthesis.
    let body = one_choice(
        meta,
        &res.text,
        prompt_tokens,
        res.tokens,
        json!({
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
                // Tests the model wrote (`aggregate: reward` without `tests`):
                // `tests`, `replies`, the pass `matrix` (a row per candidate, a
                // letter per test: P, F, T timeout, E error), `tokens`,
                // `generate_seconds`, `judge_seconds`; as `tern bon --json`.
                "generated_tests": res.generated_tests,
                // The synthesis stated no answer and was made to write one.
                "forced_answer": res.forced_answer,
                "synthesizer_model": (res.aggregate == Aggregate::Synthesize).then_some(synthesizer_model),
        }),
    );
    Ok(Json(body).into_response())
}

/// A `chat.completion` body with one assistant choice, `content`, its usage
/// and Tern's `tern` object: what best-of-N and the spreadsheet setting
/// answer with.
pub(crate) fn one_choice(
    meta: ResponseMeta,
    content: &str,
    prompt_tokens: usize,
    completion_tokens: usize,
    tern: serde_json::Value,
) -> serde_json::Value {
    json!({
        "id": meta.id,
        "object": meta.object,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.system_fingerprint,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "tern": tern,
    })
}
