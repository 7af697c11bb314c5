//! `tern train`: fine-tune the served model on this machine (GRPO or SFT,
//! LoRA or full) under a hard memory cap, with a progress bar, per-step
//! metrics in `OUT/metrics.jsonl` and resumable checkpoints.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tern_runtime::size::format_size;
use tern_trainer::config::{Algorithm, Schedule};
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
    /// Registry name or GGUF path [config default: smollm2-135m-instruct].
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Training tasks: `arithmetic[:count=N,seed=S,difficulty=D,ops=add+sub+mul+word]`,
    /// `story[:count=N,seed=S,steps=2+3,cot=0]` (multi-step word problems),
    /// `spreadsheet[:count=N,seed=S]` (workbook tasks, rewarded by the share of
    /// test-case workbooks a rollout's program solves; GRPO only) or a JSONL file.
    #[arg(long)]
    pub task: Option<String>,
    /// Held-out tasks scored greedily before and after training.
    #[arg(long)]
    pub eval_task: Option<String>,
    /// `grpo` (rollouts + verified rewards) or `sft` (reference answers).
    #[arg(long, value_parser = parse_algorithm)]
    pub algorithm: Option<Algorithm>,
    /// Train every block weight instead of LoRA adapters.
    #[arg(long)]
    pub full: bool,
    /// Plan memory, run one step's rollouts, write their metrics, and stop
    /// (no update): how many rollouts decode at once under the cap, how fast.
    #[arg(long)]
    pub dry_run: bool,
    /// SFT on synthesis data (some tasks with a worked `target`): train the
    /// tasks without one on "The answer is X." too. The default: on 300
    /// held-out stories this synthesizer beat the worked-only one 39 to 17
    /// (docs/REASONING.md).
    #[arg(long, conflicts_with = "sft_worked_only")]
    pub sft_bare_answers: bool,
    /// SFT on synthesis data: train only the tasks with a worked `target`,
    /// as the CoT-based Synthesizer paper keeps only correct syntheses.
    #[arg(long)]
    pub sft_worked_only: bool,
    /// LoRA rank [8].
    #[arg(long)]
    pub lora_rank: Option<usize>,
    /// LoRA alpha; updates are scaled by alpha / rank [16].
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// Projections with adapters: q,k,v,o,gate,up,down or all [all].
    #[arg(long)]
    pub lora_targets: Option<String>,
    /// Peak learning rate [2e-4].
    #[arg(long)]
    pub lr: Option<f64>,
    /// constant, linear or cosine [constant].
    #[arg(long, value_parser = parse_schedule)]
    pub schedule: Option<Schedule>,
    /// Linear warm-up steps [0].
    #[arg(long)]
    pub warmup_steps: Option<usize>,
    /// AdamW weight decay [0].
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Gradient-norm clip, 0 to disable [1.0].
    #[arg(long)]
    pub max_grad_norm: Option<f64>,
    /// Rollouts per prompt, G [8].
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Prompts per step [4].
    #[arg(long)]
    pub prompts_per_step: Option<usize>,
    /// Most new tokens per rollout [48].
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Rollout temperature [1.0].
    #[arg(long)]
    pub temperature: Option<f32>,
    /// PPO clip epsilon [0.2].
    #[arg(long)]
    pub clip_eps: Option<f64>,
    /// KL-to-base coefficient, 0 to skip [0]; Sparse-RL's paper uses 1e-4.
    #[arg(long)]
    pub kl_coef: Option<f64>,
    /// The KL penalty's per-token estimator: `k3` (unbounded) or
    /// `low_var_kl` (k3 clamped to 10, no gradient past it: slime's and verl's,
    /// the Sparse-RL paper's scripts) [k3].
    #[arg(long)]
    pub kl_estimator: Option<tern_trainer::config::KlEstimator>,
    /// What the loss averages over: `token` (all the batch's counted tokens:
    /// a long response weighs more) or `response` (each response's tokens,
    /// then the responses: slime's default, the Sparse-RL paper's runs) [token].
    #[arg(long)]
    pub loss_average: Option<tern_trainer::config::LossAverage>,
    /// Optimizer updates on each step's batch with pi_old fixed; from the
    /// second on the ratio moves and the clip acts [1].
    #[arg(long)]
    pub ppo_epochs: Option<usize>,
    /// Optimiser steps [50].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Seed of every random choice [0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory: checkpoints, metrics.jsonl, eval.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Hard cap on peak resident memory, e.g. 2GiB.
    ///
    /// The trainer plans each step under it and checks the measured peak
    /// after every phase. It reports the run's whole peak (the log's "peak
    /// memory", `peak_rss_bytes` in metrics.jsonl); to measure each phase on
    /// its own it resets the kernel's high-water mark, so an outside
    /// `/usr/bin/time -v` shows only the last phase's.
    #[arg(long)]
    pub memory_cap: Option<String>,
    /// Sequences per learner micro-batch [the largest the cap allows].
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Checkpoint every N steps [10].
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// KV policy of the rollouts, as `tern serve --kv-policy` takes it [full];
    /// `rkv:budget=50%,min_budget=64` keeps half of each rollout's tokens
    /// however long its answers grow. Each step's `kv_attended /
    /// kv_attended_full` in metrics.jsonl is the share of the KV its rollouts
    /// really attended over.
    #[arg(long)]
    pub rollout_kv_policy: Option<String>,
    /// A system message before every task.
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Learner attention: dense, or sparse-replay (each token scored under the
    /// visibility the rollout's KV policy gave it when it was sampled) [dense].
    #[arg(long)]
    pub learner_kv: Option<tern_trainer::config::LearnerKv>,
    /// The LoRA learner's frozen base: gguf (the sampler's own quantized
    /// kernels, one copy of the weights) or f32 (dequantized) [gguf].
    #[arg(long)]
    pub learner_weights: Option<tern_trainer::config::LearnerWeights>,
    /// Recompute each block in the backward pass (true) or keep its
    /// activations (false) [unset: recompute when the memory cap needs it].
    #[arg(long)]
    pub recompute: Option<bool>,
    /// Correction of sparse rollouts: none, tis or sparse-rl [none] (the
    /// sampler's log-probabilities are recorded at the sampling temperature,
    /// as the learner scores them).
    #[arg(long)]
    pub correction: Option<tern_trainer::correction::Correction>,
    /// Drop a rollout if any token's pi_old/pi_sparse is below this [1e-4].
    #[arg(long)]
    pub rho_veto: Option<f64>,
    /// Mask tokens whose ratio is below this [0.5].
    #[arg(long)]
    pub rho_low: Option<f64>,
    /// Mask tokens whose ratio is above this [1.5].
    #[arg(long)]
    pub rho_high: Option<f64>,
    /// Truncate importance weights at this [1.5].
    #[arg(long)]
    pub rho_cap: Option<f64>,
    /// One ratio per rollout (geometric mean) instead of per token.
    #[arg(long)]
    pub sequence_level: bool,
    /// Correction of the sampler/learner numerics mismatch, TRL's modes:
    /// none, token_truncate, token_mask, sequence_truncate or sequence_mask
    /// [none] (not with --correction).
    #[arg(long)]
    pub numerics_correction: Option<tern_trainer::correction::NumericsCorrection>,
    /// Upper bound of the numerics ratio: truncated to it or masked above it [3.0].
    #[arg(long)]
    pub numerics_clip_max: Option<f64>,
    /// Lower bound of the numerics ratio: truncated to it or masked below it [unset].
    #[arg(long)]
    pub numerics_clip_min: Option<f64>,
    /// Group advantages over all rollouts, or over those the correction kept [all].
    #[arg(long)]
    pub advantages: Option<tern_trainer::config::Advantages>,
    /// Prompt selection: uniform, or difficulty (pass rates near 1/2) [uniform].
    #[arg(long, value_parser = parse_selection)]
    pub selection: Option<tern_trainer::data::Selection>,
    /// Weight of a new observation in a task's pass-rate EMA [0.5].
    #[arg(long)]
    pub pass_rate_alpha: Option<f64>,
    /// Share of each step's groups replayed from recent steps [0].
    #[arg(long)]
    pub replay_share: Option<f64>,
    /// Groups the replay buffer keeps [32].
    #[arg(long)]
    pub replay_capacity: Option<usize>,
    /// Roll out on these OpenAI-compatible servers instead of in this
    /// process (comma-separated URLs, e.g. http://127.0.0.1:8081,http://127.0.0.1:8082):
    /// `tern serve --lora-dir DIR` workers, whose DIR holds this run's --out
    /// (each update is published as an adapter there and loaded by path), or
    /// any server that returns completion log-probabilities as token ids
    /// (vLLM with runtime LoRA updating; dense policy only). Groups go to the
    /// least-loaded worker; a failed worker's groups are retried on another
    /// (docs/SCALING.md).
    #[arg(long, value_delimiter = ',', value_name = "URL,...")]
    pub rollout_endpoints: Option<Vec<String>>,
    /// Seconds a worker may take over one group before it is taken out and
    /// the group retried elsewhere [600].
    #[arg(long, value_name = "SECS")]
    pub rollout_timeout_secs: Option<u64>,
    /// Read the rollout workers' API key from FILE (first line, trimmed) and
    /// send it as `Authorization: Bearer KEY` on every request to them: the
    /// key the workers were started with (`tern serve --api-key-file`).
    /// Workers reached over the network need one; give them `https://`
    /// URLs (TLS) so it does not travel in the clear.
    #[arg(long, value_name = "FILE")]
    pub rollout_api_key_file: Option<PathBuf>,
    /// A group sampled under an older adapter than the learner's: `correct`
    /// (importance-weighted against pi_old like any sampler mismatch) or
    /// `drop` [correct].
    #[arg(long)]
    pub stale_rollouts: Option<tern_trainer::fleet::StaleRollouts>,
    /// Where rewards come from: `task` (the answer, or the task's own tests)
    /// or `generated_tests:K` (code tasks without hidden tests: per group a
    /// model writes K unit tests for the problem and each rollout earns the
    /// share of them its program passes; grpo only) [task].
    #[arg(long)]
    pub reward: Option<tern_trainer::reward::Reward>,
    /// The model that writes the tests of `--reward generated_tests:K` (path
    /// or registry name), run as its own engine [the policy as it trains].
    #[arg(long)]
    pub test_model: Option<String>,
}

fn parse_selection(s: &str) -> Result<tern_trainer::data::Selection, String> {
    match s {
        "uniform" => Ok(tern_trainer::data::Selection::Uniform),
        "difficulty" => Ok(tern_trainer::data::Selection::Difficulty),
        o => Err(format!("unknown selection `{o}` (uniform or difficulty)")),
    }
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    match s {
        "grpo" => Ok(Algorithm::Grpo),
        "sft" => Ok(Algorithm::Sft),
        o => Err(format!("unknown algorithm `{o}` (grpo or sft)")),
    }
}

fn parse_schedule(s: &str) -> Result<Schedule, String> {
    match s {
        "constant" => Ok(Schedule::Constant),
        "linear" => Ok(Schedule::Linear),
        "cosine" => Ok(Schedule::Cosine),
        o => Err(format!(
            "unknown schedule `{o}` (constant, linear or cosine)"
        )),
    }
}

/// The run's configuration: the file (or a resumed run's saved one), then flags.
fn config(a: &TrainArgs) -> Result<TrainConfig> {
    let mut c = match (&a.config, &a.resume) {
        (Some(p), _) => TrainConfig::from_toml_file(p)?,
        (None, Some(r)) => tern_trainer::checkpoint::load(r)?.state.config,
        (None, None) => TrainConfig::default(),
    };
    macro_rules! set {
        ($($f:ident),*) => { $( if let Some(v) = a.$f.clone() { c.$f = v; } )* };
    }
    set!(
        model,
        task,
        algorithm,
        lora_rank,
        lora_alpha,
        lora_targets,
        lr,
        schedule,
        warmup_steps,
        weight_decay,
        max_grad_norm,
        group_size,
        prompts_per_step,
        max_new_tokens,
        temperature,
        clip_eps,
        kl_coef,
        ppo_epochs,
        steps,
        seed,
        out,
        checkpoint_every,
        rollout_kv_policy,
        selection,
        pass_rate_alpha,
        replay_share,
        replay_capacity,
        rollout_endpoints,
        rollout_timeout_secs,
        stale_rollouts,
        reward
    );
    if let Some(m) = &a.test_model {
        // Resolved once, so the saved config names the file that ran.
        c.test_model = Some(resolve::model_path(m)?.display().to_string());
    }
    if a.rollout_api_key_file.is_some() {
        c.rollout_api_key_file = a.rollout_api_key_file.clone();
    }
    if a.eval_task.is_some() {
        c.eval_task = a.eval_task.clone();
    }
    if a.memory_cap.is_some() {
        c.memory_cap = a.memory_cap.clone();
    }
    if a.micro_batch.is_some() {
        c.micro_batch = a.micro_batch;
    }
    if a.system_prompt.is_some() {
        c.system_prompt = a.system_prompt.clone();
    }
    if a.full {
        c.full = true;
    }
    if a.dry_run {
        c.dry_run = true;
    }
    if a.sft_bare_answers {
        c.sft_bare_answers = true;
    }
    if a.sft_worked_only {
        c.sft_bare_answers = false;
    }
    if let Some(k) = a.correction {
        c.correction = k;
    }
    if let Some(k) = a.learner_kv {
        c.learner_kv = k;
    }
    if let Some(w) = a.learner_weights {
        c.learner_weights = w;
    }
    if a.recompute.is_some() {
        c.recompute = a.recompute;
    }
    macro_rules! rho {
        ($($f:ident => $k:ident),*) => { $( if let Some(v) = a.$f { c.rho.$k = v; } )* };
    }
    rho!(rho_veto => veto, rho_low => low, rho_high => high, rho_cap => cap);
    if a.sequence_level {
        c.rho.sequence_level = true;
    }
    if let Some(k) = a.numerics_correction {
        c.numerics_correction = k;
    }
    if let Some(v) = a.numerics_clip_max {
        c.numerics.clip_max = v;
    }
    if a.numerics_clip_min.is_some() {
        c.numerics.clip_min = a.numerics_clip_min;
    }
    if let Some(k) = a.kl_estimator {
        c.kl_estimator = k;
    }
    if let Some(k) = a.loss_average {
        c.loss_average = k;
    }
    if let Some(k) = a.advantages {
        c.advantages = k;
    }
    if let (Some(r), true) = (&a.resume, a.out.is_none()) {
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
    Ok(())
}
