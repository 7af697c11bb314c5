//! R-KV (Cai et al. 2025, "R-KV: Redundancy-aware KV Cache Compression for
//! Reasoning Models"): long reasoning traces repeat themselves, so attention alone
//! keeps many near-identical tokens. Score each older entry by SnapKV's importance
//! minus its redundancy and keep the top `budget - window` plus the window.
//!
//! Owns the parameters and the combined score; importance is SnapKV's
//! (`snapkv.rs`, max pooling as in R-KV's reference), the keys come from the cache
//! ([`super::ScoreInput::keys`], post-RoPE). Also owns the policy's answers (its
//! keys, its checks, that it needs attention rows and, below `alpha = 1`, keys;
//! decode only by default, every `every` tokens).
//!
//! Score of candidate `i` (an entry before the window), per KV head:
//! `alpha * importance[i] - (1 - alpha) * redundancy[i]`, where
//! - `importance` is the pooled attention of the last `window` queries, divided by
//!   its sum over the candidates (a distribution, like R-KV's renormalised softmax);
//! - `redundancy` is the mean cosine similarity of key `i` to every other cached key
//!   (window included, diagonal zeroed), passed through a softmax over the
//!   candidates, as R-KV's reference does, so both terms are distributions on the
//!   same scale. A zero or non-finite key counts as similar to nothing; a head
//!   whose keys are missing is ranked by importance alone.
//!
//! The mean cosine needs no `C x C` matrix: with unit keys `u_j` and `s = sum_j u_j`,
//! `mean_{j != i} u_i . u_j = (u_i . s - u_i . u_i) / (C - 1)`, so a head costs
//! O(C * head_dim) instead of O(C^2 * head_dim). The reference's extra step
//! (keeping the newest of a run of near-duplicates) is not reproduced: identical
//! keys score alike, and ties keep the older entry.
//!
//! With `alpha = 1` the keys are not read and the choice is exactly SnapKV's with
//! max pooling.

use std::fmt;

use super::items::{bad, positive, Items, Key, BUDGET, EVERY, PREFILL, WINDOW};
use super::kind::{budgeted_answers, within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::snapkv::{
    check_scored, pooled_importance, Pool, Scratch, DEFAULT_KERNEL, DEFAULT_WINDOW, KERNEL,
};
use super::{top_plus_window, KeepSet, PolicyError, ScoreInput, DEFAULT_BUDGET};

/// Weight of importance against redundancy.
const ALPHA: Key = Key {
    name: "alpha",
    expected: "a number in [0, 1]",
};

/// Default `alpha`: R-KV's mixing weight, mostly redundancy.
pub const DEFAULT_ALPHA: f32 = 0.1;
/// Default `every`: decode tokens between compressions (R-KV's buffer, Sparse-RL's setting).
pub const DEFAULT_EVERY: usize = 128;
/// Pooling of the importance term, fixed as in R-KV's reference (`max_pool1d`).
pub const POOL: Pool = Pool::Max;

/// Parameters of [`super::KvPolicy::Rkv`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RkvParams {
    /// Tokens kept per layer and KV head (>= 1).
    pub budget: usize,
    /// Observation queries, always kept (1 <= window < budget).
    pub window: usize,
    /// Pooling width of the importance term (odd, >= 1).
    pub kernel: usize,
    /// Weight of importance against redundancy, in `[0, 1]`; 1 is SnapKV.
    pub alpha: f32,
    /// In decode, compress back to budget every `every` generated tokens (>= 1).
    pub every: usize,
    /// Also compress the prompt once it is read; off by default, as R-KV
    /// compresses the decoding trace and the first decode compression brings
    /// the prompt to budget.
    pub prefill: bool,
}

impl Default for RkvParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            window: DEFAULT_WINDOW,
            kernel: DEFAULT_KERNEL,
            alpha: DEFAULT_ALPHA,
            every: DEFAULT_EVERY,
            prefill: false,
        }
    }
}

/// Per head: the last `window` entries plus the `budget - window` candidates with the
/// best importance-minus-redundancy score (see the file header).
pub(super) fn select(p: &RkvParams, input: &ScoreInput) -> KeepSet {
    let c = input.n_cached;
    let n_cand = c - p.window.min(p.budget).min(c);
    // An unvalidated NaN alpha falls back to importance only.
    let alpha = if p.alpha.is_nan() {
        1.0
    } else {
        p.alpha.clamp(0.0, 1.0)
    };
    let mut scratch = Scratch::new(n_cand);
    let mut redundancy = Redundancy::default();
    let per_head = (0..input.n_kv())
        .map(|h| {
            pooled_importance(input, h, n_cand, p.kernel, POOL, &mut scratch);
            if alpha < 1.0 {
                let keys = input.keys.get(h).map_or(&[][..], Vec::as_slice);
                if let Some(r) = redundancy.compute(keys, input.head_dim, c, n_cand) {
                    normalise_sum(&mut scratch.pooled);
                    for (s, &r) in scratch.pooled.iter_mut().zip(r) {
                        *s = alpha * *s - (1.0 - alpha) * r;
                    }
                }
            }
            top_plus_window(&scratch.pooled, c, p.budget, p.window, &mut scratch.order)
        })
        .collect();
    KeepSet { per_head }
}

/// Divides `xs` by its sum so it is a distribution; left alone if the sum is not
/// positive and finite (no attention recorded).
fn normalise_sum(xs: &mut [f32]) {
    let sum: f32 = xs.iter().sum();
    if sum > 0.0 && sum.is_finite() {
        xs.iter_mut().for_each(|x| *x /= sum);
    }
}

/// Buffers for the redundancy term, reused across heads.
#[derive(Default)]
struct Redundancy {
    /// `1 / |k_j|` per cached entry, 0 for a zero or non-finite key: `[C]`.
    inv_norms: Vec<f32>,
    /// Sum of the unit keys, accumulated in f64 over up to C keys: `[head_dim]`.
    unit_sum: Vec<f64>,
    /// `unit_sum` rounded to f32 for the vectorised dot products: `[head_dim]`.
    unit_sum_f32: Vec<f32>,
    /// Softmaxed mean cosine similarity per candidate: `[n_cand]`; the result.
    out: Vec<f32>,
}

impl Redundancy {
    /// Softmax over the candidates of each one's mean cosine similarity to the
    /// other `c - 1` keys. `keys` is `[c, head_dim]` row-major; `None` if it is
    /// missing or too short, which leaves the ranking to importance alone.
    fn compute(
        &mut self,
        keys: &[f32],
        head_dim: usize,
        c: usize,
        n_cand: usize,
    ) -> Option<&[f32]> {
        let len = match c.checked_mul(head_dim) {
            Some(len) if head_dim > 0 && c >= 2 && keys.len() >= len => len,
            _ => return None,
        };
        self.mean_cosine(&keys[..len], head_dim, n_cand);
        softmax(&mut self.out);
        Some(&self.out)
    }

    /// Raw mean cosine similarity of each of the first `n_cand` keys to the others,
    /// into `self.out`, in O(C * head_dim) via the sum of unit keys.
    fn mean_cosine(&mut self, keys: &[f32], head_dim: usize, n_cand: usize) {
        let c = keys.len() / head_dim;
        self.inv_norms.clear();
        self.unit_sum.clear();
        self.unit_sum.resize(head_dim, 0.0);
        for row in keys.chunks_exact(head_dim) {
            let norm = dot(row, row).sqrt();
            let inv = if norm > 0.0 && norm.is_finite() {
                1.0 / norm
            } else {
                0.0
            };
            self.inv_norms.push(inv);
            if inv > 0.0 {
                let inv = f64::from(inv);
                for (s, &x) in self.unit_sum.iter_mut().zip(row) {
                    *s += f64::from(x) * inv;
                }
            }
        }
        self.unit_sum_f32.clear();
        self.unit_sum_f32
            .extend(self.unit_sum.iter().map(|&s| s as f32));
        let others = (c - 1) as f32;
        self.out.clear();
        for (row, &inv) in keys
            .chunks_exact(head_dim)
            .zip(&self.inv_norms)
            .take(n_cand)
        {
            // Remove the diagonal: a unit key's similarity to itself is 1.
            let sim = if inv > 0.0 {
                (dot(row, &self.unit_sum_f32) * inv - 1.0) / others
            } else {
                0.0
            };
            self.out.push(sim);
        }
    }
}

/// `a . b` over the shorter length, with eight independent accumulators so the
/// compiler can vectorise it (a single running sum cannot be reordered).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let tail = n - n % LANES;
    let rest: f32 = a[tail..].iter().zip(&b[tail..]).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + rest
}

/// In-place softmax; NaN-free for finite input, no-op on an empty slice.
fn softmax(xs: &mut [f32]) {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return;
    }
    let mut sum = 0.0f32;
    for x in xs.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    xs.iter_mut().for_each(|x| *x /= sum);
}

impl NamedPolicy for RkvParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "rkv",
        keys: &[BUDGET, WINDOW, KERNEL, ALPHA, EVERY, PREFILL],
        help: "SnapKV importance minus key redundancy, for long reasoning traces",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        Ok(Self {
            budget: p.usize(&BUDGET, d.budget)?,
            window: p.usize(&WINDOW, d.window)?,
            kernel: p.usize(&KERNEL, d.kernel)?,
            alpha: p.f32(&ALPHA, d.alpha)?,
            every: p.usize(&EVERY, d.every)?,
            prefill: p.bool(&PREFILL, d.prefill)?,
        })
    }
}

impl PolicyKind for RkvParams {
    budgeted_answers!(window);

    fn needs_recent_rows(&self) -> bool {
        true
    }

    /// The redundancy term reads them, unless `alpha = 1` gives it no weight.
    fn needs_keys(&self) -> bool {
        self.alpha < 1.0
    }

    fn validate(&self) -> Result<(), PolicyError> {
        check_scored(self.budget, self.window, self.kernel)?;
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(bad(&ALPHA, self.alpha));
        }
        positive(&EVERY, self.every)
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        within_budget(self, input, |_| select(self, input))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::SPEC.name;
        write!(
            f,
            "{name}:budget={},window={},kernel={},alpha={},every={},prefill={}",
            self.budget, self.window, self.kernel, self.alpha, self.every, self.prefill
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select as select_policy, KvPolicy, SnapKvParams};
    use super::*;

    /// Deterministic pseudo-random numbers in [0, 1) (xorshift), seeded.
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect()
    }

    fn rkv(budget: usize, window: usize, kernel: usize, alpha: f32) -> KvPolicy {
        KvPolicy::Rkv(RkvParams {
            budget,
            window,
            kernel,
            alpha,
            every: 128,
            prefill: false,
        })
    }

    fn run(
        policy: &KvPolicy,
        c: usize,
        rows: &[Vec<Vec<f32>>],
        keys: &[Vec<f32>],
        hd: usize,
    ) -> KeepSet {
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
                keys,
                values: &[],
                queries: None,
                head_dim: hd,
            },
        )
    }

    /// One-hot keys `[c, hd]`: entry `i` points along `dirs[i]`.
    fn one_hot(dirs: &[usize], hd: usize) -> Vec<f32> {
        let mut k = vec![0.0; dirs.len() * hd];
        for (i, &d) in dirs.iter().enumerate() {
            k[i * hd + d] = 1.0;
        }
        k
    }

    #[test]
    fn alpha_one_equals_snapkv() {
        let (c, n_kv, hd) = (200, 3, 16);
        let rows: Vec<Vec<Vec<f32>>> = (0..n_kv)
            .map(|h| (0..8).map(|r| noise(100 * h as u64 + r, c)).collect())
            .collect();
        let keys: Vec<Vec<f32>> = (0..n_kv).map(|h| noise(7 + h as u64, c * hd)).collect();
        for kernel in [1, 3, 7] {
            let snap = KvPolicy::SnapKv(SnapKvParams {
                budget: 64,
                window: 8,
                kernel,
                pool: Pool::Max,
                ..SnapKvParams::default()
            });
            let got = run(&rkv(64, 8, kernel, 1.0), c, &rows, &keys, hd);
            assert_well_formed(&got, n_kv, c, 64);
            assert_eq!(got, run(&snap, c, &rows, &keys, hd), "kernel {kernel}");
        }
    }

    #[test]
    fn small_alpha_drops_duplicate_keys() {
        // 10 entries, window 2 (8, 9), 4 slots among candidates 0..8. Entries 1 and 2
        // have identical keys and the highest attention; all other keys are orthogonal.
        let (c, hd) = (10, 16);
        let mut attention = vec![0.1f32; c];
        attention[1] = 0.2;
        attention[2] = 0.2;
        let rows = vec![vec![attention]];
        let keys = vec![one_hot(&[0, 1, 1, 3, 4, 5, 6, 7, 8, 9], hd)];
        let by_attention = run(&rkv(6, 2, 1, 1.0), c, &rows, &keys, hd);
        assert_eq!(by_attention.per_head[0], [0, 1, 2, 3, 8, 9]);
        for alpha in [0.0, 0.1] {
            let got = run(&rkv(6, 2, 1, alpha), c, &rows, &keys, hd);
            assert_well_formed(&got, 1, c, 6);
            assert_eq!(got.per_head[0], [0, 3, 4, 5, 8, 9], "alpha {alpha}");
        }
    }

    #[test]
    fn a_candidate_duplicating_a_window_key_is_redundant() {
        // Entry 0 repeats entry 9's key (in the window); equal attention otherwise.
        let (c, hd) = (10, 16);
        let rows = vec![vec![vec![0.1f32; c]]];
        let keys = vec![one_hot(&[9, 1, 2, 3, 4, 5, 6, 7, 8, 9], hd)];
        let got = run(&rkv(5, 2, 1, 0.1), c, &rows, &keys, hd);
        assert_eq!(got.per_head[0], [1, 2, 3, 8, 9]);
    }

    #[test]
    fn mean_cosine_matches_brute_force() {
        let (c, hd, n_cand) = (40, 8, 33);
        let mut keys: Vec<f32> = noise(3, c * hd).iter().map(|x| x - 0.5).collect();
        keys[5 * hd..6 * hd].fill(0.0); // a zero key is similar to nothing
        let mut r = Redundancy::default();
        r.mean_cosine(&keys, hd, n_cand);
        let row = |i: usize| &keys[i * hd..(i + 1) * hd];
        let cos = |a: &[f32], b: &[f32]| {
            let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
            let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
            if na == 0.0 || nb == 0.0 {
                0.0
            } else {
                dot / (na * nb)
            }
        };
        for i in 0..n_cand {
            let brute = (0..c)
                .filter(|&j| j != i)
                .map(|j| cos(row(i), row(j)))
                .sum::<f32>()
                / (c - 1) as f32;
            assert!(
                (r.out[i] - brute).abs() < 1e-5,
                "{i}: {} vs {brute}",
                r.out[i]
            );
        }
        assert_eq!(r.out[5], 0.0);
    }

    #[test]
    fn missing_keys_fall_back_to_importance() {
        let c = 12;
        let rows = vec![vec![noise(11, c)], vec![noise(12, c)]];
        let with_keys_missing = run(&rkv(6, 2, 3, 0.1), c, &rows, &[], 4);
        let importance_only = run(&rkv(6, 2, 3, 1.0), c, &rows, &[], 4);
        assert_eq!(with_keys_missing, importance_only);
    }

    #[test]
    fn softmax_and_normalise_edges() {
        let mut xs = [0.0f32, 0.0];
        softmax(&mut xs);
        assert_eq!(xs, [0.5, 0.5]);
        softmax(&mut []);
        let mut zeros = [0.0f32; 3];
        normalise_sum(&mut zeros);
        assert_eq!(zeros, [0.0; 3]);
        let mut xs = [1.0f32, 3.0];
        normalise_sum(&mut xs);
        assert_eq!(xs, [0.25, 0.75]);
    }
}
