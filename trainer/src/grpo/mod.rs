//! GRPO's arithmetic (DESIGN.md section 6, without the sparse terms): group-
//! normalised advantages and the PPO clipped surrogate, written per token so the
//! learner can turn them into gradients without materialising the vocabulary.

mod loss;

pub use loss::{counted_tokens, response_scales, Objective, Seen};

use crate::config::KlEstimator;

/// Added to a group's standard deviation so equal rewards divide safely.
pub const ADV_EPS: f64 = 1e-6;

/// `A_i = (R_i - mean) / (std + eps)` within one prompt's group (population
/// standard deviation). A group whose rewards are all equal carries no signal:
/// every advantage is exactly 0.
pub fn group_advantages(rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len();
    if n == 0 {
        return Vec::new();
    }
    let mean = rewards.iter().sum::<f64>() / n as f64;
    let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n as f64;
    let std = var.sqrt();
    if std == 0.0 {
        return vec![0.0; n];
    }
    rewards
        .iter()
        .map(|r| (r - mean) / (std + ADV_EPS))
        .collect()
}

/// [`group_advantages`] over the rollouts `kept` (a correction dropped the
/// others): the group's mean and standard deviation are of the kept rewards
/// only, and a dropped rollout's advantage is 0.
pub fn kept_advantages(rewards: &[f64], kept: &[bool]) -> Vec<f64> {
    let survivors: Vec<f64> = rewards
        .iter()
        .zip(kept)
        .filter(|(_, &k)| k)
        .map(|(&r, _)| r)
        .collect();
    let mut adv = group_advantages(&survivors).into_iter();
    kept.iter()
        .map(|&k| if k { adv.next().unwrap_or(0.0) } else { 0.0 })
        .collect()
}

/// One token's share of the clipped surrogate: its loss and the derivative of
/// that loss with respect to the token's log-probability under the learner.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenTerm {
    /// `-min(r A, clip(r, 1 - eps, 1 + eps) A) * weight`.
    pub loss: f64,
    /// `d loss / d log pi_theta`.
    pub dloss_dlogp: f64,
    /// Whether the clipped branch was the one taken (no gradient).
    pub clipped: bool,
    /// The ratio `r = pi_theta / pi_old` (clamped as the loss uses it).
    pub ratio: f64,
}

/// The PPO clipped surrogate for one token: `r = exp(logp - logp_old)`, loss
/// `-min(r A, clip(r) A) * weight`. Where the unclipped branch is the minimum
/// its gradient is `-A r weight` per unit of log-probability; where the clipped
/// one is, the loss is constant in `logp` and the gradient is 0.
pub fn clipped_token(logp: f64, logp_old: f64, advantage: f64, eps: f64, weight: f64) -> TokenTerm {
    let r = (logp - logp_old).clamp(-20.0, 20.0).exp();
    let unclipped = r * advantage;
    let clipped_r = r.clamp(1.0 - eps, 1.0 + eps);
    let clipped = clipped_r * advantage;
    if unclipped <= clipped {
        TokenTerm {
            loss: -unclipped * weight,
            dloss_dlogp: -advantage * r * weight,
            clipped: false,
            ratio: r,
        }
    } else {
        TokenTerm {
            loss: -clipped * weight,
            dloss_dlogp: 0.0,
            clipped: true,
            ratio: r,
        }
    }
}

/// The k3 estimator of KL(pi_theta || pi_ref) for one token,
/// `exp(ref - logp) - (ref - logp) - 1` (>= 0), and its derivative in `logp`.
pub fn kl_token(logp: f64, logp_ref: f64) -> (f64, f64) {
    let d = (logp_ref - logp).clamp(-20.0, 20.0);
    (d.exp() - d - 1.0, 1.0 - d.exp())
}

/// Where `low_var_kl` clamps a token's k3 value.
pub const LOW_VAR_KL_MAX: f64 = 10.0;

/// One token's KL penalty and its derivative in `logp` under `estimator`:
/// [`kl_token`], or with `low_var_kl` that value clamped to
/// [`LOW_VAR_KL_MAX`], where the derivative is 0 (the clamp is flat).
pub fn kl_token_with(logp: f64, logp_ref: f64, estimator: KlEstimator) -> (f64, f64) {
    let (kl, d) = kl_token(logp, logp_ref);
    match estimator {
        KlEstimator::K3 => (kl, d),
        KlEstimator::LowVarKl if kl > LOW_VAR_KL_MAX => (LOW_VAR_KL_MAX, 0.0),
        KlEstimator::LowVarKl => (kl, d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_by_hand() {
        // rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +-1.
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0]);
        for (got, want) in a.iter().zip([1.0, -1.0, -1.0, 1.0]) {
            assert!((got - want).abs() < 1e-5, "{a:?}");
        }
        // 1, 0, 0, 0: mean 0.25, std sqrt(0.1875) = 0.4330.
        let a = group_advantages(&[1.0, 0.0, 0.0, 0.0]);
        assert!((a[0] - 0.75 / 0.4330127).abs() < 1e-4);
        assert!((a[1] + 0.25 / 0.4330127).abs() < 1e-4);
        assert_eq!(group_advantages(&[1.0, 1.0, 1.0]), vec![0.0; 3]);
        assert!(group_advantages(&[]).is_empty());
    }

    #[test]
    fn kept_advantages_leave_dropped_rollouts_out_of_the_baseline() {
        let rewards = [1.0, 0.0, 0.0, 1.0];
        // All kept: the same as over the whole group.
        assert_eq!(
            kept_advantages(&rewards, &[true; 4]),
            group_advantages(&rewards)
        );
        // Rollout 3 dropped: rewards 1, 0, 0: mean 1/3, std sqrt(2/9).
        let a = kept_advantages(&rewards, &[true, true, true, false]);
        let std = (2.0f64 / 9.0).sqrt();
        let want = [
            (2.0 / 3.0) / std,
            -(1.0 / 3.0) / std,
            -(1.0 / 3.0) / std,
            0.0,
        ];
        for (got, want) in a.iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{a:?}");
        }
        // Against all G: rollout 0's advantage moved from 1 to 1.41.
        assert!((a[0] - group_advantages(&rewards)[0]).abs() > 0.4);
        // Dropping the only differing rollout leaves no signal.
        assert_eq!(
            kept_advantages(&[1.0, 0.0, 0.0], &[false, true, true]),
            vec![0.0; 3]
        );
    }

    #[test]
    fn clipped_surrogate_by_hand() {
        let eps = 0.2;
        // On-policy (r = 1): loss -A, gradient -A.
        let t = clipped_token(-1.0, -1.0, 2.0, eps, 1.0);
        assert!((t.loss + 2.0).abs() < 1e-12 && (t.dloss_dlogp + 2.0).abs() < 1e-12);
        // r = e^0.5 = 1.6487 > 1.2 with A > 0: clipped, loss -1.2 A, no gradient.
        let t = clipped_token(0.5, 0.0, 1.0, eps, 1.0);
        assert!(t.clipped && (t.loss + 1.2).abs() < 1e-12 && t.dloss_dlogp == 0.0);
        // Same r with A < 0: the unclipped branch is the minimum: loss r, grad r.
        let t = clipped_token(0.5, 0.0, -1.0, eps, 1.0);
        let r = 0.5f64.exp();
        assert!(!t.clipped && (t.loss - r).abs() < 1e-12 && (t.dloss_dlogp - r).abs() < 1e-12);
        // r = e^-0.5 = 0.6065 < 0.8 with A < 0: clipped at 0.8.
        let t = clipped_token(-0.5, 0.0, -1.0, eps, 1.0);
        assert!(t.clipped && (t.loss - 0.8).abs() < 1e-12);
        // A weight scales both.
        let t = clipped_token(0.0, 0.0, 1.0, eps, 0.5);
        assert!((t.loss + 0.5).abs() < 1e-12 && (t.dloss_dlogp + 0.5).abs() < 1e-12);
    }

    #[test]
    fn kl_is_zero_on_the_reference_and_positive_off_it() {
        assert_eq!(kl_token(-2.0, -2.0), (0.0, 0.0));
        let (kl, g) = kl_token(-1.0, -2.0);
        assert!(kl > 0.0 && g > 0.0);
    }

    #[test]
    fn low_var_kl_caps_a_token_at_ten_and_stops_its_gradient() {
        use KlEstimator::{LowVarKl, K3};
        // Below the cap both estimators agree bit for bit.
        for (lp, r) in [(-1.0, -2.0), (-2.0, -1.0), (-3.0, -0.6)] {
            assert_eq!(kl_token_with(lp, r, LowVarKl), kl_token_with(lp, r, K3));
            assert_eq!(kl_token_with(lp, r, K3), kl_token(lp, r));
        }
        // ref - logp = 18: k3 is e^18 - 19 (about 6.6e7) with slope 1 - e^18.
        let (k3, g3) = kl_token_with(-20.0, -2.0, K3);
        assert!(
            (k3 - (18f64.exp() - 19.0)).abs() < 1e-6 && (g3 - (1.0 - 18f64.exp())).abs() < 1e-6
        );
        assert_eq!(kl_token_with(-20.0, -2.0, LowVarKl), (LOW_VAR_KL_MAX, 0.0));
        // The cap binds from ref - logp = 2.61 (e^d - d - 1 = 10): 2.6 is
        // under it, 2.7 over.
        assert_eq!(kl_token_with(-3.0, -0.4, LowVarKl), kl_token(-3.0, -0.4));
        assert_eq!(kl_token_with(-3.0, -0.3, LowVarKl), (LOW_VAR_KL_MAX, 0.0));
    }
}
