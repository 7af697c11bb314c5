//! KeyDiff (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction
//! for Long-Context LLM Inference in Resource-Constrained Environments"): keys
//! that point where most keys point add little, so keep the entries whose keys
//! are least similar (cosine) to the mean direction of the head's keys, plus the
//! newest `window`. Query-agnostic: it reads the cached keys only, no attention,
//! so the model skips reporting weights and a prompt can be compressed before
//! any question about it has been read.
//!
//! Owns the parameters, the scoring AdaKV reuses and the policy's answers (its
//! keys, its checks, that it reads keys and no attention).
//!
//! Scoring, per KV head: the anchor is the mean of the head's keys, each first
//! scaled to unit length (every entry held, the window included, as the
//! reference does); an entry scores `-cos(key, anchor)`, so the most distinctive
//! keys rank first. A zero key or anchor has cosine 0.

use std::fmt;

use super::items::{below_budget, positive, Items, BUDGET, EVERY, PREFILL, WINDOW};
use super::kind::{budgeted_answers, within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::{top_plus_window, KeepSet, PolicyError, ScoreInput, DEFAULT_BUDGET};

/// Default `window`: newest entries always kept (as SnapKV's default).
pub const DEFAULT_WINDOW: usize = 8;
/// Default `every`: decode tokens between compressions (as SnapKV's default).
pub const DEFAULT_EVERY: usize = 128;

/// Parameters of [`super::KvPolicy::KeyDiff`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyDiffParams {
    /// Tokens kept per layer and KV head (>= 1).
    pub budget: usize,
    /// Newest entries always kept (1 <= window < budget).
    pub window: usize,
    /// In decode, compress back to budget every `every` generated tokens (>= 1).
    pub every: usize,
    /// Compress the prompt once it has been read (chunk by chunk), rather than
    /// holding it whole until the first decode compression.
    pub prefill: bool,
}

impl Default for KeyDiffParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            window: DEFAULT_WINDOW,
            every: DEFAULT_EVERY,
            prefill: true,
        }
    }
}

/// Per head: the newest `window` entries plus the `budget - window` older ones
/// with the most distinctive keys.
pub(super) fn select(p: &KeyDiffParams, budget: usize, input: &ScoreInput) -> KeepSet {
    let c = input.n_cached;
    let n_cand = c - p.window.min(budget).min(c);
    let all: Vec<usize> = (0..c).collect();
    let (mut scores, mut order) = (Vec::with_capacity(n_cand), Vec::with_capacity(n_cand));
    let per_head = (0..input.n_kv())
        .map(|h| {
            scores_into(input, h, &all, n_cand, &mut scores);
            top_plus_window(&scores, c, budget, p.window, &mut order)
        })
        .collect();
    KeepSet { per_head }
}

/// Head `h`'s KeyDiff scores of entries `held[..n_cand]` into `out`, the anchor
/// taken over every entry of `held` (the indices of the head's real entries,
/// ascending). Missing keys (a short or absent key buffer) score 0.
pub(super) fn scores_into(
    input: &ScoreInput,
    h: usize,
    held: &[usize],
    n_cand: usize,
    out: &mut Vec<f32>,
) {
    out.clear();
    let hd = input.head_dim;
    let keys = input.keys.get(h).map_or(&[][..], Vec::as_slice);
    let row = |i: usize| keys.get(i * hd..(i + 1) * hd).filter(|_| hd > 0);
    let mut anchor = vec![0f32; hd];
    for r in held.iter().filter_map(|&i| row(i)) {
        let norm = norm(r);
        if norm > 0.0 {
            anchor.iter_mut().zip(r).for_each(|(a, &x)| *a += x / norm);
        }
    }
    // The mean's length does not change a cosine: the sum serves as the anchor.
    let anchor_norm = norm(&anchor);
    out.extend(
        held[..n_cand.min(held.len())]
            .iter()
            .map(|&i| match row(i) {
                Some(r) if anchor_norm > 0.0 && norm(r) > 0.0 => {
                    let dot: f32 = r.iter().zip(&anchor).map(|(x, a)| x * a).sum();
                    -dot / (norm(r) * anchor_norm)
                }
                _ => 0.0,
            }),
    );
}

/// Euclidean length.
fn norm(x: &[f32]) -> f32 {
    x.iter().map(|v| v * v).sum::<f32>().sqrt()
}

impl NamedPolicy for KeyDiffParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "keydiff",
        keys: &[BUDGET, WINDOW, EVERY, PREFILL],
        help: "keys least like the head's mean key, plus the newest; needs no attention",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        Ok(Self {
            budget: p.usize(&BUDGET, d.budget)?,
            window: p.usize(&WINDOW, d.window)?,
            every: p.usize(&EVERY, d.every)?,
            prefill: p.bool(&PREFILL, d.prefill)?,
        })
    }
}

impl PolicyKind for KeyDiffParams {
    budgeted_answers!(window);

    fn needs_keys(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        positive(&BUDGET, self.budget)?;
        positive(&WINDOW, self.window)?;
        below_budget(WINDOW.name, self.window, self.budget)?;
        positive(&EVERY, self.every)
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        within_budget(self, input, |budget| select(self, budget, input))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::SPEC.name;
        write!(
            f,
            "{name}:budget={},window={},every={},prefill={}",
            self.budget, self.window, self.every, self.prefill
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select as select_policy, KvPolicy};
    use super::*;

    fn run(p: KeyDiffParams, keys: &[Vec<f32>], head_dim: usize) -> KeepSet {
        let c = keys[0].len() / head_dim;
        let pos = positions(keys.len(), c);
        select_policy(
            &KvPolicy::KeyDiff(p),
            &ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: c,
                positions: &pos,
                cumulative: &[],
                recent_rows: &[],
                keys,
                values: &[],
                queries: None,
                head_dim,
            },
        )
    }

    fn params(budget: usize, window: usize) -> KeyDiffParams {
        KeyDiffParams {
            budget,
            window,
            ..KeyDiffParams::default()
        }
    }

    #[test]
    fn keeps_distinctive_keys_and_the_window() {
        // Most keys point along x; entry 2 points along y, entry 4 against x.
        // Lengths differ but only direction counts.
        let keys: Vec<f32> = [
            [1.0, 0.0],
            [3.0, 0.1],
            [0.0, 1.0],
            [2.0, 0.0],
            [-1.0, 0.0],
            [1.0, 0.05],
            [5.0, 0.0],
            [1.0, 0.0],
        ]
        .concat();
        let keep = run(params(4, 2), &[keys], 2);
        assert_well_formed(&keep, 1, 8, 4);
        // Entry 4 (opposite) and entry 2 (orthogonal) plus the window 6, 7.
        assert_eq!(keep.per_head[0], [2, 4, 6, 7]);
    }

    #[test]
    fn heads_choose_independently() {
        let a = vec![1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0];
        let b = vec![0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let keep = run(params(2, 1), &[a, b], 2);
        assert_well_formed(&keep, 2, 5, 2);
        assert_eq!(keep.per_head[0], [2, 4]);
        assert_eq!(keep.per_head[1], [1, 4]);
    }

    #[test]
    fn needs_keys_only_and_survives_missing_ones() {
        let p = KvPolicy::KeyDiff(KeyDiffParams::default());
        assert!(p.needs_keys() && !p.needs_attention());
        // No keys at all: every candidate scores 0, the oldest win.
        let pos = positions(2, 10);
        let input = ScoreInput {
            layer: 0,
            n_layer: 1,
            n_cached: 10,
            positions: &pos,
            cumulative: &[],
            recent_rows: &[],
            keys: &[],
            values: &[],
            queries: None,
            head_dim: 4,
        };
        let keep = select_policy(&"keydiff:budget=4,window=1".parse().unwrap(), &input);
        assert_well_formed(&keep, 2, 10, 4);
        assert_eq!(keep.per_head[1], [0, 1, 2, 9]);
    }
}
