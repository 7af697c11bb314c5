//! `tern-runtime`: everything between a model and a caller.
//!
//! Tokenizer (GGUF vocabulary through `tokenizers`), chat template (minijinja),
//! sampler, per-sequence KV caches, generation, perplexity, the
//! continuous-batching engine and task-set evaluation. Callers (the CLI,
//! the server, the trainer) talk to this crate; it never sees their wire types.

pub mod backend;
pub mod chat;
pub mod chat_prompt;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod eval;
pub mod generate;
pub mod kv;
pub mod memory;
pub mod model;
pub mod perplexity;
pub mod reasoning;
pub mod sampler;
pub mod size;
pub mod tasks;
pub mod tokenizer;
pub mod verify;

pub use error::{Result, RuntimeError};
pub use model::LoadedModel;
