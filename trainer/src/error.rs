//! The trainer's error type.

use thiserror::Error;

/// Why training could not start or had to stop.
#[derive(Debug, Error)]
pub enum TrainError {
    /// The configuration is invalid (unknown key, bad value, missing field).
    #[error("config: {0}")]
    Config(String),
    /// The task source could not be read; nothing was trained.
    #[error(transparent)]
    Task(#[from] tern_solve::tasks::TaskError),
    /// The memory cap cannot hold a phase of the run; `phase` names it.
    #[error("memory cap {cap}: {phase} needs about {needed}; {advice}")]
    MemoryCap {
        cap: String,
        phase: &'static str,
        needed: String,
        advice: String,
    },
    /// The output directory is not usable.
    #[error("output directory {path}: {reason}")]
    OutDir { path: String, reason: String },
    /// A checkpoint could not be written or read.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: String, reason: String },
    /// Rollouts through the engine failed.
    #[error("rollout: {0}")]
    Rollout(String),
    /// The model or runtime failed.
    #[error(transparent)]
    Runtime(#[from] tern_runtime::RuntimeError),
    /// A tensor operation failed.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// A model-level failure (weights, adapters).
    #[error(transparent)]
    Model(#[from] tern_models::ModelError),
    /// File I/O.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Result with [`TrainError`].
pub type Result<T, E = TrainError> = std::result::Result<T, E>;
