//! The `key=value` items of one spec string ([`Items`]), the keys a policy
//! takes ([`Key`], each with what it accepts), and the range checks every
//! policy's validation shares ([`positive`], [`below_budget`]).
//!
//! Knows no policy: each policy's file names its keys (the shared ones are
//! here) and reads its values through [`Items`]; `spec.rs` owns the grammar
//! around them.

use std::fmt;

use super::PolicyError;

/// One key of a policy's spec: its name and what it accepts, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The key as written in a spec, e.g. `budget`.
    pub name: &'static str,
    /// What the key accepts, e.g. `a positive integer`.
    pub expected: &'static str,
}

/// Tokens kept per layer and KV head (every budgeted policy).
pub(super) const BUDGET: Key = positive_key("budget");
/// Newest entries always kept.
pub(super) const WINDOW: Key = positive_key("window");
/// Decode tokens between two compressions.
pub(super) const EVERY: Key = positive_key("every");
/// Whether the prompt is compressed while it is read.
pub(super) const PREFILL: Key = Key {
    name: "prefill",
    expected: "`true` or `false`",
};
/// First tokens always kept (streaming, expected).
pub(super) const SINK: Key = Key {
    name: "sink",
    expected: "a non-negative integer",
};

/// A key taking a positive integer.
pub(super) const fn positive_key(name: &'static str) -> Key {
    Key {
        name,
        expected: "a positive integer",
    }
}

/// A [`PolicyError::BadValue`] for `key`, with what the key accepts.
pub(super) fn bad(key: &Key, value: impl fmt::Display) -> PolicyError {
    PolicyError::BadValue {
        key: key.name,
        value: value.to_string(),
        expected: key.expected,
    }
}

/// Refuses a zero `value` for `key`.
pub(super) fn positive(key: &Key, value: usize) -> Result<(), PolicyError> {
    if value == 0 {
        return Err(bad(key, value));
    }
    Ok(())
}

/// Refuses a `value` of `key` (named as written, e.g. `sink + window`) that
/// leaves no room in `budget`.
pub(super) fn below_budget(
    key: &'static str,
    value: usize,
    budget: usize,
) -> Result<(), PolicyError> {
    if value >= budget {
        return Err(PolicyError::NotBelowBudget { key, value, budget });
    }
    Ok(())
}

/// The `key=value` items of one spec, checked against the policy's keys.
pub(super) struct Items<'a> {
    pairs: Vec<(&'static Key, &'a str)>,
}

impl<'a> Items<'a> {
    /// Splits `body` into items for `policy`, which takes `known`, rejecting
    /// malformed, unknown and repeated keys.
    pub(super) fn parse(
        policy: &'static str,
        known: &'static [Key],
        body: &'a str,
    ) -> Result<Self, PolicyError> {
        let mut pairs: Vec<(&'static Key, &'a str)> = Vec::with_capacity(known.len());
        for item in body.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(PolicyError::Malformed {
                    policy,
                    item: item.to_string(),
                });
            };
            let key = key.trim();
            let Some(key) = known.iter().find(|k| k.name == key) else {
                return Err(PolicyError::UnknownKey {
                    policy,
                    key: key.to_string(),
                    known: names(known),
                });
            };
            if pairs.iter().any(|&(k, _)| k == key) {
                return Err(PolicyError::DuplicateKey {
                    policy,
                    key: key.name,
                });
            }
            pairs.push((key, value.trim()));
        }
        Ok(Self { pairs })
    }

    /// The value of `key` as written, if given.
    pub(super) fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs
            .iter()
            .find(|&&(k, _)| k.name == key)
            .map(|&(_, v)| v)
    }

    /// Parses `key` with `parse`, or `default` when absent; range checks come later.
    pub(super) fn value<T>(
        &self,
        key: &Key,
        default: T,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, PolicyError> {
        match self.get(key.name) {
            None => Ok(default),
            Some(v) => parse(v).ok_or_else(|| bad(key, v)),
        }
    }

    /// An unsigned integer.
    pub(super) fn usize(&self, key: &Key, default: usize) -> Result<usize, PolicyError> {
        self.value(key, default, |v| v.parse().ok())
    }

    /// A number.
    pub(super) fn f32(&self, key: &Key, default: f32) -> Result<f32, PolicyError> {
        self.value(key, default, |v| v.parse().ok())
    }

    /// `true` or `false`.
    pub(super) fn bool(&self, key: &Key, default: bool) -> Result<bool, PolicyError> {
        self.value(key, default, |v| v.parse().ok())
    }
}

/// The names of `keys`, comma separated (`none` for no key), as error messages list them.
pub(super) fn names(keys: &[Key]) -> String {
    if keys.is_empty() {
        return "none".to_string();
    }
    let names: Vec<&str> = keys.iter().map(|k| k.name).collect();
    names.join(", ")
}
