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
//! window) holds at every larger budget too.

use super::KvPolicy;

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
