//! `tern-kveval`: what each KV policy costs in quality and saves in memory.
//!
//! Perplexity under eviction (`perplexity.rs` computes it as llama.cpp's
//! llama-perplexity does; `ppl.rs` and `texts.rs` tabulate it over budgets and
//! texts), passkey retrieval (`passkey.rs` builds the prompts,
//! `passkey_table.rs` scores them), KV bytes at long contexts (`memory.rs`)
//! and a RULER-style long-context suite (`ruler/`). Answers come from the
//! straight single-sequence path (`generate.rs`) or one prefill shared by
//! every policy of a sweep (`generate_each.rs`), never the engine's
//! scheduler. It sits between the engine core and the binary: it uses
//! `tern-runtime`, and only the `tern` binary (`tern kv-eval`,
//! `tern perplexity`) and the tests use it. Tables go to a [`Printer`] as
//! they are measured; records go to a JSON-lines file; errors name values,
//! never flags.

pub mod config;
pub mod error;
pub mod generate;
pub mod generate_each;
pub mod memory;
pub mod passkey;
pub mod passkey_table;
pub mod perplexity;
pub mod policy;
pub mod ppl;
pub mod printer;
mod record_file;
pub mod ruler;
pub mod run;
pub mod texts;

pub use config::{KvEvalConfig, MemoryConfig, PasskeyConfig, PplConfig, Query, RulerConfig};
pub use error::{KvEvalError, Result};
pub use printer::Printer;
pub use run::run;
