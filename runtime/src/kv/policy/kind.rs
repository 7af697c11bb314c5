//! What a policy answers about itself, so each policy's file holds all of its
//! answers: [`PolicyKind`] (the questions the cache, the engine and the spec
//! printer ask of a policy value) and [`NamedPolicy`] (a policy's entry in the
//! spec grammar: its name, keys and help, and how its items parse).
//!
//! Every policy's parameters implement both, in the policy's own file; full
//! answers through the unit [`super::full::Full`], the relative-budget wrapper
//! implements [`PolicyKind`] only. [`super::KvPolicy`] forwards each question
//! to the variant it holds with one static `match` (the `policies!` list in
//! `mod.rs`), so nothing here costs a dynamic call on the cache's per-token path.

use std::fmt;

use super::items::Key;
use super::{KeepSet, PolicyError, ScoreInput};

/// A named policy's entry in the registry: what the spec grammar and a help
/// listing know of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    /// The name before `:` in a spec string, e.g. `snapkv`.
    pub name: &'static str,
    /// The keys it takes, in the order `Display` prints them.
    pub keys: &'static [Key],
    /// One line on what it keeps, for help listings.
    pub help: &'static str,
}

/// A policy as the spec grammar knows it: parsed from the items after
/// `name:`, defaults filled in (validation comes after, through
/// [`PolicyKind::validate`]).
pub(super) trait NamedPolicy: PolicyKind + Sized {
    /// Its name, keys and help.
    const SPEC: PolicySpec;

    /// The policy with the items of `body` (the spec after `name:`), not validated.
    fn parse(body: &str) -> Result<Self, PolicyError>;
}

/// The questions asked of a policy value. Defaults answer for a policy that
/// needs no scores, keeps the same count in every head and compresses by the
/// usual triggers; a policy overrides what it does differently.
pub(super) trait PolicyKind {
    /// Tokens kept per layer on average; `None` for a policy that never evicts.
    fn budget(&self) -> Option<usize>;

    /// Sets the budget to `budget` tokens (the floor, under a relative budget);
    /// a policy without one ignores it.
    fn set_budget(&mut self, budget: usize);

    /// Tokens `layer` of `n_layer` keeps; the budget unless the policy has a schedule.
    fn layer_budget(&self, _layer: usize, _n_layer: usize) -> Option<usize> {
        self.budget()
    }

    /// The most entries one KV head of `layer` can keep after a compression,
    /// with `n_kv` heads; the layer budget unless heads keep different counts.
    fn head_capacity(&self, layer: usize, n_layer: usize, _n_kv: usize) -> Option<usize> {
        self.layer_budget(layer, n_layer)
    }

    /// Whether KV heads keep different counts.
    fn is_head_wise(&self) -> bool {
        false
    }

    /// Newest entries always kept.
    fn window(&self) -> usize;

    /// The key that sets [`PolicyKind::window`], as errors name it.
    fn window_key(&self) -> &'static str {
        "window"
    }

    /// Decode tokens between two compressions.
    fn every(&self) -> usize;

    /// Whether the prompt is brought to budget while it is read.
    fn compresses_prompt(&self) -> bool;

    /// Whether an over-budget cache compresses now, `tokens_since_last`
    /// after the last compression (`in_prefill`: a prompt chunk was just read).
    fn triggers(&self, tokens_since_last: usize, in_prefill: bool) -> bool {
        if in_prefill {
            self.compresses_prompt()
        } else {
            tokens_since_last >= self.every()
        }
    }

    /// Whether selection ranks by the attention each entry accumulated.
    fn needs_cumulative(&self) -> bool {
        false
    }

    /// Whether selection scores by the attention rows of the last `window` queries.
    fn needs_recent_rows(&self) -> bool {
        false
    }

    /// Whether selection reads the cached keys (every query-aware policy does).
    fn needs_keys(&self) -> bool {
        self.needs_queries()
    }

    /// Whether selection reads the cached values.
    fn needs_values(&self) -> bool {
        false
    }

    /// Whether selection reads the statistics of the queries since the last compression.
    fn needs_queries(&self) -> bool {
        false
    }

    /// Checks the parameters' consistency; messages name the key and value.
    fn validate(&self) -> Result<(), PolicyError>;

    /// Checks every size a request sets (budget, the always-kept window, the
    /// decode interval) against the model's context.
    fn check_context(&self, context_length: usize) -> Result<(), PolicyError> {
        let over = |key: &'static str, value: usize| {
            if value > context_length {
                Err(PolicyError::OverContext {
                    key,
                    value,
                    context_length,
                })
            } else {
                Ok(())
            }
        };
        if let Some(budget) = self.budget() {
            over("budget", budget)?;
        }
        over(self.window_key(), self.window())?;
        over("every", self.every())
    }

    /// Which entries of one layer of one sequence to keep (see [`super::select`]).
    fn select(&self, input: &ScoreInput) -> KeepSet;

    /// Writes the canonical spec: the name and every key, in the order of its keys.
    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

/// The rule every fixed-budget policy's selection shares: a layer holding no
/// more than its budget keeps everything; otherwise `over` chooses, given the
/// layer's budget.
pub(super) fn within_budget(
    kind: &impl PolicyKind,
    input: &ScoreInput,
    over: impl FnOnce(usize) -> KeepSet,
) -> KeepSet {
    match kind.layer_budget(input.layer, input.n_layer) {
        Some(budget) if input.n_cached > budget => over(budget),
        _ => KeepSet::all(input.n_kv(), input.n_cached),
    }
}

/// The five answers every budgeted, windowed policy gives straight from its
/// fields (`budget`, the window field named, `every`, `prefill`), written
/// once: `budgeted_answers!(window);` inside its `impl PolicyKind`.
macro_rules! budgeted_answers {
    ($window:ident) => {
        fn budget(&self) -> Option<usize> {
            Some(self.budget)
        }

        fn set_budget(&mut self, budget: usize) {
            self.budget = budget;
        }

        fn window(&self) -> usize {
            self.$window
        }

        fn every(&self) -> usize {
            self.every
        }

        fn compresses_prompt(&self) -> bool {
            self.prefill
        }
    };
}
pub(super) use budgeted_answers;
