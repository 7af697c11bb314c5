//! A RULER-style synthetic long-context suite (Hsieh et al. 2024, "RULER:
//! What's the Real Context Size of Your Long-Context Language Models?"),
//! generated here from a seed: what a KV policy keeps decides whether a model
//! can still retrieve, trace and aggregate across a long prompt.
//!
//! Tasks, one file per family: `niah.rs` (needle retrieval: single, multi-key,
//! multi-value), `vt.rs` (variable tracking), `cwe.rs` (common-word
//! extraction). `haystack.rs` holds the noise filler and sizes every prompt to
//! a length in the model's own tokens; `score.rs` is RULER's string-match
//! recall. Prompts are plain text (no chat template) ending with the opening
//! words of the answer, so base and instruct models alike continue with it.
//!
//! `sweep.rs` runs the suite under each policy at each fraction of the
//! prompt's entries removed; `table.rs` writes its tables.

mod cwe;
mod haystack;
mod niah;
mod score;
pub mod sweep;
mod table;
mod vt;
mod words;

use std::fmt;
use std::str::FromStr;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::Result;
use tern_runtime::tokenizer::Tokenizer;

pub use score::score;

/// One RULER task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RulerTask {
    /// One needle; return its value.
    NiahSingle,
    /// Four needles with different keys; return the queried key's value.
    NiahMultikey,
    /// Four needles with one key; return all four values.
    NiahMultivalue,
    /// A five-variable assignment chain; name every variable holding the value.
    Vt,
    /// A word list; name the ten most frequent words.
    Cwe,
}

/// A task name the suite does not know.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unknown ruler task `{0}` (known: niah_single, niah_multikey, niah_multivalue, vt, cwe)")]
pub struct UnknownRulerTask(pub String);

impl RulerTask {
    /// Every task, in report order.
    pub const ALL: [RulerTask; 5] = [
        RulerTask::NiahSingle,
        RulerTask::NiahMultikey,
        RulerTask::NiahMultivalue,
        RulerTask::Vt,
        RulerTask::Cwe,
    ];

    /// The task's name in flags and records, e.g. `niah_single`.
    pub fn name(self) -> &'static str {
        match self {
            RulerTask::NiahSingle => "niah_single",
            RulerTask::NiahMultikey => "niah_multikey",
            RulerTask::NiahMultivalue => "niah_multivalue",
            RulerTask::Vt => "vt",
            RulerTask::Cwe => "cwe",
        }
    }

    /// Tokens to generate: room for the whole answer (a 7-digit number is up
    /// to 7 tokens with digit-wise tokenizers), little more.
    pub fn max_new_tokens(self) -> usize {
        match self {
            RulerTask::NiahSingle | RulerTask::NiahMultikey | RulerTask::Vt => 32,
            RulerTask::NiahMultivalue | RulerTask::Cwe => 64,
        }
    }
}

impl fmt::Display for RulerTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RulerTask {
    type Err = UnknownRulerTask;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        RulerTask::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownRulerTask(s.to_string()))
    }
}

/// One generated sample: a prompt and what its answer must contain.
#[derive(Debug, Clone, PartialEq)]
pub struct RulerSample {
    /// The task it belongs to.
    pub task: RulerTask,
    /// Prompt token ids (with BOS where the model wants one).
    pub tokens: Vec<u32>,
    /// How many of `tokens` come before the question: what a query-agnostic
    /// run compresses before the question is read.
    pub context_tokens: usize,
    /// Strings the output must contain; the score is the share found.
    pub expected: Vec<String>,
    /// Tokens to generate; prompt plus these fit the requested length.
    pub max_new_tokens: usize,
}

/// The seed of sample `index` of `task` at `length` under a run's `seed`:
/// every cell of a report gets its own prompts, the same in every run.
pub fn sample_seed(seed: u64, task: RulerTask, length: usize, index: usize) -> u64 {
    let t = RulerTask::ALL.iter().position(|x| *x == task).unwrap_or(0) as u64;
    let mut x = seed
        ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (length as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ (index as u64 + 1).wrapping_mul(0x1656_67B1_9E37_79F9);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

/// Builds a sample of `task` whose prompt plus answer fills `length` tokens
/// of `tok` (the prompt gets `length - max_new_tokens`, as RULER sizes it),
/// drawn from `seed`.
pub fn build(tok: &Tokenizer, task: RulerTask, length: usize, seed: u64) -> Result<RulerSample> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let max_new_tokens = task.max_new_tokens();
    let target = length.saturating_sub(max_new_tokens);
    let (fitted, expected) = match task {
        RulerTask::NiahSingle => niah::build(tok, niah::Niah::Single, target, &mut rng)?,
        RulerTask::NiahMultikey => niah::build(tok, niah::Niah::MultiKey, target, &mut rng)?,
        RulerTask::NiahMultivalue => niah::build(tok, niah::Niah::MultiValue, target, &mut rng)?,
        RulerTask::Vt => vt::build(tok, target, &mut rng)?,
        RulerTask::Cwe => cwe::build(tok, target, &mut rng)?,
    };
    Ok(RulerSample {
        task,
        tokens: fitted.tokens,
        context_tokens: fitted.context,
        expected,
        max_new_tokens,
    })
}
