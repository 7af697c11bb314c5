//! KV caches: per-sequence storage of keys and values the model attends over.
//!
//! `cache.rs` owns the storage and implements the model's [`tern_models::KvStore`]
//! seam. Compression policies plug in here (they decide which entries to keep).

pub mod cache;
pub mod policy;
pub mod tee;

pub use cache::SeqCache;
pub use tee::{TeeCache, TeeError};
pub use tern_models::KvDtype;
