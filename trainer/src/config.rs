//! A training run's configuration: a TOML file whose every key is also a
//! `tern train` flag (flags win), checked in full before any work starts.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tern_models::LoraTarget;

use crate::correction::{Correction, NumericsCorrection, NumericsThresholds, Thresholds};
use crate::data::Selection;
use crate::error::{Result, TrainError};

/// What the learner optimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Supervised: maximise the log-likelihood of the task's reference answer.
    Sft,
    /// Group-relative policy optimisation on sampled rollouts and verified rewards.
    Grpo,
}

/// Learning-rate schedule over the run's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The same rate every step (after warm-up).
    Constant,
    /// Linear decay to zero at the last step.
    Linear,
    /// Cosine decay to zero at the last step.
    Cosine,
}

/// What attention the learner scores rollouts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LearnerKv {
    /// Full attention over prompt and response (Sparse-RL's learner).
    Dense,
    /// Each token sees only the entries the rollout's KV policy still held
    /// when it was sampled (the eviction record replayed as a mask): the
    /// model is trained as it will be served.
    SparseReplay,
}

/// Which rollouts of a group its advantages are computed over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Advantages {
    /// The group's mean and standard deviation over all `G` rollouts, before
    /// any correction drops one (what every run before the switch did).
    #[default]
    All,
    /// Over the rollouts that survive the correction (a vetoed or
    /// sequence-masked rollout no longer moves its group's baseline).
    Kept,
}

/// How the KL penalty to the reference model is estimated per token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlEstimator {
    /// Schulman's k3, `exp(ref - logp) - (ref - logp) - 1`, unbounded above
    /// (every run up to the Sparse-RL ablation used it).
    #[default]
    #[serde(rename = "k3")]
    K3,
    /// k3 clamped to at most 10 per token, with no gradient where the clamp
    /// binds: slime's and verl's `low_var_kl`, which the Sparse-RL paper's
    /// scripts use. A token the policy now finds far less likely than the
    /// reference does then stops pulling on the update.
    #[serde(rename = "low_var_kl")]
    LowVarKl,
}

/// What the loss averages over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossAverage {
    /// One mean over all the batch's counted tokens (every recorded run):
    /// a long response weighs in proportion to its length.
    #[default]
    Token,
    /// A mean over each response's counted tokens, then over responses
    /// (slime's default, the Sparse-RL paper's runs): every response weighs
    /// the same whatever its length or how many of its tokens a correction
    /// masked.
    Response,
}

/// How the LoRA learner holds the frozen base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LearnerWeights {
    /// The GGUF blocks on the sampler's own kernels (one copy shared with the
    /// rollout engine; dense rollouts' log-probabilities equal pi_old where
    /// the weights' kernels give a row the same result in any batch).
    Gguf,
    /// Dequantized to f32 (the learner before the quantized one: ~5x the
    /// weights' memory, and its own rounding).
    F32,
}

/// A config enum from its TOML spelling (serde's names), for the CLI's
/// flags: one list of names for both.
fn parse_named<T: serde::de::DeserializeOwned>(
    s: &str,
    what: &str,
    choices: &str,
) -> Result<T, String> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s))
        .map_err(|_| format!("unknown {what} `{s}` ({choices})"))
}

macro_rules! from_str_by_name {
    ($($t:ty => $what:literal, $choices:literal;)*) => {$(
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                parse_named(s, $what, $choices)
            }
        }
    )*};
}

from_str_by_name! {
    LearnerKv => "learner_kv", "dense or sparse-replay";
    LossAverage => "loss average", "token or response";
    KlEstimator => "KL estimator", "k3 or low_var_kl";
    Advantages => "advantages", "all or kept";
    LearnerWeights => "learner_weights", "gguf or f32";
}

/// Every setting of a run. Field names are the TOML keys and the flag names
/// (`group_size` = `--group-size`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Model: a registry name or a GGUF path.
    pub model: String,
    /// Training tasks: `arithmetic:...`, `story:...`, `spreadsheet:...` or a
    /// JSONL file.
    pub task: String,
    /// Held-out tasks scored greedily before and after training (none: skip).
    pub eval_task: Option<String>,
    /// `sft` or `grpo`.
    pub algorithm: Algorithm,
    /// Train every projection and norm instead of LoRA adapters.
    pub full: bool,
    /// Plan the memory, run the first step's rollouts, record their metrics
    /// and stop: no update, no checkpoint, no evaluation. Sizes a run (how
    /// many rollouts decode at once under the cap, and how fast) cheaply.
    pub dry_run: bool,
    /// SFT on a file where only some tasks carry a worked `target`
    /// (synthesis data): also train the others on the bare
    /// "The answer is X." line (on by default: that synthesizer won on
    /// held-out stories). Off: only the worked targets, as the CoT-based
    /// Synthesizer paper keeps only correct syntheses.
    pub sft_bare_answers: bool,
    /// LoRA rank.
    pub lora_rank: usize,
    /// LoRA alpha (the update is scaled by alpha / rank).
    pub lora_alpha: f64,
    /// Projections that get adapters: q,k,v,o,gate,up,down or all.
    pub lora_targets: String,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Learning-rate schedule.
    pub schedule: Schedule,
    /// Steps of linear warm-up.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Largest gradient norm before clipping (0: no clipping).
    pub max_grad_norm: f64,
    /// Rollouts per prompt (GRPO's group size G).
    pub group_size: usize,
    /// Prompts per step.
    pub prompts_per_step: usize,
    /// Most new tokens per rollout.
    pub max_new_tokens: usize,
    /// Rollout sampling temperature.
    pub temperature: f32,
    /// PPO clip range epsilon.
    pub clip_eps: f64,
    /// Coefficient of the k3 KL penalty to the reference (base) model; 0
    /// skips it (the default, as every recorded run used). Sparse-RL's paper
    /// uses 1e-4. LoRA only: full fine-tuning keeps no reference copy.
    pub kl_coef: f64,
    /// The KL penalty's per-token estimator (`k3` or `low_var_kl`).
    pub kl_estimator: KlEstimator,
    /// Whether the loss is a mean over tokens or over responses.
    pub loss_average: LossAverage,
    /// Optimizer updates on each step's batch, pi_old fixed at the
    /// pre-update policy: from the second on the ratio leaves 1 and the clip
    /// acts.
    pub ppo_epochs: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Seed of everything random in the run.
    pub seed: u64,
    /// Where checkpoints and `metrics.jsonl` go.
    pub out: PathBuf,
    /// Hard cap on the process's peak resident memory, e.g. `2GiB`.
    pub memory_cap: Option<String>,
    /// Sequences per learner micro-batch (unset: the largest the cap allows).
    pub micro_batch: Option<usize>,
    /// Write a checkpoint every this many steps (the last step always writes one).
    pub checkpoint_every: usize,
    /// KV policy of the rollouts (the serving spec string).
    pub rollout_kv_policy: String,
    /// A system message before each task (none: the bare question).
    pub system_prompt: Option<String>,
    /// The learner's attention: `dense`, or `sparse-replay` (the rollout
    /// policy's evictions replayed as masks).
    pub learner_kv: LearnerKv,
    /// The LoRA learner's frozen base: `gguf` (the sampler's kernels) or `f32`.
    pub learner_weights: LearnerWeights,
    /// Recompute each block in the backward pass instead of keeping its
    /// activations (unset: on when the memory cap needs it).
    pub recompute: Option<bool>,
    /// Off-policy correction of sparse rollouts: none, tis or sparse-rl.
    pub correction: Correction,
    /// Correction thresholds (veto, rejection band, truncation cap, level).
    pub rho: Thresholds,
    /// Correction of the sampler/learner numerics mismatch, in TRL's words
    /// (`vllm_importance_sampling_mode`): none, token_truncate, token_mask,
    /// sequence_truncate or sequence_mask. It weighs the same ratio as
    /// `correction`, so at most one of the two is on: the dense arms use this
    /// one, the sparse arms `correction`.
    pub numerics_correction: NumericsCorrection,
    /// The numerics correction's bounds (TRL's `clip_max` 3.0, `clip_min` unset).
    pub numerics: NumericsThresholds,
    /// Group advantages over `all` rollouts or over those `kept` by the
    /// correction.
    pub advantages: Advantages,
    /// How prompts are chosen: uniform, or difficulty (pass rates near 1/2).
    pub selection: Selection,
    /// Weight of a new group's mean reward in a task's pass-rate EMA.
    pub pass_rate_alpha: f64,
    /// Share of each step's groups replayed from the buffer (0: no replay).
    pub replay_share: f64,
    /// Groups the replay buffer keeps.
    pub replay_capacity: usize,
    /// OpenAI-compatible servers that roll out instead of the trainer's own
    /// engine (`tern serve --lora-dir`, or any server returning completion
    /// log-probabilities as token ids); empty: co-located rollouts.
    pub rollout_endpoints: Vec<String>,
    /// Seconds a worker may take over one group before its requests go to
    /// another worker.
    pub rollout_timeout_secs: u64,
    /// A file whose first line is the workers' API key, sent as a bearer
    /// token on every request to them (workers off loopback must have one).
    /// The path, not the key, is what configs and checkpoints hold.
    pub rollout_api_key_file: Option<PathBuf>,
    /// A rollout sampled under an older adapter: corrected or dropped.
    pub stale_rollouts: crate::fleet::StaleRollouts,
    /// Where rewards come from: `task` (its answer or its own tests) or
    /// `generated_tests:K` (K unit tests a model writes per group, for code
    /// tasks without hidden tests; see `reward.rs`).
    pub reward: crate::reward::Reward,
    /// The model that writes the tests of `generated_tests:K` (a registry
    /// name or GGUF path), run as its own engine; unset: the policy itself,
    /// as it is being trained.
    pub test_model: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: "smollm2-135m-instruct".into(),
            task: "arithmetic".into(),
            eval_task: None,
            algorithm: Algorithm::Grpo,
            full: false,
            dry_run: false,
            sft_bare_answers: true,
            lora_rank: 8,
            lora_alpha: 16.0,
            lora_targets: "all".into(),
            lr: 2e-4,
            schedule: Schedule::Constant,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            group_size: 8,
            prompts_per_step: 4,
            max_new_tokens: 48,
            temperature: 1.0,
            clip_eps: 0.2,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            loss_average: LossAverage::Token,
            ppo_epochs: 1,
            steps: 50,
            seed: 0,
            out: PathBuf::new(),
            memory_cap: None,
            micro_batch: None,
            checkpoint_every: 10,
            rollout_kv_policy: "full".into(),
            learner_kv: LearnerKv::Dense,
            learner_weights: LearnerWeights::Gguf,
            recompute: None,
            system_prompt: None,
            correction: Correction::None,
            rho: Thresholds::default(),
            numerics_correction: NumericsCorrection::None,
            numerics: NumericsThresholds::default(),
            advantages: Advantages::All,
            selection: Selection::Uniform,
            pass_rate_alpha: 0.5,
            replay_share: 0.0,
            replay_capacity: 32,
            rollout_endpoints: Vec::new(),
            rollout_timeout_secs: 600,
            rollout_api_key_file: None,
            stale_rollouts: crate::fleet::StaleRollouts::Correct,
            reward: crate::reward::Reward::Task,
            test_model: None,
        }
    }
}

impl TrainConfig {
    /// Reads a TOML file; unknown keys and ill-typed values are errors naming them.
    pub fn from_toml_file(path: &Path) -> Result<TrainConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TrainError::Config(format!("reading {}: {e}", path.display())))?;
        Self::from_toml_str(&text)
            .map_err(|e| TrainError::Config(format!("{}: {e}", path.display())))
    }

    /// Parses TOML text (see [`TrainConfig::from_toml_file`]).
    pub fn from_toml_str(text: &str) -> std::result::Result<TrainConfig, String> {
        toml::from_str(text).map_err(|e| e.message().to_string())
    }

    /// Checks every value that has a valid range, so a bad run fails before
    /// loading anything.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainError::Config(m));
        if self.out.as_os_str().is_empty() {
            return bad("`out` (--out DIR) is required".into());
        }
        if self.steps == 0 {
            return bad("steps must be at least 1".into());
        }
        if self.algorithm == Algorithm::Grpo && self.group_size < 2 {
            return bad(
                "group_size must be at least 2 for grpo (advantages are relative to the group)"
                    .into(),
            );
        }
        if self.prompts_per_step == 0 || self.max_new_tokens == 0 || self.ppo_epochs == 0 {
            return bad(
                "prompts_per_step, max_new_tokens and ppo_epochs must be at least 1".into(),
            );
        }
        if !(self.lr > 0.0 && self.lr < 1.0) {
            return bad(format!("lr {} must be in (0, 1)", self.lr));
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return bad("temperature must be positive (rollouts sample)".into());
        }
        if !(0.0..1.0).contains(&self.clip_eps) || self.kl_coef < 0.0 {
            return bad("clip_eps must be in [0, 1) and kl_coef >= 0".into());
        }
        if !self.full {
            if self.lora_rank == 0 {
                return bad("lora_rank must be at least 1".into());
            }
            LoraTarget::parse_list(&self.lora_targets).map_err(TrainError::Config)?;
        }
        if self.micro_batch == Some(0) || self.checkpoint_every == 0 {
            return bad("micro_batch and checkpoint_every must be at least 1".into());
        }
        self.memory_cap_bytes()?;
        if self.numerics_correction != NumericsCorrection::None
            && self.correction != Correction::None
        {
            return bad(format!(
                "correction {} and numerics_correction {} would both weigh the same ratio pi_old / pi_sampler: choose one",
                self.correction, self.numerics_correction
            ));
        }
        let n = &self.numerics;
        if !(n.clip_max >= 1.0 && n.clip_min.is_none_or(|m| (0.0..=1.0).contains(&m))) {
            return bad(
                "numerics thresholds need clip_max >= 1 and 0 <= clip_min <= 1 (a ratio of 1 is kept)"
                    .into(),
            );
        }
        if !(0.0..=1.0).contains(&self.replay_share) || !(0.0..=1.0).contains(&self.pass_rate_alpha)
        {
            return bad("replay_share and pass_rate_alpha must be in [0, 1]".into());
        }
        let r = &self.rho;
        if !(r.veto >= 0.0 && r.low <= 1.0 && r.high >= 1.0 && r.cap > 0.0) {
            return bad("rho thresholds need veto >= 0, low <= 1 <= high and cap > 0".into());
        }
        self.rollout_kv_policy
            .parse::<tern_runtime::kv::policy::KvPolicy>()
            .map_err(|e| TrainError::Config(format!("rollout_kv_policy: {e}")))?;
        if matches!(self.reward, crate::reward::Reward::GeneratedTests(_))
            && self.algorithm != Algorithm::Grpo
        {
            return bad("reward generated_tests:K scores rollouts: it needs algorithm grpo".into());
        }
        if self.test_model.is_some() && self.reward == crate::reward::Reward::Task {
            return bad(
                "test_model writes the tests of reward generated_tests:K: set that reward too"
                    .into(),
            );
        }
        if self.rollout_api_key_file.is_some() && self.rollout_endpoints.is_empty() {
            return bad(
                "rollout_api_key_file needs rollout_endpoints (the key is for the workers)".into(),
            );
        }
        if !self.rollout_endpoints.is_empty() {
            if self.full || self.algorithm != Algorithm::Grpo {
                return bad(
                    "rollout_endpoints need grpo with LoRA: workers receive each update as an adapter"
                        .into(),
                );
            }
            if self.learner_kv == LearnerKv::SparseReplay {
                return bad(
                    "learner_kv sparse-replay needs each rollout's eviction record, which remote workers do not return: use co-located rollouts"
                        .into(),
                );
            }
            if self.rollout_timeout_secs == 0 {
                return bad("rollout_timeout_secs must be at least 1".into());
            }
        }
        Ok(())
    }

    /// The cap in bytes, if one is set.
    pub fn memory_cap_bytes(&self) -> Result<Option<u64>> {
        self.memory_cap
            .as_deref()
            .map(|s| {
                tern_runtime::size::parse_size(s)
                    .map(|b| b as u64)
                    .map_err(|e| TrainError::Config(format!("memory_cap: {e}")))
            })
            .transpose()
    }

    /// The LoRA targets (empty under full fine-tuning).
    pub fn targets(&self) -> Vec<LoraTarget> {
        if self.full {
            Vec::new()
        } else {
            LoraTarget::parse_list(&self.lora_targets).unwrap_or_default()
        }
    }

    /// The learning rate at `step` (0-based) under the warm-up and schedule.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let t = (step - self.warmup_steps) as f64 / span;
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Linear => self.lr * (1.0 - t),
            Schedule::Cosine => self.lr * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_keys_parse_and_unknown_keys_are_named() {
        let c = TrainConfig::from_toml_str(
            "task = \"arithmetic:count=10\"\nalgorithm = \"sft\"\nsteps = 3\nout = \"/tmp/x\"\nmemory_cap = \"2GiB\"\n",
        )
        .unwrap();
        assert_eq!(c.algorithm, Algorithm::Sft);
        assert_eq!(c.steps, 3);
        assert_eq!(c.memory_cap_bytes().unwrap(), Some(2 << 30));
        c.validate().unwrap();
        let e = TrainConfig::from_toml_str("stepz = 3\n").unwrap_err();
        assert!(e.contains("stepz"), "{e}");
        let e = TrainConfig::from_toml_str("algorithm = \"ppo\"\n").unwrap_err();
        assert!(e.contains("ppo"), "{e}");
        let c = TrainConfig::from_toml_str(
            "numerics_correction = \"sequence_mask\"\nadvantages = \"kept\"\nkl_coef = 1e-4\nkl_estimator = \"low_var_kl\"\nloss_average = \"response\"\nppo_epochs = 2\n[numerics]\nclip_max = 2.0\nclip_min = 0.5\n",
        )
        .unwrap();
        assert_eq!(c.numerics_correction, NumericsCorrection::SequenceMask);
        assert_eq!(c.advantages, Advantages::Kept);
        assert_eq!((c.numerics.clip_max, c.numerics.clip_min), (2.0, Some(0.5)));
        assert_eq!((c.kl_coef, c.ppo_epochs), (1e-4, 2));
        assert_eq!(c.kl_estimator, KlEstimator::LowVarKl);
        assert_eq!(c.loss_average, LossAverage::Response);
        // Unset, the numerics bounds are TRL's defaults.
        let d = TrainConfig::default();
        assert_eq!(d.kl_estimator, KlEstimator::K3);
        assert_eq!(d.loss_average, LossAverage::Token);
        assert_eq!((d.numerics.clip_max, d.numerics.clip_min), (3.0, None));
        assert_eq!(d.advantages, Advantages::All);
    }

    #[test]
    fn flags_parse_the_toml_names() {
        assert_eq!("sparse-replay".parse(), Ok(LearnerKv::SparseReplay));
        assert_eq!("low_var_kl".parse(), Ok(KlEstimator::LowVarKl));
        assert_eq!("response".parse(), Ok(LossAverage::Response));
        assert_eq!("kept".parse(), Ok(Advantages::Kept));
        assert_eq!("f32".parse(), Ok(LearnerWeights::F32));
        assert_eq!(
            "K3".parse::<KlEstimator>(),
            Err("unknown KL estimator `K3` (k3 or low_var_kl)".to_string())
        );
    }

    #[test]
    fn bad_values_are_refused_before_work() {
        let ok = TrainConfig {
            out: "/tmp/x".into(),
            ..Default::default()
        };
        ok.validate().unwrap();
        for bad in [
            TrainConfig {
                out: PathBuf::new(),
                ..ok.clone()
            },
            TrainConfig {
                group_size: 1,
                ..ok.clone()
            },
            TrainConfig {
                lora_targets: "q,zz".into(),
                ..ok.clone()
            },
            TrainConfig {
                memory_cap: Some("lots".into()),
                ..ok.clone()
            },
            TrainConfig {
                rollout_kv_policy: "nope:1".into(),
                ..ok.clone()
            },
            TrainConfig {
                lr: 0.0,
                ..ok.clone()
            },
            TrainConfig {
                correction: Correction::Tis,
                numerics_correction: NumericsCorrection::TokenMask,
                ..ok.clone()
            },
            TrainConfig {
                numerics: NumericsThresholds {
                    clip_max: 0.9,
                    clip_min: None,
                },
                ..ok.clone()
            },
            TrainConfig {
                rollout_endpoints: vec!["http://127.0.0.1:1".into()],
                learner_kv: LearnerKv::SparseReplay,
                ..ok.clone()
            },
            TrainConfig {
                rollout_endpoints: vec!["http://127.0.0.1:1".into()],
                full: true,
                ..ok.clone()
            },
            TrainConfig {
                rollout_api_key_file: Some("key".into()),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        // Log-probabilities are recorded at the sampling temperature: a
        // correction at 0.8 is fine.
        let tempered = TrainConfig {
            numerics_correction: NumericsCorrection::TokenTruncate,
            temperature: 0.8,
            ..ok.clone()
        };
        assert!(tempered.validate().is_ok());
    }

    #[test]
    fn schedules_reach_their_ends() {
        let c = TrainConfig {
            steps: 10,
            warmup_steps: 2,
            schedule: Schedule::Cosine,
            lr: 1.0,
            ..Default::default()
        };
        assert!((c.lr_at(0) - 0.5).abs() < 1e-12);
        assert!((c.lr_at(2) - 1.0).abs() < 1e-12);
        assert!(c.lr_at(9) < 0.05);
    }
}
