//! Sparse-RL's corrections (DESIGN.md section 6) for rollouts sampled under a
//! compressed KV cache: the sampler (pi_sparse) is not the dense policy the
//! learner scores (pi_old), so each token carries a mismatch ratio
//! `rho = pi_old / pi_sparse` and the loss is corrected with it.
//!
//! - `none`: the plain GRPO loss (weights 1).
//! - `tis`: truncated importance sampling, `w = min(rho, cap)`.
//! - `sparse-rl`: sequence veto (any `rho < veto` drops the rollout), token
//!   rejection (`rho` outside `[low, high]` leaves the loss and its
//!   denominator), `w = min(rho, cap)` on kept tokens divided by their batch
//!   mean.
//!
//! At the sequence level one ratio per rollout (the geometric mean of its
//! tokens') stands for all of its tokens.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which correction the loss uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Correction {
    /// No correction.
    None,
    /// Truncated importance weights.
    Tis,
    /// Veto, rejection and normalised truncated weights.
    SparseRl,
}

impl FromStr for Correction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Correction::None),
            "tis" => Ok(Correction::Tis),
            "sparse-rl" => Ok(Correction::SparseRl),
            o => Err(format!("unknown correction `{o}` (none, tis or sparse-rl)")),
        }
    }
}

impl fmt::Display for Correction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Correction::None => "none",
            Correction::Tis => "tis",
            Correction::SparseRl => "sparse-rl",
        })
    }
}

/// Thresholds of the corrections.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// A rollout with any token ratio below this is dropped (sparse-rl).
    pub veto: f64,
    /// Tokens with a ratio below this are masked (sparse-rl).
    pub low: f64,
    /// Tokens with a ratio above this are masked (sparse-rl).
    pub high: f64,
    /// Importance weights are truncated at this (tis, sparse-rl).
    pub cap: f64,
    /// One ratio per rollout instead of per token.
    pub sequence_level: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            veto: 1e-4,
            low: 0.5,
            high: 1.5,
            cap: 1.5,
            sequence_level: false,
        }
    }
}

/// What the correction decided, with its statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Corrected {
    /// Per rollout and token, the loss weight (0: masked or vetoed).
    pub weights: Vec<Vec<f64>>,
    /// Rollouts dropped by the veto.
    pub rejected_rollouts: usize,
    /// Tokens masked by rejection (vetoed rollouts' tokens included).
    pub rejected_tokens: usize,
    /// Tokens that keep a non-zero weight.
    pub kept_tokens: usize,
    /// Mean token ratio.
    pub mean_rho: f64,
    /// Smallest token ratio.
    pub min_rho: f64,
    /// Estimate of KL(pi_old || pi_sparse) from the sparse samples,
    /// `mean(rho log rho)`.
    pub kl_old_sparse: f64,
}

/// `rho = exp(clamp(log pi_old - log pi_sparse, -20, 20))`.
pub fn rho(logp_old: f64, logp_sparse: f64) -> f64 {
    (logp_old - logp_sparse).clamp(-20.0, 20.0).exp()
}

/// Weights for every token of every rollout from the learner's `old` and the
/// sampler's `sparse` log-probabilities (same shapes).
pub fn correct(
    kind: Correction,
    th: &Thresholds,
    old: &[Vec<f64>],
    sparse: &[Vec<f64>],
) -> Corrected {
    let mut rhos: Vec<Vec<f64>> = old
        .iter()
        .zip(sparse)
        .map(|(o, s)| o.iter().zip(s).map(|(&a, &b)| rho(a, b)).collect())
        .collect();
    let all: Vec<f64> = rhos.iter().flatten().copied().collect();
    let n = all.len().max(1) as f64;
    let mean_rho = all.iter().sum::<f64>() / n;
    let min_rho = all.iter().copied().fold(f64::INFINITY, f64::min);
    let kl_old_sparse = all.iter().map(|r| r * r.ln()).sum::<f64>() / n;
    if th.sequence_level {
        for r in &mut rhos {
            let len = r.len().max(1) as f64;
            let g = (r.iter().map(|x| x.ln()).sum::<f64>() / len).exp();
            r.iter_mut().for_each(|x| *x = g);
        }
    }
    let (mut rejected_rollouts, mut rejected_tokens) = (0, 0);
    let mut weights: Vec<Vec<f64>> = Vec::with_capacity(rhos.len());
    for r in &rhos {
        let w: Vec<f64> = match kind {
            Correction::None => vec![1.0; r.len()],
            Correction::Tis => r.iter().map(|&x| x.min(th.cap)).collect(),
            Correction::SparseRl => {
                if r.iter().any(|&x| x < th.veto) {
                    rejected_rollouts += 1;
                    rejected_tokens += r.len();
                    vec![0.0; r.len()]
                } else {
                    r.iter()
                        .map(|&x| {
                            if x < th.low || x > th.high {
                                rejected_tokens += 1;
                                0.0
                            } else {
                                x.min(th.cap)
                            }
                        })
                        .collect()
                }
            }
        };
        weights.push(w);
    }
    let kept: Vec<f64> = weights
        .iter()
        .flatten()
        .copied()
        .filter(|&w| w > 0.0)
        .collect();
    if kind == Correction::SparseRl && !kept.is_empty() {
        let mean = kept.iter().sum::<f64>() / kept.len() as f64;
        for w in weights.iter_mut().flatten() {
            *w /= mean;
        }
    }
    Corrected {
        kept_tokens: kept.len(),
        weights,
        rejected_rollouts,
        rejected_tokens,
        mean_rho,
        min_rho,
        kl_old_sparse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(rhos: &[f64]) -> (Vec<f64>, Vec<f64>) {
        // old = ln rho, sparse = 0: the ratio of each token is exactly rho.
        (rhos.iter().map(|r| r.ln()).collect(), vec![0.0; rhos.len()])
    }

    #[test]
    fn sparse_rl_vetoes_masks_truncates_and_normalises() {
        let th = Thresholds::default();
        let (o1, s1) = lp(&[1.0, 1.2, 0.4, 1.4]); // 0.4 masked
        let (o2, s2) = lp(&[1.0, 5e-5]); // vetoed
        let (o3, s3) = lp(&[2.0, 0.8]); // 2.0 masked
        let c = correct(Correction::SparseRl, &th, &[o1, o2, o3], &[s1, s2, s3]);
        assert_eq!(c.rejected_rollouts, 1);
        assert_eq!(c.rejected_tokens, 2 + 2);
        assert_eq!(c.kept_tokens, 4);
        // Kept raw weights 1.0, 1.2, 1.4, 0.8: mean 1.1.
        let want = [
            vec![1.0 / 1.1, 1.2 / 1.1, 0.0, 1.4 / 1.1],
            vec![0.0, 0.0],
            vec![0.0, 0.8 / 1.1],
        ];
        for (got, want) in c.weights.iter().flatten().zip(want.iter().flatten()) {
            assert!((got - want).abs() < 1e-9, "{:?}", c.weights);
        }
        assert!((c.min_rho - 5e-5).abs() < 1e-12);
    }

    #[test]
    fn tis_truncates_only_and_none_is_all_ones() {
        let th = Thresholds::default();
        let (o, s) = lp(&[0.1, 1.0, 3.0]);
        let c = correct(
            Correction::Tis,
            &th,
            std::slice::from_ref(&o),
            std::slice::from_ref(&s),
        );
        let w = &c.weights[0];
        assert!(
            (w[0] - 0.1).abs() < 1e-12 && (w[1] - 1.0).abs() < 1e-12 && (w[2] - 1.5).abs() < 1e-12
        );
        assert_eq!(c.rejected_tokens, 0);
        let c = correct(Correction::None, &th, &[o], &[s]);
        assert_eq!(c.weights[0], vec![1.0; 3]);
    }

    #[test]
    fn sequence_level_uses_the_geometric_mean() {
        let th = Thresholds {
            sequence_level: true,
            ..Default::default()
        };
        // Geometric mean of 0.5 and 2.0 is 1.0: kept although both tokens
        // would be masked one by one.
        let (o, s) = lp(&[0.5, 2.0]);
        let c = correct(Correction::SparseRl, &th, &[o], &[s]);
        assert_eq!(c.rejected_tokens, 0);
        assert!(c.weights[0].iter().all(|&w| (w - 1.0).abs() < 1e-9));
    }

    #[test]
    fn identical_policies_have_ratio_one_and_zero_kl() {
        let c = correct(
            Correction::SparseRl,
            &Thresholds::default(),
            &[vec![-1.0, -2.0]],
            &[vec![-1.0, -2.0]],
        );
        assert_eq!((c.mean_rho, c.min_rho, c.kl_old_sparse), (1.0, 1.0, 0.0));
        assert_eq!(rho(0.0, 30.0), (-20f64).exp());
    }
}
