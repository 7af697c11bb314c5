//! Difficulty-aware data: which prompts a step trains on, and replay of recent
//! rollout groups.
//!
//! Every task keeps a pass rate (an EMA of its groups' mean rewards). A group
//! whose rewards are all equal carries no GRPO signal, and that is most
//! likely when the pass rate is near 0 or 1, so `difficulty` selection draws
//! tasks with weight `p (1 - p)` (unseen tasks count as `p = 1/2`, the most
//! informative), plus a floor so no task is starved. Replay keeps the most
//! recent groups that had a signal, with the learner's log-probabilities at the
//! time (their pi_old), and mixes a share of them into each step's batch under
//! the same clipped loss, which bounds how far off-policy they can pull.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How prompts are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Selection {
    /// Every task equally likely.
    Uniform,
    /// Weighted towards pass rates near 1/2.
    Difficulty,
}

/// Smallest selection weight, so tasks believed solved (or hopeless) still
/// come back now and then and their pass rates can move.
pub const WEIGHT_FLOOR: f64 = 0.02;

/// Pass rates per task index.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PassRates {
    /// EMA of each seen task's group mean reward.
    pub rates: HashMap<usize, f64>,
}

impl PassRates {
    /// Folds a group's mean reward into the task's rate (`alpha`: weight of
    /// the new observation; the first observation is taken as it is).
    pub fn update(&mut self, task: usize, mean_reward: f64, alpha: f64) {
        let r = self.rates.entry(task).or_insert(mean_reward);
        *r = (1.0 - alpha) * *r + alpha * mean_reward;
    }

    /// The task's rate, 1/2 if unseen.
    pub fn get(&self, task: usize) -> f64 {
        self.rates.get(&task).copied().unwrap_or(0.5)
    }

    /// Selection weight of a task under `Difficulty`.
    pub fn weight(&self, task: usize) -> f64 {
        let p = self.get(task);
        (p * (1.0 - p)).max(WEIGHT_FLOOR)
    }
}

/// `count` task indices for `step`, from (seed, step) and the current rates.
pub fn pick(
    selection: Selection,
    rates: &PassRates,
    seed: u64,
    step: usize,
    n_tasks: usize,
    count: usize,
) -> Vec<usize> {
    let mut rng =
        ChaCha8Rng::seed_from_u64(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    match selection {
        Selection::Uniform => (0..count).map(|_| rng.gen_range(0..n_tasks)).collect(),
        Selection::Difficulty => {
            let cumulative: Vec<f64> = (0..n_tasks)
                .scan(0.0, |acc, t| {
                    *acc += rates.weight(t);
                    Some(*acc)
                })
                .collect();
            let total = *cumulative.last().unwrap_or(&1.0);
            (0..count)
                .map(|_| {
                    let x = rng.gen_range(0.0..total);
                    cumulative.partition_point(|&c| c <= x).min(n_tasks - 1)
                })
                .collect()
        }
    }
}

/// One stored sample: a rollout with the advantage and log-probabilities it
/// was trained with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Replayed {
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Response ids.
    pub response: Vec<u32>,
    /// Its group-normalised advantage.
    pub advantage: f64,
    /// The learner's log-probabilities when it was first trained on (pi_old).
    pub logp_old: Vec<f64>,
    /// Its eviction record, kept when the learner replays visibility.
    #[serde(default)]
    pub visibility: Option<tern_models::EvictionLog>,
}

/// A FIFO of recent groups (each a list of samples).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayBuffer {
    /// Most groups kept.
    pub capacity: usize,
    /// Oldest first.
    pub groups: VecDeque<Vec<Replayed>>,
}

impl ReplayBuffer {
    /// An empty buffer of `capacity` groups.
    pub fn new(capacity: usize) -> Self {
        ReplayBuffer {
            capacity,
            groups: VecDeque::new(),
        }
    }

    /// Adds a group, dropping the oldest beyond capacity.
    pub fn push(&mut self, group: Vec<Replayed>) {
        if self.capacity == 0 || group.is_empty() {
            return;
        }
        self.groups.push_back(group);
        while self.groups.len() > self.capacity {
            self.groups.pop_front();
        }
    }

    /// `count` groups drawn from (seed, step), without repeats.
    pub fn sample(&self, seed: u64, step: usize, count: usize) -> Vec<Vec<Replayed>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(0xA5A5) ^ step as u64);
        let mut idx: Vec<usize> = (0..self.groups.len()).collect();
        let mut out = Vec::new();
        while out.len() < count && !idx.is_empty() {
            let i = idx.swap_remove(rng.gen_range(0..idx.len()));
            out.push(self.groups[i].clone());
        }
        out
    }
}

/// What a checkpoint keeps of the data side, so a resumed run picks and
/// replays exactly as the uninterrupted one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DataState {
    /// Pass rates per task.
    pub rates: PassRates,
    /// The replay buffer.
    pub replay: ReplayBuffer,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_follow_an_ema_and_weights_favour_one_half() {
        let mut r = PassRates::default();
        assert_eq!(r.get(3), 0.5);
        r.update(3, 1.0, 0.5);
        assert_eq!(r.get(3), 1.0);
        r.update(3, 0.0, 0.5);
        assert_eq!(r.get(3), 0.5);
        r.update(4, 1.0, 0.5);
        assert!(r.weight(3) > r.weight(4));
        assert_eq!(r.weight(4), WEIGHT_FLOOR);
    }

    #[test]
    fn difficulty_selection_prefers_uncertain_tasks() {
        let mut r = PassRates::default();
        for t in 0..50 {
            r.update(t, if t < 40 { 1.0 } else { 0.5 }, 1.0);
        }
        let picks = pick(Selection::Difficulty, &r, 1, 0, 50, 2000);
        let uncertain = picks.iter().filter(|&&t| t >= 40).count();
        // 10 tasks at weight 0.25 vs 40 at 0.02: ~76% of draws.
        assert!(uncertain > 1300, "{uncertain} of 2000");
        assert_eq!(picks, pick(Selection::Difficulty, &r, 1, 0, 50, 2000));
        assert!(pick(Selection::Uniform, &r, 1, 0, 50, 100)
            .iter()
            .all(|&t| t < 50));
    }

    #[test]
    fn replay_is_a_bounded_fifo_sampled_without_repeats() {
        let mut b = ReplayBuffer::new(2);
        let g = |a: f64| {
            vec![Replayed {
                prompt: vec![1],
                response: vec![2],
                advantage: a,
                logp_old: vec![-1.0],
                visibility: None,
            }]
        };
        b.push(g(1.0));
        b.push(g(2.0));
        b.push(g(3.0));
        assert_eq!(b.groups.len(), 2);
        assert_eq!(b.groups[0][0].advantage, 2.0);
        let s = b.sample(0, 1, 5);
        assert_eq!(s.len(), 2);
        assert_ne!(s[0][0].advantage, s[1][0].advantage);
    }
}
