//! Ada-KV (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive
//! Budget Allocation for Efficient LLM Inference"): a layer's KV heads do not
//! need the same share of its budget. A head whose attention is concentrated on
//! a few entries loses little by keeping few; a head whose attention is spread
//! out needs many. So instead of the top `budget` entries of every head, keep
//! the top `budget * n_kv` entries of the whole layer, ranked across heads by
//! an inner score-based policy's scores.
//!
//! A wrapper: the inner policy ([`Scorer`]: snapkv, pyramidkv, h2o or keydiff)
//! gives the scores, the budget (PyramidKV's per layer), the window and when to
//! compress, and answers most questions asked of Ada-KV; this file allocates,
//! and parses its own keys (`inner`, `floor`) before handing the rest of the
//! spec to the inner policy. The scores compare across heads as they
//! are: SnapKV's and H2O's are softmax attention (each query row sums to 1 in
//! every head), KeyDiff's a cosine.
//!
//! Allocation, per layer (as kvpress's `AdaKVPress`):
//! - every head keeps its newest `window` entries;
//! - every head keeps at least `floor * budget` entries (its best-scored ones
//!   beyond the window): the safeguard, so no head is starved by a few others;
//! - the rest of the layer's `budget * n_kv` slots go to the best-scored
//!   remaining entries of all heads together (higher score first, then the
//!   older entry, then the lower head).
//!
//! Heads then hold different counts. The cache keeps each layer one dense block
//! by padding the shorter heads with slots at [`HIDDEN_POSITION`], which no
//! query sees; this selection never keeps a padding slot and never counts one.

use std::fmt;

use tern_models::HIDDEN_POSITION;

use super::items::{bad, Items, Key};
use super::kind::{NamedPolicy, PolicyKind, PolicySpec};
use super::snapkv::{pool_1d, Pool};
use super::{
    better, keydiff, rank_key, top_plus_window, H2oParams, KeepSet, KeyDiffParams, KvPolicy,
    PolicyError, PyramidKvParams, Ranked, ScoreInput, SnapKvParams,
};

/// Default `floor`: kvpress's `alpha_safeguard`.
pub const DEFAULT_FLOOR: f32 = 0.2;
/// The policy whose scores Ada-KV ranks ([`Scorer`]).
const INNER: Key = Key {
    name: "inner",
    expected: "`snapkv`, `pyramidkv`, `h2o` or `keydiff`",
};
/// The share of the per-head budget every head keeps at least.
const FLOOR: Key = Key {
    name: "floor",
    expected: "a number in [0, 1]",
};

/// The score-based policy Ada-KV ranks by (its `inner`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scorer {
    /// SnapKV's pooled attention of the last `window` queries.
    SnapKv(SnapKvParams),
    /// SnapKV's scores with PyramidKV's per-layer budget.
    PyramidKv(PyramidKvParams),
    /// H2O's accumulated attention.
    H2o(H2oParams),
    /// KeyDiff's key distinctiveness (query-agnostic).
    KeyDiff(KeyDiffParams),
}

impl Scorer {
    /// The inner policy on its own: what gives Ada-KV its budget, window and
    /// triggers.
    pub fn policy(&self) -> KvPolicy {
        match *self {
            Scorer::SnapKv(p) => KvPolicy::SnapKv(p),
            Scorer::PyramidKv(p) => KvPolicy::PyramidKv(p),
            Scorer::H2o(p) => KvPolicy::H2o(p),
            Scorer::KeyDiff(p) => KvPolicy::KeyDiff(p),
        }
    }

    /// The scorer behind `policy`; `None` for policies without comparable
    /// scores (full, streaming, rkv, adakv itself).
    pub fn from_policy(policy: &KvPolicy) -> Option<Self> {
        match *policy {
            KvPolicy::SnapKv(p) => Some(Scorer::SnapKv(p)),
            KvPolicy::PyramidKv(p) => Some(Scorer::PyramidKv(p)),
            KvPolicy::H2o(p) => Some(Scorer::H2o(p)),
            KvPolicy::KeyDiff(p) => Some(Scorer::KeyDiff(p)),
            _ => None,
        }
    }

    /// The scorer `name` with the items of `body`, not validated; `None` for
    /// a policy Ada-KV cannot wrap.
    fn parse(name: &str, body: &str) -> Option<Result<Self, PolicyError>> {
        Some(match name {
            n if n == SnapKvParams::SPEC.name => SnapKvParams::parse(body).map(Scorer::SnapKv),
            n if n == PyramidKvParams::SPEC.name => {
                PyramidKvParams::parse(body).map(Scorer::PyramidKv)
            }
            n if n == H2oParams::SPEC.name => H2oParams::parse(body).map(Scorer::H2o),
            n if n == KeyDiffParams::SPEC.name => KeyDiffParams::parse(body).map(Scorer::KeyDiff),
            _ => return None,
        })
    }
}

/// Parameters of [`super::KvPolicy::AdaKv`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaKvParams {
    /// The policy whose scores are ranked across heads.
    pub inner: Scorer,
    /// Fraction of the per-head budget every head keeps at least, in `[0, 1]`;
    /// 1 gives every head exactly its budget, i.e. the inner policy.
    pub floor: f32,
}

impl Default for AdaKvParams {
    fn default() -> Self {
        Self {
            inner: Scorer::SnapKv(SnapKvParams::default()),
            floor: DEFAULT_FLOOR,
        }
    }
}

impl AdaKvParams {
    /// Entries every head keeps at a layer budget of `budget`: its window or its
    /// floor, whichever is more.
    pub fn guaranteed(&self, budget: usize) -> usize {
        safeguard(self.floor, budget).max(self.inner.policy().window().min(budget))
    }
}

/// Per head, the sorted indices of the real entries to keep; heads keep
/// different counts, `budget * n_kv` in all (or every real entry when the layer
/// holds no more).
pub(super) fn select(p: &AdaKvParams, input: &ScoreInput) -> KeepSet {
    let n_kv = input.n_kv();
    let inner = p.inner.policy();
    // The real entries of each head (padding slots are never kept).
    let held: Vec<Vec<usize>> = (0..n_kv)
        .map(|h| {
            let pos = &input.positions[h];
            (0..input.n_cached)
                .filter(|&i| pos.get(i) != Some(&HIDDEN_POSITION))
                .collect()
        })
        .collect();
    let total: usize = held.iter().map(Vec::len).sum();
    let budget = match inner.layer_budget(input.layer, input.n_layer) {
        Some(b) if total > b.saturating_mul(n_kv) => b,
        _ => return KeepSet { per_head: held },
    };
    let window = inner.window().min(budget);
    let safe = p.guaranteed(budget);
    let mut order = Vec::new();
    let mut scores = Vec::new();
    // Per head: the guaranteed entries (window + safeguard), as indices into
    // `held[h]`, and the other candidates into the shared pool.
    let mut keep: Vec<Vec<usize>> = Vec::with_capacity(n_kv);
    let mut pool: Vec<(Ranked, usize)> = Vec::with_capacity(total);
    for (h, held_h) in held.iter().enumerate() {
        let m = held_h.len();
        let n_cand = m - window.min(m);
        head_scores(&p.inner, input, h, held_h, n_cand, &mut scores);
        let guaranteed = top_plus_window(&scores, m, safe.min(m), window, &mut order);
        let mut taken = vec![false; m];
        guaranteed.iter().for_each(|&j| taken[j] = true);
        pool.extend((0..n_cand).filter(|&j| !taken[j]).map(|j| {
            (
                (rank_key(scores.get(j).copied().unwrap_or(0.0)), held_h[j]),
                h,
            )
        }));
        keep.push(guaranteed);
    }
    let slots = (budget * n_kv).saturating_sub(keep.iter().map(Vec::len).sum());
    // Across heads: better score, then the older entry, then the lower head.
    let across = |a: &(Ranked, usize), b: &(Ranked, usize)| better(&a.0, &b.0).then(a.1.cmp(&b.1));
    if slots < pool.len() {
        if slots > 0 {
            pool.select_nth_unstable_by(slots - 1, across);
        }
        pool.truncate(slots);
    }
    let mut per_head: Vec<Vec<usize>> = keep
        .into_iter()
        .zip(&held)
        .map(|(k, held_h)| k.into_iter().map(|j| held_h[j]).collect())
        .collect();
    for ((_, i), h) in pool {
        per_head[h].push(i);
    }
    per_head.iter_mut().for_each(|k| k.sort_unstable());
    KeepSet { per_head }
}

/// Entries every head keeps at least: `floor * budget`, rounded down (as
/// kvpress), within `[0, budget]` whatever `floor` holds.
fn safeguard(floor: f32, budget: usize) -> usize {
    let f = if floor.is_finite() {
        floor.clamp(0.0, 1.0)
    } else {
        0.0
    };
    ((f64::from(f) * budget as f64 + 1e-9).floor() as usize).min(budget)
}

/// The inner policy's scores of head `h`'s entries `held[..n_cand]` (its real
/// entries before the window), computed over the head's real entries alone so
/// padding neither scores nor pools.
fn head_scores(
    inner: &Scorer,
    input: &ScoreInput,
    h: usize,
    held: &[usize],
    n_cand: usize,
    out: &mut Vec<f32>,
) {
    match inner {
        Scorer::SnapKv(p) => attention_scores(input, h, held, n_cand, p.kernel, p.pool, out),
        Scorer::PyramidKv(p) => attention_scores(input, h, held, n_cand, p.kernel, p.pool, out),
        Scorer::H2o(_) => {
            let cum = input.cumulative.get(h).map_or(&[][..], Vec::as_slice);
            out.clear();
            out.extend(
                held[..n_cand]
                    .iter()
                    .map(|&i| cum.get(i).copied().unwrap_or(0.0)),
            );
        }
        Scorer::KeyDiff(_) => keydiff::scores_into(input, h, held, n_cand, out),
    }
}

/// SnapKV's importance over `held[..n_cand]`: mean attention of the recent
/// rows (a row too short for an entry counts 0), pooled along the head's real
/// entries.
fn attention_scores(
    input: &ScoreInput,
    h: usize,
    held: &[usize],
    n_cand: usize,
    kernel: usize,
    pool: Pool,
    out: &mut Vec<f32>,
) {
    let rows = input.recent_rows.get(h).map_or(&[][..], Vec::as_slice);
    let inv = if rows.len() > 1 {
        1.0 / rows.len() as f32
    } else {
        1.0
    };
    let raw: Vec<f32> = held[..n_cand]
        .iter()
        .map(|&i| {
            rows.iter()
                .map(|r| r.get(i).copied().unwrap_or(0.0))
                .sum::<f32>()
                * inv
        })
        .collect();
    pool_1d(&raw, kernel, pool, out);
}

impl NamedPolicy for AdaKvParams {
    const SPEC: PolicySpec = PolicySpec {
        name: "adakv",
        keys: &[INNER, FLOOR],
        help: "a score-based policy's scores ranked across the KV heads of a layer \
               (takes its inner policy's keys too)",
    };

    /// `inner` and `floor` are Ada-KV's own; every other item goes to the inner
    /// policy's parser, and errors about those items still name adakv.
    fn parse(body: &str) -> Result<Self, PolicyError> {
        let (mut own, mut rest) = (Vec::new(), Vec::new());
        for item in body.split(',') {
            let key = item.split_once('=').map(|(k, _)| k.trim());
            if key.is_some_and(|k| Self::SPEC.keys.iter().any(|own| own.name == k)) {
                own.push(item);
            } else {
                rest.push(item);
            }
        }
        let own_body = own.join(",");
        let p = Items::parse(Self::SPEC.name, Self::SPEC.keys, &own_body)?;
        let d = Self::default();
        let inner = p.get(INNER.name).unwrap_or(d.inner.policy().name());
        let Some(parsed) = Scorer::parse(inner, &rest.join(",")) else {
            return Err(bad(&INNER, inner));
        };
        let inner = parsed.map_err(|e| match e {
            PolicyError::UnknownKey { key, known, .. } => PolicyError::UnknownKey {
                policy: Self::SPEC.name,
                key,
                known: format!("{}, {known}", super::items::names(Self::SPEC.keys)),
            },
            PolicyError::Malformed { item, .. } => PolicyError::Malformed {
                policy: Self::SPEC.name,
                item,
            },
            PolicyError::DuplicateKey { key, .. } => PolicyError::DuplicateKey {
                policy: Self::SPEC.name,
                key,
            },
            other => other,
        })?;
        Ok(Self {
            inner,
            floor: p.f32(&FLOOR, d.floor)?,
        })
    }
}

/// Most answers are the inner policy's; heads keep different counts.
impl PolicyKind for AdaKvParams {
    fn budget(&self) -> Option<usize> {
        self.inner.policy().budget()
    }

    fn set_budget(&mut self, budget: usize) {
        if let Some(inner) = Scorer::from_policy(&self.inner.policy().with_budget(budget)) {
            self.inner = inner;
        }
    }

    fn layer_budget(&self, layer: usize, n_layer: usize) -> Option<usize> {
        self.inner.policy().layer_budget(layer, n_layer)
    }

    /// One head may take what the others leave above their guaranteed
    /// `max(window, floor * budget)`.
    fn head_capacity(&self, layer: usize, n_layer: usize, n_kv: usize) -> Option<usize> {
        let budget = PolicyKind::layer_budget(self, layer, n_layer)?;
        let guaranteed = self.guaranteed(budget);
        let others = n_kv.saturating_sub(1);
        Some(budget.saturating_mul(n_kv) - others.saturating_mul(guaranteed))
    }

    fn is_head_wise(&self) -> bool {
        true
    }

    fn window(&self) -> usize {
        self.inner.policy().window()
    }

    fn window_key(&self) -> &'static str {
        self.inner.policy().window_key()
    }

    fn every(&self) -> usize {
        self.inner.policy().every()
    }

    fn compresses_prompt(&self) -> bool {
        self.inner.policy().compresses_prompt()
    }

    fn needs_cumulative(&self) -> bool {
        self.inner.policy().needs_cumulative()
    }

    fn needs_recent_rows(&self) -> bool {
        self.inner.policy().needs_recent_rows()
    }

    fn needs_keys(&self) -> bool {
        self.inner.policy().needs_keys()
    }

    fn validate(&self) -> Result<(), PolicyError> {
        self.inner.policy().validate()?;
        if !(0.0..=1.0).contains(&self.floor) {
            return Err(bad(&FLOOR, self.floor));
        }
        Ok(())
    }

    /// Weighs the budget against the layer's real entries, not its padded length.
    fn select(&self, input: &ScoreInput) -> KeepSet {
        select(self, input)
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.policy().to_string();
        let (name, keys) = inner.split_once(':').unwrap_or((&inner, ""));
        write!(
            f,
            "{}:inner={name},floor={},{keys}",
            Self::SPEC.name,
            self.floor
        )
    }
}

#[cfg(test)]
#[path = "adakv_tests.rs"]
mod tests;
