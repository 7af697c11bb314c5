//! What a step reports: one line of `metrics.jsonl` per step, the fields
//! the plots, the resume check and the progress bar read. The step fills it
//! in; the recorder writes it.

use serde::{Deserialize, Serialize};

use crate::config::Advantages;

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
    /// Share of scored tokens whose clipped branch was taken (first epoch;
    /// every epoch's is in `epochs`).
    pub clipped_frac: f64,
    /// Which rollouts the group advantages were computed over (records
    /// written before the switch existed used `all`).
    #[serde(default)]
    pub advantages: Advantages,
    /// The PPO ratio `pi_theta / pi_old` over every epoch's loss tokens
    /// (GRPO updates only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<RatioStats>,
    /// Each PPO epoch's update, in order (GRPO updates only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<EpochStats>,
    /// KV bytes the rollouts held at their peaks, summed.
    pub kv_bytes_peak: usize,
    /// KV bytes full caches would have held.
    pub kv_bytes_full: usize,
    /// Cached entries the rollouts' sampling queries attended over, summed
    /// over tokens, layers and KV heads (0 where unmeasured: a full cache,
    /// remote rollouts, records written before it was measured).
    #[serde(default)]
    pub kv_attended: u64,
    /// What full caches would have offered the same queries:
    /// `kv_attended / kv_attended_full` is the share of the KV the rollouts
    /// really kept ([`StepMetrics::kv_kept`]), where the bytes above give
    /// only peaks.
    #[serde(default)]
    pub kv_attended_full: u64,
    /// Peak resident memory of the process so far.
    pub peak_rss_bytes: u64,
    /// Sequences per learner micro-batch this step (planned from its
    /// sequences' lengths under the cap; 0 in records written before that).
    #[serde(default)]
    pub micro_batch: usize,
    /// Whether this step's learner recomputed blocks in its backward pass.
    #[serde(default)]
    pub recompute: bool,
    /// The estimator's peak for this step's largest learner micro-batch.
    pub peak_estimate_bytes: u64,
    /// The estimator's peak for this step's rollout phase: the fixed state
    /// plus the KV budget the plan gave the engine (0 for SFT, and in
    /// records written before it).
    #[serde(default)]
    pub rollout_estimate_bytes: u64,
    /// Peak resident memory of this step's rollout phase alone (0 where the
    /// kernel cannot reset the peak, and in records written before it).
    #[serde(default)]
    pub rollout_peak_bytes: u64,
    /// Peak resident memory of this step's learner phase alone (scoring,
    /// gradients, update): what `peak_estimate_bytes` predicts.
    #[serde(default)]
    pub learner_peak_bytes: u64,
    /// Mismatch statistics of the sampler against pi_old, for every GRPO step
    /// whose learner batch is not empty (both sides at the sampling
    /// temperature, so a dense run's are exactly 1 on the quantized learner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rho: Option<RhoStats>,
    /// Wall seconds of the step.
    pub seconds: f64,
    /// Wall seconds of the learner's passes (pi_old scoring, gradients and
    /// the update): `learner_tokens / learner_seconds` is its throughput.
    #[serde(default)]
    pub learner_seconds: f64,
    /// Rollouts on `--rollout-endpoints`: what each worker did, retries and
    /// stale rollouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::fleet::FleetStats>,
}

impl StepMetrics {
    /// The share of the KV the step's rollouts really kept: entries attended
    /// over, against a full cache, summed over every sampled token; `None`
    /// where unmeasured.
    pub fn kv_kept(&self) -> Option<f64> {
        (self.kv_attended_full > 0).then(|| self.kv_attended as f64 / self.kv_attended_full as f64)
    }
}

/// Per-step statistics of `rho = pi_old / pi_sampler` (pi_sparse under a
/// compressed rollout cache).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RhoStats {
    /// Rollouts dropped whole (veto, `sequence_mask`).
    pub rejected_rollouts: usize,
    /// Tokens masked (dropped rollouts' included).
    pub rejected_tokens: usize,
    /// Mean token ratio.
    pub mean_rho: f64,
    /// Smallest token ratio.
    pub min_rho: f64,
    /// Largest token ratio.
    #[serde(default)]
    pub max_rho: f64,
    /// Estimate of KL(pi_old || pi_sampler).
    pub kl_old_sparse: f64,
    /// Token counts per bin of `correction::RHO_HIST_EDGES` (`[0, 0.5)`,
    /// `[0.5, 0.8)`, ..., `[0.99, 1.01)`, ..., `[2, inf)`).
    #[serde(default)]
    pub hist: Vec<usize>,
    /// Per scored rollout, what Sparse-RL's thresholds see in its ratios
    /// whichever correction acts (none included), so that a run can test
    /// whether long answers are masked more (docs/SPARSE_RL.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollouts: Option<RolloutRho>,
}

/// One entry per rollout the learner scored (groups with a reward signal),
/// in batch order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutRho {
    /// Response tokens.
    pub tokens: Vec<usize>,
    /// Tokens whose ratio lies outside Sparse-RL's `[low, high]` band.
    pub outside: Vec<usize>,
    /// Whether any token's ratio fell below Sparse-RL's veto.
    pub vetoed: Vec<bool>,
    /// The rollout's group-normalised advantage (its sign: better or worse
    /// than its group).
    pub advantage: Vec<f64>,
}

/// The PPO ratio `r = pi_theta / pi_old` over the tokens of an update.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatioStats {
    /// Mean ratio.
    pub mean: f64,
    /// Smallest ratio.
    pub min: f64,
    /// Largest ratio.
    pub max: f64,
    /// Share of the tokens whose clipped branch was taken.
    pub clipped_frac: f64,
}

/// One PPO epoch: an optimizer update on the step's batch with pi_old fixed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// The loss before this epoch's update.
    pub loss: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// The ratio over this epoch's loss tokens (exactly 1 in the first epoch
    /// of a dense run).
    pub ratio: RatioStats,
    /// Mean k3 KL to the reference model over the loss tokens (0 with
    /// `kl_coef` 0).
    pub kl_ref: f64,
}
