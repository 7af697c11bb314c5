//! The one error type of `tern-kveval`.
//!
//! Messages say what is wrong in the evaluation's terms (a window, a text, a
//! budget); they name no flag. The binary knows which of its flags set each
//! value and adds it at its edge.

use std::path::PathBuf;

use tern_runtime::kv::policy::PolicyError;
use tern_runtime::RuntimeError;

/// What can go wrong while evaluating KV policies.
#[derive(Debug, thiserror::Error)]
pub enum KvEvalError {
    /// The model, tokenizer or backend failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// An evaluation name no evaluation answers to.
    #[error("unknown task `{0}` (known: ppl, passkey, memory, ruler)")]
    UnknownTask(String),
    /// A policy name that is neither a known name nor a spec.
    #[error(
        "unknown policy `{0}` (known: full, streaming, h2o, snapkv, pyramidkv, rkv, adakv, \
         keydiff, expected, or a spec such as `snapkv:window=32`)"
    )]
    UnknownPolicy(String),
    /// A policy spec that does not parse once its budget is added.
    #[error("policy {spec}: {source}")]
    Policy {
        /// The spec as run, budget included.
        spec: String,
        /// Why it does not parse.
        source: PolicyError,
    },
    /// A text to score cannot be read.
    #[error("cannot read {} as UTF-8 text", path.display())]
    ReadText {
        /// The text's path.
        path: PathBuf,
        /// What reading it said.
        source: std::io::Error,
    },
    /// A text shorter than one window of the multi-text table.
    #[error("{} has {tokens} tokens; one window of {window} tokens needs at least that many", path.display())]
    ShortText {
        /// The text's path.
        path: PathBuf,
        /// Its length in tokens.
        tokens: usize,
        /// The window size.
        window: usize,
    },
    /// A perplexity window outside what the model can read.
    #[error(
        "the window must be between 4 tokens and the model's context length {max}, got {window}"
    )]
    Window {
        /// The window asked for.
        window: usize,
        /// The model's context length.
        max: usize,
    },
    /// Too few tokens for one perplexity window.
    #[error("the text has {tokens} tokens; at least ctx = {window} are needed for one window")]
    TooFewTokens {
        /// Tokens in the text.
        tokens: usize,
        /// The window size.
        window: usize,
    },
    /// A kept percentage that leaves no cache entry of a window.
    #[error("{kept}% of a {window}-token window leaves no cache entry")]
    NothingKept {
        /// The percentage kept.
        kept: usize,
        /// The window size.
        window: usize,
    },
    /// The records file (or its folder) cannot be created.
    #[error("cannot create {}", path.display())]
    CreateRecords {
        /// The path that failed.
        path: PathBuf,
        /// What creating it said.
        source: std::io::Error,
    },
    /// A record cannot be written.
    #[error("write failed")]
    WriteRecords(#[source] std::io::Error),
    /// A query-agnostic split that leaves no context or no question.
    #[error(
        "the context must be a proper, non-empty prefix of the {prompt}-token prompt (got {context})"
    )]
    ContextSplit {
        /// Tokens asked to be the context.
        context: usize,
        /// Tokens in the prompt.
        prompt: usize,
    },
    /// A RULER-style prompt too short for its task's fixed text.
    #[error(
        "a prompt of {target} tokens cannot hold this task's instructions and question ({needed} tokens)"
    )]
    TooShortForTask {
        /// Tokens the prompt may take.
        target: usize,
        /// Tokens the instructions and question take alone.
        needed: usize,
    },
    /// One RULER-style sample could not be built.
    #[error("ruler {task} at {length} tokens")]
    RulerSample {
        /// The task's name.
        task: &'static str,
        /// The sequence length asked for.
        length: usize,
        /// Why.
        source: Box<KvEvalError>,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, KvEvalError>;
