//! `tern-runtime`: everything between a model and a caller.
//!
//! Tokenizer (GGUF vocabulary through `tokenizers`), chat template (minijinja),
//! sampler, per-sequence KV caches, backends, perplexity and the
//! continuous-batching engine: the engine core. Its clients (best-of-N,
//! reasoning, verification, tasks, evaluation) live in `tern-solve`, which
//! depends on this crate and never the other way; the CLI, the server and the
//! trainer talk to both, and this crate never sees their wire types.

pub mod backend;
pub mod chat;
pub mod chat_prompt;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod generate;
pub mod kv;
pub mod memory;
pub mod model;
pub mod perplexity;
pub mod sampler;
pub mod size;
pub mod tokenizer;

pub use error::{Result, RuntimeError};
pub use model::LoadedModel;
