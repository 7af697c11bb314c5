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
//!
//! [`sft_control`] turns a synthesizer's example into its SFT-only control:
//! the same problem and the same target, asked without the candidates, so a
//! model fine-tuned on the controls learns the targets without learning to
//! read candidates (what synthesis adds beyond SFT on the same answers).

use serde::{Deserialize, Serialize};
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
/// sampling found. Read back (`Deserialize`) to build its SFT-only control.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

/// Why a synthesis example has no control in a task set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ControlError {
    /// The example's source task is past the end of the task set.
    #[error("example of task {source_task}: the task set has only {len} tasks")]
    NoSuchTask {
        /// The example's `source`.
        source_task: usize,
        /// Tasks in the set.
        len: usize,
    },
    /// The example was not built from this task (another task set or seed).
    #[error(
        "example of task {source_task} does not match that task (its prompt does not hold the \
         task's question, or its answer differs): give the --task the data was built from"
    )]
    Mismatch {
        /// The example's `source`.
        source_task: usize,
    },
}

/// The SFT-only control of a synthesis example: the same source task, answer
/// and `target` (or the same lack of one, which SFT trains as the bare answer
/// line, as it does the synthesizer's), but asked with `task`'s own question,
/// no candidates shown. Everything the sampling found is carried over, so
/// the two files list the same problems in the same order. `task` must be
/// the example's source (its question inside the synthesis prompt, the same
/// answer).
pub fn sft_control(
    example: &SynthesisExample,
    task: &Task,
) -> Result<SynthesisExample, ControlError> {
    if example.answer != task.answer || !example.question.contains(task.question.trim()) {
        return Err(ControlError::Mismatch {
            source_task: example.source,
        });
    }
    Ok(SynthesisExample {
        question: task.question.clone(),
        ..example.clone()
    })
}

/// [`sft_control`] of every example, each against its `source` in `tasks`
/// (the whole task set the examples were built from).
pub fn sft_controls(
    examples: &[SynthesisExample],
    tasks: &[Task],
) -> Result<Vec<SynthesisExample>, ControlError> {
    examples
        .iter()
        .map(|e| {
            let task = tasks.get(e.source).ok_or(ControlError::NoSuchTask {
                source_task: e.source,
                len: tasks.len(),
            })?;
            sft_control(e, task)
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn task(question: &str, answer: &str) -> Task {
        serde_json::from_value(serde_json::json!({"question": question, "answer": answer})).unwrap()
    }

    /// An example as `synthesis_example` builds it for `task` (number
    /// `source`), with these candidates and target.
    fn example(
        task: &Task,
        source: usize,
        cands: &[&str],
        target: Option<&str>,
    ) -> SynthesisExample {
        SynthesisExample {
            question: synthesis_prompt(&task.question, cands),
            answer: task.answer.clone(),
            target: target.map(str::to_string),
            source,
            n: cands.len(),
            candidates_right: 1,
            majority_right: false,
            disagree: true,
            k: 4,
            syntheses_right: target.is_some() as usize,
            tokens: 321,
        }
    }

    #[test]
    fn the_control_is_the_synthesis_example_minus_the_candidates() {
        let tasks = vec![
            task("Ann has 3 apples and buys 4. How many now?", "7"),
            task("Bob had 10 pens and lost 2. How many left?", "8"),
            task("Cy reads 5 pages a day for 3 days. Pages?", "15"),
        ];
        let cands = [
            "3 + 4 = 12. The answer is 12.",
            "3 + 4 = 7. The answer is 7.",
        ];
        let examples = vec![
            example(&tasks[2], 2, &cands, Some("5 * 3 = 15. The answer is 15.")),
            example(&tasks[0], 0, &cands, None),
        ];
        let controls = sft_controls(&examples, &tasks).unwrap();
        assert_eq!(controls.len(), examples.len());
        for (c, e) in controls.iter().zip(&examples) {
            // Same problem, same target (or none), same answer, same order.
            assert_eq!(c.question, tasks[e.source].question);
            assert_eq!(
                (&c.target, &c.answer, c.source),
                (&e.target, &e.answer, e.source)
            );
            // Nothing of the candidates is left in the prompt.
            assert!(e.question.contains("Solution 1:") && !c.question.contains("Solution 1:"));
            assert!(cands.iter().all(|cand| !c.question.contains(cand)));
            // Only the question differs.
            assert_eq!(
                SynthesisExample {
                    question: e.question.clone(),
                    ..c.clone()
                },
                *e
            );
        }
    }

    #[test]
    fn a_control_needs_the_task_set_the_data_came_from() {
        let tasks = vec![task("Ann has 3 apples and buys 4. How many now?", "7")];
        let e = example(&tasks[0], 0, &["The answer is 7."], None);
        // Another set: the question is not in the prompt.
        let other = vec![task("Dee has 2 cats. Cats?", "7")];
        assert_eq!(
            sft_controls(std::slice::from_ref(&e), &other),
            Err(ControlError::Mismatch { source_task: 0 })
        );
        // A source past the set's end.
        let far = SynthesisExample {
            source: 5,
            ..e.clone()
        };
        let err = sft_controls(&[far], &tasks).unwrap_err();
        assert!(err.to_string().contains("only 1 tasks"), "{err}");
        // The same question with another answer is another task.
        let wrong = vec![task("Ann has 3 apples and buys 4. How many now?", "8")];
        assert!(sft_controls(&[e], &wrong).is_err());
    }
}
