//! A training run's configuration: a TOML file whose every key is also a
//! `tern train` flag (flags win), checked in full before any work starts.
//! Every setting is defined once, in [`settings`]; [`choices`] holds the
//! values its enums take, this module the reading and the checks.

pub mod choices;
pub mod flags;
pub mod settings;

use std::path::Path;

use tern_models::LoraTarget;

use crate::correction::{Correction, NumericsCorrection};
use crate::error::{Result, TrainError};

pub use choices::{
    Advantages, Algorithm, KlEstimator, LearnerKv, LearnerWeights, LossAverage, Schedule,
};
pub use settings::TrainConfig;

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
    use std::path::PathBuf;

    use super::*;
    use crate::correction::NumericsThresholds;
    use crate::data::Selection;

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
        assert_eq!("sft".parse(), Ok(Algorithm::Sft));
        assert_eq!("cosine".parse(), Ok(Schedule::Cosine));
        assert_eq!("difficulty".parse(), Ok(Selection::Difficulty));
        // The messages the CLI's own parsers gave before they were these.
        assert_eq!(
            "ppo".parse::<Algorithm>(),
            Err("unknown algorithm `ppo` (grpo or sft)".to_string())
        );
        assert_eq!(
            "step".parse::<Schedule>(),
            Err("unknown schedule `step` (constant, linear or cosine)".to_string())
        );
        assert_eq!(
            "hard".parse::<Selection>(),
            Err("unknown selection `hard` (uniform or difficulty)".to_string())
        );
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
