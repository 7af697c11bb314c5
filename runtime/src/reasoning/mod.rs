//! Spending more compute on a hard question: best-of-N with a shared prompt,
//! aggregated by majority vote, by a CoT-based synthesizer, or by a verifier's
//! reward, with adaptive width (stop sampling once the leading answer is
//! settled). A client of [`EngineHandle`] like any other: candidates are one
//! request with `n` completions, so the prompt is prefilled once and its cache
//! forked `n` ways.

mod synthesize;

use std::str::FromStr;

use crate::chat::ChatMessage;
use crate::engine::{EngineHandle, Event, SubmitError, SubmitRequest};
use crate::error::RuntimeError;
use crate::kv::policy::KvPolicy;
use crate::sampler::SamplingParams;
use crate::verify::{self, Limits};

pub use synthesize::synthesis_prompt;

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
    /// KV policy for every generation.
    pub kv_policy: KvPolicy,
    /// Unit tests (Python snippets) for `reward` on code tasks.
    pub tests: Vec<String>,
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
    /// Tokens generated in all (candidates plus synthesis).
    pub tokens: usize,
    /// Candidates a fixed-width run would have sampled but adaptive width skipped.
    pub candidates_saved: usize,
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
}

type Result<T> = std::result::Result<T, ReasoningError>;

/// Runs best-of-N on `engine`, blocking the calling thread.
pub fn best_of_n(engine: &EngineHandle, req: &BonRequest) -> Result<BonResult> {
    if req.n == 0 || req.n > crate::engine::MAX_N {
        return Err(RuntimeError::InvalidParam {
            param: "n".into(),
            reason: format!(
                "must be between 1 and {}, got {}",
                crate::engine::MAX_N,
                req.n
            ),
        }
        .into());
    }
    if req.aggregate == Aggregate::Reward && req.tests.is_empty() {
        return Err(ReasoningError::Verify(
            "the reward aggregate needs unit tests to score candidates".into(),
        ));
    }
    let prompt = chat_tokens(engine, &req.messages)?;
    let question = req
        .messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(|m| m.content.clone())
        .unwrap_or_default();

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
        let texts = generate(engine, &prompt, sampling, req, k)?;
        candidates.extend(texts.into_iter().map(|(text, tokens)| Candidate {
            answer: verify::extract_answer(&text),
            text,
            tokens,
            passed: None,
        }));
        if req.adaptive && req.aggregate != Aggregate::Reward {
            if let Some(v) = verify::vote(candidates.iter().map(|c| c.answer.as_deref())) {
                if verify::majority_confident(v.count, v.runner_up, 0.95) {
                    break;
                }
            }
        }
    }
    let candidates_saved = req.n - candidates.len();
    let mut tokens: usize = candidates.iter().map(|c| c.tokens).sum();
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
            let p = synthesis_prompt(&question, &texts);
            let synth = chat_tokens(engine, &[ChatMessage::new("user", p)])?;
            let mut sampling = req.sampling.clone();
            // The synthesizer reasons once: greedy, so the result is reproducible.
            sampling.temperature = 0.0;
            let (text, n) = generate(engine, &synth, sampling, req, 1)?
                .pop()
                .unwrap_or_default();
            tokens += n;
            (verify::extract_answer(&text), text, None)
        }
        Aggregate::Reward => {
            let programs: Vec<String> = candidates
                .iter()
                .map(|c| verify::extract_code(&c.text))
                .collect();
            let reports = verify::judge_many(&programs, &req.tests, &Limits::default())
                .map_err(|e| ReasoningError::Verify(e.to_string()))?;
            for (c, r) in candidates.iter_mut().zip(&reports) {
                c.passed = Some(r.passed);
            }
            let best = verify::best_by_tests(&reports).unwrap_or(0);
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
    })
}

/// The model's chat template over `messages`, tokenized, ready to generate.
fn chat_tokens(engine: &EngineHandle, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    let model = engine.model();
    let text = model.chat_template()?.render(messages, true)?;
    Ok(model.tokenizer.encode(&text, true, true)?)
}

/// `k` completions of `prompt` sharing one prefill; `(text, tokens)` each.
fn generate(
    engine: &EngineHandle,
    prompt: &[u32],
    sampling: SamplingParams,
    req: &BonRequest,
    k: usize,
) -> Result<Vec<(String, usize)>> {
    let ctx = engine.model().config().context_length;
    let max_tokens = req.max_tokens.min(ctx.saturating_sub(prompt.len())).max(1);
    let mut sub = SubmitRequest::new(prompt.to_vec(), sampling, max_tokens);
    sub.n = k;
    sub.kv_policy = req.kv_policy.clone();
    let mut stream = engine.submit(sub)?;
    let mut out = vec![(String::new(), 0usize); k];
    while let Some(ev) = stream.blocking_recv() {
        match ev {
            Event::Token { index, text, .. } => {
                out[index].0.push_str(&text);
                out[index].1 += 1;
            }
            Event::Error(e) => return Err(ReasoningError::Engine(e)),
            Event::Prefilled { .. } | Event::Done { .. } => {}
        }
    }
    Ok(out)
}
