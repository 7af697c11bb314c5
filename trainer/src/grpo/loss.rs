//! The update's loss, token by token: the clipped surrogate of [`super`]
//! weighed by the Sparse-RL correction and joined by the KL penalty (GRPO), or
//! the plain negative log-likelihood (SFT). The learner turns each token's
//! `(loss, dloss/dlogp)` into gradients; this is the one place that says what
//! those are, so the step only wires the batch to it.

use super::{clipped_token, kl_token_with};
use crate::config::KlEstimator;

/// How many tokens the loss averages over: every response token, or under a
/// correction only those with a weight (`weights[i]` is sample `i`'s, if any).
pub fn counted_tokens(
    response_lens: impl IntoIterator<Item = usize>,
    weights: &[Option<Vec<f64>>],
) -> usize {
    response_lens
        .into_iter()
        .zip(weights)
        .map(|(len, w)| match w {
            Some(w) => w.iter().filter(|&&x| x > 0.0).count(),
            None => len,
        })
        .sum()
}

/// Per sample, the factor that makes the loss a mean over each response's
/// counted tokens and then over the responses (`loss_average = "response"`):
/// `1 / (counted_i * responses)`, 0 for a response with no counted token.
pub fn response_scales(
    response_lens: impl IntoIterator<Item = usize>,
    weights: &[Option<Vec<f64>>],
) -> Vec<f64> {
    let counts: Vec<usize> = response_lens
        .into_iter()
        .zip(weights)
        .map(|(len, w)| counted_tokens([len], std::slice::from_ref(w)))
        .collect();
    let n = counts.len().max(1) as f64;
    counts
        .iter()
        .map(|&c| if c == 0 { 0.0 } else { 1.0 / (c as f64 * n) })
        .collect()
}

/// One update's per-token objective over a batch; sample `i`, token `j`.
pub struct Objective<'a> {
    /// Supervised fine-tuning: `-logp` per token, no ratio, no clip.
    pub sft: bool,
    /// `1 / counted_tokens`: the loss is a mean.
    pub inv: f64,
    /// Per sample, used instead of `inv` when the loss is a mean per
    /// response ([`response_scales`]).
    pub per_sample_inv: Option<&'a [f64]>,
    /// Each sample's advantage.
    pub advantages: &'a [f64],
    /// Each sample's `pi_old` log-probabilities, where known (otherwise the
    /// token is on-policy: the ratio is 1).
    pub old: &'a [Option<Vec<f64>>],
    /// Each sample's correction weights, where corrected (0 masks a token).
    pub weights: &'a [Option<Vec<f64>>],
    /// Reference-model log-probabilities for the KL penalty, when it is on.
    pub refs: Option<&'a [Vec<f64>]>,
    /// PPO's clip range.
    pub clip_eps: f64,
    /// The KL penalty's coefficient.
    pub kl_coef: f64,
    /// The KL penalty's per-token estimator.
    pub kl_estimator: KlEstimator,
    /// Tokens so far whose clipped branch was taken.
    pub clipped: usize,
    /// What the pass saw of the ratio and the KL, token by token.
    pub seen: Seen,
}

/// The ratio `pi_theta / pi_old` and the KL to the reference over the tokens
/// an [`Objective`] weighed (masked tokens excluded).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seen {
    /// Tokens weighed.
    pub tokens: usize,
    /// Sum of their ratios.
    pub ratio_sum: f64,
    /// Smallest ratio.
    pub ratio_min: f64,
    /// Largest ratio.
    pub ratio_max: f64,
    /// Sum of their k3 KL to the reference (0 without one).
    pub kl_sum: f64,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            tokens: 0,
            ratio_sum: 0.0,
            ratio_min: f64::INFINITY,
            ratio_max: f64::NEG_INFINITY,
            kl_sum: 0.0,
        }
    }
}

impl Seen {
    /// Mean, min and max of the ratio (all 1 when no token was weighed).
    pub fn ratio(&self) -> (f64, f64, f64) {
        if self.tokens == 0 {
            return (1.0, 1.0, 1.0);
        }
        (
            self.ratio_sum / self.tokens as f64,
            self.ratio_min,
            self.ratio_max,
        )
    }

    /// Mean KL to the reference per weighed token.
    pub fn kl_mean(&self) -> f64 {
        self.kl_sum / self.tokens.max(1) as f64
    }

    /// Both passes' tokens together.
    pub fn merge(&self, o: &Seen) -> Seen {
        Seen {
            tokens: self.tokens + o.tokens,
            ratio_sum: self.ratio_sum + o.ratio_sum,
            ratio_min: self.ratio_min.min(o.ratio_min),
            ratio_max: self.ratio_max.max(o.ratio_max),
            kl_sum: self.kl_sum + o.kl_sum,
        }
    }
}

impl Objective<'_> {
    /// Token `j` of sample `i` at learner log-probability `logp`: its
    /// `(loss, dloss/dlogp)`.
    pub fn token(&mut self, i: usize, j: usize, logp: f64) -> (f64, f64) {
        let inv = self.per_sample_inv.map_or(self.inv, |v| v[i]);
        if self.sft {
            return (-logp * inv, -inv);
        }
        let lp_old = self.old[i].as_ref().map_or(logp, |o| o[j]);
        let w = self.weights[i].as_ref().map_or(1.0, |w| w[j]);
        if w == 0.0 {
            return (0.0, 0.0);
        }
        let t = clipped_token(logp, lp_old, self.advantages[i], self.clip_eps, inv * w);
        if t.clipped {
            self.clipped += 1;
        }
        let s = &mut self.seen;
        s.tokens += 1;
        s.ratio_sum += t.ratio;
        s.ratio_min = s.ratio_min.min(t.ratio);
        s.ratio_max = s.ratio_max.max(t.ratio);
        let (mut l, mut d) = (t.loss, t.dloss_dlogp);
        if let Some(r) = self.refs {
            let (kl, dkl) = kl_token_with(logp, r[i][j], self.kl_estimator);
            s.kl_sum += kl;
            l += self.kl_coef * kl * inv;
            d += self.kl_coef * dkl * inv;
        }
        (l, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GRPO objective with no reference, no correction's old log-probs and
    /// PPO's usual clip; each test sets what it is about.
    fn objective<'a>(
        inv: f64,
        advantages: &'a [f64],
        old: &'a [Option<Vec<f64>>],
        weights: &'a [Option<Vec<f64>>],
    ) -> Objective<'a> {
        Objective {
            sft: false,
            inv,
            per_sample_inv: None,
            advantages,
            old,
            weights,
            refs: None,
            clip_eps: 0.2,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            clipped: 0,
            seen: Seen::default(),
        }
    }

    #[test]
    fn masked_tokens_neither_count_nor_carry_a_gradient() {
        let weights = vec![None, Some(vec![1.0, 0.0, 0.5])];
        assert_eq!(counted_tokens([4, 3], &weights), 6);
        let mut o = objective(0.5, &[1.0, 1.0], &[None, None], &weights);
        assert_eq!(o.token(1, 1, -1.0), (0.0, 0.0));
        // On-policy, weight 0.5, mean over 2 tokens: -A w / n.
        assert_eq!(o.token(1, 2, -1.0), (-0.25, -0.25));
        // The masked token is not in the ratio's statistics.
        assert_eq!(o.seen.tokens, 1);
        assert_eq!(o.seen.ratio(), (1.0, 1.0, 1.0));
        o.sft = true;
        assert_eq!(o.token(0, 0, -2.0), (1.0, -0.5));
    }

    #[test]
    fn a_response_mean_weighs_every_response_alike() {
        // Two responses: one token, and three of which one is masked.
        let weights = vec![None, Some(vec![1.0, 0.0, 1.0])];
        let scales = response_scales([1, 3], &weights);
        assert_eq!(scales, vec![0.5, 0.25]);
        assert_eq!(response_scales([2], &[Some(vec![0.0, 0.0])]), vec![0.0]);
        let mut o = Objective {
            per_sample_inv: Some(&scales),
            ..objective(1.0 / 3.0, &[1.0, 1.0], &[None, None], &weights)
        };
        // On-policy, A = 1: each response's tokens sum to -1/2.
        assert_eq!(o.token(0, 0, -1.0), (-0.5, -0.5));
        let (l1, _) = o.token(1, 0, -1.0);
        let (l2, _) = o.token(1, 2, -1.0);
        assert_eq!(l1 + l2, -0.5);
        o.sft = true;
        assert_eq!(o.token(0, 0, -2.0), (1.0, -0.5));
    }

    /// A second PPO epoch: pi_old is the first epoch's pre-update
    /// log-probability, the update moved the policy, so the ratio leaves 1
    /// and the clip takes the tokens that moved too far in the advantage's
    /// direction.
    #[test]
    fn a_second_epoch_sees_the_ratio_move_and_the_clip_engage() {
        let old = vec![Some(vec![-1.0, -1.0, -1.0])];
        let weights = vec![None];
        let refs = vec![vec![-1.0, -1.0, -1.0]];
        let mut o = Objective {
            refs: Some(&refs),
            kl_coef: 1e-4,
            ..objective(1.0 / 3.0, &[1.0], &old, &weights)
        };
        // Ratios e^0.1 = 1.105 (inside), e^0.5 = 1.649 (clipped, A > 0),
        // e^-0.5 = 0.607 (below the range but A > 0: unclipped).
        let (_, d0) = o.token(0, 0, -0.9);
        let (l1, d1) = o.token(0, 1, -0.5);
        let (_, d2) = o.token(0, 2, -1.5);
        assert_eq!(o.clipped, 1);
        assert!(d0 < 0.0 && d2 < 0.0, "unclipped tokens carry a gradient");
        // The clipped token: constant surrogate, only the KL's gradient.
        let (kl, dkl) = super::super::kl_token(-0.5, -1.0);
        assert!((l1 - (-1.2 + 1e-4 * kl) / 3.0).abs() < 1e-12);
        assert!((d1 - 1e-4 * dkl / 3.0).abs() < 1e-15);
        let (mean, min, max) = o.seen.ratio();
        let r = [0.1f64.exp(), 0.5f64.exp(), (-0.5f64).exp()];
        assert!((mean - r.iter().sum::<f64>() / 3.0).abs() < 1e-12);
        assert!((min - r[2]).abs() < 1e-12 && (max - r[1]).abs() < 1e-12);
        let kls: f64 = [-0.9, -0.5, -1.5]
            .iter()
            .map(|&lp| super::super::kl_token(lp, -1.0).0)
            .sum();
        assert!((o.seen.kl_mean() - kls / 3.0).abs() < 1e-12);
    }
}
