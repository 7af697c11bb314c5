//! Expected Attention (Devoto et al. 2025, "Expected Attention: KV Cache
//! Compression by Estimating Attention from Future Queries Distribution"): no
//! query yet asked says what the next ones will ask, but their distribution
//! does. Model the coming queries as a Gaussian fitted to the recent ones,
//! carried forward by RoPE over the next `n_future` positions, and keep the
//! entries that Gaussian is expected to attend to most, weighted by how much
//! their values would move the output.
//!
//! Owns the parameters, the running query statistics the cache keeps per layer
//! ([`QueryStats`]), the score and the policy's answers (its keys, its checks,
//! that it reads queries, keys and values; it compresses at prefill end if
//! `prefill`, then every `every` decode tokens, as SnapKV).
//!
//! Statistics. The model hands the cache each step's post-RoPE queries, scaled
//! so `q . k` is the logit ([`tern_models::KvStore::observe_queries`]). Each is
//! turned back by its own position to one common frame (what it was before
//! RoPE, up to the model's magnitude factor), so queries from different
//! positions average meaningfully; the cache sums them (and their second
//! moments) per query head since the last compression, as kvpress's decoding
//! wrapper buffers the hidden states since its last compression. Queries at
//! the first `sink` positions are left out, as in kvpress: attention sinks are
//! outliers.
//!
//! Score of entry `i`, per query head `j` with mean `mu` and covariance `S` in
//! that frame:
//! - `R` = the rotation averaged over the next `n_future` positions (from the
//!   newest observed query's position plus one), block-diagonal over RoPE's
//!   pairs; `mu' = R mu`, `S' = R S R^T` (kvpress's approximation);
//! - `z_i = mu' . k_i + k_i^T S' k_i / 2`: the log of `E[exp(q . k_i)]` for a
//!   Gaussian `q` (the `1/sqrt(d)` is in the queries already);
//! - `softmax_i(z)` over the non-sink entries: the expected attention weight;
//! - averaged over the query heads of the GQA group (each head normalised on
//!   its own first, as kvpress does), then `(a + epsilon) * |v_i|`.
//!
//! Sinks (entries at the first `sink` positions) are always kept, as kvpress
//! keeps them; the newest `window` entries too, as every Tern policy does.
//!
//! Covariance at head_dim 64 (`cov`): `pair` (default) keeps the 2x2 block of
//! each RoPE pair. The averaged rotation is block-diagonal over exactly those
//! pairs, so the blocks are closed under it, and scoring costs O(head_dim) per
//! key like the mean term. `full` keeps the whole `head_dim x head_dim` matrix
//! per query head (64x the memory of the mean, O(head_dim^2) per key, on
//! every observed query and every scored key) for the cross-pair
//! correlations; `none` uses the mean alone.

use tern_models::Rotary;

use std::fmt;

use super::items::{bad, below_budget, positive, Items, Key, BUDGET, EVERY, PREFILL, SINK, WINDOW};
use super::kind::{budgeted_answers, within_budget, NamedPolicy, PolicyKind, PolicySpec};
use super::{top_plus_window, KeepSet, KvPolicy, PolicyError, ScoreInput, DEFAULT_BUDGET};

/// Largest `n_future` (expected): each compression averages RoPE over that
/// many positions on the engine thread; kvpress uses 512.
pub const MAX_N_FUTURE: usize = 1 << 16;
/// Future positions averaged over, at most [`MAX_N_FUTURE`].
const N_FUTURE: Key = Key {
    name: "n_future",
    expected: "an integer from 1 to 65536",
};
/// Covariance kept, [`Covariance`].
const COV: Key = Key {
    name: "cov",
    expected: "`none`, `pair` or `full`",
};
/// Added to the expected attention.
const EPSILON: Key = Key {
    name: "epsilon",
    expected: "a finite number >= 0",
};

/// Default `window`: newest entries always kept (SnapKV's default, for a like
/// for like comparison; kvpress keeps none).
pub const DEFAULT_WINDOW: usize = 8;
/// Default `n_future`: positions the future queries are spread over (kvpress's).
pub const DEFAULT_N_FUTURE: usize = 512;
/// Default `sink`: first positions always kept and left out of the query
/// statistics (kvpress's `n_sink`).
pub const DEFAULT_SINK: usize = 4;
/// Default `every`: decode tokens between compressions (as SnapKV's).
pub const DEFAULT_EVERY: usize = 128;

/// How much of the queries' covariance the score uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Covariance {
    /// The mean alone.
    None,
    /// The 2x2 block of each RoPE pair (closed under RoPE's rotations).
    #[default]
    Pair,
    /// The whole matrix.
    Full,
}

impl Covariance {
    /// The spelling used in spec strings: `none`, `pair` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Covariance::None => "none",
            Covariance::Pair => "pair",
            Covariance::Full => "full",
        }
    }

    /// The covariance a spec spells `none`, `pair` or `full`.
    fn from_spec(s: &str) -> Option<Self> {
        match s {
            "none" => Some(Covariance::None),
            "pair" => Some(Covariance::Pair),
            "full" => Some(Covariance::Full),
            _ => None,
        }
    }
}

/// Parameters of [`super::KvPolicy::Expected`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpectedParams {
    /// Tokens kept per layer and KV head (>= 1).
    pub budget: usize,
    /// Newest entries always kept (`sink + window < budget`).
    pub window: usize,
    /// Future positions the expected attention averages over (>= 1).
    pub n_future: usize,
    /// First positions always kept and not used as query samples.
    pub sink: usize,
    /// Covariance kept and scored.
    pub cov: Covariance,
    /// Added to the expected attention before the value norm weights it (>= 0).
    pub epsilon: f32,
    /// In decode, compress back to budget every `every` generated tokens (>= 1).
    pub every: usize,
    /// Compress the prompt at prefill end (at each prefill chunk's end).
    pub prefill: bool,
}

impl Default for ExpectedParams {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            window: DEFAULT_WINDOW,
            n_future: DEFAULT_N_FUTURE,
            sink: DEFAULT_SINK,
            cov: Covariance::Pair,
            epsilon: 0.0,
            every: DEFAULT_EVERY,
            prefill: true,
        }
    }
}

/// Running sums of one layer's queries since the last compression, per query
/// head, in the common frame (see the file header). The cache owns one per
/// scored layer; [`select`] reads it through [`ScoreInput::queries`].
#[derive(Clone, Debug)]
pub struct QueryStats {
    n_head: usize,
    head_dim: usize,
    cov: Covariance,
    sink: usize,
    /// The layer's rotation, from the first observed step.
    rope: Option<Rotary>,
    /// Queries summed.
    count: usize,
    /// Position after the newest observed query: where the future starts.
    next: usize,
    /// Sum of the queries, `[n_head][head_dim]`.
    sum: Vec<f64>,
    /// Sum of second moments: per head `[head_dim / 2][aa, ab, bb]` (pair) or
    /// `[head_dim][head_dim]`, upper triangle (full); empty for none.
    second: Vec<f64>,
}

impl QueryStats {
    /// Empty statistics for `policy` if it scores by queries, else `None`.
    pub fn for_policy(policy: &KvPolicy, n_head: usize, head_dim: usize) -> Option<Self> {
        let KvPolicy::Expected(p) = policy else {
            return None;
        };
        let second = match p.cov {
            Covariance::None => 0,
            Covariance::Pair => n_head * (head_dim / 2) * 3,
            Covariance::Full => n_head * head_dim * head_dim,
        };
        Some(Self {
            n_head,
            head_dim,
            cov: p.cov,
            sink: p.sink,
            rope: None,
            count: 0,
            next: 0,
            sum: vec![0.0; n_head * head_dim],
            second: vec![0.0; second],
        })
    }

    /// Queries summed since the last [`QueryStats::reset`].
    pub fn count(&self) -> usize {
        self.count
    }

    /// Adds one step's queries: `q` is `[n_head, positions.len(), head_dim]`
    /// row-major, post-RoPE, as the model hands them over; `rope` the rotation
    /// that produced them. A step of the wrong shape is ignored.
    pub fn observe(&mut self, q: &[f32], positions: &[u32], rope: &Rotary) {
        let (hd, n) = (self.head_dim, positions.len());
        if rope.head_dim() != hd || q.len() != self.n_head * n * hd || hd % 2 != 0 {
            return;
        }
        if self.rope.is_none() {
            self.rope = Some(rope.clone());
        }
        if let Some(&last) = positions.last() {
            self.next = last as usize + 1;
        }
        let mut x = vec![0.0f64; self.n_head * hd];
        for (t, &pos) in positions.iter().enumerate() {
            if (pos as usize) < self.sink {
                continue;
            }
            for h in 0..self.n_head {
                let row = &q[(h * n + t) * hd..(h * n + t + 1) * hd];
                for (d, &v) in x[h * hd..(h + 1) * hd].iter_mut().zip(row) {
                    *d = f64::from(v);
                }
            }
            rope.rotate(&mut x, -f64::from(pos));
            self.count += 1;
            for (s, &v) in self.sum.iter_mut().zip(&x) {
                *s += v;
            }
            for (h, head) in x.chunks_exact(hd).enumerate() {
                match self.cov {
                    Covariance::None => {}
                    Covariance::Pair => {
                        let m = &mut self.second[h * (hd / 2) * 3..(h + 1) * (hd / 2) * 3];
                        for (i, m) in m.chunks_exact_mut(3).enumerate() {
                            let (a, b) = rope.pair(i);
                            let (xa, xb) = (head[a], head[b]);
                            m[0] += xa * xa;
                            m[1] += xa * xb;
                            m[2] += xb * xb;
                        }
                    }
                    Covariance::Full => {
                        let m = &mut self.second[h * hd * hd..(h + 1) * hd * hd];
                        for (r, &xr) in head.iter().enumerate() {
                            for (mc, &xc) in m[r * hd + r..(r + 1) * hd].iter_mut().zip(&head[r..])
                            {
                                *mc += xr * xc;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Remembers `rope` as the layer's rotation if none was seen yet, without
    /// summing anything: queries held back to be summed later
    /// ([`QueryStats::observe_held`]) then have their rotation.
    pub fn keep_rope(&mut self, rope: &Rotary) {
        if self.rope.is_none() {
            self.rope = Some(rope.clone());
        }
    }

    /// [`QueryStats::observe`] with the layer's own rotation (queries of a
    /// speculative draft, summed once they are accepted); ignored before any
    /// rotation was seen.
    pub fn observe_held(&mut self, q: &[f32], positions: &[u32]) {
        if let Some(rope) = self.rope.take() {
            self.observe(q, positions, &rope);
            self.rope = Some(rope);
        }
    }

    /// Forgets the queries summed so far (after a compression: the next one is
    /// scored by the queries that come after it). Keeps the rotation and the
    /// future's start.
    pub fn reset(&mut self) {
        self.count = 0;
        self.sum.iter_mut().for_each(|s| *s = 0.0);
        self.second.iter_mut().for_each(|s| *s = 0.0);
    }

    /// The future queries' distribution per head: mean and covariance after the
    /// rotation averaged over `n_future` positions from [`QueryStats::next`].
    /// `None` with no queries summed or no rotation seen.
    fn future(&self, n_future: usize) -> Option<Vec<Future>> {
        let rope = self.rope.as_ref().filter(|_| self.count > 0)?;
        let (hd, half) = (self.head_dim, self.head_dim / 2);
        let turn = average_rotation(rope, self.next, n_future);
        let n = self.count as f64;
        let heads = (0..self.n_head)
            .map(|h| {
                let mu: Vec<f64> = self.sum[h * hd..(h + 1) * hd]
                    .iter()
                    .map(|s| s / n)
                    .collect();
                let mut mean = mu.clone();
                rotate_by(rope, &turn, &mut mean);
                let cov = match self.cov {
                    Covariance::None => Cov::None,
                    Covariance::Pair => {
                        let m = &self.second[h * half * 3..(h + 1) * half * 3];
                        let blocks = m
                            .chunks_exact(3)
                            .zip(&turn)
                            .enumerate()
                            .map(|(i, (m, &(c, s)))| {
                                let (a, b) = rope.pair(i);
                                let saa = m[0] / n - mu[a] * mu[a];
                                let sab = m[1] / n - mu[a] * mu[b];
                                let sbb = m[2] / n - mu[b] * mu[b];
                                // M S M^T with M = [[c, -s], [s, c]].
                                [
                                    c * c * saa - 2.0 * c * s * sab + s * s * sbb,
                                    c * s * (saa - sbb) + (c * c - s * s) * sab,
                                    s * s * saa + 2.0 * c * s * sab + c * c * sbb,
                                ]
                            })
                            .collect();
                        Cov::Pair(blocks)
                    }
                    Covariance::Full => {
                        let m = &self.second[h * hd * hd..(h + 1) * hd * hd];
                        let sigma = |r: usize, q: usize| {
                            let (r, q) = (r.min(q), r.max(q));
                            m[r * hd + q] / n - mu[r] * mu[q]
                        };
                        // Row e of M: its pair's two elements with their weights.
                        let rows: Vec<[(usize, f64); 2]> = (0..hd)
                            .map(|e| {
                                let i = (0..half).find(|&i| {
                                    let (a, b) = rope.pair(i);
                                    a == e || b == e
                                });
                                let i = i.unwrap_or(0);
                                let (a, b) = rope.pair(i);
                                let (c, s) = turn[i];
                                if e == a {
                                    [(a, c), (b, -s)]
                                } else {
                                    [(a, s), (b, c)]
                                }
                            })
                            .collect();
                        let mut out = vec![0.0; hd * hd];
                        for r in 0..hd {
                            for q in r..hd {
                                let mut v = 0.0;
                                for &(r2, wr) in &rows[r] {
                                    for &(q2, wq) in &rows[q] {
                                        v += wr * wq * sigma(r2, q2);
                                    }
                                }
                                out[r * hd + q] = v;
                                out[q * hd + r] = v;
                            }
                        }
                        Cov::Full(out)
                    }
                };
                Future { mean, cov }
            })
            .collect();
        Some(heads)
    }
}

/// Per RoPE pair, the mean `(cos, sin)` of its angle over positions
/// `next .. next + n_future`.
fn average_rotation(rope: &Rotary, next: usize, n_future: usize) -> Vec<(f64, f64)> {
    let n = n_future.max(1);
    rope.freqs()
        .iter()
        .map(|&w| {
            let (mut c, mut s) = (0.0, 0.0);
            for t in next..next + n {
                let (st, ct) = (t as f64 * w).sin_cos();
                c += ct;
                s += st;
            }
            (c / n as f64, s / n as f64)
        })
        .collect()
}

/// `x <- M x` for the block rotation `turn` (per pair `(cos, sin)`).
fn rotate_by(rope: &Rotary, turn: &[(f64, f64)], x: &mut [f64]) {
    for (i, &(c, s)) in turn.iter().enumerate() {
        let (a, b) = rope.pair(i);
        let (xa, xb) = (x[a], x[b]);
        x[a] = c * xa - s * xb;
        x[b] = s * xa + c * xb;
    }
}

/// One query head's future distribution.
struct Future {
    /// `[head_dim]`.
    mean: Vec<f64>,
    cov: Cov,
}

/// A future covariance, in the layout of its [`Covariance`].
enum Cov {
    None,
    /// Per pair `[aa, ab, bb]`.
    Pair(Vec<[f64; 3]>),
    /// `[head_dim][head_dim]`, symmetric.
    Full(Vec<f64>),
}

impl Future {
    /// `mean . k + k^T cov k / 2`: the log of the expected `exp(q . k)`.
    fn log_expected(&self, rope: &Rotary, k: &[f32]) -> f64 {
        let k64 = |i: usize| f64::from(k[i]);
        let lin: f64 = self
            .mean
            .iter()
            .zip(k)
            .map(|(m, &v)| m * f64::from(v))
            .sum();
        let quad = match &self.cov {
            Cov::None => 0.0,
            Cov::Pair(blocks) => blocks
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let (a, b) = rope.pair(i);
                    let (ka, kb) = (k64(a), k64(b));
                    s[0] * ka * ka + 2.0 * s[1] * ka * kb + s[2] * kb * kb
                })
                .sum(),
            Cov::Full(m) => {
                let hd = k.len();
                m.chunks_exact(hd)
                    .zip(k)
                    .map(|(row, &kr)| {
                        let r: f64 = row.iter().zip(k).map(|(s, &v)| s * f64::from(v)).sum();
                        r * f64::from(kr)
                    })
                    .sum()
            }
        };
        lin + 0.5 * quad
    }
}

/// Per KV head: the sinks, the newest `window` entries, and the best by
/// expected attention times value norm (see the file header). Without query
/// statistics the expected attention is uniform, so the value norm alone ranks.
pub(super) fn select(p: &ExpectedParams, budget: usize, input: &ScoreInput) -> KeepSet {
    let c = input.n_cached;
    let n_kv = input.n_kv();
    let hd = input.head_dim;
    let n_cand = c - p.window.min(budget).min(c);
    let stats = input.queries;
    let rope = stats.and_then(|s| s.rope.as_ref());
    let futures = stats
        .filter(|s| s.head_dim == hd && hd > 0)
        .and_then(|s| s.future(p.n_future));
    let group = stats.map_or(1, |s| (s.n_head / n_kv.max(1)).max(1));
    let mut order = Vec::with_capacity(n_cand);
    let mut z = vec![0.0f64; c];
    let mut score = vec![0.0f64; c];
    let per_head = (0..n_kv)
        .map(|h| {
            let positions = &input.positions[h];
            let is_sink = |i: usize| positions.get(i).is_some_and(|&q| (q as usize) < p.sink);
            let keys = input.keys.get(h).map_or(&[][..], Vec::as_slice);
            let values = input.values.get(h).map_or(&[][..], Vec::as_slice);
            score.iter_mut().for_each(|s| *s = 0.0);
            let heads = match (&futures, rope) {
                (Some(f), Some(rope)) if keys.len() >= c * hd => {
                    f.get(h * group..(h + 1) * group).map(|f| (f, rope))
                }
                _ => None,
            };
            match heads {
                Some((heads, rope)) => {
                    for f in heads {
                        for (i, zi) in z.iter_mut().enumerate() {
                            *zi = if is_sink(i) {
                                f64::NEG_INFINITY
                            } else {
                                f.log_expected(rope, &keys[i * hd..(i + 1) * hd])
                            };
                        }
                        softmax(&mut z);
                        for (s, &a) in score.iter_mut().zip(&z) {
                            *s += a / heads.len() as f64;
                        }
                    }
                }
                None => {
                    let live = (0..c).filter(|&i| !is_sink(i)).count().max(1);
                    score.iter_mut().for_each(|s| *s = 1.0 / live as f64);
                }
            }
            let ranked: Vec<f32> = (0..n_cand)
                .map(|i| {
                    if is_sink(i) {
                        return f32::INFINITY;
                    }
                    let norm = values
                        .get(i * hd..(i + 1) * hd)
                        .filter(|_| hd > 0)
                        .map_or(1.0, |v| {
                            v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
                        });
                    ((score[i] + f64::from(p.epsilon)) * norm) as f32
                })
                .collect();
            top_plus_window(&ranked, c, budget, p.window, &mut order)
        })
        .collect();
    KeepSet { per_head }
}

/// In-place softmax; `-inf` entries get 0, an all `-inf` or non-finite row all 0.
fn softmax(z: &mut [f64]) {
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        z.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0.0;
    for v in z.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    z.iter_mut().for_each(|v| *v /= sum);
}

impl NamedPolicy for ExpectedParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "expected",
        keys: &[BUDGET, WINDOW, N_FUTURE, SINK, COV, EPSILON, EVERY, PREFILL],
        help: "attention expected from the distribution of future queries, times value norm",
    };

    fn parse(body: &str) -> Result<Self, PolicyError> {
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, body)?;
        let d = Self::default();
        Ok(Self {
            budget: p.usize(&BUDGET, d.budget)?,
            window: p.usize(&WINDOW, d.window)?,
            n_future: p.usize(&N_FUTURE, d.n_future)?,
            sink: p.usize(&SINK, d.sink)?,
            cov: p.value(&COV, d.cov, Covariance::from_spec)?,
            epsilon: p.f32(&EPSILON, d.epsilon)?,
            every: p.usize(&EVERY, d.every)?,
            prefill: p.bool(&PREFILL, d.prefill)?,
        })
    }
}

impl PolicyKind for ExpectedParams {
    budgeted_answers!(window);

    fn needs_values(&self) -> bool {
        true
    }

    fn needs_queries(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<(), PolicyError> {
        positive(&BUDGET, self.budget)?;
        positive(&N_FUTURE, self.n_future)?;
        if self.n_future > MAX_N_FUTURE {
            return Err(bad(&N_FUTURE, self.n_future));
        }
        if !(self.epsilon >= 0.0 && self.epsilon.is_finite()) {
            return Err(bad(&EPSILON, self.epsilon));
        }
        // Sinks and window are both always kept: together under the budget.
        let kept = self.sink.saturating_add(self.window);
        below_budget("sink + window", kept, self.budget)?;
        positive(&EVERY, self.every)
    }

    fn select(&self, input: &ScoreInput) -> KeepSet {
        within_budget(self, input, |budget| select(self, budget, input))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::SPEC.name;
        write!(
            f,
            "{name}:budget={},window={},n_future={},sink={},cov={},epsilon={},every={},prefill={}",
            self.budget,
            self.window,
            self.n_future,
            self.sink,
            self.cov.as_str(),
            self.epsilon,
            self.every,
            self.prefill
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::select as select_policy;
    use super::super::test_support::assert_well_formed;
    use super::*;
    use tern_models::ModelConfig;

    const HD: usize = 8;

    fn rotary(neox: bool) -> Rotary {
        let c = ModelConfig {
            architecture: "llama".into(),
            name: None,
            n_layer: 1,
            n_embd: 2 * HD,
            n_head: 2,
            n_kv_head: 1,
            head_dim: HD,
            n_ff: 4,
            vocab_size: 4,
            context_length: 4096,
            rope_base: 1_000_000.0,
            rope_freq_scale: 1.0,
            rms_eps: 1e-5,
            sliding: None,
        };
        Rotary::new(&c, neox, None)
    }

    fn params(budget: usize, window: usize, n_future: usize, cov: Covariance) -> ExpectedParams {
        ExpectedParams {
            budget,
            window,
            n_future,
            sink: 0,
            cov,
            ..ExpectedParams::default()
        }
    }

    fn stats(p: &ExpectedParams, n_head: usize) -> QueryStats {
        let policy = KvPolicy::Expected(*p);
        QueryStats::for_policy(&policy, n_head, HD).unwrap()
    }

    /// `x` (one or more heads) as RoPE leaves it at position `p`.
    fn at(rope: &Rotary, x: &[f64], p: f64) -> Vec<f64> {
        let mut y = x.to_vec();
        rope.rotate(&mut y, p);
        y
    }

    fn f32s(x: &[f64]) -> Vec<f32> {
        x.iter().map(|&v| v as f32).collect()
    }

    /// Deterministic pseudo-random vector in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f64> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    /// Observes pre-RoPE single-head queries `xs` at `positions`, one step each.
    fn observe_all(s: &mut QueryStats, rope: &Rotary, xs: &[Vec<f64>], positions: &[u32]) {
        for (x, &p) in xs.iter().zip(positions) {
            s.observe(&f32s(&at(rope, x, p as f64)), &[p], rope);
        }
    }

    /// `(1/F) sum_t rotate(v, t)` over the future positions: the averaged rotation applied.
    fn averaged(rope: &Rotary, v: &[f64], next: usize, n_future: usize) -> Vec<f64> {
        let mut out = vec![0.0; v.len()];
        for t in next..next + n_future {
            for (o, r) in out.iter_mut().zip(at(rope, v, t as f64)) {
                *o += r / n_future as f64;
            }
        }
        out
    }

    #[test]
    fn future_mean_is_the_recent_queries_carried_to_each_future_position() {
        for neox in [false, true] {
            let rope = rotary(neox);
            let p = params(8, 1, 37, Covariance::None);
            let mut s = stats(&p, 1);
            let xs: Vec<Vec<f64>> = (0..5).map(|i| noise(i, HD)).collect();
            let positions = [90, 91, 95, 120, 121];
            observe_all(&mut s, &rope, &xs, &positions);
            let mut mean = vec![0.0; HD];
            for x in &xs {
                for (m, v) in mean.iter_mut().zip(x) {
                    *m += v / xs.len() as f64;
                }
            }
            let want = averaged(&rope, &mean, 122, 37);
            let got = &s.future(37).unwrap()[0].mean;
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "neox {neox}: {got:?} vs {want:?}");
            }
            // The other pairing would carry the queries elsewhere.
            let wrong = averaged(&rotary(!neox), &mean, 122, 37);
            assert!(got.iter().zip(&wrong).any(|(g, w)| (g - w).abs() > 1e-2));
        }
    }

    #[test]
    fn covariance_term_is_the_variance_of_the_future_logit() {
        // k^T S' k = mean_j ((R(x_j - mu)) . k)^2 with R the averaged rotation.
        let rope = rotary(true);
        let xs: Vec<Vec<f64>> = (0..40)
            .map(|i| noise(100 + i, HD).iter().map(|v| 3.0 * v).collect())
            .collect();
        let positions: Vec<u32> = (200..240).collect();
        let mut mean = vec![0.0; HD];
        for x in &xs {
            for (m, v) in mean.iter_mut().zip(x) {
                *m += v / xs.len() as f64;
            }
        }
        let variance_along = |k: &[f64]| {
            xs.iter()
                .map(|x| {
                    let d: Vec<f64> = x.iter().zip(&mean).map(|(a, b)| a - b).collect();
                    let r = averaged(&rope, &d, 240, 16);
                    let dot: f64 = r.iter().zip(k).map(|(a, b)| a * b).sum();
                    dot * dot
                })
                .sum::<f64>()
                / xs.len() as f64
        };
        let log_e = |cov: Covariance, k: &[f64]| {
            let mut s = stats(&params(8, 1, 16, cov), 1);
            observe_all(&mut s, &rope, &xs, &positions);
            s.future(16).unwrap()[0].log_expected(&rope, &f32s(k))
        };
        let k = noise(7, HD);
        let lin = log_e(Covariance::None, &k);
        let full = log_e(Covariance::Full, &k) - lin;
        let want = 0.5 * variance_along(&f32s(&k).iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert!(
            (full - want).abs() < 1e-4 * want.max(1.0),
            "{full} vs {want}"
        );
        // A key on one RoPE pair sees no cross-pair terms: pair equals full there.
        let mut k1 = vec![0.0; HD];
        let (a, b) = rope.pair(1);
        (k1[a], k1[b]) = (0.7, -1.3);
        let pair = log_e(Covariance::Pair, &k1) - log_e(Covariance::None, &k1);
        let full = log_e(Covariance::Full, &k1) - log_e(Covariance::None, &k1);
        assert!(
            pair > 0.0 && (pair - full).abs() < 1e-6 * full,
            "{pair} vs {full}"
        );
    }

    /// One KV head over `keys` (pre-RoPE directions, rotated to their positions
    /// 0..), with `values`, scored by queries `xs` observed at 100.. .
    fn choose(
        p: &ExpectedParams,
        xs: &[Vec<f64>],
        keys: &[Vec<f64>],
        values: &[Vec<f64>],
        n_head: usize,
    ) -> KeepSet {
        let rope = rotary(false);
        let mut s = stats(p, n_head);
        for (i, x) in xs.iter().enumerate() {
            let pos = 100 + i as u32;
            // Every head of the step asks the same thing.
            let q: Vec<f64> = (0..n_head).flat_map(|_| at(&rope, x, pos as f64)).collect();
            s.observe(&f32s(&q), &[pos], &rope);
        }
        let c = keys.len();
        let k: Vec<f32> = keys
            .iter()
            .enumerate()
            .flat_map(|(i, k)| f32s(&at(&rope, k, i as f64)))
            .collect();
        let v: Vec<f32> = values.iter().flat_map(|v| f32s(v)).collect();
        let positions = vec![(0..c as u32).collect::<Vec<_>>()];
        let (keys, values) = (vec![k], vec![v]);
        select_policy(
            &KvPolicy::Expected(*p),
            &ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: c,
                positions: &positions,
                cumulative: &[],
                recent_rows: &[],
                keys: &keys,
                values: &values,
                queries: Some(&s),
                head_dim: HD,
            },
        )
    }

    fn unit(i: usize, scale: f64) -> Vec<f64> {
        let mut v = vec![0.0; HD];
        v[i] = scale;
        v
    }

    #[test]
    fn keeps_keys_aligned_with_the_mean_query() {
        // Queries point along element 0 (pair 0 in the interleaved layout) with
        // a little noise; keys along +0, -0, or an unrelated element.
        let xs: Vec<Vec<f64>> = (0..16)
            .map(|i| {
                let mut x: Vec<f64> = noise(i, HD).iter().map(|v| 0.1 * v).collect();
                x[0] += 4.0;
                x
            })
            .collect();
        // Slow pairs only matter over 512 future positions: put the signal on
        // the slowest pair so the averaged rotation keeps it.
        let xs: Vec<Vec<f64>> = xs
            .into_iter()
            .map(|mut x| {
                x.swap(0, HD - 2);
                x
            })
            .collect();
        let aligned = unit(HD - 2, 2.0);
        let opposite = unit(HD - 2, -2.0);
        let other = unit(2, 2.0);
        let keys = vec![
            other.clone(),
            opposite.clone(),
            aligned.clone(),
            other,
            aligned.clone(),
            opposite,
            aligned,
            unit(3, 1.0),
            unit(4, 1.0),
        ];
        let values = vec![vec![1.0; HD]; keys.len()];
        for cov in [Covariance::None, Covariance::Pair, Covariance::Full] {
            for n_head in [1, 3] {
                let p = params(5, 2, 512, cov);
                let keep = choose(&p, &xs, &keys, &values, n_head);
                assert_well_formed(&keep, 1, 9, 5);
                assert_eq!(keep.per_head[0], [2, 4, 6, 7, 8], "{cov:?} heads {n_head}");
            }
        }
    }

    #[test]
    fn value_norm_and_sinks_weigh_in() {
        let xs: Vec<Vec<f64>> = (0..4).map(|_| unit(HD - 2, 3.0)).collect();
        let keys: Vec<Vec<f64>> = (0..8).map(|_| unit(HD - 2, 1.0)).collect();
        // Equal expected attention everywhere: the larger values win.
        let mut values = vec![vec![1.0; HD]; 8];
        values[1] = vec![3.0; HD];
        values[4] = vec![2.0; HD];
        let p = params(4, 2, 64, Covariance::Pair);
        assert_eq!(choose(&p, &xs, &keys, &values, 1).per_head[0], [1, 4, 6, 7]);
        // A sink is kept whatever it scores.
        let p = ExpectedParams { sink: 1, ..p };
        assert_eq!(choose(&p, &xs, &keys, &values, 1).per_head[0], [0, 1, 6, 7]);
    }

    #[test]
    fn variance_favours_keys_along_the_spread() {
        // Mean along the slowest pair; the queries also swing widely along
        // the next slowest (element 4). Two keys with the same mean term: the
        // one along the swing is expected to draw more attention under a
        // covariance.
        let xs: Vec<Vec<f64>> = (0..32)
            .map(|i| {
                let mut x = unit(HD - 2, 1.0);
                x[4] = if i % 2 == 0 { 3.0 } else { -3.0 };
                x
            })
            .collect();
        let mut quiet = unit(HD - 2, 1.0);
        quiet[2] = 1.0;
        let mut swinging = unit(HD - 2, 1.0);
        swinging[4] = 1.0;
        let keys = vec![quiet, swinging, unit(4, 0.0), unit(4, 0.0)];
        let values = vec![vec![1.0; HD]; 4];
        let pick = |cov| choose(&params(3, 2, 1, cov), &xs, &keys, &values, 1).per_head[0][0];
        assert_eq!(pick(Covariance::Pair), 1);
        assert_eq!(pick(Covariance::Full), 1);
    }

    #[test]
    fn without_queries_the_value_norm_ranks() {
        let p = params(3, 1, 16, Covariance::Pair);
        let values: Vec<f32> = [1.0, 5.0, 2.0, 1.0, 1.0]
            .iter()
            .flat_map(|&v| vec![v; HD])
            .collect();
        let positions = vec![(0..5).collect::<Vec<u32>>()];
        let keys = vec![vec![1.0; 5 * HD]];
        let values = vec![values];
        let keep = select_policy(
            &KvPolicy::Expected(p),
            &ScoreInput {
                layer: 0,
                n_layer: 1,
                n_cached: 5,
                positions: &positions,
                cumulative: &[],
                recent_rows: &[],
                keys: &keys,
                values: &values,
                queries: None,
                head_dim: HD,
            },
        );
        assert_eq!(keep.per_head[0], [1, 2, 4]);
    }

    #[test]
    fn reset_forgets_queries_but_not_the_rotation() {
        let rope = rotary(true);
        let p = params(8, 1, 4, Covariance::Full);
        let mut s = stats(&p, 1);
        assert!(s.future(4).is_none());
        observe_all(&mut s, &rope, &[noise(1, HD)], &[10]);
        assert_eq!(s.count(), 1);
        s.reset();
        assert_eq!(s.count(), 0);
        assert!(s.future(4).is_none());
        // Sinks are not samples; a malformed step is ignored.
        let p = ExpectedParams { sink: 4, ..p };
        let mut s = stats(&p, 1);
        observe_all(&mut s, &rope, &[noise(1, HD), noise(2, HD)], &[3, 4]);
        assert_eq!(s.count(), 1);
        s.observe(&[1.0; 3], &[5], &rope);
        assert_eq!(s.count(), 1);
    }
}
