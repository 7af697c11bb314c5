//! SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before
//! Generation"): the last `window` queries already attend to what generation will
//! need. Average their attention over the older entries, pool it along the
//! sequence so a chosen token keeps its neighbours, and keep the top
//! `budget - window` plus the window itself.
//!
//! Owns SnapKV's parameters, [`Pool`], and the scoring PyramidKV (same scoring,
//! per-layer budget) and R-KV (same importance, minus redundancy) reuse. The
//! attention rows come from the cache ([`super::ScoreInput::recent_rows`], already
//! combined over the GQA group). Also owns the policy's answers (its keys, its
//! checks, that it needs the recent attention rows) and the pooling keys and
//! checks PyramidKV and R-KV share ([`KERNEL`], [`POOL`], [`check_scored`]).
//!
//! Scoring details, per KV head:
//! - importance of entry `i` = sum over the recent rows of `row[i]` divided by the
//!   number of rows; a row shorter than `i + 1` (a query older than the entry)
//!   contributes 0, as the entry did not exist for it;
//! - only the candidates (entries before the window) are scored and pooled, as in
//!   SnapKV's reference, so the window's own high self-attention does not spill
//!   onto the last candidates;
//! - pooling is 1-D over the candidates, kernel `k` centred, stride 1, same length,
//!   as the references' `max_pool1d` / `avg_pool1d` with padding `k / 2`: `max`
//!   takes the largest in-range neighbour (edge padding never wins, as with
//!   PyTorch's -inf padding) and `avg` divides the in-range sum by `k` always (zero
//!   padding counted, PyTorch's `count_include_pad` default that SnapKV's reference
//!   uses), so edge entries are slightly damped.

use std::fmt;

use super::items::{bad, below_budget, positive, Items, Key, BUDGET, EVERY, PREFILL, WINDOW};
use super::kind::{budgeted_answers, within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::{top_plus_window, KeepSet, PolicyError, Ranked, ScoreInput, DEFAULT_BUDGET};

/// Widest pooling `kernel` (snapkv, pyramidkv, rkv, adakv's inner): pooling
/// costs `kernel` operations per cached entry on the engine thread, and the
/// papers use 5 to 13, so 63 is generous and still cheap.
pub const MAX_KERNEL: usize = 63;
/// Pooling width, odd so it is centred, at most [`MAX_KERNEL`].
pub(super) const KERNEL: Key = Key {
    name: "kernel",
    expected: "an odd integer from 1 to 63",
};
/// Pooling kind, [`Pool`].
pub(super) const POOL: Key = Key {
    name: "pool",
    expected: "`max` or `avg`",
};

/// Default `window`: observation queries, always kept (Sparse-RL's setting).
pub const DEFAULT_WINDOW: usize = 8;
/// Default `kernel`: pooling width (odd, so it is centred).
pub const DEFAULT_KERNEL: usize = 7;
/// Default `every`: decode tokens between compressions (Sparse-RL's setting).
pub const DEFAULT_EVERY: usize = 128;

/// How importance is pooled along the sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pool {
    /// Largest score in the kernel: a spike protects its whole neighbourhood.
    #[default]
    Max,
    /// Mean over the kernel (zero padded): smoother, favours dense regions.
    Avg,
}

impl Pool {
    /// The spelling used in spec strings: `max` or `avg`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pool::Max => "max",
            Pool::Avg => "avg",
        }
    }

    /// The pooling a spec spells `max` or `avg`.
    pub(super) fn from_spec(s: &str) -> Option<Self> {
        match s {
            "max" => Some(Pool::Max),
            "avg" => Some(Pool::Avg),
            _ => None,
        }
    }
}

/// Parameters of [`super::KvPolicy::SnapKv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapKvParams {
    /// Tokens kept per layer and KV head (>= 1).
    pub budget: usize,
    /// Observation queries whose attention scores the cache; their entries are always
    /// kept (1 <= window < budget).
    pub window: usize,
    /// Pooling width along the sequence (odd, >= 1; 1 disables pooling).
    pub kernel: usize,
    /// Pooling kind.
    pub pool: Pool,
    /// In decode, compress back to budget every `every` generated tokens (>= 1).
    pub every: usize,
    /// Compress the prompt at prefill end (SnapKV's own use).
    pub prefill: bool,
}

impl Default for SnapKvParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            window: DEFAULT_WINDOW,
            kernel: DEFAULT_KERNEL,
            pool: Pool::Max,
            every: DEFAULT_EVERY,
            prefill: true,
        }
    }
}

/// Per head: the last `window` entries plus the `budget - window` candidates with
/// the highest pooled importance. Shared by SnapKV and PyramidKV (its layer budget).
pub(super) fn select_pooled(
    budget: usize,
    window: usize,
    kernel: usize,
    pool: Pool,
    input: &ScoreInput,
) -> KeepSet {
    let c = input.n_cached;
    let n_cand = c - window.min(budget).min(c);
    let mut scratch = Scratch::new(n_cand);
    let per_head = (0..input.n_kv())
        .map(|h| {
            pooled_importance(input, h, n_cand, kernel, pool, &mut scratch);
            top_plus_window(&scratch.pooled, c, budget, window, &mut scratch.order)
        })
        .collect();
    KeepSet { per_head }
}

/// Buffers reused across heads so scoring a layer allocates once.
pub(super) struct Scratch {
    /// Raw importance of the candidates, `[n_cand]`.
    pub(super) raw: Vec<f32>,
    /// Pooled importance of the candidates, `[n_cand]`; the result.
    pub(super) pooled: Vec<f32>,
    /// Ranking scratch for the top-k selection.
    pub(super) order: Vec<Ranked>,
}

impl Scratch {
    /// Buffers sized for `n_cand` candidates.
    pub(super) fn new(n_cand: usize) -> Self {
        Self {
            raw: Vec::with_capacity(n_cand),
            pooled: Vec::with_capacity(n_cand),
            order: Vec::with_capacity(n_cand),
        }
    }
}

/// Head `h`'s importance of the first `n_cand` entries, pooled, into `scratch.pooled`.
pub(super) fn pooled_importance(
    input: &ScoreInput,
    h: usize,
    n_cand: usize,
    kernel: usize,
    pool: Pool,
    scratch: &mut Scratch,
) {
    let rows = input.recent_rows.get(h).map_or(&[][..], Vec::as_slice);
    mean_attention(rows, n_cand, &mut scratch.raw);
    pool_1d(&scratch.raw, kernel, pool, &mut scratch.pooled);
}

/// `out[i]` = mean over `rows` of `row[i]` for `i < n`, a row too short for `i`
/// counting 0. All zeros when there are no rows.
fn mean_attention(rows: &[Vec<f32>], n: usize, out: &mut Vec<f32>) {
    out.clear();
    out.resize(n, 0.0);
    for row in rows {
        for (o, &a) in out.iter_mut().zip(row) {
            *o += a;
        }
    }
    if rows.len() > 1 {
        let inv = 1.0 / rows.len() as f32;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

/// 1-D pooling of `xs`, kernel `kernel` (centred; an even kernel reaches one further
/// to the right, 0 acts as 1), stride 1, same length; padding as in the file header.
pub(super) fn pool_1d(xs: &[f32], kernel: usize, pool: Pool, out: &mut Vec<f32>) {
    let n = xs.len();
    out.clear();
    let left = kernel.max(1).saturating_sub(1) / 2;
    let right = kernel.max(1).saturating_sub(1) - left;
    if left == 0 && right == 0 {
        out.extend_from_slice(xs);
        return;
    }
    // Direct sums per output rather than a running sum: kernels are small (7 by
    // default) and exact sums keep ties exact, so tie-breaking stays by index.
    let inv = 1.0 / kernel as f32;
    out.extend((0..n).map(|i| {
        let span = &xs[i.saturating_sub(left)..i.saturating_add(right).saturating_add(1).min(n)];
        match pool {
            Pool::Max => span.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            Pool::Avg => span.iter().sum::<f32>() * inv,
        }
    }));
}

/// Checks shared by the attention-scored policies (snapkv, pyramidkv, rkv):
/// a budget, a window below it, an odd kernel no wider than [`MAX_KERNEL`].
pub(super) fn check_scored(budget: usize, window: usize, kernel: usize) -> Result<(), PolicyError> {
    positive(&BUDGET, budget)?;
    positive(&WINDOW, window)?;
    below_budget(WINDOW.name, window, budget)?;
    if kernel.is_multiple_of(2) || kernel > MAX_KERNEL {
        return Err(bad(&KERNEL, kernel));
    }
    Ok(())
}

impl NamedPolicy for SnapKvParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "snapkv",
        keys: &[BUDGET, WINDOW, KERNEL, POOL, EVERY, PREFILL],
        help: "importance from the attention of the last `window` queries, pooled",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        Ok(Self {
            budget: p.usize(&BUDGET, d.budget)?,
            window: p.usize(&WINDOW, d.window)?,
            kernel: p.usize(&KERNEL, d.kernel)?,
            pool: p.value(&POOL, d.pool, Pool::from_spec)?,
            every: p.usize(&EVERY, d.every)?,
            prefill: p.bool(&PREFILL, d.prefill)?,
        })
    }
}

impl PolicyKind for SnapKvParams {
    budgeted_answers!(window);

    fn needs_recent_rows(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_scored(self.budget, self.window, self.kernel)?;
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
            "{name}:budget={},window={},kernel={},pool={},every={},prefill={}",
            self.budget,
            self.window,
            self.kernel,
            self.pool.as_str(),
            self.every,
            self.prefill
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select as select_policy, KvPolicy};
    use super::*;

    fn params(budget: usize, window: usize, kernel: usize, pool: Pool) -> KvPolicy {
        KvPolicy::SnapKv(SnapKvParams {
            budget,
            window,
            kernel,
            pool,
            ..SnapKvParams::default()
        })
    }

    fn run(policy: &KvPolicy, c: usize, rows: &[Vec<Vec<f32>>]) -> KeepSet {
        let pos = positions(rows.len(), c);
        select_policy(
            policy,
            &ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: c,
                positions: &pos,
                cumulative: &[],
                recent_rows: rows,
                keys: &[],
                values: &[],
                queries: None,
                head_dim: 0,
            },
        )
    }

    /// One row over `c` entries with the given (index, attention) spikes.
    fn row(c: usize, spikes: &[(usize, f32)]) -> Vec<f32> {
        let mut r = vec![0.0; c];
        for &(i, a) in spikes {
            r[i] = a;
        }
        r
    }

    #[test]
    fn keeps_what_the_window_attends_to() {
        // 12 entries, window 2 (entries 10, 11), 3 slots for candidates 0..10.
        let rows = vec![vec![
            row(12, &[(1, 0.5), (4, 0.2), (8, 0.1), (11, 0.9)]),
            row(12, &[(1, 0.3), (4, 0.4), (6, 0.3), (11, 0.9)]),
        ]];
        let keep = run(&params(5, 2, 1, Pool::Max), 12, &rows);
        assert_well_formed(&keep, 1, 12, 5);
        // Means: 1 -> 0.4, 4 -> 0.3, 6 -> 0.15, 8 -> 0.05.
        assert_eq!(keep.per_head[0], [1, 4, 6, 10, 11]);
    }

    #[test]
    fn pooling_keeps_a_spikes_neighbour_over_an_isolated_medium_score() {
        // A spike at 2 and an isolated medium score at 6; 3 candidate slots.
        let rows = vec![vec![row(12, &[(2, 1.0), (6, 0.5)])]];
        // Without pooling: the spike, the medium one, then a zero (lowest index).
        let keep = run(&params(5, 2, 1, Pool::Max), 12, &rows);
        assert_eq!(keep.per_head[0], [0, 2, 6, 10, 11]);
        // Kernel 3 spreads the spike to 1 and 3, which outrank the medium score.
        for pool in [Pool::Max, Pool::Avg] {
            let keep = run(&params(5, 2, 3, pool), 12, &rows);
            assert_eq!(keep.per_head[0], [1, 2, 3, 10, 11], "{pool:?}");
        }
    }

    #[test]
    fn heads_choose_independently() {
        let rows = vec![
            vec![row(10, &[(2, 1.0)])],
            vec![row(10, &[(5, 1.0)])],
            vec![row(10, &[(0, 0.2), (7, 0.8)])],
        ];
        let keep = run(&params(3, 2, 1, Pool::Max), 10, &rows);
        assert_well_formed(&keep, 3, 10, 3);
        assert_eq!(keep.per_head[0], [2, 8, 9]);
        assert_eq!(keep.per_head[1], [5, 8, 9]);
        assert_eq!(keep.per_head[2], [7, 8, 9]);
    }

    #[test]
    fn short_rows_count_missing_entries_as_zero() {
        // The first query predates entries 4.. ; the mean divides by both rows, so
        // entry 5 (0.6 / 2 = 0.3) loses to entry 1 ((0.2 + 0.5) / 2 = 0.35).
        let rows = vec![vec![
            vec![0.0, 0.2, 0.0, 0.0],
            row(10, &[(1, 0.5), (5, 0.6)]),
        ]];
        let keep = run(&params(3, 2, 1, Pool::Max), 10, &rows);
        assert_eq!(keep.per_head[0], [1, 8, 9]);
    }

    #[test]
    fn pool_shapes_and_edges() {
        let mut out = Vec::new();
        let xs = [3.0, 0.0, 0.0, 0.0, 6.0];
        pool_1d(&xs, 3, Pool::Max, &mut out);
        assert_eq!(out, [3.0, 3.0, 0.0, 6.0, 6.0]);
        pool_1d(&xs, 3, Pool::Avg, &mut out);
        assert_eq!(out, [1.0, 1.0, 0.0, 2.0, 2.0]);
        pool_1d(&xs, 1, Pool::Avg, &mut out);
        assert_eq!(out, xs);
        // A kernel wider than the input still pools over what exists.
        pool_1d(&xs, 11, Pool::Max, &mut out);
        assert_eq!(out, [6.0; 5]);
        pool_1d(&xs, 11, Pool::Avg, &mut out);
        assert!(
            out.iter().all(|&v| (v - 9.0 / 11.0).abs() < 1e-6),
            "{out:?}"
        );
        pool_1d(&[], 7, Pool::Avg, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn no_rows_keeps_oldest_candidates() {
        let keep = run(&params(4, 2, 7, Pool::Max), 9, &[vec![]]);
        assert_eq!(keep.per_head[0], [0, 1, 7, 8]);
    }
}
