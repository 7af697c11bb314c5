//! `tern-trainer`: on-device fine-tuning of the model Tern serves.
//!
//! GRPO (and SFT) with LoRA or full fine-tuning, rollouts through the runtime's
//! own engine (the same sampler and KV policy as serving), a learner that runs
//! the serving forward in f32 with gradients, a hard memory cap, atomic
//! checkpoints that resume exactly. It depends on `tern-runtime`, never on the
//! server.

pub mod checkpoint;
pub mod config;
pub mod correction;
pub mod data;
mod error;
pub mod export;
pub mod fleet;
mod grpo;
pub mod learner;
mod logprob;
mod memory;
pub mod merge;
mod metrics;
mod optim;
pub mod recorder;
pub mod reward;
pub mod rollout;
mod step;
mod teacher;
pub mod train;

pub use config::{Algorithm, TrainConfig};
pub use error::{Result, TrainError};
pub use metrics::StepMetrics;
pub use train::train;
