//! `tern-runtime`: everything between a model and a caller.
//!
//! Tokenizer (GGUF vocabulary through `tokenizers`), chat template (minijinja),
//! sampler, per-sequence KV caches, backends and the continuous-batching
//! engine: the engine core. Its clients (best-of-N, reasoning, verification,
//! tasks, evaluation) live in `tern-solve`, and the KV evaluation (perplexity,
//! passkey, the RULER-style suite) in `tern-kveval`; both depend on this crate
//! and never the other way. The CLI, the server and the trainer talk to them
//! all, and this crate never sees their wire types or flags.

pub mod backend;
pub mod chat;
pub mod chat_prompt;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod kv;
pub mod memory;
pub mod model;
pub mod sampler;
pub mod size;
pub mod tokenizer;

pub use error::{Result, RuntimeError, Setting};
pub use model::LoadedModel;
