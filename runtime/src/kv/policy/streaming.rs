//! StreamingLLM (Xiao et al. 2023, "Efficient Streaming Language Models with
//! Attention Sinks"): keep the first `sink` tokens, which soak up attention
//! whatever their content, and a rolling window of the most recent
//! `budget - sink`.
//!
//! Owns the policy's parameters, its selection and its answers (its keys, its
//! checks, every step once over budget); needs no scores at all, which is why
//! it is also the policy the llama.cpp backend can honour.

use std::fmt;

use super::items::{below_budget, positive, Items, BUDGET, SINK};
use super::kind::{within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::{KeepSet, PolicyError, ScoreInput, DEFAULT_BUDGET};

/// Default `sink`: the paper's four initial tokens.
pub const DEFAULT_SINK: usize = 4;

/// Parameters of [`super::KvPolicy::Streaming`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamingParams {
    /// Tokens kept per layer and KV head, sinks included (>= 1).
    pub budget: usize,
    /// Initial tokens always kept as attention sinks (< `budget`; 0 is a plain sliding window).
    pub sink: usize,
}

impl Default for StreamingParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            sink: DEFAULT_SINK,
        }
    }
}

/// Keeps entries `0..sink` and the last `budget - sink` of `n_cached`, for every head.
/// Cached entries are sorted by position, so the lowest indices are the oldest tokens.
pub(super) fn select(p: &StreamingParams, n_kv: usize, n_cached: usize) -> KeepSet {
    if n_cached <= p.budget {
        return KeepSet::all(n_kv, n_cached);
    }
    let sink = p.sink.min(p.budget);
    let recent = p.budget - sink;
    let keep: Vec<usize> = (0..sink).chain(n_cached - recent..n_cached).collect();
    KeepSet {
        per_head: vec![keep; n_kv],
    }
}

impl NamedPolicy for StreamingParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "streaming",
        keys: &[BUDGET, SINK],
        help: "attention sinks plus a rolling window; needs no scores",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        Ok(Self {
            budget: p.usize(&BUDGET, d.budget)?,
            sink: p.usize(&SINK, d.sink)?,
        })
    }
}

impl PolicyKind for StreamingParams {
    fn budget(&self) -> Option<usize> {
        Some(self.budget)
    }

    fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
    }

    /// Everything past the sinks.
    fn window(&self) -> usize {
        self.budget.saturating_sub(self.sink)
    }

    /// A rolling window trims every step.
    fn every(&self) -> usize {
        1
    }

    fn compresses_prompt(&self) -> bool {
        true
    }

    /// Whenever over budget, prefill or decode.
    fn triggers(&self, _tokens_since_last: usize, _in_prefill: bool) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        positive(&BUDGET, self.budget)?;
        below_budget(SINK.name, self.sink, self.budget)
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        within_budget(self, input, |_| select(self, input.n_kv(), input.n_cached))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::SPEC.name;
        write!(f, "{name}:budget={},sink={}", self.budget, self.sink)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select as select_policy, KvPolicy, ScoreInput};
    use super::*;

    fn run(budget: usize, sink: usize, c: usize, n_kv: usize) -> KeepSet {
        let pos = positions(n_kv, c);
        let policy = KvPolicy::Streaming(StreamingParams { budget, sink });
        select_policy(
            &policy,
            &ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: c,
                positions: &pos,
                cumulative: &[],
                recent_rows: &[],
                keys: &[],
                values: &[],
                queries: None,
                head_dim: 0,
            },
        )
    }

    #[test]
    fn keeps_sinks_and_recent() {
        let keep = run(6, 2, 20, 2);
        assert_well_formed(&keep, 2, 20, 6);
        assert_eq!(keep.per_head[0], [0, 1, 16, 17, 18, 19]);
        assert_eq!(keep.per_head[1], keep.per_head[0]);
    }

    #[test]
    fn zero_sink_is_a_sliding_window() {
        assert_eq!(run(3, 0, 10, 1).per_head[0], [7, 8, 9]);
    }

    #[test]
    fn one_over_budget_drops_the_oldest_non_sink() {
        assert_eq!(run(4, 1, 5, 1).per_head[0], [0, 2, 3, 4]);
    }

    #[test]
    fn under_budget_keeps_all() {
        assert_eq!(run(8, 4, 8, 3), KeepSet::all(3, 8));
        assert_eq!(run(8, 4, 0, 3), KeepSet::all(3, 0));
    }

    #[test]
    fn inconsistent_params_do_not_panic() {
        // sink >= budget is rejected by validation; selection still clamps safely.
        let keep = select(
            &StreamingParams {
                budget: 3,
                sink: 10,
            },
            1,
            8,
        );
        assert_eq!(keep.per_head[0], [0, 1, 2]);
    }
}
