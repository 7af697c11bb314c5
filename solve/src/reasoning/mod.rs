//! Spending more compute on a hard question: best-of-N with a shared prompt,
//! aggregated by majority vote, by a CoT-based synthesizer, or by a verifier's
//! reward, with adaptive width (stop sampling once the leading answer is
//! settled). A client of [`EngineHandle`] like any other: candidates are one
//! request with `n` completions, so the prompt is prefilled once and its cache
//! forked `n` ways. Adaptive length ([`adaptive_length`]) caps and probes one
//! completion's reasoning through the engine's thinking budget. Code
//! candidates can also be judged by tests a model writes for them
//! ([`best_of_n_generated_tests`]).

mod length;
mod synthesize;
mod test_budget;
mod unit_tests;

use std::str::FromStr;

use crate::verify::{self, Limits};
use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineHandle, SubmitError, SubmitRequest};
use tern_runtime::error::RuntimeError;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;

pub use length::{
    adaptive_length, closing_think_spec, probe_answer, probes_agree, think_spec, Effort,
    LengthPolicy, LengthReport, LengthRequest, LengthResult, LengthTally, ProbeRecord,
    ANSWER_SUFFIX, ANSWER_TOKENS, DEFAULT_PROBE_EVERY, MAX_THINKING_BUDGET, THINK_CLOSE_SUFFIX,
};
pub use synthesize::synthesis_prompt;
pub use test_budget::{allocate, disagreement, normalized_program};
pub use unit_tests::{
    best_of_n_generated_tests, choose_by_generated_tests, collect_replies, test_prompt,
    test_requests, tests_from_replies, GeneratedTests, TestGenError, TestSpec, MAX_GENERATED_TESTS,
    REPLY_HEAD, TEST_SEED_OFFSET,
};

/// How the candidates become one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// Extract each candidate's final answer and vote (self-consistency).
    Majority,
    /// One more generation reads the numbered candidates and writes its own answer.
    Synthesize,
    /// A verifier scores candidates (unit tests for code); the best one wins.
    Reward,
}

/// Whether `aggregate` cannot run for want of tests: `reward` scores each
/// candidate by the unit tests it passes. Every front end (the library's own
/// guard, `tern bon`, the server) asks this one question and words the answer
/// in its own terms (flags, JSON fields).
pub fn lacks_tests(aggregate: Aggregate, tests: &[String]) -> bool {
    aggregate == Aggregate::Reward && tests.is_empty()
}

impl FromStr for Aggregate {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "majority" => Ok(Self::Majority),
            "synthesize" => Ok(Self::Synthesize),
            "reward" => Ok(Self::Reward),
            other => Err(format!(
                "unknown aggregate `{other}`: use majority, synthesize or reward"
            )),
        }
    }
}

/// Adaptive width's default stopping confidence: the leading answer is the
/// majority with probability >= 0.95 (4 agreeing votes with no rival).
pub const DEFAULT_CONFIDENCE: f64 = 0.95;

/// A best-of-N request.
#[derive(Clone, Debug)]
pub struct BonRequest {
    /// The conversation to answer (its last user turn is the question the
    /// synthesizer is shown).
    pub messages: Vec<ChatMessage>,
    /// Most candidates to sample.
    pub n: usize,
    /// Candidates' sampling; candidate `i` is seeded `seed + i`.
    pub sampling: SamplingParams,
    /// Most tokens per candidate (and for the synthesis).
    pub max_tokens: usize,
    /// How to aggregate.
    pub aggregate: Aggregate,
    /// Sample in waves and stop once the leading answer is confidently the majority.
    pub adaptive: bool,
    /// Candidates per wave when adaptive.
    pub wave: usize,
    /// Adaptive width stops once the leading answer is the majority with
    /// this posterior probability ([`DEFAULT_CONFIDENCE`] unless asked).
    pub confidence: f64,
    /// KV policy for every generation.
    pub kv_policy: KvPolicy,
    /// Unit tests (Python snippets) for `reward` on code tasks.
    pub tests: Vec<String>,
    /// Code placed before each candidate's program when `reward` judges it
    /// (a code task's imports and signature; see `tasks::Task::prelude`).
    pub prelude: String,
    /// Adaptive length for every candidate: a reasoning cap and, with
    /// `auto`, answer probes (`max_tokens` bounds reasoning plus answer).
    pub length: Option<LengthPolicy>,
    /// Stops `reward`'s judge early (the server sets it when the client
    /// disconnects); a default switch is never set.
    pub cancel: verify::Cancel,
}

/// One sampled candidate.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Candidate {
    /// Its full text.
    pub text: String,
    /// Its extracted final answer, if any.
    pub answer: Option<String>,
    /// Tokens it generated.
    pub tokens: usize,
    /// Tests passed (reward aggregation only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passed: Option<usize>,
    /// What adaptive length did (requests with a length policy only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length: Option<LengthReport>,
}

/// What best-of-N produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BonResult {
    /// The chosen final answer.
    pub answer: Option<String>,
    /// The chosen response text (the synthesis, or the winning candidate).
    pub text: String,
    /// Every candidate sampled, in seed order.
    pub candidates: Vec<Candidate>,
    /// The aggregation used.
    pub aggregate: Aggregate,
    /// Index of the chosen candidate (majority / reward), if one was chosen.
    pub chosen: Option<usize>,
    /// Tokens generated in all (candidates, their answer probes, synthesis).
    pub tokens: usize,
    /// Candidates a fixed-width run would have sampled but adaptive width skipped.
    pub candidates_saved: usize,
    /// Unit tests each candidate ran (`reward` only): a few when the
    /// candidates agree on them, more when they disagree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests_run: Option<usize>,
    /// The synthesis stated no final answer, so the answer suffix was appended
    /// to it and the synthesizer wrote one more sentence (`synthesize` only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub forced_answer: bool,
    /// The tests a model wrote and the pass matrix over them (`reward` with
    /// generated tests only, [`best_of_n_generated_tests`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated_tests: Option<GeneratedTests>,
}

/// Why best-of-N failed.
#[derive(Debug, thiserror::Error)]
pub enum ReasoningError {
    /// The engine refused a request.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Templating, tokenizing or an invalid parameter.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The engine failed mid-generation.
    #[error("generation failed: {0}")]
    Engine(String),
    /// `reward` without tests, or the judge could not run.
    #[error("{0}")]
    Verify(String),
    /// Tests a model was to write could not be written or run.
    #[error(transparent)]
    Tests(#[from] TestGenError),
}

type Result<T> = std::result::Result<T, ReasoningError>;

/// Runs best-of-N on `engine`, blocking the calling thread; the same model
/// synthesizes.
pub fn best_of_n(engine: &EngineHandle, req: &BonRequest) -> Result<BonResult> {
    best_of_n_with(engine, engine, req)
}

/// Runs best-of-N with candidates from `engine` and the synthesis (aggregate
/// `synthesize`) from `synthesizer`, which may run another model.
pub fn best_of_n_with(
    engine: &EngineHandle,
    synthesizer: &EngineHandle,
    req: &BonRequest,
) -> Result<BonResult> {
    if req.n == 0 || req.n > tern_runtime::engine::MAX_N {
        return Err(RuntimeError::InvalidParam {
            param: "n".into(),
            reason: format!(
                "must be between 1 and {}, got {}",
                tern_runtime::engine::MAX_N,
                req.n
            ),
        }
        .into());
    }
    if lacks_tests(req.aggregate, &req.tests) {
        return Err(ReasoningError::Verify(
            "the reward aggregate needs unit tests to score candidates".into(),
        ));
    }
    let prompt = chat_tokens(engine, &req.messages)?;
    let question = last_user_turn(&req.messages);

    let mut candidates: Vec<Candidate> = Vec::new();
    let wave = if req.adaptive {
        req.wave.clamp(1, req.n)
    } else {
        req.n
    };
    while candidates.len() < req.n {
        let k = wave.min(req.n - candidates.len());
        let mut sampling = req.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(candidates.len() as u64);
        candidates.extend(generate(engine, &prompt, sampling, req, k)?);
        if req.adaptive
            && req.aggregate != Aggregate::Reward
            && settled(&candidates, req.confidence)
        {
            break;
        }
    }
    aggregate(synthesizer, req, &question, candidates)
}

/// Whether adaptive width stops after `candidates`: the leading answer is the
/// majority with probability >= `confidence` (the Beta rule,
/// `verify::majority_confident`).
fn settled(candidates: &[Candidate], confidence: f64) -> bool {
    verify::vote(candidates.iter().map(|c| c.answer.as_deref()))
        .is_some_and(|v| verify::majority_confident(v.count, v.runner_up, confidence))
}

/// How many of `candidates` (in seed order) adaptive width with waves of `wave`
/// and stopping confidence `confidence` would have sampled before stopping.
pub fn adaptive_width(candidates: &[Candidate], wave: usize, confidence: f64) -> usize {
    let wave = wave.max(1);
    let mut used = 0;
    while used < candidates.len() {
        used = (used + wave).min(candidates.len());
        if settled(&candidates[..used], confidence) {
            break;
        }
    }
    used
}

/// Several aggregations of one set of candidates, as if each had been run on its
/// own: `req.n` candidates are sampled once (candidate `i` seeded `seed + i`, as
/// every run seeds them), then each `(aggregate, adaptive)` way is applied to
/// them; `adaptive` is `Some(wave)` for adaptive width in waves of `wave`, which
/// sees the prefix it would have sampled ([`adaptive_width`]), and `None` for
/// all `n`. A candidate's text depends only on its seed (a batched row computes
/// exactly as it would alone), so each result equals a separate
/// [`best_of_n_with`] run with that aggregate; `tern eval` uses this to score
/// majority, adaptive and synthesize for the price of one set of samples.
pub fn best_of_n_shared(
    engine: &EngineHandle,
    synthesizer: &EngineHandle,
    req: &BonRequest,
    ways: &[(Aggregate, Option<usize>)],
) -> Result<Vec<BonResult>> {
    let ways: Vec<_> = ways
        .iter()
        .map(|&(a, w)| (a, w.map(|w| (w, req.confidence)), synthesizer))
        .collect();
    best_of_n_shared_by(engine, req, &ways)
}

/// One way to aggregate shared candidates: the aggregate, adaptive width's
/// `(wave, confidence)` if adaptive, and the engine that synthesizes.
pub type Way<'a> = (Aggregate, Option<(usize, f64)>, &'a EngineHandle);

/// [`best_of_n_shared`] with each way's own synthesizer and adaptive
/// `(wave, confidence)`: one set of candidates synthesized by several models
/// (a trained synthesizer against the untrained one, over the very same
/// candidates), or stopped at several confidences.
pub fn best_of_n_shared_by(
    engine: &EngineHandle,
    req: &BonRequest,
    ways: &[Way<'_>],
) -> Result<Vec<BonResult>> {
    let sample = BonRequest {
        aggregate: Aggregate::Majority,
        adaptive: false,
        ..req.clone()
    };
    let all = best_of_n_with(engine, engine, &sample)?;
    let question = last_user_turn(&req.messages);
    ways.iter()
        .map(|&(agg, adaptive, synthesizer)| {
            let r = BonRequest {
                aggregate: agg,
                adaptive: adaptive.is_some(),
                wave: adaptive.map_or(req.wave, |(w, _)| w),
                confidence: adaptive.map_or(req.confidence, |(_, c)| c),
                ..req.clone()
            };
            let mut cands = all.candidates.clone();
            if let Some((wave, confidence)) = adaptive.filter(|_| agg != Aggregate::Reward) {
                cands.truncate(adaptive_width(&cands, wave.clamp(1, req.n), confidence));
            }
            aggregate(synthesizer, &r, &question, cands)
        })
        .collect()
}

/// The text of the conversation's last user turn (what the synthesizer is shown).
fn last_user_turn(messages: &[ChatMessage]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(|m| m.content.clone())
        .unwrap_or_default()
}

/// `req.aggregate` over `candidates` (sampled in seed order).
fn aggregate(
    synthesizer: &EngineHandle,
    req: &BonRequest,
    question: &str,
    mut candidates: Vec<Candidate>,
) -> Result<BonResult> {
    let candidates_saved = req.n - candidates.len();
    let mut tokens: usize = candidates
        .iter()
        .map(|c| c.tokens + c.length.as_ref().map_or(0, |l| l.probe_tokens))
        .sum();
    let mut tests_run = None;
    let mut forced_answer = false;
    let (answer, text, chosen) = match req.aggregate {
        Aggregate::Majority => {
            let v = verify::vote(candidates.iter().map(|c| c.answer.as_deref()));
            match v {
                Some(v) => (
                    Some(v.answer),
                    candidates[v.index].text.clone(),
                    Some(v.index),
                ),
                None => (None, candidates[0].text.clone(), Some(0)),
            }
        }
        Aggregate::Synthesize => {
            let texts: Vec<&str> = candidates.iter().map(|c| c.text.as_str()).collect();
            let p = synthesis_prompt(question, &texts);
            let synth = chat_tokens(synthesizer, &[ChatMessage::new("user", p)])?;
            let mut sampling = req.sampling.clone();
            // The synthesizer reasons once: greedy, so the result is reproducible.
            sampling.temperature = 0.0;
            let synthesis = BonRequest {
                length: None,
                ..req.clone()
            };
            let c = generate(synthesizer, &synth, sampling, &synthesis, 1)?
                .pop()
                .ok_or_else(|| ReasoningError::Engine("the synthesis produced nothing".into()))?;
            tokens += c.tokens;
            match c.answer {
                Some(answer) => (Some(answer), c.text, None),
                // A small synthesizer often re-writes candidates and stops
                // without the asked-for answer line: force one, as adaptive
                // length forces the answer at its cap (if the context has room).
                None => match force_answer(synthesizer, &synth, &c.text)? {
                    Some((text, spent)) => {
                        tokens += spent;
                        forced_answer = true;
                        (verify::extract_answer(&text), text, None)
                    }
                    None => (None, c.text, None),
                },
            }
        }
        Aggregate::Reward => {
            let programs: Vec<String> = candidates
                .iter()
                .map(|c| verify::with_prelude(&req.prelude, &verify::extract_code(&c.text)))
                .collect();
            let judged = verify::judge_scaled(
                &programs,
                &req.tests,
                verify::SCREEN_TESTS,
                &Limits {
                    cancel: req.cancel.clone(),
                    ..Limits::default()
                },
            )
            .map_err(|e| ReasoningError::Verify(e.to_string()))?;
            for (c, r) in candidates.iter_mut().zip(&judged.reports) {
                c.passed = Some(r.passed);
            }
            tests_run = Some(judged.tests_run);
            let best = verify::best_by_tests(&judged.reports).unwrap_or(0);
            (
                candidates[best].answer.clone(),
                candidates[best].text.clone(),
                Some(best),
            )
        }
    };
    Ok(BonResult {
        answer,
        text,
        candidates,
        aggregate: req.aggregate,
        chosen,
        tokens,
        candidates_saved,
        tests_run,
        forced_answer,
        generated_tests: None,
    })
}

/// `text` (a completion of `prompt`) followed by [`ANSWER_SUFFIX`] and the
/// one greedy sentence the model writes after it, with the tokens that
/// sentence cost; `None` when the context has no room left for it.
fn force_answer(
    engine: &EngineHandle,
    prompt: &[u32],
    text: &str,
) -> Result<Option<(String, usize)>> {
    let model = engine.model();
    let head = format!("{}{ANSWER_SUFFIX}", text.trim_end());
    let mut tokens = prompt.to_vec();
    tokens.extend(model.tokenizer.encode(&head, false, false)?);
    let room = model.room(tokens.len());
    if room == 0 {
        return Ok(None);
    }
    let mut sub = SubmitRequest::new(tokens, SamplingParams::greedy(), ANSWER_TOKENS.min(room));
    // The answer ends with its sentence once it has begun, as a forced
    // answer at a thinking budget does.
    sub.stop_after_content = length::ANSWER_STOP.iter().map(|s| s.to_string()).collect();
    let answer = engine.submit(sub)?.collect_blocking()?;
    let (tail, spent) = (&answer.first().text, answer.first().completion_tokens);
    Ok(Some((format!("{head}{tail}"), spent)))
}

/// The model's chat template over `messages`, tokenized, ready to generate
/// (the tasks' own text: control-token text is parsed).
fn chat_tokens(engine: &EngineHandle, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    Ok(engine
        .model()
        .chat_prompt(messages, ContentTokens::Special)?)
}

/// `k` candidates of `prompt` sharing one prefill, under `req`'s length
/// policy if it has one.
fn generate(
    engine: &EngineHandle,
    prompt: &[u32],
    sampling: SamplingParams,
    req: &BonRequest,
    k: usize,
) -> Result<Vec<Candidate>> {
    let model = engine.model();
    let room = model.room(prompt.len());
    let mut max_tokens = model.fit_max_tokens(prompt.len(), req.max_tokens);
    let mut think = None;
    let mut cap = 0;
    if let Some(policy) = &req.length {
        let mut spec = think_spec(model, policy)?;
        let room = room.saturating_sub(spec.answer_suffix.len());
        let (fitted, limit) = policy.fit(req.max_tokens.min(room));
        spec.budget = fitted.cap;
        cap = fitted.cap;
        max_tokens = limit;
        think = Some(spec);
    }
    let mut sub = SubmitRequest::new(prompt.to_vec(), sampling, max_tokens);
    sub.n = k;
    sub.kv_policy = req.kv_policy.clone();
    let length = think.is_some();
    sub.think = think;
    let out = engine.submit(sub)?.collect_blocking()?;
    Ok(out
        .into_completions()
        .into_iter()
        .map(|c| {
            let report = length.then(|| LengthTally::of(cap, &c).finish(c.completion_tokens));
            Candidate {
                answer: match &report {
                    Some(r) => length::final_answer(&c.text, r),
                    None => verify::extract_answer(&c.text),
                },
                tokens: c.completion_tokens,
                length: report,
                text: c.text,
                passed: None,
            }
        })
        .collect())
}
