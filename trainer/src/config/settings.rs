//! Every training setting, defined once: its name (the TOML key, and the
//! `tern train` flag with `-` for `_`), type, default and doc (the flag's
//! help). From this table come [`TrainConfig`] with its `Default` and its
//! TOML reading, and the binary's flags ([`crate::train_flags!`]) with each
//! default stated in their help.
//!
//! An entry is `name: Type = default`, optionally `, [clap attributes]` for
//! its flag, or `, flags { ... }` listing the flags that set it (a nested
//! section's keys, a switch and its negation) in place of its own.
//! Cross-field checks live in [`TrainConfig::validate`].

/// Hands the settings table to a generator: `__train_config` (the struct)
/// or `__train_flags` (the flags). Paths in it are absolute (`$crate::...`),
/// as the flags are expanded in the binary.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_train_settings {
    ($generate:ident) => {
        $crate::$generate! {
            /// Registry name or GGUF path.
            model: String = "smollm2-135m-instruct".into(), [short = 'm'];
            /// Training tasks: `arithmetic[:count=N,seed=S,difficulty=D,ops=add+sub+mul+word]`,
            /// `story[:count=N,seed=S,steps=2+3,cot=0]` (multi-step word problems),
            /// `spreadsheet[:count=N,seed=S]` (workbook tasks, rewarded by the share of
            /// test-case workbooks a rollout's program solves; GRPO only) or a JSONL file.
            task: String = "arithmetic".into();
            /// Held-out tasks scored greedily before and after training.
            eval_task: Option<String> = None;
            /// `grpo` (rollouts + verified rewards) or `sft` (reference answers).
            algorithm: $crate::config::choices::Algorithm = $crate::config::choices::Algorithm::Grpo;
            /// Train every block weight instead of LoRA adapters.
            full: bool = false;
            // No update, no checkpoint, no evaluation: sizes a run cheaply.
            /// Plan memory, run one step's rollouts, write their metrics, and stop
            /// (no update): how many rollouts decode at once under the cap, how fast.
            dry_run: bool = false;
            /// SFT on synthesis data (some tasks with a worked `target`): also
            /// train the tasks without one on the bare "The answer is X." line;
            /// off, only the worked targets.
            sft_bare_answers: bool = true, flags {
                /// SFT on synthesis data (some tasks with a worked `target`): train the
                /// tasks without one on "The answer is X." too. The default: on 300
                /// held-out stories this synthesizer beat the worked-only one 39 to 17
                /// (docs/REASONING.md).
                sft_bare_answers: bool => sft_bare_answers = true,
                    [conflicts_with = "sft_worked_only"];
                /// SFT on synthesis data: train only the tasks with a worked `target`,
                /// as the CoT-based Synthesizer paper keeps only correct syntheses.
                sft_worked_only: bool => sft_bare_answers = false;
            };
            /// LoRA rank.
            lora_rank: usize = 8;
            /// LoRA alpha; updates are scaled by alpha / rank.
            lora_alpha: f64 = 16.0;
            /// Projections with adapters: q,k,v,o,gate,up,down or all.
            lora_targets: String = "all".into();
            /// Peak learning rate.
            lr: f64 = 2e-4;
            /// constant, linear or cosine.
            schedule: $crate::config::choices::Schedule = $crate::config::choices::Schedule::Constant;
            /// Linear warm-up steps.
            warmup_steps: usize = 0;
            /// AdamW weight decay.
            weight_decay: f64 = 0.0;
            /// Gradient-norm clip, 0 to disable.
            max_grad_norm: f64 = 1.0;
            /// Rollouts per prompt, G.
            group_size: usize = 8;
            /// Prompts per step.
            prompts_per_step: usize = 4;
            /// Most new tokens per rollout.
            max_new_tokens: usize = 48;
            /// Rollout temperature.
            temperature: f32 = 1.0;
            /// PPO clip epsilon.
            clip_eps: f64 = 0.2;
            // The k3 penalty to the reference (base) model; 0, as every
            // recorded run used. LoRA only: full fine-tuning keeps no
            // reference copy.
            /// KL-to-base coefficient, 0 to skip; Sparse-RL's paper uses 1e-4.
            kl_coef: f64 = 0.0;
            /// The KL penalty's per-token estimator: `k3` (unbounded) or
            /// `low_var_kl` (k3 clamped to 10, no gradient past it: slime's and verl's,
            /// the Sparse-RL paper's scripts).
            kl_estimator: $crate::config::choices::KlEstimator = $crate::config::choices::KlEstimator::K3;
            /// What the loss averages over: `token` (all the batch's counted tokens:
            /// a long response weighs more) or `response` (each response's tokens,
            /// then the responses: slime's default, the Sparse-RL paper's runs).
            loss_average: $crate::config::choices::LossAverage = $crate::config::choices::LossAverage::Token;
            /// Optimizer updates on each step's batch with pi_old fixed; from the
            /// second on the ratio moves and the clip acts.
            ppo_epochs: usize = 1;
            /// Optimiser steps.
            steps: usize = 50;
            /// Seed of every random choice.
            seed: u64 = 0;
            // Required: `validate` refuses an empty one.
            /// Output directory: checkpoints, metrics.jsonl, eval.json.
            out: ::std::path::PathBuf = ::std::path::PathBuf::new();
            /// Hard cap on peak resident memory, e.g. 2GiB.
            ///
            /// The trainer plans each step under it and checks the measured peak
            /// after every phase. It reports the run's whole peak (the log's "peak
            /// memory", `peak_rss_bytes` in metrics.jsonl); to measure each phase on
            /// its own it resets the kernel's high-water mark, so an outside
            /// `/usr/bin/time -v` shows only the last phase's.
            memory_cap: Option<String> = None;
            /// Sequences per learner micro-batch; unset, the largest the cap allows.
            micro_batch: Option<usize> = None;
            // The last step always writes one.
            /// Checkpoint every N steps.
            checkpoint_every: usize = 10;
            /// KV policy of the rollouts, as `tern serve --kv-policy` takes it;
            /// `rkv:budget=50%,min_budget=64` keeps half of each rollout's tokens
            /// however long its answers grow. Each step's `kv_attended /
            /// kv_attended_full` in metrics.jsonl is the share of the KV its rollouts
            /// really attended over.
            rollout_kv_policy: String = "full".into();
            /// A system message before every task.
            system_prompt: Option<String> = None;
            /// Learner attention: dense, or sparse-replay (each token scored under the
            /// visibility the rollout's KV policy gave it when it was sampled).
            learner_kv: $crate::config::choices::LearnerKv = $crate::config::choices::LearnerKv::Dense;
            /// The LoRA learner's frozen base: gguf (the sampler's own quantized
            /// kernels, one copy of the weights) or f32 (dequantized).
            learner_weights: $crate::config::choices::LearnerWeights =
                $crate::config::choices::LearnerWeights::Gguf;
            /// Recompute each block in the backward pass (true) or keep its
            /// activations (false); unset, recompute when the memory cap needs it.
            recompute: Option<bool> = None;
            /// Correction of sparse rollouts: none, tis or sparse-rl (the
            /// sampler's log-probabilities are recorded at the sampling temperature,
            /// as the learner scores them).
            correction: $crate::correction::Correction = $crate::correction::Correction::None;
            /// Correction thresholds (veto, rejection band, truncation cap, level);
            /// the TOML keys `rho.veto` ... `rho.sequence_level`.
            rho: $crate::correction::Thresholds = $crate::correction::Thresholds::default(), flags {
                /// Drop a rollout if any token's pi_old/pi_sparse is below this.
                rho_veto: f64 => rho.veto;
                /// Mask tokens whose ratio is below this.
                rho_low: f64 => rho.low;
                /// Mask tokens whose ratio is above this.
                rho_high: f64 => rho.high;
                /// Truncate importance weights at this.
                rho_cap: f64 => rho.cap;
                /// One ratio per rollout (geometric mean) instead of per token.
                sequence_level: bool => rho.sequence_level = true;
            };
            // It weighs the same ratio as `correction`, so at most one of the
            // two is on: the dense arms use this one, the sparse arms
            // `correction`.
            /// Correction of the sampler/learner numerics mismatch, TRL's modes:
            /// none, token_truncate, token_mask, sequence_truncate or sequence_mask
            /// (not with --correction).
            numerics_correction: $crate::correction::NumericsCorrection =
                $crate::correction::NumericsCorrection::None;
            /// The numerics correction's bounds (TRL's `clip_max` 3.0, `clip_min`
            /// unset); the TOML keys `numerics.clip_max` and `numerics.clip_min`.
            numerics: $crate::correction::NumericsThresholds =
                $crate::correction::NumericsThresholds::default(), flags {
                /// Upper bound of the numerics ratio: truncated to it or masked above it.
                numerics_clip_max: f64 => numerics.clip_max;
                /// Lower bound of the numerics ratio: truncated to it or masked below it.
                numerics_clip_min: Option<f64> => numerics.clip_min;
            };
            /// Group advantages over all rollouts, or over those the correction kept.
            advantages: $crate::config::choices::Advantages = $crate::config::choices::Advantages::All;
            /// Prompt selection: uniform, or difficulty (pass rates near 1/2).
            selection: $crate::data::Selection = $crate::data::Selection::Uniform;
            /// Weight of a new observation in a task's pass-rate EMA.
            pass_rate_alpha: f64 = 0.5;
            /// Share of each step's groups replayed from recent steps.
            replay_share: f64 = 0.0;
            /// Groups the replay buffer keeps.
            replay_capacity: usize = 32;
            /// Roll out on these OpenAI-compatible servers instead of in this
            /// process (comma-separated URLs, e.g. http://127.0.0.1:8081,http://127.0.0.1:8082):
            /// `tern serve --lora-dir DIR` workers, whose DIR holds this run's --out
            /// (each update is published as an adapter there and loaded by path), or
            /// any server that returns completion log-probabilities as token ids
            /// (vLLM with runtime LoRA updating; dense policy only). Groups go to the
            /// least-loaded worker; a failed worker's groups are retried on another
            /// (docs/SCALING.md).
            rollout_endpoints: Vec<String> = Vec::new(),
                [value_delimiter = ',', value_name = "URL,..."];
            /// Seconds a worker may take over one group before it is taken out and
            /// the group retried elsewhere.
            rollout_timeout_secs: u64 = 600, [value_name = "SECS"];
            // The path, not the key, is what configs and checkpoints hold.
            /// Read the rollout workers' API key from FILE (first line, trimmed) and
            /// send it as `Authorization: Bearer KEY` on every request to them: the
            /// key the workers were started with (`tern serve --api-key-file`).
            /// Workers reached over the network need one; give them `https://`
            /// URLs (TLS) so it does not travel in the clear.
            rollout_api_key_file: Option<::std::path::PathBuf> = None, [value_name = "FILE"];
            /// A group sampled under an older adapter than the learner's: `correct`
            /// (importance-weighted against pi_old like any sampler mismatch) or
            /// `drop`.
            stale_rollouts: $crate::fleet::StaleRollouts = $crate::fleet::StaleRollouts::Correct;
            /// Where rewards come from: `task` (the answer, or the task's own tests)
            /// or `generated_tests:K` (code tasks without hidden tests: per group a
            /// model writes K unit tests for the problem and each rollout earns the
            /// share of them its program passes; grpo only).
            reward: $crate::reward::Reward = $crate::reward::Reward::Task;
            /// The model that writes the tests of `--reward generated_tests:K` (path
            /// or registry name), run as its own engine; unset, the policy as it trains.
            test_model: Option<String> = None;
        }
    };
}

/// Defines [`TrainConfig`] and its `Default` from the settings table.
#[doc(hidden)]
#[macro_export]
macro_rules! __train_config {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident : $ty:ty = $default:expr
        $(, [$($attr:tt)*])?
        $(, flags { $($flags:tt)* })?;
    )*) => {
        /// Every setting of a run. Field names are the TOML keys and the flag
        /// names (`group_size` = `--group-size`); unknown keys are refused.
        #[derive(Clone, Debug, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct TrainConfig {
            $(
                $(#[doc = $doc])*
                pub $name: $ty,
            )*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                TrainConfig {
                    $($name: $default,)*
                }
            }
        }
    };
}

__with_train_settings!(__train_config);
