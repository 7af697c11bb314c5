//! Spec strings: the one written form of a [`KvPolicy`], read by `FromStr`,
//! printed by `Display`, and used by serde, so CLI flags, request fields, config
//! files and training logs all name a policy the same way.
//!
//! Grammar: `name` or `name:key=value,key=value,...`, e.g. `full`,
//! `streaming:budget=256,sink=4`, `h2o:budget=256,recent=32`,
//! `snapkv:budget=256,window=8,kernel=7,pool=max`, `pyramidkv:budget=256,window=8`,
//! `rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128`, `keydiff:budget=256,window=8`,
//! `expected:budget=256,n_future=512,cov=pair`,
//! `adakv:inner=snapkv,floor=0.2,budget=256,window=32,kernel=5,pool=avg` (Ada-KV takes
//! `inner` and `floor`, and every key of its inner policy). Any budgeted policy
//! takes a relative budget, a share of the sequence's current length with a
//! floor in tokens: `rkv:budget=50%,min_budget=64` (the share in `(0%, 100%]`;
//! `min_budget` is required with a share and refused without one; see
//! `relative.rs`). Keys may come in any
//! order, missing keys take their defaults, spaces around names, keys and values
//! and empty items are ignored. `Display` prints every key in a fixed order, so
//! printing then parsing gives the same policy back.
//!
//! Owns [`PolicyError`] and the consistency checks ([`KvPolicy::validate`]);
//! defaults live with each policy's parameters.

use std::fmt;
use std::str::FromStr;

use super::{
    AdaKvParams, Covariance, ExpectedParams, H2oParams, KeyDiffParams, KvPolicy, Pool,
    PyramidKvParams, RelativeParams, RkvParams, Scorer, SnapKvParams, StreamingParams,
};

/// Keys each policy accepts, in printing order.
const STREAMING_KEYS: &[&str] = &["budget", "sink"];
const H2O_KEYS: &[&str] = &["budget", "recent", "every", "prefill"];
const SNAPKV_KEYS: &[&str] = &["budget", "window", "kernel", "pool", "every", "prefill"];
const PYRAMIDKV_KEYS: &[&str] = &[
    "budget",
    "window",
    "kernel",
    "pool",
    "min_ratio",
    "every",
    "prefill",
];
const RKV_KEYS: &[&str] = &["budget", "window", "kernel", "alpha", "every", "prefill"];
const EXPECTED_KEYS: &[&str] = &[
    "budget", "window", "n_future", "sink", "cov", "epsilon", "every", "prefill",
];
const KEYDIFF_KEYS: &[&str] = &["budget", "window", "every", "prefill"];
/// Ada-KV's own keys; the rest of its spec goes to the inner policy.
const ADAKV_KEYS: &[&str] = &["inner", "floor"];
/// Policies Ada-KV can wrap.
const ADAKV_INNERS: &[&str] = &["snapkv", "pyramidkv", "h2o", "keydiff"];
/// Widest pooling `kernel` (snapkv, pyramidkv, rkv, adakv's inner): pooling
/// costs `kernel` operations per cached entry on the engine thread, and the
/// papers use 5 to 13, so 63 is generous and still cheap.
pub const MAX_KERNEL: usize = 63;
/// Largest `n_future` (expected): each compression averages RoPE over that
/// many positions on the engine thread; kvpress uses 512.
pub const MAX_N_FUTURE: usize = 1 << 16;
/// Every policy name, for [`PolicyError::UnknownPolicy`].
const POLICIES: &str = "full, streaming, h2o, snapkv, pyramidkv, rkv, keydiff, adakv, expected";
/// The names [`POLICIES`] lists, one by one.
const NAMES: &[&str] = &[
    "full",
    "streaming",
    "h2o",
    "snapkv",
    "pyramidkv",
    "rkv",
    "keydiff",
    "adakv",
    "expected",
];

/// Why a spec string or a hand-built policy was rejected; every message names the
/// offending policy, key or value so a user can fix the spec from it alone.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The name before `:` is not a policy.
    #[error("unknown policy `{0}` (known: {POLICIES})")]
    UnknownPolicy(String),
    /// A key the policy does not take.
    #[error("unknown key `{key}` for {policy} (known: {known})")]
    UnknownKey {
        /// Policy name.
        policy: &'static str,
        /// The key as written.
        key: String,
        /// The keys the policy takes, comma separated (`none` for full).
        known: String,
    },
    /// An item without `=`.
    #[error("malformed parameter `{item}` for {policy}: expected key=value")]
    Malformed {
        /// Policy name.
        policy: &'static str,
        /// The item as written.
        item: String,
    },
    /// The same key twice.
    #[error("key `{key}` given twice for {policy}")]
    DuplicateKey {
        /// Policy name.
        policy: &'static str,
        /// The repeated key.
        key: &'static str,
    },
    /// A value that does not parse or is out of range.
    #[error("bad value `{value}` for `{key}`: expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as written (or printed, for a hand-built policy).
        value: String,
        /// What the key accepts.
        expected: &'static str,
    },
    /// `sink`, `recent`, `window` (or `sink + window`) leaves no room in the budget.
    #[error("`{key}` = {value} must be less than `budget` = {budget}")]
    NotBelowBudget {
        /// The key.
        key: &'static str,
        /// Its value.
        value: usize,
        /// The budget it must stay under.
        budget: usize,
    },
    /// A size that exceeds the model's context (see [`KvPolicy::check_context`]).
    #[error(
        "`{key}` = {value} exceeds the model's context of {context_length} tokens \
         (it must be at most the context)"
    )]
    OverContext {
        /// The key.
        key: &'static str,
        /// Its value.
        value: usize,
        /// The served model's context window.
        context_length: usize,
    },
    /// A relative budget (`budget=P%`) without its floor.
    #[error(
        "`budget` = {percent}% is a share of the sequence's length: give `min_budget=N`, \
         the fewest tokens {policy} keeps while that share is smaller"
    )]
    MissingFloor {
        /// Policy name.
        policy: &'static str,
        /// The share, in percent.
        percent: f32,
    },
    /// `min_budget` given with a budget in tokens.
    #[error(
        "`min_budget` is the floor of a relative budget: it needs `budget=P%` \
         (a share of the sequence's length), not a token count"
    )]
    FloorWithoutShare,
    /// PyramidKV's last layer would keep no more than the window.
    #[error(
        "`min_ratio` = {min_ratio} leaves the last layer {last} tokens (budget * min_ratio), \
         which must exceed `window` = {window}"
    )]
    LastLayerTooSmall {
        /// The ratio.
        min_ratio: f32,
        /// The last layer's budget it gives.
        last: usize,
        /// The window that must fit under it.
        window: usize,
    },
}

impl FromStr for KvPolicy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let (name, body) = match s.split_once(':') {
            Some((name, body)) => (name.trim(), body),
            None => (s.trim(), ""),
        };
        let Some(&known) = NAMES.iter().find(|&&n| n == name) else {
            return Err(PolicyError::UnknownPolicy(name.to_string()));
        };
        let policy = match split_relative(known, body)? {
            None => parse_unchecked(name, body)?,
            Some((percent, inner_body)) => {
                // The floor stands in for the budget: errors about it name `min_budget`.
                let inner = parse_unchecked(name, &inner_body).map_err(|e| match e {
                    PolicyError::BadValue {
                        key: "budget",
                        value,
                        ..
                    } => bad("min_budget", value),
                    other => other,
                })?;
                if matches!(inner, KvPolicy::Full) {
                    // full takes no keys: its parser already refused `budget`.
                    return Err(bad_share(format!("{percent}%")));
                }
                KvPolicy::Relative(RelativeParams {
                    percent,
                    inner: Box::new(inner),
                })
            }
        };
        policy.validate()?;
        Ok(policy)
    }
}

/// A relative budget's share and the body its inner policy parses (the
/// floor as `budget=N`, `min_budget` removed); `None` for a budget in tokens.
fn split_relative(policy: &'static str, body: &str) -> Result<Option<(f32, String)>, PolicyError> {
    let items: Vec<&str> = body.split(',').collect();
    fn key_of(item: &str) -> Option<(&str, &str)> {
        item.split_once('=').map(|(k, v)| (k.trim(), v.trim()))
    }
    let share = items
        .iter()
        .filter_map(|i| key_of(i))
        .find(|&(k, v)| k == "budget" && v.ends_with('%'))
        .map(|(_, v)| v);
    let floors: Vec<&str> = items
        .iter()
        .filter_map(|i| key_of(i))
        .filter(|&(k, _)| k == "min_budget")
        .map(|(_, v)| v)
        .collect();
    let Some(share) = share else {
        return if floors.is_empty() {
            Ok(None)
        } else {
            Err(PolicyError::FloorWithoutShare)
        };
    };
    let percent = share
        .trim_end_matches('%')
        .trim()
        .parse::<f32>()
        .ok()
        .filter(|p| *p > 0.0 && *p <= 100.0)
        .ok_or_else(|| bad_share(share))?;
    let floor = match floors.as_slice() {
        [] => return Err(PolicyError::MissingFloor { policy, percent }),
        [one] => *one,
        _ => {
            return Err(PolicyError::DuplicateKey {
                policy,
                key: "min_budget",
            })
        }
    };
    let inner: Vec<String> = items
        .iter()
        .filter(|&&i| key_of(i).is_none_or(|(k, _)| k != "min_budget"))
        .map(|&i| match key_of(i) {
            Some(("budget", _)) => format!("budget={floor}"),
            _ => i.to_string(),
        })
        .collect();
    Ok(Some((percent, inner.join(","))))
}

/// The policy `name` with the items of `body`, defaults filled in, not validated.
fn parse_unchecked(name: &str, body: &str) -> Result<KvPolicy, PolicyError> {
    Ok(match name {
        "full" => {
            Params::parse("full", &[], body)?;
            KvPolicy::Full
        }
        "streaming" => {
            let p = Params::parse("streaming", STREAMING_KEYS, body)?;
            let d = StreamingParams::default();
            KvPolicy::Streaming(StreamingParams {
                budget: p.usize("budget", d.budget)?,
                sink: p.usize("sink", d.sink)?,
            })
        }
        "h2o" => {
            let p = Params::parse("h2o", H2O_KEYS, body)?;
            let d = H2oParams::default();
            let budget = p.usize("budget", d.budget)?;
            KvPolicy::H2o(H2oParams {
                budget,
                recent: p.usize("recent", super::h2o::default_recent(budget))?,
                every: p.usize("every", d.every)?,
                prefill: p.bool("prefill", d.prefill)?,
            })
        }
        "snapkv" => {
            let p = Params::parse("snapkv", SNAPKV_KEYS, body)?;
            let d = SnapKvParams::default();
            KvPolicy::SnapKv(SnapKvParams {
                budget: p.usize("budget", d.budget)?,
                window: p.usize("window", d.window)?,
                kernel: p.usize("kernel", d.kernel)?,
                pool: p.pool("pool", d.pool)?,
                every: p.usize("every", d.every)?,
                prefill: p.bool("prefill", d.prefill)?,
            })
        }
        "pyramidkv" => {
            let p = Params::parse("pyramidkv", PYRAMIDKV_KEYS, body)?;
            let d = PyramidKvParams::default();
            KvPolicy::PyramidKv(PyramidKvParams {
                budget: p.usize("budget", d.budget)?,
                window: p.usize("window", d.window)?,
                kernel: p.usize("kernel", d.kernel)?,
                pool: p.pool("pool", d.pool)?,
                min_ratio: p.f32("min_ratio", d.min_ratio)?,
                every: p.usize("every", d.every)?,
                prefill: p.bool("prefill", d.prefill)?,
            })
        }
        "rkv" => {
            let p = Params::parse("rkv", RKV_KEYS, body)?;
            let d = RkvParams::default();
            KvPolicy::Rkv(RkvParams {
                budget: p.usize("budget", d.budget)?,
                window: p.usize("window", d.window)?,
                kernel: p.usize("kernel", d.kernel)?,
                alpha: p.f32("alpha", d.alpha)?,
                every: p.usize("every", d.every)?,
                prefill: p.bool("prefill", d.prefill)?,
            })
        }
        "keydiff" => {
            let p = Params::parse("keydiff", KEYDIFF_KEYS, body)?;
            let d = KeyDiffParams::default();
            KvPolicy::KeyDiff(KeyDiffParams {
                budget: p.usize("budget", d.budget)?,
                window: p.usize("window", d.window)?,
                every: p.usize("every", d.every)?,
                prefill: p.bool("prefill", d.prefill)?,
            })
        }
        "expected" => {
            let p = Params::parse("expected", EXPECTED_KEYS, body)?;
            let d = ExpectedParams::default();
            KvPolicy::Expected(ExpectedParams {
                budget: p.usize("budget", d.budget)?,
                window: p.usize("window", d.window)?,
                n_future: p.usize("n_future", d.n_future)?,
                sink: p.usize("sink", d.sink)?,
                cov: p.cov("cov", d.cov)?,
                epsilon: p.f32("epsilon", d.epsilon)?,
                every: p.usize("every", d.every)?,
                prefill: p.bool("prefill", d.prefill)?,
            })
        }
        "adakv" => parse_adakv(body)?,
        other => return Err(PolicyError::UnknownPolicy(other.to_string())),
    })
}

/// Ada-KV: `inner` and `floor` are its own, every other item goes to the inner
/// policy's parser; errors about those items still name adakv.
fn parse_adakv(body: &str) -> Result<KvPolicy, PolicyError> {
    let (mut own, mut rest) = (Vec::new(), Vec::new());
    for item in body.split(',') {
        let key = item.split_once('=').map(|(k, _)| k.trim());
        if key.is_some_and(|k| ADAKV_KEYS.contains(&k)) {
            own.push(item);
        } else {
            rest.push(item);
        }
    }
    let own_body = own.join(",");
    let p = Params::parse("adakv", ADAKV_KEYS, &own_body)?;
    let d = AdaKvParams::default();
    let inner = p.get("inner").unwrap_or(d.inner.policy().name());
    if !ADAKV_INNERS.contains(&inner) {
        return Err(bad("inner", inner));
    }
    let inner_policy = parse_unchecked(inner, &rest.join(",")).map_err(|e| match e {
        PolicyError::UnknownKey { key, known, .. } => PolicyError::UnknownKey {
            policy: "adakv",
            key,
            known: format!("{}, {known}", ADAKV_KEYS.join(", ")),
        },
        PolicyError::Malformed { item, .. } => PolicyError::Malformed {
            policy: "adakv",
            item,
        },
        PolicyError::DuplicateKey { key, .. } => PolicyError::DuplicateKey {
            policy: "adakv",
            key,
        },
        other => other,
    })?;
    let inner = Scorer::from_policy(&inner_policy).ok_or_else(|| bad("inner", inner))?;
    Ok(KvPolicy::AdaKv(AdaKvParams {
        inner,
        floor: p.f32("floor", d.floor)?,
    }))
}

impl fmt::Display for KvPolicy {
    /// The canonical spec: every key, in the order of the `*_KEYS` lists.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvPolicy::Full => f.write_str("full"),
            KvPolicy::Streaming(p) => write!(f, "streaming:budget={},sink={}", p.budget, p.sink),
            KvPolicy::H2o(p) => write!(
                f,
                "h2o:budget={},recent={},every={},prefill={}",
                p.budget, p.recent, p.every, p.prefill
            ),
            KvPolicy::SnapKv(p) => write!(
                f,
                "snapkv:budget={},window={},kernel={},pool={},every={},prefill={}",
                p.budget,
                p.window,
                p.kernel,
                p.pool.as_str(),
                p.every,
                p.prefill
            ),
            KvPolicy::PyramidKv(p) => write!(
                f,
                "pyramidkv:budget={},window={},kernel={},pool={},min_ratio={},every={},prefill={}",
                p.budget,
                p.window,
                p.kernel,
                p.pool.as_str(),
                p.min_ratio,
                p.every,
                p.prefill
            ),
            KvPolicy::Rkv(p) => write!(
                f,
                "rkv:budget={},window={},kernel={},alpha={},every={},prefill={}",
                p.budget, p.window, p.kernel, p.alpha, p.every, p.prefill
            ),
            KvPolicy::Expected(p) => write!(
                f,
                "expected:budget={},window={},n_future={},sink={},cov={},epsilon={},every={},prefill={}",
                p.budget,
                p.window,
                p.n_future,
                p.sink,
                p.cov.as_str(),
                p.epsilon,
                p.every,
                p.prefill
            ),
            KvPolicy::KeyDiff(p) => write!(
                f,
                "keydiff:budget={},window={},every={},prefill={}",
                p.budget, p.window, p.every, p.prefill
            ),
            KvPolicy::AdaKv(p) => {
                let inner = p.inner.policy().to_string();
                let (name, keys) = inner.split_once(':').unwrap_or((&inner, ""));
                write!(f, "adakv:inner={name},floor={},{keys}", p.floor)
            }
            KvPolicy::Relative(p) => {
                // The inner spec with its `budget=FLOOR` item as the share and floor.
                let inner = p.inner.to_string();
                let (name, keys) = inner.split_once(':').unwrap_or((&inner, ""));
                let keys: Vec<String> = keys
                    .split(',')
                    .map(|item| match item.strip_prefix("budget=") {
                        Some(floor) => format!("budget={}%,min_budget={floor}", p.percent),
                        None => item.to_string(),
                    })
                    .collect();
                write!(f, "{name}:{}", keys.join(","))
            }
        }
    }
}

impl serde::Serialize for KvPolicy {
    /// As the canonical spec string.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KvPolicy {
    /// From a spec string, with [`PolicyError`]'s message on failure.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = String::deserialize(deserializer)?;
        spec.parse().map_err(serde::de::Error::custom)
    }
}

/// The consistency checks behind [`KvPolicy::validate`].
pub(super) fn validate(policy: &KvPolicy) -> Result<(), PolicyError> {
    match policy {
        KvPolicy::Full => Ok(()),
        KvPolicy::Streaming(p) => {
            positive("budget", p.budget)?;
            below_budget("sink", p.sink, p.budget)
        }
        KvPolicy::H2o(p) => {
            positive("budget", p.budget)?;
            below_budget("recent", p.recent, p.budget)?;
            positive("every", p.every)
        }
        KvPolicy::SnapKv(p) => {
            check_scored(p.budget, p.window, p.kernel)?;
            positive("every", p.every)
        }
        KvPolicy::PyramidKv(p) => {
            check_scored(p.budget, p.window, p.kernel)?;
            let r = p.min_ratio;
            if !(r > 0.0 && r <= 1.0) {
                return Err(bad("min_ratio", r));
            }
            let last = p.min_layer_budget();
            if last <= p.window {
                return Err(PolicyError::LastLayerTooSmall {
                    min_ratio: r,
                    last,
                    window: p.window,
                });
            }
            positive("every", p.every)
        }
        KvPolicy::Rkv(p) => {
            check_scored(p.budget, p.window, p.kernel)?;
            if !(0.0..=1.0).contains(&p.alpha) {
                return Err(bad("alpha", p.alpha));
            }
            positive("every", p.every)
        }
        KvPolicy::Expected(p) => {
            positive("budget", p.budget)?;
            positive("n_future", p.n_future)?;
            if p.n_future > MAX_N_FUTURE {
                return Err(bad("n_future", p.n_future));
            }
            if !(p.epsilon >= 0.0 && p.epsilon.is_finite()) {
                return Err(bad("epsilon", p.epsilon));
            }
            // Sinks and window are both always kept: together under the budget.
            below_budget("sink + window", p.sink.saturating_add(p.window), p.budget)?;
            positive("every", p.every)
        }
        KvPolicy::KeyDiff(p) => {
            check_scored(p.budget, p.window, 1)?;
            positive("every", p.every)
        }
        KvPolicy::AdaKv(p) => {
            validate(&p.inner.policy())?;
            if !(0.0..=1.0).contains(&p.floor) {
                return Err(bad("floor", p.floor));
            }
            Ok(())
        }
        KvPolicy::Relative(p) => {
            if !(p.percent > 0.0 && p.percent <= 100.0) {
                return Err(bad_share(format!("{}%", p.percent)));
            }
            match *p.inner {
                KvPolicy::Full | KvPolicy::Relative(_) => Err(bad_share(format!("{}%", p.percent))),
                // At the floor: every check holds at any larger budget too.
                ref inner => {
                    positive("min_budget", p.floor())?;
                    validate(inner)
                }
            }
        }
    }
}

/// Checks shared by the attention-scored policies (snapkv, pyramidkv, rkv).
fn check_scored(budget: usize, window: usize, kernel: usize) -> Result<(), PolicyError> {
    positive("budget", budget)?;
    positive("window", window)?;
    below_budget("window", window, budget)?;
    if kernel.is_multiple_of(2) || kernel > MAX_KERNEL {
        return Err(bad("kernel", kernel));
    }
    Ok(())
}

/// The checks behind [`KvPolicy::check_context`]: every size a request can
/// set (budget, the always-kept window, the decode interval) within the
/// context, so none sizes a buffer or a loop past what the model can hold.
pub(super) fn check_context(policy: &KvPolicy, context_length: usize) -> Result<(), PolicyError> {
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
    if let Some(budget) = policy.budget() {
        over("budget", budget)?;
    }
    if let KvPolicy::Relative(p) = policy {
        // The floor, window and interval; the share never exceeds the length.
        return check_context(&p.inner, context_length);
    }
    let window_key = match policy {
        KvPolicy::H2o(_) => "recent",
        KvPolicy::AdaKv(p) if matches!(p.inner.policy(), KvPolicy::H2o(_)) => "recent",
        _ => "window",
    };
    over(window_key, policy.window())?;
    over("every", policy.every())
}

fn positive(key: &'static str, value: usize) -> Result<(), PolicyError> {
    if value == 0 {
        return Err(bad(key, value));
    }
    Ok(())
}

fn below_budget(key: &'static str, value: usize, budget: usize) -> Result<(), PolicyError> {
    if value >= budget {
        return Err(PolicyError::NotBelowBudget { key, value, budget });
    }
    Ok(())
}

/// A [`PolicyError::BadValue`] for `key`, with what the key accepts.
fn bad(key: &'static str, value: impl fmt::Display) -> PolicyError {
    PolicyError::BadValue {
        key,
        value: value.to_string(),
        expected: expected(key),
    }
}

/// A [`PolicyError::BadValue`] for a relative `budget` (`P%`).
fn bad_share(value: impl fmt::Display) -> PolicyError {
    PolicyError::BadValue {
        key: "budget",
        value: value.to_string(),
        expected: "a share of the sequence's length above 0% and at most 100%, \
                   with its floor as min_budget=N (a policy that keeps tokens)",
    }
}

/// What each key accepts, for error messages.
fn expected(key: &str) -> &'static str {
    match key {
        "sink" | "recent" => "a non-negative integer",
        "epsilon" => "a finite number >= 0",
        "cov" => "`none`, `pair` or `full`",
        "kernel" => "an odd integer from 1 to 63",
        "n_future" => "an integer from 1 to 65536",
        "alpha" | "floor" => "a number in [0, 1]",
        "inner" => "`snapkv`, `pyramidkv`, `h2o` or `keydiff`",
        "min_ratio" => "a number in (0, 1]",
        "pool" => "`max` or `avg`",
        "prefill" => "`true` or `false`",
        _ => "a positive integer",
    }
}

/// The `key=value` items of one spec, checked against the policy's keys.
struct Params<'a> {
    pairs: Vec<(&'static str, &'a str)>,
}

impl<'a> Params<'a> {
    /// Splits `body` into items, rejecting malformed, unknown and repeated keys.
    fn parse(
        policy: &'static str,
        known: &'static [&'static str],
        body: &'a str,
    ) -> Result<Self, PolicyError> {
        let mut pairs: Vec<(&'static str, &'a str)> = Vec::with_capacity(known.len());
        for item in body.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(PolicyError::Malformed {
                    policy,
                    item: item.to_string(),
                });
            };
            let key = key.trim();
            let Some(&key) = known.iter().find(|&&k| k == key) else {
                return Err(PolicyError::UnknownKey {
                    policy,
                    key: key.to_string(),
                    known: if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    },
                });
            };
            if pairs.iter().any(|&(k, _)| k == key) {
                return Err(PolicyError::DuplicateKey { policy, key });
            }
            pairs.push((key, value.trim()));
        }
        Ok(Self { pairs })
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|&&(k, _)| k == key).map(|&(_, v)| v)
    }

    /// Parses `key` with `parse`, or `default` when absent; range checks come later.
    fn value<T>(
        &self,
        key: &'static str,
        default: T,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, PolicyError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => parse(v).ok_or_else(|| bad(key, v)),
        }
    }

    fn usize(&self, key: &'static str, default: usize) -> Result<usize, PolicyError> {
        self.value(key, default, |v| v.parse().ok())
    }

    fn f32(&self, key: &'static str, default: f32) -> Result<f32, PolicyError> {
        self.value(key, default, |v| v.parse().ok())
    }

    fn bool(&self, key: &'static str, default: bool) -> Result<bool, PolicyError> {
        self.value(key, default, |v| v.parse().ok())
    }

    fn cov(&self, key: &'static str, default: Covariance) -> Result<Covariance, PolicyError> {
        self.value(key, default, |v| match v {
            "none" => Some(Covariance::None),
            "pair" => Some(Covariance::Pair),
            "full" => Some(Covariance::Full),
            _ => None,
        })
    }

    fn pool(&self, key: &'static str, default: Pool) -> Result<Pool, PolicyError> {
        self.value(key, default, |v| match v {
            "max" => Some(Pool::Max),
            "avg" => Some(Pool::Avg),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<KvPolicy, PolicyError> {
        s.parse()
    }

    fn err(s: &str) -> String {
        match parse(s) {
            Ok(p) => panic!("`{s}` parsed as {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_print_canonically() {
        let cases = [
            ("full", "full"),
            ("streaming", "streaming:budget=256,sink=4"),
            ("h2o", "h2o:budget=256,recent=128,every=1,prefill=true"),
            ("h2o:budget=100", "h2o:budget=100,recent=50,every=1,prefill=true"),
            ("h2o:budget=1", "h2o:budget=1,recent=0,every=1,prefill=true"),
            (
                "snapkv",
                "snapkv:budget=256,window=8,kernel=7,pool=max,every=128,prefill=true",
            ),
            (
                "pyramidkv",
                "pyramidkv:budget=256,window=8,kernel=7,pool=max,min_ratio=0.5,every=128,prefill=true",
            ),
            (
                "rkv",
                "rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128,prefill=false",
            ),
            ("keydiff", "keydiff:budget=256,window=8,every=128,prefill=true"),
            (
                "adakv",
                "adakv:inner=snapkv,floor=0.2,budget=256,window=8,kernel=7,pool=max,every=128,prefill=true",
            ),
            (
                "expected",
                "expected:budget=256,window=8,n_future=512,sink=4,cov=pair,epsilon=0,every=128,prefill=true",
            ),
            (
                "adakv:inner=h2o",
                "adakv:inner=h2o,floor=0.2,budget=256,recent=128,every=1,prefill=true",
            ),
        ];
        for (short, canonical) in cases {
            let p = parse(short).unwrap();
            assert_eq!(p.to_string(), canonical);
            assert_eq!(parse(canonical).unwrap(), p);
        }
        assert_eq!(parse("full").unwrap(), KvPolicy::default());
        assert_eq!(
            parse("snapkv").unwrap(),
            KvPolicy::SnapKv(SnapKvParams::default())
        );
    }

    #[test]
    fn design_examples_round_trip() {
        for spec in [
            "full",
            "streaming:budget=256,sink=4",
            "h2o:budget=256,recent=32",
            "snapkv:budget=256,window=8,kernel=7,pool=max",
            "pyramidkv:budget=256,window=8",
            "rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128",
            "rkv:budget=512,window=8,every=128",
        ] {
            let p = parse(spec).unwrap();
            assert_eq!(parse(&p.to_string()).unwrap(), p, "{spec}");
            assert!(p.to_string().starts_with(spec.split(',').next().unwrap()));
        }
        // A spec that already names every key prints back unchanged.
        let rkv = "rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128,prefill=false";
        assert_eq!(parse(rkv).unwrap().to_string(), rkv);
    }

    #[test]
    fn non_default_values_round_trip() {
        for spec in [
            "streaming:budget=10,sink=0",
            "h2o:budget=64,recent=0,every=16,prefill=false",
            "snapkv:budget=100,window=4,kernel=1,pool=avg,every=3,prefill=false",
            "pyramidkv:budget=100,window=4,kernel=5,pool=avg,min_ratio=0.3,every=16,prefill=false",
            "rkv:budget=512,window=16,kernel=3,alpha=0.25,every=64,prefill=true",
            "rkv:budget=512,window=16,kernel=3,alpha=0,every=64,prefill=false",
            "rkv:budget=512,window=16,kernel=3,alpha=1,every=64,prefill=false",
            "rkv:budget=512,window=16,kernel=3,alpha=0.3333333,every=64,prefill=false",
            "keydiff:budget=64,window=1,every=1,prefill=false",
            "adakv:inner=snapkv,floor=0.2,budget=256,window=32,kernel=5,pool=avg,every=128,prefill=true",
            "adakv:inner=pyramidkv,floor=0,budget=100,window=4,kernel=5,pool=avg,min_ratio=0.3,every=16,prefill=false",
            "adakv:inner=h2o,floor=1,budget=64,recent=32,every=4,prefill=false",
            "adakv:inner=keydiff,floor=0.35,budget=64,window=8,every=32,prefill=true",
            "expected:budget=128,window=0,n_future=64,sink=0,cov=none,epsilon=0.01,every=32,prefill=false",
            "expected:budget=512,window=16,n_future=1,sink=8,cov=full,epsilon=0,every=1,prefill=true",
        ] {
            let p = parse(spec).unwrap();
            assert_eq!(p.to_string(), spec);
            assert_eq!(parse(&p.to_string()).unwrap(), p);
        }
    }

    #[test]
    fn keys_in_any_order_with_spaces() {
        let a = parse(" h2o : recent = 8 , budget = 64 , ").unwrap();
        assert_eq!(a, parse("h2o:budget=64,recent=8").unwrap());
        // Ada-KV's own keys may come anywhere among its inner policy's.
        let a = parse("adakv: window=32 , inner = snapkv,budget=64, floor=0.5").unwrap();
        assert_eq!(
            a,
            parse("adakv:inner=snapkv,floor=0.5,budget=64,window=32").unwrap()
        );
        assert_eq!(parse("snapkv:").unwrap(), parse("snapkv").unwrap());
    }

    #[test]
    fn errors_name_the_key_or_value() {
        let cases = [
            (
                "xyz",
                "unknown policy `xyz` (known: full, streaming, h2o, snapkv, pyramidkv, rkv, keydiff, adakv, expected)",
            ),
            (
                "h2o:foo=1",
                "unknown key `foo` for h2o (known: budget, recent, every, prefill)",
            ),
            (
                "full:budget=3",
                "unknown key `budget` for full (known: none)",
            ),
            (
                "snapkv:budget=abc",
                "bad value `abc` for `budget`: expected a positive integer",
            ),
            (
                "streaming:budget=0",
                "bad value `0` for `budget`: expected a positive integer",
            ),
            (
                "h2o:budget=-5",
                "bad value `-5` for `budget`: expected a positive integer",
            ),
            (
                "h2o:recent=x",
                "bad value `x` for `recent`: expected a non-negative integer",
            ),
            (
                "h2o:every=0",
                "bad value `0` for `every`: expected a positive integer",
            ),
            (
                "snapkv:kernel=4",
                "bad value `4` for `kernel`: expected an odd integer from 1 to 63",
            ),
            (
                "snapkv:kernel=0",
                "bad value `0` for `kernel`: expected an odd integer from 1 to 63",
            ),
            (
                "snapkv:window=0",
                "bad value `0` for `window`: expected a positive integer",
            ),
            (
                "snapkv:pool=min",
                "bad value `min` for `pool`: expected `max` or `avg`",
            ),
            (
                "snapkv:prefill=yes",
                "bad value `yes` for `prefill`: expected `true` or `false`",
            ),
            (
                "rkv:alpha=1.5",
                "bad value `1.5` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "rkv:alpha=-0.1",
                "bad value `-0.1` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "rkv:alpha=nan",
                "bad value `NaN` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "rkv:alpha=lots",
                "bad value `lots` for `alpha`: expected a number in [0, 1]",
            ),
            (
                "pyramidkv:min_ratio=0",
                "bad value `0` for `min_ratio`: expected a number in (0, 1]",
            ),
            (
                "pyramidkv:min_ratio=2",
                "bad value `2` for `min_ratio`: expected a number in (0, 1]",
            ),
            (
                "streaming:budget=4,sink=4",
                "`sink` = 4 must be less than `budget` = 4",
            ),
            (
                "h2o:budget=16,recent=32",
                "`recent` = 32 must be less than `budget` = 16",
            ),
            (
                "rkv:budget=8,window=8",
                "`window` = 8 must be less than `budget` = 8",
            ),
            (
                "pyramidkv:budget=16,window=8",
                "`min_ratio` = 0.5 leaves the last layer 8 tokens (budget * min_ratio), \
                 which must exceed `window` = 8",
            ),
            (
                "h2o:budget",
                "malformed parameter `budget` for h2o: expected key=value",
            ),
            ("h2o:budget=8,budget=9", "key `budget` given twice for h2o"),
            (
                "expected:cov=diag",
                "bad value `diag` for `cov`: expected `none`, `pair` or `full`",
            ),
            (
                "expected:n_future=0",
                "bad value `0` for `n_future`: expected an integer from 1 to 65536",
            ),
            (
                "expected:epsilon=-1",
                "bad value `-1` for `epsilon`: expected a finite number >= 0",
            ),
            (
                "expected:sink=x",
                "bad value `x` for `sink`: expected a non-negative integer",
            ),
            (
                "expected:every=0",
                "bad value `0` for `every`: expected a positive integer",
            ),
            (
                "expected:prefill=1",
                "bad value `1` for `prefill`: expected `true` or `false`",
            ),
            (
                "expected:budget=16,sink=4,window=12",
                "`sink + window` = 16 must be less than `budget` = 16",
            ),
            (
                "expected:kernel=3",
                "unknown key `kernel` for expected \
                 (known: budget, window, n_future, sink, cov, epsilon, every, prefill)",
            ),
            (
                "",
                "unknown policy `` (known: full, streaming, h2o, snapkv, pyramidkv, rkv, keydiff, adakv, expected)",
            ),
            (
                "adakv:inner=rkv",
                "bad value `rkv` for `inner`: expected `snapkv`, `pyramidkv`, `h2o` or `keydiff`",
            ),
            (
                "adakv:inner=adakv",
                "bad value `adakv` for `inner`: expected `snapkv`, `pyramidkv`, `h2o` or `keydiff`",
            ),
            (
                "adakv:floor=1.5",
                "bad value `1.5` for `floor`: expected a number in [0, 1]",
            ),
            (
                "adakv:floor=some",
                "bad value `some` for `floor`: expected a number in [0, 1]",
            ),
            (
                "adakv:inner=h2o,window=8",
                "unknown key `window` for adakv (known: inner, floor, budget, recent, every, prefill)",
            ),
            (
                "adakv:budget=16,window=16",
                "`window` = 16 must be less than `budget` = 16",
            ),
            (
                "adakv:kernel=4",
                "bad value `4` for `kernel`: expected an odd integer from 1 to 63",
            ),
            ("adakv:floor=0.1,floor=0.2", "key `floor` given twice for adakv"),
            ("adakv:budget=8,budget=9", "key `budget` given twice for adakv"),
            (
                "adakv:window",
                "malformed parameter `window` for adakv: expected key=value",
            ),
            (
                "keydiff:window=0",
                "bad value `0` for `window`: expected a positive integer",
            ),
            (
                "keydiff:budget=4,window=4",
                "`window` = 4 must be less than `budget` = 4",
            ),
            (
                "h2o:prefill=maybe",
                "bad value `maybe` for `prefill`: expected `true` or `false`",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(err(spec), message, "{spec}");
        }
    }

    #[test]
    fn validate_catches_hand_built_policies() {
        let p = KvPolicy::Streaming(StreamingParams { budget: 4, sink: 9 });
        assert_eq!(
            p.validate().unwrap_err().to_string(),
            "`sink` = 9 must be less than `budget` = 4"
        );
        let p = KvPolicy::Rkv(RkvParams {
            alpha: f32::INFINITY,
            ..RkvParams::default()
        });
        assert!(p.validate().unwrap_err().to_string().contains("`alpha`"));
        assert!(KvPolicy::Rkv(RkvParams::default()).validate().is_ok());
    }

    #[test]
    fn sizes_are_bounded_by_constants_and_by_the_context() {
        // Context-free bounds: pooling width and the future horizon.
        assert_eq!(
            err("snapkv:kernel=65"),
            "bad value `65` for `kernel`: expected an odd integer from 1 to 63"
        );
        assert!(parse("snapkv:kernel=63").is_ok());
        assert_eq!(
            err("expected:n_future=65537"),
            "bad value `65537` for `n_future`: expected an integer from 1 to 65536"
        );
        // The probe parses (window < budget) but not within a 3,000-token context.
        let probe = parse("snapkv:budget=1000000,window=999999").unwrap();
        assert_eq!(
            probe.check_context(3000).unwrap_err(),
            PolicyError::OverContext {
                key: "budget",
                value: 1_000_000,
                context_length: 3000
            }
        );
        let cases = [
            ("snapkv:budget=256,window=8", 256, None),
            ("snapkv:budget=257,window=8", 256, Some("budget")),
            ("h2o:budget=100,recent=10,every=300", 256, Some("every")),
            ("rkv:budget=200,window=8,every=128", 128, Some("budget")),
            (
                "adakv:inner=h2o,budget=64,recent=8,every=100",
                80,
                Some("every"),
            ),
            ("streaming:budget=64,sink=4", 64, None),
            ("full", 1, None),
            ("expected:budget=64,n_future=512,every=32", 64, None),
        ];
        for (spec, ctx, key) in cases {
            let got = parse(spec).unwrap().check_context(ctx).err();
            let got = got.map(|e| match e {
                PolicyError::OverContext { key, .. } => key,
                other => panic!("{spec}: {other}"),
            });
            assert_eq!(got, key, "{spec} within {ctx}");
        }
        // The window alone over the context (budget within it) names `window`.
        let p = KvPolicy::SnapKv(SnapKvParams {
            budget: 10,
            window: 20,
            ..SnapKvParams::default()
        });
        assert!(p
            .check_context(15)
            .unwrap_err()
            .to_string()
            .contains("`window` = 20"));
    }

    #[test]
    fn serde_uses_the_spec_string() {
        let p = parse("h2o:budget=64,recent=8").unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, "\"h2o:budget=64,recent=8,every=1,prefill=true\"");
        assert_eq!(serde_json::from_str::<KvPolicy>(&json).unwrap(), p);
        assert_eq!(
            serde_json::from_str::<KvPolicy>("\"rkv\"").unwrap(),
            KvPolicy::Rkv(RkvParams::default())
        );
        let e = serde_json::from_str::<KvPolicy>("\"h2o:foo=1\"").unwrap_err();
        assert!(e.to_string().contains("unknown key `foo` for h2o"), "{e}");
        assert!(serde_json::from_str::<KvPolicy>("42").is_err());
    }

    #[test]
    fn relative_budgets_round_trip() {
        for (spec, canonical) in [
            (
                "rkv:budget=50%,min_budget=64",
                "rkv:budget=50%,min_budget=64,window=8,kernel=7,alpha=0.1,every=128,prefill=false",
            ),
            (
                "streaming:min_budget=32, budget = 12.5% ,sink=2",
                "streaming:budget=12.5%,min_budget=32,sink=2",
            ),
            (
                "adakv:inner=h2o,budget=100%,min_budget=16,recent=4",
                "adakv:inner=h2o,floor=0.2,budget=100%,min_budget=16,recent=4,every=1,prefill=true",
            ),
        ] {
            let p = parse(spec).unwrap();
            assert!(p.is_relative(), "{spec}");
            assert_eq!(p.to_string(), canonical);
            assert_eq!(parse(canonical).unwrap(), p);
            // Serde writes and reads the same string.
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<KvPolicy>(&json).unwrap(), p);
        }
        let p = parse("rkv:budget=50%,min_budget=64").unwrap();
        assert_eq!((p.name(), p.budget(), p.window()), ("rkv", Some(64), 8));
        // A budget in tokens is still a plain policy.
        assert!(!parse("rkv:budget=64").unwrap().is_relative());
    }

    #[test]
    fn bad_relative_budgets_are_clear_errors() {
        for (spec, says) in [
            ("rkv:budget=0%,min_budget=64", "bad value `0%` for `budget`"),
            (
                "rkv:budget=150%,min_budget=64",
                "bad value `150%` for `budget`",
            ),
            (
                "rkv:budget=-5%,min_budget=64",
                "bad value `-5%` for `budget`",
            ),
            ("rkv:budget=x%,min_budget=64", "bad value `x%` for `budget`"),
            ("rkv:budget=50%", "give `min_budget=N`"),
            ("rkv:budget=64,min_budget=32", "it needs `budget=P%`"),
            ("rkv:min_budget=32", "it needs `budget=P%`"),
            (
                "rkv:budget=50%,min_budget=0",
                "bad value `0` for `min_budget`",
            ),
            (
                "rkv:budget=50%,min_budget=x",
                "bad value `x` for `min_budget`",
            ),
            (
                "rkv:budget=50%,min_budget=8,window=8",
                "`window` = 8 must be less than `budget` = 8",
            ),
            (
                "rkv:budget=50%,min_budget=64,min_budget=65",
                "key `min_budget` given twice for rkv",
            ),
            (
                "full:budget=50%,min_budget=64",
                "unknown key `budget` for full",
            ),
            ("nope:budget=50%", "unknown policy `nope`"),
        ] {
            let e = err(spec);
            assert!(e.contains(says), "{spec}: {e}");
        }
        // The floor and window must fit the model's context.
        let p = parse("rkv:budget=50%,min_budget=64").unwrap();
        assert!(p.check_context(128).is_ok());
        let e = p.check_context(32).unwrap_err().to_string();
        assert!(e.contains("`budget` = 64 exceeds"), "{e}");
    }
}
