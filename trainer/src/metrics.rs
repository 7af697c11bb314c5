//! What a step reports: one line of `metrics.jsonl` per step, the fields
//! the plots, the resume check and the progress bar read. The step fills it
//! in; the recorder writes it.

use serde::{Deserialize, Serialize};

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// 1-based step number.
    pub step: usize,
    /// Mean reward of the step's rollouts (GRPO) or 0 (SFT).
    pub reward_mean: f64,
    /// Their standard deviation.
    pub reward_std: f64,
    /// The loss of the update (first epoch).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Rollout tokens generated.
    pub rollout_tokens: usize,
    /// Rollout tokens per second.
    pub tokens_per_s: f64,
    /// Tokens the learner scored.
    pub learner_tokens: usize,
    /// Groups whose rewards differed (the ones that carry a gradient).
    pub groups_with_signal: usize,
    /// Groups replayed from earlier steps.
    #[serde(default)]
    pub replayed_groups: usize,
    /// Share of scored tokens whose clipped branch was taken.
    pub clipped_frac: f64,
    /// KV bytes the rollouts held at their peaks, summed.
    pub kv_bytes_peak: usize,
    /// KV bytes full caches would have held.
    pub kv_bytes_full: usize,
    /// Peak resident memory of the process so far.
    pub peak_rss_bytes: u64,
    /// The estimator's peak for this step's largest learner micro-batch.
    pub peak_estimate_bytes: u64,
    /// Mismatch statistics of sparse or corrected rollouts (absent for dense
    /// uncorrected runs, which skip the extra scoring pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rho: Option<RhoStats>,
    /// Wall seconds of the step.
    pub seconds: f64,
    /// Wall seconds of the learner's passes (pi_old scoring, gradients and
    /// the update): `learner_tokens / learner_seconds` is its throughput.
    #[serde(default)]
    pub learner_seconds: f64,
}

/// Per-step statistics of `rho = pi_old / pi_sparse`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RhoStats {
    /// Rollouts dropped by the veto.
    pub rejected_rollouts: usize,
    /// Tokens masked (vetoed rollouts' included).
    pub rejected_tokens: usize,
    /// Mean token ratio.
    pub mean_rho: f64,
    /// Smallest token ratio.
    pub min_rho: f64,
    /// Estimate of KL(pi_old || pi_sparse).
    pub kl_old_sparse: f64,
}
