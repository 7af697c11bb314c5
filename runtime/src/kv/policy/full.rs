//! Full attention: keep every cached entry. The reference every other policy
//! is measured against, and the default.
//!
//! Owns the answers of [`super::KvPolicy::Full`] (through the unit [`Full`]):
//! no budget, no window, never compresses, takes no keys.

use std::fmt;

use super::items::Items;
use super::kind::{NamedPolicy, PolicyKind, PolicySpec};
use super::{KeepSet, PolicyError, ScoreInput};

/// The parameters of [`super::KvPolicy::Full`]: there are none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Full;

impl NamedPolicy for Full {
    const SPEC: PolicySpec = PolicySpec {
        name: "full",
        keys: &[],
        help: "keep everything (the reference)",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        Ok(Full)
    }
}

impl PolicyKind for Full {
    fn budget(&self) -> Option<usize> {
        None
    }

    fn set_budget(&mut self, _budget: usize) {}

    fn window(&self) -> usize {
        0
    }

    fn every(&self) -> usize {
        0
    }

    fn compresses_prompt(&self) -> bool {
        false
    }

    fn triggers(&self, _tokens_since_last: usize, _in_prefill: bool) -> bool {
        false
    }

    fn validate(&self) -> Result<(), PolicyError> {
        Ok(())
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        KeepSet::all(input.n_kv(), input.n_cached)
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::SPEC.name)
    }
}
