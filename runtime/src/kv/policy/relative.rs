//! Relative budgets: a policy whose budget is a share of the sequence's
//! current length, never below a floor (`rkv:budget=50%,min_budget=64`).
//!
//! A fixed budget names a compression only for one answer length: an arm
//! run at `budget=256` keeps half of a 512-token sequence but all of a
//! 200-token one, so a training run whose answers shorten drifts out of the
//! compression it names (docs/SPARSE_RL.md found a "~50%" arm keeping 61%
//! on average). Under a relative budget the sequence's budget at length
//! `L` is `max(min_budget, ceil(share * L))`: the policy's own rules
//! (window, schedule, scores) then apply at that budget, so a "50%" arm
//! keeps half of whatever it reads, give or take what arrives between two
//! compressions (the policy's `every`).
//!
//! The inner policy holds the floor as its budget, so every check made at
//! the floor (window below the budget, PyramidKV's last layer above the
//! window) holds at every larger budget too. Owns the `budget=P%,min_budget=N`
//! items of a spec ([`parse`]) and the wrapper's answers: the inner policy's,
//! at the floor, except selection, which runs at the sequence's length.

use std::fmt;

use super::items::{bad, positive, positive_key, Key};
use super::kind::PolicyKind;
use super::{select, KeepSet, KvPolicy, PolicyError, ScoreInput};

/// The floor of a relative budget, in tokens.
const MIN_BUDGET: Key = positive_key("min_budget");

/// Parameters of [`KvPolicy::Relative`].
#[derive(Clone, Debug, PartialEq)]
pub struct RelativeParams {
    /// Share of the sequence's current length kept, in percent, in `(0, 100]`.
    pub percent: f32,
    /// The policy applied, with the floor (`min_budget`) as its budget.
    pub inner: Box<KvPolicy>,
}

impl RelativeParams {
    /// The fewest tokens kept per layer: the inner policy's budget.
    pub fn floor(&self) -> usize {
        self.inner.budget().unwrap_or(0)
    }

    /// The budget of a sequence that has read `seen` tokens:
    /// `max(floor, ceil(percent / 100 * seen))`.
    pub fn budget_at(&self, seen: usize) -> usize {
        let share = (f64::from(self.percent) / 100.0 * seen as f64).ceil();
        // `as` saturates: an absurd length gives usize::MAX, not a wrap.
        (share as usize).max(self.floor())
    }

    /// The inner policy at the budget for `seen` tokens.
    pub fn at_length(&self, seen: usize) -> KvPolicy {
        self.inner.with_budget(self.budget_at(seen))
    }
}

/// The policy `name` with the items of `body` under a relative budget, not
/// validated; `None` when its budget (if any) is in tokens.
pub(super) fn parse(name: &'static str, body: &str) -> Result<Option<KvPolicy>, PolicyError> {
    let Some((percent, inner_body)) = split(name, body)? else {
        return Ok(None);
    };
    // The floor stands in for the budget: errors about it name `min_budget`.
    let inner = KvPolicy::parse_named(name, &inner_body).map_err(|e| match e {
        PolicyError::BadValue {
            key: "budget",
            value,
            ..
        } => bad(&MIN_BUDGET, value),
        other => other,
    })?;
    if matches!(inner, KvPolicy::Full) {
        // full takes no keys: its parser already refused `budget`.
        return Err(bad_share(format!("{percent}%")));
    }
    Ok(Some(KvPolicy::Relative(RelativeParams {
        percent,
        inner: Box::new(inner),
    })))
}

/// A relative budget's share and the body its inner policy parses (the
/// floor as `budget=N`, `min_budget` removed); `None` for a budget in tokens.
fn split(policy: &'static str, body: &str) -> Result<Option<(f32, String)>, PolicyError> {
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
        .filter(|&(k, _)| k == MIN_BUDGET.name)
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
                key: MIN_BUDGET.name,
            })
        }
    };
    let inner: Vec<String> = items
        .iter()
        .filter(|&&i| key_of(i).is_none_or(|(k, _)| k != MIN_BUDGET.name))
        .map(|&i| match key_of(i) {
            Some(("budget", _)) => format!("budget={floor}"),
            _ => i.to_string(),
        })
        .collect();
    Ok(Some((percent, inner.join(","))))
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

/// The inner policy's answers, at the floor; selection and validation are its own.
impl PolicyKind for RelativeParams {
    fn budget(&self) -> Option<usize> {
        self.inner.budget()
    }

    /// Sets the floor.
    fn set_budget(&mut self, budget: usize) {
        *self.inner = self.inner.with_budget(budget);
    }

    fn layer_budget(&self, layer: usize, n_layer: usize) -> Option<usize> {
        self.inner.layer_budget(layer, n_layer)
    }

    fn head_capacity(&self, layer: usize, n_layer: usize, n_kv: usize) -> Option<usize> {
        self.inner.head_capacity(layer, n_layer, n_kv)
    }

    fn is_head_wise(&self) -> bool {
        self.inner.is_head_wise()
    }

    fn window(&self) -> usize {
        self.inner.window()
    }

    fn window_key(&self) -> &'static str {
        self.inner.window_key()
    }

    fn every(&self) -> usize {
        self.inner.every()
    }

    fn compresses_prompt(&self) -> bool {
        self.inner.compresses_prompt()
    }

    fn triggers(&self, tokens_since_last: usize, in_prefill: bool) -> bool {
        self.inner.triggers(tokens_since_last, in_prefill)
    }

    fn needs_cumulative(&self) -> bool {
        self.inner.needs_cumulative()
    }

    fn needs_recent_rows(&self) -> bool {
        self.inner.needs_recent_rows()
    }

    fn needs_keys(&self) -> bool {
        self.inner.needs_keys()
    }

    fn needs_values(&self) -> bool {
        self.inner.needs_values()
    }

    fn needs_queries(&self) -> bool {
        self.inner.needs_queries()
    }

    fn validate(&self) -> Result<(), PolicyError> {
        if !(self.percent > 0.0 && self.percent <= 100.0) {
            return Err(bad_share(format!("{}%", self.percent)));
        }
        match *self.inner {
            KvPolicy::Full | KvPolicy::Relative(_) => Err(bad_share(format!("{}%", self.percent))),
            // At the floor: every check holds at any larger budget too.
            ref inner => {
                positive(&MIN_BUDGET, self.floor())?;
                inner.validate()
            }
        }
    }

    /// The floor, window and interval; the share never exceeds the length.
    fn check_context(&self, context_length: usize) -> Result<(), PolicyError> {
        self.inner.check_context(context_length)
    }

    /// A relative budget is the share of the sequence read so far: the newest
    /// cached position (the window always keeps it) plus one.
    fn select(&self, input: &ScoreInput) -> KeepSet {
        let seen = input
            .positions
            .iter()
            .filter_map(|h| h.iter().rev().find(|&&x| x != tern_models::HIDDEN_POSITION))
            .max()
            .map_or(input.n_cached, |&x| x as usize + 1);
        select(&self.at_length(seen), input)
    }

    /// The inner spec with its `budget=FLOOR` item as the share and floor.
    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.to_string();
        let (name, keys) = inner.split_once(':').unwrap_or((&inner, ""));
        let keys: Vec<String> = keys
            .split(',')
            .map(|item| match item.strip_prefix("budget=") {
                Some(floor) => format!("budget={}%,min_budget={floor}", self.percent),
                None => item.to_string(),
            })
            .collect();
        write!(f, "{name}:{}", keys.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{select, should_compress, ScoreInput};
    use super::*;

    fn relative(spec: &str) -> RelativeParams {
        match spec.parse::<KvPolicy>().unwrap() {
            KvPolicy::Relative(p) => p,
            other => panic!("{spec} parsed as {other}"),
        }
    }

    #[test]
    fn the_budget_is_the_share_of_the_length_never_below_the_floor() {
        let p = relative("rkv:budget=50%,min_budget=64,window=8");
        assert_eq!(p.floor(), 64);
        // Below 128 tokens half is under the floor: the floor holds.
        for (seen, want) in [
            (0, 64),
            (10, 64),
            (128, 64),
            (129, 65),
            (300, 150),
            (1001, 501),
        ] {
            assert_eq!(p.budget_at(seen), want, "seen {seen}");
        }
        let q = relative("snapkv:budget=12.5%,min_budget=16,window=4");
        assert_eq!((q.budget_at(100), q.budget_at(1000)), (16, 125));
        assert_eq!(q.at_length(1000).budget(), Some(125));
        assert!(matches!(q.at_length(1000), KvPolicy::SnapKv(_)));
    }

    /// What one layer holds after a sequence of `len` tokens is read one
    /// token at a time, compressing as the cache does (trigger, then select
    /// at the budget of the current length).
    fn drive(policy: &KvPolicy, len: usize) -> Vec<u32> {
        let mut held: Vec<u32> = Vec::new();
        let mut since = 0;
        for pos in 0..len as u32 {
            held.push(pos);
            since += 1;
            let now = policy.at_length(pos as usize + 1);
            if should_compress(&now, held.len(), since, false) {
                let positions = vec![held.clone(); 2];
                let rows = vec![vec![vec![0.5; held.len()]]; 2];
                let keep = select(
                    policy,
                    &ScoreInput {
                        layer: 0,
                        n_layer: 1,
                        n_cached: held.len(),
                        positions: &positions,
                        cumulative: &[],
                        recent_rows: &rows,
                        keys: &[],
                        values: &[],
                        queries: None,
                        head_dim: 0,
                    },
                );
                assert_well_formed(&keep, 2, held.len(), keep.kept());
                held = keep.per_head[0].iter().map(|&i| held[i]).collect();
                since = 0;
            }
        }
        held
    }

    #[test]
    fn a_half_budget_keeps_half_at_every_length_within_one_interval() {
        let every = 16;
        let p: KvPolicy = "streaming:budget=50%,min_budget=32,sink=4".parse().unwrap();
        let r: KvPolicy = format!("rkv:budget=50%,min_budget=32,window=8,every={every},alpha=1")
            .parse()
            .unwrap();
        for len in [20usize, 64, 100, 257, 600, 1500] {
            let want = len.div_ceil(2).max(32).min(len);
            // Streaming trims every step: exactly the budget.
            assert_eq!(drive(&p, len).len(), want, "streaming at {len}");
            // R-KV compresses every `every` tokens: between `want` and
            // `want + every` (the tokens since the last compression).
            let kept = drive(&r, len).len();
            assert!(
                kept >= want && kept <= want + every,
                "rkv at {len}: {kept} vs {want}"
            );
            assert!(kept >= 32.min(len), "below the floor at {len}");
        }
    }

    #[test]
    fn select_resolves_the_budget_from_the_newest_position() {
        // 300 entries ending at position 999: half of 1000 is 500, more than
        // held, so nothing goes; ending at 299 half is 150.
        let p: KvPolicy = "snapkv:budget=50%,min_budget=32,window=8".parse().unwrap();
        let late = vec![(700..1000).collect::<Vec<u32>>(); 2];
        let early = positions(2, 300);
        let input = |positions: &'static [Vec<u32>]| ScoreInput {
            layer: 0,
            n_layer: 1,
            n_cached: 300,
            positions,
            cumulative: &[],
            recent_rows: &[],
            keys: &[],
            values: &[],
            queries: None,
            head_dim: 0,
        };
        let late: &'static [Vec<u32>] = Box::leak(late.into_boxed_slice());
        let early: &'static [Vec<u32>] = Box::leak(early.into_boxed_slice());
        assert_eq!(select(&p, &input(late)).kept(), 300);
        assert_eq!(select(&p, &input(early)).kept(), 150);
    }
}
