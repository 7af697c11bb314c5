//! PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on
//! Pyramidal Information Funneling"): lower layers spread attention widely, upper
//! layers focus on few tokens, so give lower layers more of the cache. SnapKV's
//! scoring with a budget that falls linearly from the first layer to the last,
//! averaging `budget` so the total matches SnapKV's.
//!
//! Owns the parameters, the per-layer schedule and the policy's answers (its
//! keys, its checks, its per-layer budget); selection is SnapKV's (`snapkv.rs`)
//! at this layer's budget.
//!
//! Schedule: the last layer gets `budget * min_ratio`, the first
//! `budget * (2 - min_ratio)`, the layers between lie on the line joining them.
//! Each layer takes the floor of its real budget and the few tokens the floors lose
//! go one each to the first layers, so budgets stay integers, never increase with
//! depth, stay within one token of the line and sum to exactly `n_layer * budget`.

use std::fmt;

use super::items::{bad, positive, Items, Key, BUDGET, EVERY, PREFILL, WINDOW};
use super::kind::{budgeted_answers, within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::snapkv::{
    check_scored, select_pooled, Pool, DEFAULT_EVERY, DEFAULT_KERNEL, DEFAULT_WINDOW, KERNEL, POOL,
};
use super::{KeepSet, PolicyError, ScoreInput, DEFAULT_BUDGET};

/// The last layer's share of the mean budget.
const MIN_RATIO: Key = Key {
    name: "min_ratio",
    expected: "a number in (0, 1]",
};

/// Default `min_ratio`: the last layer keeps half the mean budget (the first keeps
/// 1.5x). Gentler than the reference's steepest setting (its last layer gets about
/// 1/20 of the budget, tuned for long-prompt prefill) because our budgets also carry
/// long decoded reasoning, where upper layers still need recall; lower it at will.
pub const DEFAULT_MIN_RATIO: f32 = 0.5;

/// Slack so a real budget that should be an integer is not floored one below it.
const FLOOR_EPS: f64 = 1e-9;

/// Parameters of [`super::KvPolicy::PyramidKv`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PyramidKvParams {
    /// Mean tokens kept per layer and KV head (>= 1); the total over layers is
    /// `n_layer * budget`.
    pub budget: usize,
    /// Observation queries, always kept (>= 1, below the last layer's budget).
    pub window: usize,
    /// Pooling width along the sequence (odd, >= 1).
    pub kernel: usize,
    /// Pooling kind.
    pub pool: Pool,
    /// The last (smallest) layer's budget as a fraction of `budget`, in `(0, 1]`;
    /// 1 gives every layer `budget`, i.e. plain SnapKV.
    pub min_ratio: f32,
    /// In decode, compress back to budget every `every` generated tokens (>= 1).
    pub every: usize,
    /// Compress the prompt at prefill end.
    pub prefill: bool,
}

impl Default for PyramidKvParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            window: DEFAULT_WINDOW,
            kernel: DEFAULT_KERNEL,
            pool: Pool::Max,
            min_ratio: DEFAULT_MIN_RATIO,
            every: DEFAULT_EVERY,
            prefill: true,
        }
    }
}

impl PyramidKvParams {
    /// Tokens layer `layer` of `n_layer` keeps (see the file header). A single layer
    /// keeps `budget`; a `layer` past the end is treated as the last.
    pub fn layer_budget(&self, layer: usize, n_layer: usize) -> usize {
        if n_layer <= 1 {
            return self.budget;
        }
        let layer = layer.min(n_layer - 1);
        let floor = |l: usize| (self.real_budget(l, n_layer) + FLOOR_EPS).floor() as usize;
        // Saturating: an absurd budget must not overflow, whatever it gives.
        let floors = (0..n_layer).map(floor).fold(0, usize::saturating_add);
        let extra = self.budget.saturating_mul(n_layer).saturating_sub(floors);
        floor(layer) + usize::from(layer < extra)
    }

    /// The last layer's budget, the smallest of all: `floor(budget * min_ratio)`.
    pub fn min_layer_budget(&self) -> usize {
        (self.budget as f64 * self.ratio() + FLOOR_EPS).floor() as usize
    }

    /// Layer `l`'s budget on the line, before rounding.
    fn real_budget(&self, l: usize, n_layer: usize) -> f64 {
        let mean = self.budget as f64;
        let low = mean * self.ratio();
        let high = 2.0 * mean - low;
        high - (high - low) * l as f64 / (n_layer - 1) as f64
    }

    /// `min_ratio` forced into `(0, 1]` so a hand-built, unvalidated value cannot
    /// produce nonsense budgets (validation rejects it first).
    fn ratio(&self) -> f64 {
        let r = f64::from(self.min_ratio);
        if r.is_finite() && r > 0.0 {
            r.min(1.0)
        } else {
            1.0
        }
    }
}

impl NamedPolicy for PyramidKvParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "pyramidkv",
        keys: &[BUDGET, WINDOW, KERNEL, POOL, MIN_RATIO, EVERY, PREFILL],
        help: "SnapKV with a per-layer budget that falls linearly with depth",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        Ok(Self {
            budget: p.usize(&BUDGET, d.budget)?,
            window: p.usize(&WINDOW, d.window)?,
            kernel: p.usize(&KERNEL, d.kernel)?,
            pool: p.value(&POOL, d.pool, Pool::from_spec)?,
            min_ratio: p.f32(&MIN_RATIO, d.min_ratio)?,
            every: p.usize(&EVERY, d.every)?,
            prefill: p.bool(&PREFILL, d.prefill)?,
        })
    }
}

impl PolicyKind for PyramidKvParams {
    budgeted_answers!(window);

    /// The linear schedule, largest at layer 0.
    fn layer_budget(&self, layer: usize, n_layer: usize) -> Option<usize> {
        Some(PyramidKvParams::layer_budget(self, layer, n_layer))
    }

    fn needs_recent_rows(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_scored(self.budget, self.window, self.kernel)?;
        let r = self.min_ratio;
        if !(r > 0.0 && r <= 1.0) {
            return Err(bad(&MIN_RATIO, r));
        }
        let last = self.min_layer_budget();
        if last <= self.window {
            return Err(PolicyError::LastLayerTooSmall {
                min_ratio: r,
                last,
                window: self.window,
            });
        }
        positive(&EVERY, self.every)
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        within_budget(self, input, |budget| {
            select_pooled(budget, self.window, self.kernel, self.pool, input)
        })
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::SPEC.name;
        write!(
            f,
            "{name}:budget={},window={},kernel={},pool={},min_ratio={},every={},prefill={}",
            self.budget,
            self.window,
            self.kernel,
            self.pool.as_str(),
            self.min_ratio,
            self.every,
            self.prefill
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select, KeepSet, KvPolicy, ScoreInput, SnapKvParams};
    use super::*;

    fn params(budget: usize, min_ratio: f32) -> PyramidKvParams {
        PyramidKvParams {
            budget,
            window: 2,
            kernel: 1,
            min_ratio,
            ..PyramidKvParams::default()
        }
    }

    #[test]
    fn budgets_fall_linearly_and_average_to_budget() {
        for budget in [1, 7, 37, 100, 256, 512] {
            for ratio in [0.05f32, 0.1, 0.33, 0.5, 0.9, 1.0] {
                for n_layer in [1, 2, 3, 7, 24, 30, 32, 80] {
                    let p = params(budget, ratio);
                    let b: Vec<usize> = (0..n_layer).map(|l| p.layer_budget(l, n_layer)).collect();
                    let what = format!("budget={budget} ratio={ratio} n_layer={n_layer}: {b:?}");
                    assert_eq!(b.iter().sum::<usize>(), n_layer * budget, "{what}");
                    assert!(b.windows(2).all(|w| w[0] >= w[1]), "{what}");
                    if n_layer == 1 {
                        assert_eq!(b, [budget]);
                        continue;
                    }
                    for (l, &bl) in b.iter().enumerate() {
                        let real = p.real_budget(l, n_layer);
                        assert!((bl as f64 - real).abs() <= 1.0, "{what}");
                    }
                    assert_eq!(b[n_layer - 1], p.min_layer_budget(), "{what}");
                }
            }
        }
    }

    #[test]
    fn known_schedules() {
        let p = params(256, 0.5);
        let b: Vec<usize> = (0..5).map(|l| p.layer_budget(l, 5)).collect();
        assert_eq!(b, [384, 320, 256, 192, 128]);
        assert_eq!(
            p.layer_budget(99, 5),
            128,
            "past the end acts as the last layer"
        );
        let p = params(10, 0.5);
        let b: Vec<usize> = (0..4).map(|l| p.layer_budget(l, 4)).collect();
        // Line: 15, 11.67, 8.33, 5 -> floors 15, 11, 8, 5 (39) + 1 to layer 0.
        assert_eq!(b, [16, 11, 8, 5]);
        assert_eq!(params(10, 1.0).layer_budget(0, 4), 10);
    }

    #[test]
    fn first_layer_keeps_more_than_last_with_snapkv_choice() {
        let (c, n_layer) = (24, 3);
        let pos = positions(1, c);
        // Candidate importance falls with index, so each layer keeps its oldest ones.
        let rows = vec![vec![(0..c)
            .map(|i| 1.0 / (i + 1) as f32)
            .collect::<Vec<_>>()]];
        let p = params(8, 0.5); // layer budgets 12, 8, 4
        let policy = KvPolicy::PyramidKv(p);
        let keep = |layer: usize, policy: &KvPolicy| -> KeepSet {
            let input = ScoreInput {
                layer,
                n_layer,
                n_cached: c,
                positions: &pos,
                cumulative: &[],
                recent_rows: &rows,
                keys: &[],
                values: &[],
                queries: None,
                head_dim: 0,
            };
            select(policy, &input)
        };
        let counts: Vec<usize> = (0..n_layer).map(|l| keep(l, &policy).kept()).collect();
        assert_eq!(counts, [12, 8, 4]);
        for (l, &budget) in counts.iter().enumerate() {
            let snap = KvPolicy::SnapKv(SnapKvParams {
                budget,
                window: 2,
                kernel: 1,
                ..SnapKvParams::default()
            });
            let got = keep(l, &policy);
            assert_well_formed(&got, 1, c, budget);
            assert_eq!(got, keep(l, &snap), "layer {l} is SnapKV at its budget");
        }
        assert_eq!(keep(2, &policy).per_head[0], [0, 1, 22, 23]);
    }

    #[test]
    fn ratio_one_is_snapkv() {
        let p = params(6, 1.0);
        assert!((0..12).all(|l| p.layer_budget(l, 12) == 6));
    }
}
