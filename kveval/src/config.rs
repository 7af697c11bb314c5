//! What one KV evaluation run measures: plain data the CLI fills from its
//! flags (`tern kv-eval`), grouped by evaluation. Checking happens where each
//! value is used, so an error arrives with the value that caused it.

use std::path::PathBuf;

use tern_runtime::kv::KvDtype;

use crate::ruler::RulerTask;

/// A whole run: which evaluations, the policies they compare, and each
/// evaluation's own settings.
#[derive(Debug, Clone)]
pub struct KvEvalConfig {
    /// The model as its user named it (a registry name or a path); records
    /// carry it.
    pub model: String,
    /// Evaluations to run, in order: `ppl`, `passkey`, `memory`, `ruler`.
    pub tasks: Vec<String>,
    /// Policies to compare against full: names (with the evaluation's
    /// settings, [`crate::policy::policy`]) or specs without a budget, as
    /// written in one comma list ([`crate::policy::policy_names`] rejoins a
    /// spec's own commas).
    pub policies: Vec<String>,
    /// How every cache stores keys and values.
    pub kv_dtype: KvDtype,
    /// Seed of passkeys and RULER-style samples.
    pub seed: u64,
    /// Where records go as JSON lines, as each is measured: the multi-text
    /// perplexity table's and the RULER-style suite's.
    pub out: Option<PathBuf>,
    /// The perplexity tables.
    pub ppl: PplConfig,
    /// The passkey table.
    pub passkey: PasskeyConfig,
    /// The KV-bytes table.
    pub memory: MemoryConfig,
    /// The RULER-style suite.
    pub ruler: RulerConfig,
}

/// Perplexity under eviction: one text, or several side by side.
#[derive(Debug, Clone)]
pub struct PplConfig {
    /// The text of the single-text table.
    pub file: PathBuf,
    /// Texts of the multi-text table (replaces `file`).
    pub files: Vec<PathBuf>,
    /// Window (context) size in tokens.
    pub ctx: usize,
    /// Windows to score, each from an empty cache.
    pub windows: usize,
    /// Cache budgets, one column each.
    pub budgets: Vec<usize>,
    /// Budgets as percentages of `ctx` kept (replaces `budgets`).
    pub kept: Vec<usize>,
}

/// Passkey retrieval.
#[derive(Debug, Clone)]
pub struct PasskeyConfig {
    /// Cache budgets, one row per policy and budget.
    pub budgets: Vec<usize>,
    /// Prompt lengths in tokens, one column each.
    pub contexts: Vec<usize>,
    /// Depths of the key in percent of the filler.
    pub depths: Vec<usize>,
    /// Trials per context and depth.
    pub trials: usize,
}

/// KV bytes held at long contexts.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Prompt lengths in tokens, one row each.
    pub contexts: Vec<usize>,
    /// SnapKV's budget.
    pub budget: usize,
}

/// The RULER-style suite.
#[derive(Debug, Clone)]
pub struct RulerConfig {
    /// Sequence lengths in tokens (prompt plus answer, as RULER sizes them).
    pub lengths: Vec<usize>,
    /// Tasks to run.
    pub tasks: Vec<RulerTask>,
    /// Samples per task and length.
    pub samples: usize,
    /// Percentages of the compressed entries each policy removes (1-99).
    pub removed: Vec<u32>,
    /// What a policy may see before it compresses.
    pub query: Query,
}

/// Whether a policy compresses with the question in view (kvpress's two
/// settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// The whole prompt, question included, is read and compressed at once.
    Aware,
    /// Only the context before the question is compressed; the question and
    /// the answer are kept whole, and budgets count context tokens.
    Agnostic,
}

impl Query {
    /// The setting's name in tables and records: `aware` or `agnostic`.
    pub fn name(self) -> &'static str {
        match self {
            Query::Aware => "aware",
            Query::Agnostic => "agnostic",
        }
    }
}
