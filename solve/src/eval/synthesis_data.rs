//! Training data for the synthesizer, built the way the CoT-based
//! Synthesizer paper builds it: sample N candidates per task with the serving
//! model (the same sampling `tern eval` gives the task), render the synthesis
//! prompt exactly as `synthesize@N` does, sample K syntheses of it, and keep
//! the correct ones as imitation targets. Each example is a task line
//! (`question` = the synthesis prompt, `answer` = the task's), so the file
//! trains with `tern train --task FILE` as it is: SFT on `target`, or GRPO
//! with the correctness reward on the synthesis prompts.
//!
//! Which tasks teach the synthesizer something: those whose candidates
//! disagree or whose majority is wrong (the paper prefers them; a unanimous,
//! right majority needs no synthesis). [`Keep`] chooses.

use serde::Serialize;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;

use super::{judge, EvalError};
use crate::reasoning::{best_of_n_with, synthesis_prompt, Aggregate, BonRequest, BonResult};
use crate::tasks::Task;

/// Which tasks become examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Every task.
    All,
    /// Tasks whose candidates do not all give one answer, or whose majority
    /// answer is wrong.
    Disagree,
}

/// How the examples are sampled.
#[derive(Clone, Debug)]
pub struct DataSettings {
    /// Candidates per task (the N of synthesize@N).
    pub n: usize,
    /// Syntheses sampled per task.
    pub k: usize,
    /// Temperature of candidates and syntheses.
    pub temperature: f32,
    /// Base seed: task `i`'s candidates are seeded as `tern eval` seeds them
    /// (`seed + 1000 i`), its syntheses from `seed + 1000 i + 500`.
    pub seed: u64,
    /// Most tokens per candidate and per synthesis.
    pub max_tokens: usize,
}

/// One synthesis example: a task line for `tern train`, with what the
/// sampling found.
#[derive(Clone, Debug, Serialize)]
pub struct SynthesisExample {
    /// The synthesis prompt (the user turn `synthesize@N` sends).
    pub question: String,
    /// The source task's answer.
    pub answer: String,
    /// The first correct synthesis, if any: SFT's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The source task's index in its task set.
    pub source: usize,
    /// Candidates sampled, and how many were right.
    pub n: usize,
    /// Right candidates.
    pub candidates_right: usize,
    /// Whether the candidates' majority answer was right.
    pub majority_right: bool,
    /// Whether the candidates gave more than one answer (or none at all).
    pub disagree: bool,
    /// Syntheses sampled.
    pub k: usize,
    /// Right syntheses.
    pub syntheses_right: usize,
    /// Tokens generated for this example (candidates and syntheses).
    pub tokens: usize,
}

impl std::str::FromStr for Keep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Keep::All),
            "disagree" => Ok(Keep::Disagree),
            other => Err(format!("unknown selection `{other}`: use all or disagree")),
        }
    }
}

impl SynthesisExample {
    /// Whether `keep` takes this example.
    pub fn kept(&self, keep: Keep) -> bool {
        match keep {
            Keep::All => true,
            Keep::Disagree => self.disagree || !self.majority_right,
        }
    }
}

/// `n` samples of one user turn at the settings' temperature, seeded from
/// `seed`, with their majority vote.
fn sample(
    engine: &EngineHandle,
    question: &str,
    n: usize,
    seed: u64,
    s: &DataSettings,
) -> Result<BonResult, EvalError> {
    let req = BonRequest {
        messages: vec![ChatMessage::new("user", question)],
        n,
        sampling: SamplingParams {
            temperature: s.temperature,
            top_p: 0.95,
            seed,
            ..SamplingParams::default()
        },
        max_tokens: s.max_tokens,
        aggregate: Aggregate::Majority,
        adaptive: false,
        wave: n,
        confidence: crate::reasoning::DEFAULT_CONFIDENCE,
        kv_policy: KvPolicy::Full,
        tests: Vec::new(),
        prelude: String::new(),
        length: None,
        cancel: Default::default(),
    };
    Ok(best_of_n_with(engine, engine, &req)?)
}

/// Builds task `i`'s example: candidates from `engine`, syntheses from
/// `synthesizer` (the model being trained).
pub fn synthesis_example(
    engine: &EngineHandle,
    synthesizer: &EngineHandle,
    i: usize,
    task: &Task,
    s: &DataSettings,
) -> Result<SynthesisExample, EvalError> {
    if task.is_code() {
        return Err(EvalError::SynthesisOfCode(i));
    }
    let base = s.seed.wrapping_add(i as u64 * 1000);
    let cands = sample(engine, &task.question, s.n, base, s)?;
    let right = |text: &str, answer: Option<&str>| -> Result<bool, EvalError> {
        Ok(judge(task, text, answer)?.ok)
    };
    let mut candidates_right = 0;
    for c in &cands.candidates {
        candidates_right += right(&c.text, c.answer.as_deref())? as usize;
    }
    let majority_right = right(&cands.text, cands.answer.as_deref())?;
    let answers: std::collections::HashSet<Option<&str>> = cands
        .candidates
        .iter()
        .map(|c| c.answer.as_deref())
        .collect();
    let disagree = answers.len() > 1 || answers.contains(&None);
    let texts: Vec<&str> = cands.candidates.iter().map(|c| c.text.as_str()).collect();
    let question = synthesis_prompt(&task.question, &texts);
    let synth = sample(synthesizer, &question, s.k, base.wrapping_add(500), s)?;
    let mut target = None;
    let mut syntheses_right = 0;
    for c in &synth.candidates {
        if right(&c.text, c.answer.as_deref())? {
            syntheses_right += 1;
            target.get_or_insert_with(|| c.text.clone());
        }
    }
    Ok(SynthesisExample {
        question,
        answer: task.answer.clone(),
        target,
        source: i,
        n: s.n,
        candidates_right,
        majority_right,
        disagree,
        k: s.k,
        syntheses_right,
        tokens: cands.tokens + synth.tokens,
    })
}
