//! `tern-solve`: the clients of Tern's engine that solve tasks.
//!
//! Everything here reaches the model only through `tern-runtime`'s engine
//! (submit a request, collect its completions), so the engine core never
//! depends on it: best-of-N with the chain-of-thought synthesizer and
//! adaptive-length reasoning ([`reasoning`]), answer extraction, voting and the
//! sandboxed code judge ([`verify`]), task sets ([`tasks`]) and the evaluation
//! harness that `tern eval` and the trainer share ([`eval`]).

pub mod eval;
pub mod reasoning;
pub mod tasks;
pub mod verify;
