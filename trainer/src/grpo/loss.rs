//! The update's loss, token by token: the clipped surrogate of [`super`]
//! weighed by the Sparse-RL correction and joined by the KL penalty (GRPO), or
//! the plain negative log-likelihood (SFT). The learner turns each token's
//! `(loss, dloss/dlogp)` into gradients; this is the one place that says what
//! those are, so the step only wires the batch to it.

use super::{clipped_token, kl_token};

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

/// One update's per-token objective over a batch; sample `i`, token `j`.
pub struct Objective<'a> {
    /// Supervised fine-tuning: `-logp` per token, no ratio, no clip.
    pub sft: bool,
    /// `1 / counted_tokens`: the loss is a mean.
    pub inv: f64,
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
    /// Tokens so far whose clipped branch was taken.
    pub clipped: usize,
}

impl Objective<'_> {
    /// Token `j` of sample `i` at learner log-probability `logp`: its
    /// `(loss, dloss/dlogp)`.
    pub fn token(&mut self, i: usize, j: usize, logp: f64) -> (f64, f64) {
        let inv = self.inv;
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
        let (mut l, mut d) = (t.loss, t.dloss_dlogp);
        if let Some(r) = self.refs {
            let (kl, dkl) = kl_token(logp, r[i][j]);
            l += self.kl_coef * kl * inv;
            d += self.kl_coef * dkl * inv;
        }
        (l, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_tokens_neither_count_nor_carry_a_gradient() {
        let weights = vec![None, Some(vec![1.0, 0.0, 0.5])];
        assert_eq!(counted_tokens([4, 3], &weights), 6);
        let mut o = Objective {
            sft: false,
            inv: 0.5,
            advantages: &[1.0, 1.0],
            old: &[None, None],
            weights: &weights,
            refs: None,
            clip_eps: 0.2,
            kl_coef: 0.0,
            clipped: 0,
        };
        assert_eq!(o.token(1, 1, -1.0), (0.0, 0.0));
        // On-policy, weight 0.5, mean over 2 tokens: -A w / n.
        assert_eq!(o.token(1, 2, -1.0), (-0.25, -0.25));
        o.sft = true;
        assert_eq!(o.token(0, 0, -2.0), (1.0, -0.5));
    }
}
