//! `tern train`: fine-tune the served model on this machine (GRPO or SFT,
//! LoRA or full) under a hard memory cap, with a progress bar, per-step
//! metrics in `OUT/metrics.jsonl` and resumable checkpoints.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tern_runtime::size::format_size;
use tern_trainer::recorder::Progress;
use tern_trainer::TrainConfig;

use super::resolve;

/// `tern train`: every key of the TOML config is also a flag; flags win.
///
/// Example: `tern train --task arithmetic --algorithm grpo --steps 2 --memory-cap 2GiB --out runs/a`
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A TOML file of settings (keys as the flags below, with `_` for `-`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Continue the run whose output directory (or checkpoint) this is.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Every training setting, from the trainer's one table of them.
    #[command(flatten)]
    pub settings: TrainFlags,
}

tern_trainer::train_flags!();

/// The run's configuration: the file (or a resumed run's saved one), then flags.
fn config(a: &TrainArgs) -> Result<TrainConfig> {
    let mut c = match (&a.config, &a.resume) {
        (Some(p), _) => TrainConfig::from_toml_file(p)?,
        (None, Some(r)) => tern_trainer::checkpoint::load(r)?.state.config,
        (None, None) => TrainConfig::default(),
    };
    a.settings.apply_to(&mut c);
    if let Some(m) = &a.settings.test_model {
        // Resolved once, so the saved config names the file that ran.
        c.test_model = Some(resolve::model_path(m)?.display().to_string());
    }
    if let (Some(r), true) = (&a.resume, a.settings.out.is_none()) {
        // A resumed run writes where it was resumed from.
        if r.join("latest").exists() {
            c.out = r.clone();
        }
    }
    c.validate()?;
    Ok(c)
}

/// Runs the subcommand.
pub fn run(a: &TrainArgs) -> Result<()> {
    // The learner's many small element-wise ops run on candle's spinning
    // barrier pool; on 2 busy cores its waits cost more than the parallelism
    // gains (one GRPO step measured 30.5 s with 2 threads, 16.7 s with 1,
    // same loss to the last digit). Matmuls keep --threads through rayon.
    let pool = std::env::var("TERN_CANDLE_THREADS").unwrap_or_else(|_| "1".into());
    std::env::set_var("CANDLE_NUM_THREADS", pool);
    let cfg = config(a)?;
    let model_path = resolve::model_path(&cfg.model)?;
    let bar = ProgressBar::new(cfg.steps as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("valid template"),
    );
    let mut on_progress = |p: Progress<'_>| match p {
        Progress::Note(s) => eprintln!("{s}"),
        Progress::Start {
            from,
            steps,
            plan,
            params,
        } => {
            bar.set_position(from as u64);
            eprintln!(
                "training {params} parameters for {} steps; micro-batch {}, rollout KV {} ({} sequences at once){}",
                steps - from,
                plan.micro_batch,
                format_size(plan.rollout_kv_bytes),
                plan.rollout_at_once,
                plan.cap
                    .map(|c| format!(
                        ", cap {} (at answers of --max-new-tokens: learner peak estimate {}, recompute {}; the cap binds on {}; each step re-plans its micro-batch and recompute from its own lengths)",
                        format_size(c as usize),
                        format_size(plan.learner_peak as usize),
                        if plan.recompute { "on" } else { "off" },
                        plan.binds
                    ))
                    .unwrap_or_default()
            );
        }
        Progress::Step(m) => {
            bar.set_position(m.step as u64);
            let kept = m
                .kv_kept()
                .map(|k| format!(" kv kept {:.0}%", k * 100.0))
                .unwrap_or_default();
            bar.set_message(format!(
                "reward {:.3} loss {:.4} {:.0} tok/s peak {}{kept}",
                m.reward_mean,
                m.loss,
                m.tokens_per_s,
                format_size(m.peak_rss_bytes as usize)
            ));
        }
    };
    let summary = tern_trainer::train(&cfg, &model_path, a.resume.as_deref(), &mut on_progress)
        .context("training stopped")?;
    bar.finish();
    if cfg.dry_run {
        println!(
            "dry run: one step's rollouts, no update; peak memory {}",
            format_size(summary.peak_rss_bytes as usize)
        );
        println!("metrics: {}", cfg.out.join("metrics.jsonl").display());
        return Ok(());
    }
    println!(
        "done: {} steps, checkpoint {}, peak memory {}",
        summary.steps,
        summary.checkpoint.display(),
        format_size(summary.peak_rss_bytes as usize)
    );
    if let (Some(b), Some(after)) = (summary.eval.before, summary.eval.after) {
        println!(
            "held-out accuracy ({} tasks): {:.1}% before, {:.1}% after",
            summary.eval.tasks,
            100.0 * b,
            100.0 * after
        );
    }
    println!("metrics: {}", cfg.out.join("metrics.jsonl").display());
    let tests = cfg.out.join("tests.jsonl");
    if tests.exists() {
        println!("model-written tests and pass matrices: {}", tests.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tern_trainer::config::{Advantages, Algorithm, KlEstimator, LearnerKv, LearnerWeights};
    use tern_trainer::config::{LossAverage, Schedule};
    use tern_trainer::correction::{Correction, NumericsCorrection};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        train: TrainArgs,
    }

    /// The config of `tern train ARGS` (whitespace-separated).
    fn parsed(args: &str) -> Result<TrainConfig> {
        let cli = Cli::try_parse_from(std::iter::once("train").chain(args.split_whitespace()))?;
        config(&cli.train)
    }

    #[test]
    fn every_flag_sets_its_key() {
        let c = parsed(
            "--out /tmp/x -m some.gguf --task story --eval-task arithmetic:count=5 \
            --algorithm grpo --dry-run --sft-worked-only --lora-rank 4 --lora-alpha 8 \
            --lora-targets q,v --lr 0.001 --schedule cosine --warmup-steps 2 --weight-decay \
            0.01 --max-grad-norm 0.5 --group-size 4 --prompts-per-step 2 --max-new-tokens 16 \
            --temperature 0.9 --clip-eps 0.3 --kl-coef 0.0001 --kl-estimator low_var_kl \
            --loss-average response --ppo-epochs 2 --steps 3 --seed 7 --memory-cap 2GiB \
            --micro-batch 2 --checkpoint-every 1 --rollout-kv-policy \
            rkv:budget=50%,min_budget=64 --system-prompt Brief. --learner-kv sparse-replay \
            --learner-weights f32 --recompute true --correction sparse-rl --rho-veto 0.001 \
            --rho-low 0.4 --rho-high 1.6 --rho-cap 2 --sequence-level --advantages kept \
            --selection difficulty --pass-rate-alpha 0.25 --replay-share 0.5 \
            --replay-capacity 8 --stale-rollouts drop",
        )
        .unwrap();
        let mut want = TrainConfig {
            out: "/tmp/x".into(),
            model: "some.gguf".into(),
            task: "story".into(),
            eval_task: Some("arithmetic:count=5".into()),
            algorithm: Algorithm::Grpo,
            dry_run: true,
            sft_bare_answers: false,
            lora_rank: 4,
            lora_alpha: 8.0,
            lora_targets: "q,v".into(),
            lr: 0.001,
            schedule: Schedule::Cosine,
            warmup_steps: 2,
            weight_decay: 0.01,
            max_grad_norm: 0.5,
            group_size: 4,
            prompts_per_step: 2,
            max_new_tokens: 16,
            temperature: 0.9,
            clip_eps: 0.3,
            kl_coef: 0.0001,
            kl_estimator: KlEstimator::LowVarKl,
            loss_average: LossAverage::Response,
            ppo_epochs: 2,
            steps: 3,
            seed: 7,
            memory_cap: Some("2GiB".into()),
            micro_batch: Some(2),
            checkpoint_every: 1,
            rollout_kv_policy: "rkv:budget=50%,min_budget=64".into(),
            system_prompt: Some("Brief.".into()),
            learner_kv: LearnerKv::SparseReplay,
            learner_weights: LearnerWeights::F32,
            recompute: Some(true),
            correction: Correction::SparseRl,
            advantages: Advantages::Kept,
            selection: tern_trainer::data::Selection::Difficulty,
            pass_rate_alpha: 0.25,
            replay_share: 0.5,
            replay_capacity: 8,
            stale_rollouts: tern_trainer::fleet::StaleRollouts::Drop,
            ..TrainConfig::default()
        };
        want.rho.veto = 0.001;
        want.rho.low = 0.4;
        want.rho.high = 1.6;
        want.rho.cap = 2.0;
        want.rho.sequence_level = true;
        assert_eq!(c, want);

        let c = parsed(
            "--out /tmp/x --full --sft-bare-answers --numerics-correction token_mask \
            --numerics-clip-max 2 --numerics-clip-min 0.5 --rollout-endpoints \
            http://127.0.0.1:1,http://127.0.0.1:2 --rollout-timeout-secs 5",
        );
        // Fleets need LoRA: the flags reached the config and were checked.
        let e = c.unwrap_err().to_string();
        assert!(e.contains("rollout_endpoints need grpo with LoRA"), "{e}");
        let c = parsed(
            "--out /tmp/x --numerics-correction token_mask --numerics-clip-max 2 \
            --numerics-clip-min 0.5 --rollout-endpoints \
            http://127.0.0.1:1,http://127.0.0.1:2 --rollout-timeout-secs 5 \
            --rollout-api-key-file key.txt",
        )
        .unwrap();
        assert_eq!(c.numerics_correction, NumericsCorrection::TokenMask);
        assert_eq!((c.numerics.clip_max, c.numerics.clip_min), (2.0, Some(0.5)));
        assert_eq!(
            c.rollout_endpoints,
            ["http://127.0.0.1:1", "http://127.0.0.1:2"]
        );
        assert_eq!(c.rollout_timeout_secs, 5);
        assert_eq!(c.rollout_api_key_file, Some("key.txt".into()));
        assert!(c.sft_bare_answers && !c.full);
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("run.toml");
        std::fs::write(&file, "steps = 5\ngroup_size = 4\n[rho]\ncap = 3.0\n").unwrap();
        let file = file.to_str().unwrap();
        let c = parsed(&format!("--config {file} --out /tmp/x --steps 3")).unwrap();
        assert_eq!((c.steps, c.group_size, c.rho.cap), (3, 4, 3.0));
        assert_eq!(c.lora_rank, TrainConfig::default().lora_rank);
        // Switches only turn a setting on or off; absent, the file's stands.
        std::fs::write(
            dir.path().join("run.toml"),
            "sft_bare_answers = false\nfull = true\n",
        )
        .unwrap();
        let c = parsed(&format!("--config {file} --out /tmp/x")).unwrap();
        assert!(!c.sft_bare_answers && c.full);
        let e = parsed("--sft-bare-answers --sft-worked-only").unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
    }

    #[test]
    fn help_states_each_default_once_from_the_table() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        for stated in [
            "Registry name or GGUF path [default: smollm2-135m-instruct]",
            "LoRA rank [default: 8]",
            "Peak learning rate [default: 0.0002]",
            "constant, linear or cosine [default: constant]",
            "Drop a rollout if any token's pi_old/pi_sparse is below this [default: 0.0001]",
            "Hard cap on peak resident memory, e.g. 2GiB [default: unset]",
            "Train every block weight instead of LoRA adapters [default: false]",
            "(docs/REASONING.md) [default: true]",
            "keeps only correct syntheses [default: false]",
        ] {
            assert!(help.contains(stated), "{stated} not in\n{help}");
        }
    }
}
