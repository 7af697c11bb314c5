//! H2O (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative
//! Inference of Large Language Models"): every cached token accumulates the
//! attention it receives; keep the `budget - recent` heaviest of the older tokens
//! plus the `recent` newest.
//!
//! Owns the parameters, the selection and the policy's answers (its keys, its
//! checks, that it needs accumulated attention). The accumulated scores come
//! from the cache ([`super::ScoreInput::cumulative`], already combined over the
//! GQA group); this file only ranks them.

use std::fmt;

use super::items::{below_budget, positive, Items, Key, BUDGET, EVERY, PREFILL};
use super::kind::{budgeted_answers, within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::{top_plus_window, KeepSet, PolicyError, ScoreInput, DEFAULT_BUDGET};

/// The newest tokens always kept (H2O's name for its window).
const RECENT: Key = Key {
    name: "recent",
    expected: "a non-negative integer",
};

/// Default `recent` for a given `budget`: half of it, H2O's reference split
/// (half heavy hitters, half recent). On SmolLM2 it beat the earlier fixed 32 at
/// budgets 128 and 512 (docs/KV.md, "Reference settings").
pub fn default_recent(budget: usize) -> usize {
    budget / 2
}
/// Default `every`: compress each step once over budget, as the paper evicts per token.
pub const DEFAULT_EVERY: usize = 1;

/// Parameters of [`super::KvPolicy::H2o`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2oParams {
    /// Tokens kept per layer and KV head (>= 1).
    pub budget: usize,
    /// Newest tokens always kept (< `budget`; 0 keeps heavy hitters only; a spec
    /// without it takes [`default_recent`] of its budget).
    pub recent: usize,
    /// In decode, compress back to budget every `every` generated tokens (>= 1).
    pub every: usize,
    /// Compress the prompt once it is read (each prefill chunk's accumulated
    /// attention is exactly H2O's score), rather than at the first decode step.
    pub prefill: bool,
}

impl Default for H2oParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            recent: default_recent(DEFAULT_BUDGET),
            every: DEFAULT_EVERY,
            prefill: true,
        }
    }
}

/// Per head: the `recent` newest entries plus the heaviest `budget - recent` others
/// by accumulated attention (a missing head or entry scores 0).
pub(super) fn select(p: &H2oParams, input: &ScoreInput) -> KeepSet {
    let mut order = Vec::with_capacity(input.n_cached);
    let per_head = (0..input.n_kv())
        .map(|h| {
            let scores = input.cumulative.get(h).map_or(&[][..], Vec::as_slice);
            top_plus_window(scores, input.n_cached, p.budget, p.recent, &mut order)
        })
        .collect();
    KeepSet { per_head }
}

impl NamedPolicy for H2oParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "h2o",
        keys: &[BUDGET, RECENT, EVERY, PREFILL],
        help: "heavy hitters by accumulated attention plus the newest tokens",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        let budget = p.usize(&BUDGET, d.budget)?;
        Ok(Self {
            budget,
            recent: p.usize(&RECENT, default_recent(budget))?,
            every: p.usize(&EVERY, d.every)?,
            prefill: p.bool(&PREFILL, d.prefill)?,
        })
    }
}

impl PolicyKind for H2oParams {
    budgeted_answers!(recent);

    fn window_key(&self) -> &'static str {
        RECENT.name
    }

    fn needs_cumulative(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        positive(&BUDGET, self.budget)?;
        below_budget(RECENT.name, self.recent, self.budget)?;
        positive(&EVERY, self.every)
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        within_budget(self, input, |_| select(self, input))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::SPEC.name;
        write!(
            f,
            "{name}:budget={},recent={},every={},prefill={}",
            self.budget, self.recent, self.every, self.prefill
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select as select_policy, KvPolicy};
    use super::*;

    fn run(p: H2oParams, cumulative: &[Vec<f32>]) -> KeepSet {
        let c = cumulative[0].len();
        let pos = positions(cumulative.len(), c);
        select_policy(
            &KvPolicy::H2o(p),
            &ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: c,
                positions: &pos,
                cumulative,
                recent_rows: &[],
                keys: &[],
                values: &[],
                queries: None,
                head_dim: 0,
            },
        )
    }

    fn params(budget: usize, recent: usize) -> H2oParams {
        H2oParams {
            budget,
            recent,
            every: 1,
            prefill: true,
        }
    }

    #[test]
    fn keeps_heavy_hitters_and_recent() {
        // Heavy hitters at 2 and 7; the recent entries (10, 11) score low but stay.
        let mut scores = vec![0.1f32; 12];
        scores[2] = 5.0;
        scores[7] = 3.0;
        scores[5] = 1.0;
        scores[10] = 0.0;
        let keep = run(params(5, 2), &[scores]);
        assert_well_formed(&keep, 1, 12, 5);
        assert_eq!(keep.per_head[0], [2, 5, 7, 10, 11]);
    }

    #[test]
    fn recent_entries_do_not_take_heavy_hitter_slots() {
        // The newest entries are the heaviest, yet the 2 heavy-hitter slots go to
        // the best non-recent entries.
        let scores = vec![0.0, 0.3, 0.2, 0.1, 9.0, 9.0];
        let keep = run(params(4, 2), &[scores]);
        assert_eq!(keep.per_head[0], [1, 2, 4, 5]);
    }

    #[test]
    fn heads_choose_independently() {
        let a = vec![9.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let b = vec![0.0, 0.0, 0.0, 9.0, 0.0, 0.0];
        let keep = run(params(3, 2), &[a, b]);
        assert_well_formed(&keep, 2, 6, 3);
        assert_eq!(keep.per_head[0], [0, 4, 5]);
        assert_eq!(keep.per_head[1], [3, 4, 5]);
    }

    #[test]
    fn ties_keep_older_entries() {
        let keep = run(params(3, 1), &[vec![1.0; 8]]);
        assert_eq!(keep.per_head[0], [0, 1, 7]);
    }

    #[test]
    fn zero_recent_is_pure_heavy_hitters() {
        let keep = run(params(2, 0), &[vec![0.0, 2.0, 0.0, 0.0, 1.0, 0.0]]);
        assert_eq!(keep.per_head[0], [1, 4]);
    }

    #[test]
    fn under_budget_keeps_all() {
        assert_eq!(run(params(4, 1), &[vec![0.0; 4]]), KeepSet::all(1, 4));
    }
}
