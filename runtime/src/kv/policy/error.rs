//! [`PolicyError`]: why a spec string or a hand-built policy was rejected.
//!
//! Every message names the offending policy, key or value, so a user can fix
//! the spec from it alone. The list of known policies comes from the registry
//! in `mod.rs`; the checks that raise these errors live with each policy.

/// Why a spec string or a hand-built policy was rejected; every message names the
/// offending policy, key or value so a user can fix the spec from it alone.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The name before `:` is not a policy.
    #[error("unknown policy `{0}` (known: {known})", known = super::KvPolicy::known_names())]
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
    /// A size that exceeds the model's context (see [`super::KvPolicy::check_context`]).
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
