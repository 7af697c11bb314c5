//! KV compression policies: which cached entries a sequence keeps once its cache
//! is over budget (DESIGN.md §3).
//!
//! One [`KvPolicy`] value, read from and printed back to a spec string
//! (`spec.rs`), drives serving and training alike. Policies are pure: [`select`]
//! takes the scores of one layer of one sequence ([`ScoreInput`]) and returns the
//! entries to keep ([`KeepSet`]); [`should_compress`] says when to call it. They
//! own no storage and see no tensors: the cache gathers what the policy asks for
//! ([`KvPolicy::needs_cumulative`], [`KvPolicy::needs_recent_rows`],
//! [`KvPolicy::needs_keys`], [`KvPolicy::needs_values`],
//! [`KvPolicy::needs_queries`]), calls [`select`] for every layer and compacts itself.
//!
//! One file per policy, which answers every question asked of it (its budget,
//! window and triggers, what the cache must gather for it, its keys, checks and
//! printed spec) through the traits of `kind.rs`: `full.rs`, `streaming.rs`
//! (StreamingLLM, Xiao et al. 2023), `h2o.rs` (H2O, Zhang et al. 2023), `snapkv.rs`
//! (SnapKV, Li et al. 2024, and the pooling PyramidKV and R-KV reuse), `pyramidkv.rs`
//! (PyramidKV, Cai et al. 2024), `rkv.rs` (R-KV, Cai et al. 2025), `expected.rs`
//! (Expected Attention, Devoto et al. 2025), `keydiff.rs` (KeyDiff, Park et al.
//! 2025), `adakv.rs` (Ada-KV, Feng et al. 2024: head-wise budgets over any of
//! snapkv, pyramidkv, h2o, keydiff). `relative.rs` makes any budgeted policy's
//! budget a share of the sequence's current length (`budget=50%,min_budget=64`).
//! The registry below lists them, one line each; `registry.rs` expands it into
//! [`KvPolicy`], its static dispatch and [`KvPolicy::SPECS`]. `spec.rs` reads and
//! prints spec strings, `items.rs` their `key=value` items, `error.rs` holds
//! [`PolicyError`].
//!
//! Rules every policy follows:
//! - a layer holding no more than its budget keeps everything;
//! - the newest [`KvPolicy::window`] entries are always kept (in every head);
//! - kept indices are sorted ascending; every KV head keeps the same count, so a
//!   layer stays one dense `[n_kv_head, kept, head_dim]` block with original positions,
//!   except under the head-wise [`KvPolicy::AdaKv`], whose heads keep different counts
//!   and which the cache pads to one block with slots no query sees
//!   ([`tern_models::HIDDEN_POSITION`]; see [`KvPolicy::is_head_wise`]);
//! - ranking is deterministic: higher score first, equal scores keep the lower index
//!   (the older entry), NaN ranks below everything;
//! - malformed input (a missing head, a short score row) never panics: what is
//!   missing scores 0.

#[macro_use]
mod registry;

mod adakv;
mod error;
mod expected;
mod full;
mod h2o;
mod items;
mod keydiff;
mod kind;
mod pyramidkv;
mod relative;
mod rkv;
mod snapkv;
mod spec;
mod streaming;

use std::cmp::Ordering;

pub use adakv::{AdaKvParams, Scorer};
pub use error::PolicyError;
pub use expected::{Covariance, ExpectedParams, QueryStats, MAX_N_FUTURE};
pub use h2o::H2oParams;
pub use items::Key;
pub use keydiff::KeyDiffParams;
pub use kind::PolicySpec;
pub use pyramidkv::PyramidKvParams;
pub use relative::RelativeParams;
pub use rkv::RkvParams;
pub use snapkv::{Pool, SnapKvParams, MAX_KERNEL};
pub use streaming::StreamingParams;

use full::Full;
use kind::{NamedPolicy, PolicyKind};

/// Default `budget` of every budgeted policy: cached tokens kept per layer (and KV head).
pub const DEFAULT_BUDGET: usize = 256;

// The registry: every budgeted policy, one line each, in the order error
// messages list them (after `full`). A new policy is its file (parameters
// implementing `NamedPolicy` and `PolicyKind`) plus its line here.
policies! {
    /// Attention sinks plus a rolling window; needs no scores.
    Streaming(StreamingParams),
    /// Heavy hitters by accumulated attention plus the newest tokens.
    H2o(H2oParams),
    /// Importance from the attention of the last `window` queries, pooled.
    SnapKv(SnapKvParams),
    /// SnapKV with a per-layer budget that falls linearly with depth.
    PyramidKv(PyramidKvParams),
    /// SnapKV importance minus key redundancy, for long reasoning traces.
    Rkv(RkvParams),
    /// Keys least like the head's mean key, plus the newest; needs no attention.
    KeyDiff(KeyDiffParams),
    /// A score-based policy's scores ranked across the KV heads of a layer, so
    /// heads keep different counts (the layer's total stays the inner budget).
    AdaKv(AdaKvParams),
    /// Attention expected from the distribution of future queries, times value norm.
    Expected(ExpectedParams),
}

/// Every question forwards to the parameters the policy holds (their files
/// answer), except the relative-budget helpers, which only the wrapper has.
impl KvPolicy {
    /// Tokens kept per layer on average; `None` for [`KvPolicy::Full`], which never evicts.
    /// The engine sizes admission (KV bytes per sequence) from this.
    pub fn budget(&self) -> Option<usize> {
        with_kind!(self, k => PolicyKind::budget(k))
    }

    /// The policy a sequence that has read `seen` tokens compresses by: under
    /// a relative budget the inner policy at `max(floor, ceil(share * seen))`,
    /// otherwise the policy itself.
    pub fn at_length(&self, seen: usize) -> std::borrow::Cow<'_, KvPolicy> {
        match self {
            KvPolicy::Relative(p) => std::borrow::Cow::Owned(p.at_length(seen)),
            other => std::borrow::Cow::Borrowed(other),
        }
    }

    /// Whether the budget is a share of the sequence's length (`budget=P%`).
    pub fn is_relative(&self) -> bool {
        matches!(self, KvPolicy::Relative(_))
    }

    /// This policy with its budget set to `budget` tokens (the inner
    /// policy's under adakv; the floor under a relative budget); full is
    /// returned as it is.
    pub fn with_budget(&self, budget: usize) -> KvPolicy {
        let mut p = self.clone();
        with_kind!(mut &mut p, k => PolicyKind::set_budget(k, budget));
        p
    }

    /// Tokens `layer` of `n_layer` keeps: PyramidKV's linear schedule (largest at
    /// layer 0, averaging `budget`), `budget` for the others, `None` for full.
    /// Under adakv, the mean per KV head (heads keep different counts).
    pub fn layer_budget(&self, layer: usize, n_layer: usize) -> Option<usize> {
        with_kind!(self, k => PolicyKind::layer_budget(k, layer, n_layer))
    }

    /// The most entries one KV head of `layer` can keep after a compression, with
    /// `n_kv` heads: the layer budget, except under adakv, where one head may take
    /// what the others leave above their guaranteed `max(window, floor * budget)`.
    /// The cache pads every head to its layer's largest count, so this bounds a
    /// layer's memory (the engine reserves by it).
    pub fn head_capacity(&self, layer: usize, n_layer: usize, n_kv: usize) -> Option<usize> {
        with_kind!(self, k => PolicyKind::head_capacity(k, layer, n_layer, n_kv))
    }

    /// Whether KV heads keep different counts (adakv): the cache then pads heads
    /// with hidden slots and the model masks even a single new token.
    pub fn is_head_wise(&self) -> bool {
        with_kind!(self, k => PolicyKind::is_head_wise(k))
    }

    /// Newest entries always kept: `budget - sink` for streaming, `recent` for h2o,
    /// `window` for snapkv/pyramidkv/rkv/keydiff/expected (and adakv's inner policy), 0 for
    /// full (which keeps everything anyway).
    pub fn window(&self) -> usize {
        with_kind!(self, k => PolicyKind::window(k))
    }

    /// The key that sets [`KvPolicy::window`] (`recent` for h2o), as errors name it.
    fn window_key(&self) -> &'static str {
        with_kind!(self, k => PolicyKind::window_key(k))
    }

    /// Decode tokens between two compressions (1 for streaming, which trims
    /// every step; 0 for full, which never compresses).
    pub fn every(&self) -> usize {
        with_kind!(self, k => PolicyKind::every(k))
    }

    /// Whether the prompt is brought to budget while it is read (chunk by
    /// chunk) rather than held whole until decoding starts compressing.
    pub fn compresses_prompt(&self) -> bool {
        with_kind!(self, k => PolicyKind::compresses_prompt(k))
    }

    /// Whether an over-budget cache compresses now (see [`should_compress`]).
    fn triggers(&self, tokens_since_last: usize, in_prefill: bool) -> bool {
        with_kind!(self, k => PolicyKind::triggers(k, tokens_since_last, in_prefill))
    }

    /// Whether the cache must accumulate the attention each entry receives
    /// ([`ScoreInput::cumulative`]); only H2O ranks by it (also inside adakv).
    pub fn needs_cumulative(&self) -> bool {
        with_kind!(self, k => PolicyKind::needs_cumulative(k))
    }

    /// Whether the cache must keep the attention rows of the last [`KvPolicy::window`]
    /// queries ([`ScoreInput::recent_rows`]): snapkv, pyramidkv and rkv score by them.
    pub fn needs_recent_rows(&self) -> bool {
        with_kind!(self, k => PolicyKind::needs_recent_rows(k))
    }

    /// Whether the model must hand attention weights to the cache at all; false for
    /// full and streaming, which lets the model skip that work.
    pub fn needs_attention(&self) -> bool {
        self.needs_cumulative() || self.needs_recent_rows()
    }

    /// Whether [`select`] reads the cached keys ([`ScoreInput::keys`]): R-KV's
    /// redundancy term (not at `alpha = 1`, where it has no weight), KeyDiff, and
    /// Expected Attention's scores.
    pub fn needs_keys(&self) -> bool {
        with_kind!(self, k => PolicyKind::needs_keys(k))
    }

    /// Whether [`select`] reads the cached values ([`ScoreInput::values`]):
    /// Expected Attention weights by their norm.
    pub fn needs_values(&self) -> bool {
        with_kind!(self, k => PolicyKind::needs_values(k))
    }

    /// Whether the model must hand each step's queries to the cache, which
    /// keeps their statistics ([`ScoreInput::queries`]): Expected Attention.
    pub fn needs_queries(&self) -> bool {
        with_kind!(self, k => PolicyKind::needs_queries(k))
    }

    /// Checks the parameters' consistency (the spec parser calls this; call it after
    /// building a policy by hand). Messages name the offending key and value.
    pub fn validate(&self) -> Result<(), PolicyError> {
        with_kind!(self, k => PolicyKind::validate(k))
    }

    /// Checks the sizes a request sets against the model's context:
    /// `budget`, the always-kept window (`window`, or h2o's `recent`) and
    /// `every` may each be at most `context_length`. A value past the
    /// context can never be reached by a real sequence, but it would size
    /// the scoring rows a policy keeps and the reservation admission counts,
    /// so the server refuses it rather than accounting for the impossible.
    pub fn check_context(&self, context_length: usize) -> Result<(), PolicyError> {
        with_kind!(self, k => PolicyKind::check_context(k, context_length))
    }

    /// Writes the canonical spec (`Display`, in `spec.rs`).
    fn fmt_spec(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        with_kind!(self, k => PolicyKind::fmt_spec(k, f))
    }

    /// The registry's names, comma separated, as [`PolicyError::UnknownPolicy`] lists them.
    fn known_names() -> String {
        let names: Vec<&str> = Self::SPECS.iter().map(|s| s.name).collect();
        names.join(", ")
    }
}

/// What a policy may look at for ONE layer of one sequence.
#[derive(Clone, Copy, Debug)]
pub struct ScoreInput<'a> {
    /// Layer index, for per-layer budgets (PyramidKV).
    pub layer: usize,
    /// Layers in the model.
    pub n_layer: usize,
    /// Cached entries per KV head (same count C for every head).
    pub n_cached: usize,
    /// Original token positions of the cached entries, per KV head, sorted ascending:
    /// `[KV][C]`. Its length is the number of KV heads the answer covers. Under a
    /// head-wise policy, padding slots at [`tern_models::HIDDEN_POSITION`] may sit
    /// among them (only adakv's selection is ever given such a layer).
    pub positions: &'a [Vec<u32>],
    /// Attention the entries received, accumulated since each was cached (H2O's score),
    /// per KV head, already combined over the query heads of the GQA group: `[KV][C]`.
    /// Empty if the policy does not need it.
    pub cumulative: &'a [Vec<f32>],
    /// Attention rows of the most recent queries (up to `window` of them, oldest first),
    /// per KV head, combined over the group: `[KV][rows][len]` where `len <= C` covers the
    /// first `len` entries (entries cached after that query have no score from it).
    /// Empty if unneeded.
    pub recent_rows: &'a [Vec<Vec<f32>>],
    /// Post-RoPE keys per KV head, row-major `[C, head_dim]` f32: `[KV][C*head_dim]`;
    /// empty unless the policy needs keys.
    pub keys: &'a [Vec<f32>],
    /// Values per KV head, laid out as [`ScoreInput::keys`]; empty unless the
    /// policy needs values.
    pub values: &'a [Vec<f32>],
    /// Statistics of the queries since the last compression; `None` unless the
    /// policy needs queries.
    pub queries: Option<&'a QueryStats>,
    /// Width of one key row in [`ScoreInput::keys`].
    pub head_dim: usize,
}

impl ScoreInput<'_> {
    /// Number of KV heads the selection covers.
    fn n_kv(&self) -> usize {
        self.positions.len()
    }
}

/// Per KV head, the sorted indices (into `0..C`) of entries to keep. All heads keep
/// the same count, so the cache can gather each layer into one dense block, except
/// under a head-wise policy (adakv), where the cache pads the shorter heads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepSet {
    /// `[KV][kept]`, ascending indices into the layer's cached entries.
    pub per_head: Vec<Vec<usize>>,
}

impl KeepSet {
    /// Every one of `n_cached` entries for each of `n_kv` heads.
    pub fn all(n_kv: usize, n_cached: usize) -> Self {
        Self {
            per_head: vec![(0..n_cached).collect(); n_kv],
        }
    }

    /// Entries kept by the fullest head (every head's count but under adakv): the
    /// length of the layer's block after compaction.
    pub fn kept(&self) -> usize {
        self.per_head.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Whether nothing of `n_cached` entries is dropped in any head, so the cache
    /// can skip compaction.
    pub fn keeps_all(&self, n_cached: usize) -> bool {
        self.per_head.iter().all(|h| h.len() == n_cached)
    }
}

/// Which entries of one layer of one sequence to keep under `policy`.
///
/// Pure and deterministic; a layer at or under its budget keeps everything. Cost is
/// O(C) per head plus the policy's scoring (R-KV adds O(C * head_dim)).
pub fn select(policy: &KvPolicy, input: &ScoreInput) -> KeepSet {
    with_kind!(policy, k => PolicyKind::select(k, input))
}

/// Whether the cache should be compressed back to budget now.
///
/// `n_cached` is the entry count of the layer being checked (per KV head; under
/// adakv the mean over heads of real entries, padding left out); `tokens_since_last`
/// counts tokens cached since the last compression (or since prefill ended);
/// `in_prefill` is true for the calls made when the prompt (or one chunk of it) has
/// been cached, before the first generated token.
///
/// The rule, for every budgeted policy but streaming: two independent switches,
/// both over budget only.
/// - `prefill=true`: compress the prompt once it is read (at the end of each
///   prefill chunk, so a long prompt never holds more than budget + chunk), scored
///   by its last queries: SnapKV's own setting. `prefill=false`: hold the whole
///   prompt until the first decode compression.
/// - `every=N`: in decode, compress every `N` generated tokens (Tern's periodic
///   decode compression; between two, the cache holds up to budget + N).
///
/// Defaults: `prefill=true` for h2o, snapkv, pyramidkv, keydiff and expected; `false` for rkv
/// (R-KV compresses the decoding trace); `every` 1 for h2o (every step, as in the
/// paper), 128 for the others. adakv takes both from its inner policy. Full never
/// compresses; streaming trims whenever over budget, prefill or decode (a rolling
/// window). A relative budget answers here for its floor: the cache asks with
/// [`KvPolicy::at_length`] of the sequence's length, so the trigger follows the
/// budget as the sequence grows.
pub fn should_compress(
    policy: &KvPolicy,
    n_cached: usize,
    tokens_since_last: usize,
    in_prefill: bool,
) -> bool {
    match policy.budget() {
        Some(budget) if n_cached > budget => policy.triggers(tokens_since_last, in_prefill),
        _ => false,
    }
}

/// A score as ranked: NaN below everything, `-0.0` equal to `0.0`.
fn rank_key(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x + 0.0
    }
}

/// A candidate as ranked: its [`rank_key`] and its index.
type Ranked = (f32, usize);

/// Better first: higher score, then lower index (the older entry wins ties). A
/// total order, so the top k are always exactly determined.
fn better(a: &Ranked, b: &Ranked) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// One head's keep list: the last `window` of `n_cached` entries plus the
/// `budget - window` best-scored of the entries before them.
///
/// `candidate_scores[i]` scores entry `i < n_cached - window` (missing ones score 0).
/// `order` is scratch reused across heads. O(C), no sort: a partial selection finds
/// the k-th best candidate, then one pass in index order keeps every candidate
/// ranked at or above it (exactly k, as the order is total), already sorted.
fn top_plus_window(
    candidate_scores: &[f32],
    n_cached: usize,
    budget: usize,
    window: usize,
    order: &mut Vec<Ranked>,
) -> Vec<usize> {
    let window = window.min(budget).min(n_cached);
    let n_cand = n_cached - window;
    let k = (budget - window).min(n_cand);
    let ranked = || {
        candidate_scores
            .iter()
            .copied()
            .chain(std::iter::repeat(0.0))
            .take(n_cand)
            .map(rank_key)
            .enumerate()
            .map(|(i, key)| (key, i))
    };
    let mut keep = Vec::with_capacity(k + window);
    if k == n_cand {
        keep.extend(0..n_cand);
    } else if k > 0 {
        order.clear();
        order.extend(ranked());
        let (_, &mut kth, _) = order.select_nth_unstable_by(k - 1, better);
        keep.extend(
            ranked()
                .filter(|r| better(r, &kth) != Ordering::Greater)
                .map(|(_, i)| i),
        );
    }
    keep.extend(n_cand..n_cached);
    keep
}

/// Shared builders of hand-made inputs for the policy tests.
#[cfg(test)]
mod test_support {
    /// Positions `0..c` for each of `n_kv` heads.
    pub fn positions(n_kv: usize, c: usize) -> Vec<Vec<u32>> {
        (0..n_kv).map(|_| (0..c as u32).collect()).collect()
    }

    /// Asserts the keep-set invariants: sorted, distinct, in range, same count per head.
    pub fn assert_well_formed(keep: &super::KeepSet, n_kv: usize, c: usize, kept: usize) {
        assert_eq!(keep.per_head.len(), n_kv);
        for head in &keep.per_head {
            assert_eq!(head.len(), kept, "{head:?}");
            assert!(head.windows(2).all(|w| w[0] < w[1]), "{head:?}");
            assert!(head.iter().all(|&i| i < c), "{head:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    fn input<'a>(c: usize, positions: &'a [Vec<u32>]) -> ScoreInput<'a> {
        ScoreInput {
            layer: 0,
            n_layer: 1,
            n_cached: c,
            positions,
            cumulative: &[],
            recent_rows: &[],
            keys: &[],
            values: &[],
            queries: None,
            head_dim: 0,
        }
    }

    fn all_policies() -> Vec<KvPolicy> {
        [
            "full",
            "streaming",
            "h2o",
            "snapkv",
            "pyramidkv",
            "rkv",
            "expected",
            "keydiff",
            "adakv",
            "adakv:inner=h2o",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect()
    }

    #[test]
    fn the_registry_names_each_policy_once_and_prints_its_keys_in_order() {
        let names: Vec<&str> = KvPolicy::SPECS.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "full",
                "streaming",
                "h2o",
                "snapkv",
                "pyramidkv",
                "rkv",
                "keydiff",
                "adakv",
                "expected"
            ]
        );
        for spec in KvPolicy::SPECS {
            let policy: KvPolicy = spec.name.parse().unwrap();
            assert_eq!(policy.name(), spec.name);
            // The canonical spec lists the policy's keys first, in order
            // (adakv's inner policy's keys follow its own).
            let printed = policy.to_string();
            let keys: Vec<&str> = printed
                .split_once(':')
                .map_or(vec![], |(_, items)| items.split(',').collect())
                .into_iter()
                .map(|item| item.split_once('=').unwrap().0)
                .take(spec.keys.len())
                .collect();
            let want: Vec<&str> = spec.keys.iter().map(|k| k.name).collect();
            assert_eq!(keys, want, "{printed}");
            assert!(!spec.help.is_empty());
        }
    }

    #[test]
    fn at_or_under_budget_keeps_everything() {
        let pos = positions(2, 256);
        for policy in all_policies() {
            for c in [0, 1, 100, 128, 256] {
                let keep = select(&policy, &input(c, &pos));
                assert_eq!(keep, KeepSet::all(2, c), "{policy} c={c}");
                assert!(keep.keeps_all(c));
            }
        }
    }

    #[test]
    fn over_budget_keeps_budget_sorted_with_missing_scores() {
        // No scores at all: every policy still answers, never panics, keeps `budget`.
        let pos = positions(3, 300);
        for policy in all_policies().into_iter().skip(1) {
            let keep = select(&policy, &input(300, &pos));
            assert_well_formed(&keep, 3, 300, 256);
            let window = policy.window();
            assert!(keep.per_head[0].ends_with(&(300 - window..300).collect::<Vec<_>>()));
        }
    }

    #[test]
    fn absurd_parameters_do_not_panic() {
        let huge = usize::MAX;
        let p: KvPolicy = format!("pyramidkv:budget={huge},window=8,kernel={MAX_KERNEL}")
            .parse()
            .unwrap();
        assert!(p.layer_budget(0, 80).is_some());
        assert!(!should_compress(&p, 10, 10, true));
        // Unvalidated, hand-built: kernels wider than anything, a window past the budget.
        let pos = positions(2, 40);
        let rows = vec![vec![vec![0.5; 40]]; 2];
        let keys = vec![vec![1.0; 40 * 4]; 2];
        let input = ScoreInput {
            recent_rows: &rows,
            keys: &keys,
            head_dim: 4,
            ..input(40, &pos)
        };
        for policy in [
            KvPolicy::SnapKv(SnapKvParams {
                budget: 10,
                window: 30,
                kernel: huge,
                ..SnapKvParams::default()
            }),
            KvPolicy::Rkv(RkvParams {
                budget: 10,
                window: 3,
                kernel: huge - 1,
                alpha: f32::NAN,
                every: 0,
                prefill: false,
            }),
            KvPolicy::PyramidKv(PyramidKvParams {
                budget: 10,
                min_ratio: -3.0,
                ..PyramidKvParams::default()
            }),
        ] {
            assert_well_formed(&select(&policy, &input), 2, 40, 10);
        }
    }

    #[test]
    fn top_plus_window_breaks_ties_towards_older_entries() {
        let mut order = Vec::new();
        // Candidates 0..6, window 6..8; scores tie at 1.0 for 1, 3, 5 and NaN at 0.
        let scores = [f32::NAN, 1.0, 0.5, 1.0, -0.0, 1.0];
        assert_eq!(top_plus_window(&scores, 8, 4, 2, &mut order), [1, 3, 6, 7]);
        // -0.0 ties with 0.0 (index order decides); NaN ranks below both.
        let scores = [f32::NAN, -0.0, 0.0];
        assert_eq!(top_plus_window(&scores, 4, 2, 1, &mut order), [1, 3]);
        // Short score slices: missing candidates score 0.
        assert_eq!(top_plus_window(&[-1.0], 5, 3, 1, &mut order), [1, 2, 4]);
    }

    #[test]
    fn policy_accessors() {
        let full = KvPolicy::Full;
        assert_eq!(full.budget(), None);
        assert_eq!(full.layer_budget(3, 10), None);
        assert!(!full.needs_attention() && !full.needs_keys());
        let p: KvPolicy = "streaming:budget=100,sink=4".parse().unwrap();
        assert_eq!((p.budget(), p.window()), (Some(100), 96));
        assert!(!p.needs_attention());
        let p: KvPolicy = "h2o:budget=100,recent=10".parse().unwrap();
        assert_eq!((p.window(), p.layer_budget(5, 10)), (10, Some(100)));
        assert!(p.needs_cumulative() && !p.needs_recent_rows() && !p.needs_keys());
        let p: KvPolicy = "snapkv:window=16".parse().unwrap();
        assert!(p.needs_recent_rows() && p.needs_attention() && !p.needs_keys());
        assert_eq!(p.window(), 16);
        let p: KvPolicy = "rkv".parse().unwrap();
        assert!(p.needs_keys() && p.needs_recent_rows());
        let p: KvPolicy = "rkv:alpha=1".parse().unwrap();
        assert!(!p.needs_keys(), "alpha = 1 ignores redundancy");
    }

    #[test]
    fn should_compress_triggers() {
        let p = |s: &str| s.parse::<KvPolicy>().unwrap();
        // Full never compresses.
        assert!(!should_compress(&KvPolicy::Full, 1 << 20, 1 << 20, false));
        // Streaming: whenever over budget.
        let s = p("streaming:budget=8,sink=2");
        assert!(!should_compress(&s, 8, 100, false));
        assert!(should_compress(&s, 9, 0, false));
        assert!(should_compress(&s, 9, 0, true));
        // H2O: prefill end when over, decode every `every` (default every step).
        let h = p("h2o:budget=8,recent=2");
        assert!(should_compress(&h, 9, 0, true));
        assert!(should_compress(&h, 9, 1, false));
        assert!(!should_compress(&h, 9, 0, false));
        assert!(!should_compress(&h, 8, 1, false));
        let h = p("h2o:budget=8,recent=2,every=4");
        assert!(!should_compress(&h, 11, 3, false));
        assert!(should_compress(&h, 12, 4, false));
        // SnapKV / PyramidKV: prefill per flag, decode every `every`.
        for name in ["snapkv", "pyramidkv"] {
            let on = p(&format!("{name}:budget=16,window=2,every=4"));
            let off = p(&format!("{name}:budget=16,window=2,every=4,prefill=false"));
            assert!(should_compress(&on, 17, 0, true));
            assert!(!should_compress(&on, 16, 0, true));
            assert!(!should_compress(&off, 100, 0, true));
            assert!(!should_compress(&on, 19, 3, false));
            assert!(should_compress(&on, 20, 4, false));
            assert!(should_compress(&off, 20, 4, false));
            assert!(!should_compress(&on, 16, 4, false));
        }
        // R-KV: decode only.
        let r = p("rkv:budget=16,window=2,every=128");
        assert!(!should_compress(&r, 1000, 1000, true));
        assert!(!should_compress(&r, 143, 127, false));
        assert!(should_compress(&r, 144, 128, false));
        assert!(!should_compress(&r, 16, 128, false));
        // `prefill` switches prompt compression for h2o, rkv and keydiff too.
        let h = p("h2o:budget=8,recent=2,prefill=false");
        assert!(!should_compress(&h, 100, 0, true));
        assert!(should_compress(&h, 9, 1, false));
        let r = p("rkv:budget=16,window=2,prefill=true");
        assert!(should_compress(&r, 17, 0, true));
        assert!(r.compresses_prompt() && !h.compresses_prompt());
        for (spec, prompt) in [
            ("keydiff:budget=16", true),
            ("keydiff:budget=16,prefill=false", false),
        ] {
            let k = p(spec);
            assert_eq!(should_compress(&k, 17, 0, true), prompt, "{spec}");
            assert!(should_compress(&k, 17, 128, false) && !should_compress(&k, 17, 127, false));
        }
    }
}
