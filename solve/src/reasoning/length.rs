//! Adaptive length: how long a completion may reason before it must answer
//! (`reasoning_effort`, `thinking_budget_tokens`), and the probe rule that
//! stops it early once its answer has converged (DESIGN.md §5).
//!
//! The engine does the mechanics (a thinking budget, forked answer probes,
//! forcing the answer suffix; see [`tern_runtime::engine::ThinkSpec`]); this file
//! decides the numbers and what "converged" means, turns the engine's probe
//! and conclusion events into a [`LengthReport`], and runs one adaptive-length
//! generation for the CLI and `tern eval` ([`adaptive_length`]). The server
//! builds the same spec with [`think_spec`] and the same report with
//! [`LengthTally`], so it can stream.

use std::str::FromStr;

use crate::verify;
use tern_runtime::chat::think_reader::THINK_CLOSE;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::{
    Completion, ConvergenceRule, EngineHandle, ProbeSpec, SubmitRequest, ThinkSpec,
};
use tern_runtime::error::RuntimeError;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::model::LoadedModel;
use tern_runtime::sampler::SamplingParams;

use super::{chat_tokens, Result};

/// The text that forces a final answer, for probes and for the real answer.
pub const ANSWER_SUFFIX: &str = "\n\nThe final answer is";
/// Reasoning tokens between answer probes unless the caller says otherwise.
pub const DEFAULT_PROBE_EVERY: usize = 64;
/// Most tokens a probe writes after the suffix: enough for a number and its unit.
pub const PROBE_TOKENS: usize = 20;
/// Consecutive probes that must give the same answer to stop reasoning.
pub const AGREEING_PROBES: usize = 3;
/// Most tokens the answer gets after the suffix once reasoning stops.
pub const ANSWER_TOKENS: usize = 48;
/// Where a forced answer ends, once it has begun: a line break or the end of
/// its sentence (a period then a space, so "3.5" is not cut).
pub const ANSWER_STOP: [&str; 2] = ["\n", ". "];
/// The largest thinking budget a request may ask for; beyond it a 135M-class
/// model only repeats itself, and the context window is 8k.
pub const MAX_THINKING_BUDGET: usize = 4096;

/// How much a request may reason (OpenAI's `reasoning_effort`, plus `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effort {
    /// At most 128 reasoning tokens, then answer.
    Low,
    /// At most 512 reasoning tokens, then answer.
    Medium,
    /// At most 2048 reasoning tokens, then answer.
    High,
    /// Probe the answer every k tokens and stop once it has converged, with
    /// the high cap.
    Auto,
}

impl Effort {
    /// The reasoning cap in tokens. Chosen for small models: a low-effort
    /// arithmetic answer fits in 128 tokens, a worked multi-step one in 512,
    /// and 2048 leaves room for long chains without filling the context.
    pub fn cap(self) -> usize {
        match self {
            Self::Low => 128,
            Self::Medium => 512,
            Self::High | Self::Auto => 2048,
        }
    }
}

impl FromStr for Effort {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "low" => Ok(Self::Low),
            "medium" => Ok(Self::Medium),
            "high" => Ok(Self::High),
            "auto" => Ok(Self::Auto),
            other => Err(format!(
                "unknown reasoning_effort `{other}`: use low, medium, high or auto"
            )),
        }
    }
}

/// A request's reasoning length: a cap, and whether probes may stop it sooner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LengthPolicy {
    /// Most reasoning tokens before the answer is forced.
    pub cap: usize,
    /// Reasoning tokens between answer probes; `None`: no probes, just the cap.
    pub probe_every: Option<usize>,
}

impl LengthPolicy {
    /// The policy for `effort` and/or an explicit `budget` (which replaces the
    /// effort's cap); `None` when neither is given. Probes run with `auto`
    /// (every `probe_every` tokens); the fixed efforts and a bare budget are
    /// plain caps, so their cost is predictable.
    pub fn new(
        effort: Option<Effort>,
        budget: Option<usize>,
        probe_every: usize,
    ) -> std::result::Result<Option<Self>, RuntimeError> {
        if let Some(b) = budget {
            if b == 0 || b > MAX_THINKING_BUDGET {
                return Err(RuntimeError::InvalidParam {
                    param: "thinking_budget_tokens".into(),
                    reason: format!("must be between 1 and {MAX_THINKING_BUDGET}, got {b}"),
                });
            }
        }
        if probe_every == 0 {
            return Err(RuntimeError::InvalidParam {
                param: "probe_every".into(),
                reason: "must be at least 1".into(),
            });
        }
        let cap = match (effort, budget) {
            (_, Some(b)) => b,
            (Some(e), None) => e.cap(),
            (None, None) => return Ok(None),
        };
        Ok(Some(Self {
            cap,
            probe_every: (effort == Some(Effort::Auto)).then_some(probe_every),
        }))
    }
}

impl LengthPolicy {
    /// The policy fitted under a total token limit `max_tokens` (reasoning
    /// plus answer), and the limit to submit: the cap shrinks so the forced
    /// answer always has its [`ANSWER_TOKENS`] (a generation that runs out
    /// of tokens mid-reasoning would never answer).
    pub fn fit(&self, max_tokens: usize) -> (Self, usize) {
        let cap = self
            .cap
            .min(max_tokens.saturating_sub(ANSWER_TOKENS))
            .max(1);
        let fitted = Self {
            cap,
            probe_every: self.probe_every,
        };
        (fitted, (cap + ANSWER_TOKENS).min(max_tokens.max(1)))
    }
}

/// Whether the last [`AGREEING_PROBES`] probe texts state the same answer
/// (numerically equivalent), each having one.
pub fn probes_agree(probes: &[String]) -> bool {
    if probes.len() < AGREEING_PROBES {
        return false;
    }
    let answers: Vec<Option<String>> = probes[probes.len() - AGREEING_PROBES..]
        .iter()
        .map(|p| probe_answer(p))
        .collect();
    match answers.first() {
        Some(Some(first)) => answers.iter().all(|a| {
            a.as_deref()
                .is_some_and(|a| verify::answers_match(a, first))
        }),
        _ => false,
    }
}

/// Words that mark a probe as unsure (Dynasor-CoT's certainty check): a probe
/// that writes "wait" or "hmm" after the answer suffix is still reasoning,
/// so its number is no vote for stopping.
pub const HESITATION: [&str; 7] = [
    "wait", "hmm", "hold on", "but", "however", "actually", "not sure",
];

/// Whether `text` contains one of [`HESITATION`] as a word (any case).
pub fn hesitates(text: &str) -> bool {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    HESITATION.iter().any(|h| {
        let hw: Vec<&str> = h.split(' ').collect();
        words.windows(hw.len()).any(|w| w == hw.as_slice())
    })
}

/// The answer a probe states: its text read as the end of the forced
/// sentence, reduced to its final number when it has one ("3 + 5 = 8 apples"
/// states 8). A probe that only restates the question of an answer ("The
/// answer is"), or hesitates ([`hesitates`]: "8. Wait, ..."), states nothing.
pub fn probe_answer(probe: &str) -> Option<String> {
    if hesitates(probe) {
        return None;
    }
    let stated = verify::extract_answer(&format!("{}{probe}", ANSWER_SUFFIX.trim_start()))?;
    if stated.to_ascii_lowercase().contains("answer") {
        return None;
    }
    match verify::extract_answer(&stated) {
        Some(n) if verify::normalize_number(&n).is_some() => Some(n),
        _ => Some(stated),
    }
}

/// A completion's final answer under adaptive length: after an early stop,
/// the settling probe's own answer (Dynasor-CoT reuses it; the engine then
/// writes that probe's words greedily, see `engine::apply::conclude`), else
/// the answer its text states.
pub fn final_answer(text: &str, report: &LengthReport) -> Option<String> {
    match report.probes.last() {
        Some(p) if report.stopped_early && p.answer.is_some() => p.answer.clone(),
        _ => verify::extract_answer(text),
    }
}

/// The engine's think spec for `policy`: the suffix tokenized for `model`,
/// probes of [`PROBE_TOKENS`] judged by [`probes_agree`].
pub fn think_spec(model: &LoadedModel, policy: &LengthPolicy) -> Result<ThinkSpec> {
    let answer_suffix = model.tokenizer.encode(ANSWER_SUFFIX, false, false)?;
    Ok(ThinkSpec {
        budget: policy.cap,
        answer_suffix,
        answer_tokens: ANSWER_TOKENS,
        // The forced answer ends with its sentence or line: what a small
        // model writes after that is more reasoning that costs tokens.
        answer_stop: ANSWER_STOP.iter().map(|s| s.to_string()).collect(),
        probe: policy.probe_every.map(|every| ProbeSpec {
            every,
            max_tokens: PROBE_TOKENS,
            // The answer sentence ends at the line's end; what follows is
            // more reasoning that costs tokens and says nothing new.
            stop: vec!["\n".into()],
            rule: ConvergenceRule::new(probes_agree),
        }),
        closes_with: None,
    })
}

/// What closes a reasoning model's think block when its budget runs out
/// (llama.cpp's `--reasoning-budget` ends the block with the same tag).
pub const THINK_CLOSE_SUFFIX: &str = "\n</think>\n\n";

/// The engine's think spec for a model whose chat template marks reasoning
/// (`<think>` ... `</think>`): the budget counts the reasoning only. A model
/// that closes its block within the budget is not touched; one that reaches
/// the budget has the block closed for it ([`THINK_CLOSE_SUFFIX`]) and then
/// answers freely within the request's `max_tokens` (`answer_tokens`). No
/// probes: a thinking model's answer is whatever it writes after the block,
/// not one stated number.
pub fn closing_think_spec(
    model: &LoadedModel,
    budget: usize,
    answer_tokens: usize,
) -> Result<ThinkSpec> {
    Ok(ThinkSpec {
        budget,
        answer_suffix: model.tokenizer.encode(THINK_CLOSE_SUFFIX, false, true)?,
        answer_tokens,
        answer_stop: Vec::new(),
        probe: None,
        closes_with: Some(THINK_CLOSE.to_string()),
    })
}

/// One answer probe, as reported.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProbeRecord {
    /// Reasoning tokens before the probe.
    pub at: usize,
    /// The answer the probe stated, if any.
    pub answer: Option<String>,
    /// Tokens the probe generated (spent, then discarded).
    pub tokens: usize,
}

/// What adaptive length did for one completion.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LengthReport {
    /// The reasoning cap.
    pub cap: usize,
    /// Probes taken, in order.
    pub probes: Vec<ProbeRecord>,
    /// Whether agreeing probes stopped the reasoning before the cap.
    pub stopped_early: bool,
    /// Whether the cap forced the answer.
    pub hit_cap: bool,
    /// Reasoning tokens (all generated tokens when the model answered by itself).
    pub reasoning_tokens: usize,
    /// Tokens written after the forced suffix.
    pub answer_tokens: usize,
    /// Tokens the probes generated.
    pub probe_tokens: usize,
    /// Everything generated: reasoning, answer and probes.
    pub tokens_spent: usize,
    /// Reasoning tokens the cap allowed but an early stop did not spend
    /// (`cap - reasoning_tokens` when stopped early, else 0).
    pub tokens_saved: usize,
}

/// Builds a [`LengthReport`] from one completion's engine events.
#[derive(Clone, Debug)]
pub struct LengthTally {
    report: LengthReport,
    concluded_at: Option<usize>,
}

impl LengthTally {
    /// A tally for a completion capped at `cap` reasoning tokens.
    pub fn new(cap: usize) -> Self {
        Self {
            report: LengthReport {
                cap,
                ..LengthReport::default()
            },
            concluded_at: None,
        }
    }

    /// The tally of a finished completion capped at `cap` reasoning tokens:
    /// its probes and where it concluded.
    pub fn of(cap: usize, c: &Completion) -> Self {
        let mut t = Self::new(cap);
        for p in &c.probes {
            t.probe(p.at, &p.text, p.tokens);
        }
        if let Some(end) = c.conclusion {
            t.concluded(end.at, end.early);
        }
        t
    }

    /// Records an [`tern_runtime::engine::Event::Probe`].
    pub fn probe(&mut self, at: usize, text: &str, tokens: usize) {
        self.report.probes.push(ProbeRecord {
            at,
            answer: probe_answer(text),
            tokens,
        });
    }

    /// Records an [`tern_runtime::engine::Event::Concluded`].
    pub fn concluded(&mut self, at: usize, early: bool) {
        self.concluded_at = Some(at);
        self.report.stopped_early = early;
        self.report.hit_cap = !early;
    }

    /// The report once the completion generated `completion_tokens` in all.
    pub fn finish(&self, completion_tokens: usize) -> LengthReport {
        let mut report = self.report.clone();
        let r = &mut report;
        r.reasoning_tokens = self.concluded_at.unwrap_or(completion_tokens);
        r.answer_tokens = completion_tokens - r.reasoning_tokens.min(completion_tokens);
        r.probe_tokens = r.probes.iter().map(|p| p.tokens).sum();
        r.tokens_spent = completion_tokens + r.probe_tokens;
        r.tokens_saved = if r.stopped_early {
            r.cap.saturating_sub(r.reasoning_tokens)
        } else {
            0
        };
        report
    }
}

/// One adaptive-length generation.
#[derive(Clone, Debug)]
pub struct LengthRequest {
    /// The conversation to answer.
    pub messages: Vec<ChatMessage>,
    /// Sampling of the reasoning (probes are always greedy).
    pub sampling: SamplingParams,
    /// The cap and probes.
    pub policy: LengthPolicy,
    /// KV policy.
    pub kv_policy: KvPolicy,
}

/// What an adaptive-length generation produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LengthResult {
    /// The full text: reasoning, then the forced suffix and the answer if it
    /// was forced.
    pub text: String,
    /// Its extracted final answer.
    pub answer: Option<String>,
    /// Probes, tokens spent and saved.
    pub length: LengthReport,
}

/// Runs one adaptive-length generation on `engine`, blocking the thread.
pub fn adaptive_length(engine: &EngineHandle, req: &LengthRequest) -> Result<LengthResult> {
    let model = engine.model();
    let prompt = chat_tokens(engine, &req.messages)?;
    let think = think_spec(model, &req.policy)?;
    let room = model.room(prompt.len() + think.answer_suffix.len());
    let (policy, max_tokens) = req.policy.fit((req.policy.cap + ANSWER_TOKENS).min(room));
    let think = ThinkSpec {
        budget: policy.cap,
        ..think
    };
    let mut sub = SubmitRequest::new(prompt, req.sampling.clone(), max_tokens);
    sub.kv_policy = req.kv_policy.clone();
    sub.think = Some(think);
    let out = engine.submit(sub)?.collect_blocking()?;
    let c = out.first();
    let (text, generated) = (c.text.clone(), c.completion_tokens);
    let length = LengthTally::of(policy.cap, c).finish(generated);
    Ok(LengthResult {
        answer: final_answer(&text, &length),
        text,
        length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn probes_state_their_final_number() {
        assert_eq!(probe_answer(" 3 + 5 = 8 apples.").as_deref(), Some("8"));
        assert_eq!(probe_answer(" $\\boxed{12}$").as_deref(), Some("12"));
        assert_eq!(probe_answer(" Paris.").as_deref(), Some("Paris"));
        assert_eq!(probe_answer(": The answer is"), None);
        assert_eq!(probe_answer(""), None);
        // Hesitation: the probe is still reasoning, whatever number it wrote.
        assert_eq!(probe_answer(" 8. Wait, let me check"), None);
        assert_eq!(probe_answer(" hmm, 8"), None);
        assert_eq!(probe_answer(" 8, but the second step"), None);
        assert_eq!(probe_answer(" 8. Hold on."), None);
        // Words that merely contain one are not hesitation.
        assert_eq!(probe_answer(" 8 buttons.").as_deref(), Some("8"));
        assert_eq!(probe_answer(" 12 waiters.").as_deref(), Some("12"));
    }

    #[test]
    fn three_numerically_equal_probes_agree() {
        assert!(probes_agree(&p(&[
            " 7.",
            " 8.",
            " 8 apples.",
            " $8$",
            " 8.0"
        ])));
        assert!(!probes_agree(&p(&[" 8.", " 8."])));
        assert!(!probes_agree(&p(&[" 8.", " 9.", " 8."])));
        assert!(!probes_agree(&p(&[":", ":", ":"])));
        assert!(!probes_agree(&p(&[" 8.", " 8.", " not sure"])));
        assert!(!probes_agree(&p(&[" 8.", " 8.", " 8. Wait"])));
    }

    #[test]
    fn effort_and_budget_make_the_cap_and_only_auto_probes() {
        assert_eq!(LengthPolicy::new(None, None, 64).unwrap(), None);
        let low = LengthPolicy::new(Some(Effort::Low), None, 64)
            .unwrap()
            .unwrap();
        assert_eq!((low.cap, low.probe_every), (128, None));
        let auto = LengthPolicy::new(Some(Effort::Auto), None, 32)
            .unwrap()
            .unwrap();
        assert_eq!((auto.cap, auto.probe_every), (2048, Some(32)));
        let budget = LengthPolicy::new(Some(Effort::Auto), Some(300), 64)
            .unwrap()
            .unwrap();
        assert_eq!((budget.cap, budget.probe_every), (300, Some(64)));
        let bare = LengthPolicy::new(None, Some(50), 64).unwrap().unwrap();
        assert_eq!((bare.cap, bare.probe_every), (50, None));
        assert!(LengthPolicy::new(None, Some(0), 64).is_err());
        assert!(LengthPolicy::new(None, Some(MAX_THINKING_BUDGET + 1), 64).is_err());
        assert!("extreme".parse::<Effort>().is_err());
        let (fitted, max) = low.fit(100);
        assert_eq!((fitted.cap, max), (100 - ANSWER_TOKENS, 100));
        let (fitted, max) = low.fit(1000);
        assert_eq!((fitted.cap, max), (128, 128 + ANSWER_TOKENS));
        assert_eq!("auto".parse::<Effort>().unwrap(), Effort::Auto);
    }

    #[test]
    fn tally_counts_reasoning_answer_probes_and_savings() {
        let mut t = LengthTally::new(512);
        t.probe(64, " 12.", 4);
        t.probe(128, " 12.", 5);
        t.probe(192, " 12", 3);
        t.concluded(192, true);
        let r = t.finish(200);
        assert!(r.stopped_early && !r.hit_cap);
        assert_eq!(r.reasoning_tokens, 192);
        assert_eq!(r.answer_tokens, 8);
        assert_eq!(r.probe_tokens, 12);
        assert_eq!(r.tokens_spent, 212);
        assert_eq!(r.tokens_saved, 320);
        assert_eq!(r.probes[2].answer.as_deref(), Some("12"));

        let natural = LengthTally::new(128).finish(40);
        assert_eq!((natural.reasoning_tokens, natural.answer_tokens), (40, 0));
        assert_eq!(natural.tokens_saved, 0);
        let mut capped = LengthTally::new(128);
        capped.concluded(128, false);
        let r = capped.finish(140);
        assert!(r.hit_cap && !r.stopped_early);
        assert_eq!((r.answer_tokens, r.tokens_saved), (12, 0));
    }
}
