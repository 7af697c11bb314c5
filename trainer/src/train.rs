//! The training loop: per step, roll out through the engine, score rewards,
//! re-score teacher-forced under the pre-update weights, update, hand the engine
//! the new adapters; metrics to `metrics.jsonl`, checkpoints as configured.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tern_models::GgufFile;
use tern_runtime::engine::DEFAULT_PREFILL_CHUNK;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::SeqCache;
use tern_runtime::tasks::{self, Task};
use tern_runtime::LoadedModel;

use crate::checkpoint::{self, Checkpoint, State};
use crate::config::{Algorithm, LearnerKv, TrainConfig};
use crate::correction::{self, Correction};
use crate::data::{self, DataState, ReplayBuffer, Replayed};
use crate::error::{Result, TrainError};
use crate::grpo;
use crate::learner::{Learner, Sample};
use crate::memory::{self, Estimate, Plan};
use crate::optim::{clip_grad_norm, AdamW};
use crate::rollout::{self, RolloutSpec};

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

/// What the caller hears while a run goes on.
pub enum Progress<'a> {
    /// The run is about to take its first step.
    Start {
        /// First step to run (non-zero when resumed).
        from: usize,
        /// Total steps.
        steps: usize,
        /// The memory plan.
        plan: &'a Plan,
        /// Trainable scalars.
        params: usize,
    },
    /// A step finished.
    Step(&'a StepMetrics),
    /// A status line (loading, evaluating, checkpointing).
    Note(String),
}

/// Held-out accuracy before and after, in `eval.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EvalReport {
    /// Tasks scored.
    pub tasks: usize,
    /// Share of tasks greedy decoding solves (right answer; for code, every
    /// test passes) with the weights the run started from.
    pub before: Option<f64>,
    /// The same after the last step.
    pub after: Option<f64>,
}

/// How a run ended.
pub struct Summary {
    /// Steps completed in total.
    pub steps: usize,
    /// Directory of the last checkpoint.
    pub checkpoint: PathBuf,
    /// Held-out accuracy, if an eval task was set.
    pub eval: EvalReport,
    /// Peak resident memory measured.
    pub peak_rss_bytes: u64,
}

/// Checks `dir` can be created and written before anything is loaded.
fn prepare_out(dir: &Path) -> Result<()> {
    let fail = |reason: String| TrainError::OutDir {
        path: dir.display().to_string(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    let probe = dir.join(".write-test");
    std::fs::write(&probe, b"ok").map_err(|e| fail(format!("not writable ({e})")))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Share of `tasks` the engine's current weights solve greedily (see
/// [`rollout::solved`]).
fn evaluate(engine: &EngineHandle, cfg: &TrainConfig, tasks: &[Task]) -> Result<f64> {
    let picks: Vec<usize> = (0..tasks.len()).collect();
    let policy = KvPolicy::Full;
    let mut correct = 0.0;
    for chunk in picks.chunks(16) {
        let spec = RolloutSpec {
            group_size: 1,
            max_new_tokens: cfg.max_new_tokens,
            temperature: 1e-6,
            kv_policy: &policy,
            system: cfg.system_prompt.as_deref(),
            record_evictions: false,
        };
        let (groups, _) = rollout::rollout(engine, tasks, chunk, &spec, cfg.seed)?;
        for g in &groups {
            if rollout::solved(&g.rollouts[0].text, &tasks[g.task])? {
                correct += 1.0;
            }
        }
    }
    Ok(correct / tasks.len() as f64)
}

/// Runs (or resumes) a training run; `model_path` is the resolved GGUF.
pub fn train(
    cfg: &TrainConfig,
    model_path: &Path,
    resume: Option<&Path>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Summary> {
    cfg.validate()?;
    let resumed = resume.map(checkpoint::load).transpose()?;
    let train_tasks = tasks::load(&cfg.task)?;
    let eval_tasks = cfg.eval_task.as_deref().map(tasks::load).transpose()?;
    // SFT writes "The answer is X" for a task: code tasks have no such line.
    if cfg.algorithm == Algorithm::Sft && train_tasks.iter().any(|t| t.is_code()) {
        return Err(TrainError::Config(
            "sft needs answer tasks: code tasks (graded by tests) train with grpo".into(),
        ));
    }
    prepare_out(&cfg.out)?;
    let kv_policy: KvPolicy = cfg
        .rollout_kv_policy
        .parse()
        .map_err(|e| TrainError::Config(format!("rollout_kv_policy: {e}")))?;
    let cap = cfg.memory_cap_bytes()?;
    // The sparse-replay learner needs each rollout's eviction record; under a
    // full cache there is nothing to replay and it is the dense learner.
    let replay_kv = cfg.learner_kv == LearnerKv::SparseReplay && kv_policy != KvPolicy::Full;

    // Plan before loading anything big.
    let gguf = GgufFile::open(model_path)?;
    let mcfg = tern_models::ModelConfig::from_gguf(&gguf)?;
    drop(gguf);
    let gguf_bytes = std::fs::metadata(model_path)?.len();
    let targets = cfg.targets();
    let trainable: u64 = if cfg.full {
        let e = Estimate::new(&mcfg, 0, 0);
        (e.learner_weights / 4).saturating_sub((mcfg.vocab_size * mcfg.n_embd) as u64)
    } else {
        let per_layer: usize = targets
            .iter()
            .map(|&t| {
                let (o, i) = t.shape(&mcfg);
                cfg.lora_rank * (o + i)
            })
            .sum();
        (per_layer * mcfg.n_layer) as u64
    };
    let est = Estimate::new(&mcfg, gguf_bytes, trainable);
    if let Some(c) = cap {
        // Refuse a cap that cannot even hold the weights before loading them.
        memory::plan(&mcfg, &est, Some(c), 1, 1, Some(1), 0)?;
    }

    progress(Progress::Note("loading the rollout model".into()));
    let serving = Arc::new(LoadedModel::load(model_path)?);
    // The longest sequence the learner can see: the longest prompt plus the
    // response cap (SFT: the reference answer).
    let mut longest_prompt = 0;
    for t in &train_tasks {
        let ids = rollout::prompt_ids(&serving, cfg.system_prompt.as_deref(), t)?;
        longest_prompt = longest_prompt.max(ids.len());
    }
    let seq_len = longest_prompt + cfg.max_new_tokens;
    let batch_seqs = match cfg.algorithm {
        Algorithm::Grpo => cfg.prompts_per_step * cfg.group_size,
        Algorithm::Sft => cfg.prompts_per_step,
    };
    // What the rollout batch needs at once under the rollout policy: the
    // engine reserves each sequence's worst case, so a sparse policy fits
    // more sequences in the same memory.
    let per_seq = SeqCache::reservation_bytes(
        &mcfg,
        &kv_policy,
        longest_prompt,
        cfg.max_new_tokens,
        DEFAULT_PREFILL_CHUNK,
    )
    .max(1);
    let mut plan = memory::plan(
        &mcfg,
        &est,
        cap,
        seq_len,
        batch_seqs,
        cfg.micro_batch,
        batch_seqs * per_seq,
    )?;
    plan.rollout_at_once = (plan.rollout_kv_bytes / per_seq).min(batch_seqs);
    // A group is one engine request: it must fit whole.
    if plan.rollout_at_once < cfg.group_size.max(1) && cfg.algorithm == Algorithm::Grpo {
        return Err(TrainError::MemoryCap {
            cap: cap.map(|c| tern_runtime::size::format_size(c as usize)).unwrap_or_default(),
            phase: "rollout KV cache (one group at once)",
            needed: tern_runtime::size::format_size(cfg.group_size * per_seq),
            advice: "use a sparse --rollout-kv-policy, lower --group-size or --max-new-tokens, or raise --memory-cap".into(),
        });
    }

    progress(Progress::Note("loading the learner".into()));
    let engine = EngineHandle::spawn(
        serving,
        EngineConfig {
            kv_memory: plan.rollout_kv_bytes,
            max_queue: batch_seqs.max(64),
            ..EngineConfig::default()
        },
    );
    let mut learner = Learner::load(
        model_path,
        &targets,
        cfg.lora_rank,
        cfg.lora_alpha,
        cfg.seed,
    )?;
    learner.set_temperature(cfg.temperature as f64);
    memory::check(cap, "loading the weights")?;
    progress(Progress::Note(format!(
        "loaded: resident {} (peak {})",
        fmt_bytes(tern_runtime::memory::rss_bytes()),
        fmt_bytes(tern_runtime::memory::peak_rss_bytes())
    )));

    let names: Vec<String> = learner.params().into_iter().map(|(n, _)| n).collect();
    let mut opt = {
        let p = learner.params();
        let vars: Vec<&candle_core::Var> = p.iter().map(|(_, v)| *v).collect();
        AdamW::new(&vars, cfg.weight_decay)?
    };
    let mut start = 0;
    let mut data_state = DataState {
        replay: ReplayBuffer::new(cfg.replay_capacity),
        ..Default::default()
    };
    if let Some(ck) = &resumed {
        restore(&learner, &mut opt, &names, ck)?;
        start = ck.state.step;
        data_state = ck.state.data.clone();
        progress(Progress::Note(format!("resumed after step {start}")));
    }
    let metrics_path = cfg.out.join("metrics.jsonl");
    truncate_metrics(&metrics_path, start)?;
    let eval_path = cfg.out.join("eval.json");
    let mut eval = if start > 0 {
        std::fs::read_to_string(&eval_path)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default()
    } else {
        EvalReport::default()
    };
    if let (Some(et), 0, false) = (&eval_tasks, start, cfg.dry_run) {
        progress(Progress::Note(format!(
            "scoring {} held-out tasks",
            et.len()
        )));
        engine.set_adapters(0, learner.adapters_snapshot()?)?;
        eval.tasks = et.len();
        eval.before = Some(evaluate(&engine, cfg, et)?);
        write_json(&eval_path, &eval)?;
    }

    progress(Progress::Start {
        from: start,
        // A dry run does one step's rollouts only.
        steps: if cfg.dry_run { start + 1 } else { cfg.steps },
        plan: &plan,
        params: learner.param_count(),
    });
    let mut last_dir = cfg.out.clone();
    for step in start..cfg.steps {
        let t0 = Instant::now();
        engine.set_adapters(step as u64, learner.adapters_snapshot()?)?;
        let picks = data::pick(
            cfg.selection,
            &data_state.rates,
            cfg.seed,
            step,
            train_tasks.len(),
            cfg.prompts_per_step,
        );
        let mut m = StepMetrics {
            step: step + 1,
            reward_mean: 0.0,
            reward_std: 0.0,
            loss: 0.0,
            lr: cfg.lr_at(step),
            grad_norm: 0.0,
            rollout_tokens: 0,
            tokens_per_s: 0.0,
            learner_tokens: 0,
            groups_with_signal: 0,
            replayed_groups: 0,
            clipped_frac: 0.0,
            kv_bytes_peak: 0,
            kv_bytes_full: 0,
            peak_rss_bytes: 0,
            peak_estimate_bytes: 0,
            rho: None,
            seconds: 0.0,
        };
        // Samples and, per sample, its advantage and behaviour log-probs.
        let mut samples = Vec::new();
        let mut advantages = Vec::new();
        let mut behaviour: Vec<Vec<f64>> = Vec::new();
        // Group index (within this step) of each fresh sample, for replay.
        let mut group_of: Vec<usize> = Vec::new();
        match cfg.algorithm {
            Algorithm::Grpo => {
                let spec = RolloutSpec {
                    group_size: cfg.group_size,
                    max_new_tokens: cfg.max_new_tokens,
                    temperature: cfg.temperature,
                    kv_policy: &kv_policy,
                    system: cfg.system_prompt.as_deref(),
                    record_evictions: replay_kv,
                };
                let seed = cfg.seed.wrapping_add(1_000_003 * step as u64);
                let (groups, secs) = rollout::rollout(&engine, &train_tasks, &picks, &spec, seed)?;
                memory::check(cap, "rollouts")?;
                let rewards: Vec<f64> = groups
                    .iter()
                    .flat_map(|g| g.rollouts.iter().map(|r| r.reward))
                    .collect();
                let n = rewards.len() as f64;
                m.reward_mean = rewards.iter().sum::<f64>() / n;
                m.reward_std = (rewards
                    .iter()
                    .map(|r| (r - m.reward_mean).powi(2))
                    .sum::<f64>()
                    / n)
                    .sqrt();
                for (gi, g) in groups.iter().enumerate() {
                    let mean = g.rollouts.iter().map(|r| r.reward).sum::<f64>()
                        / g.rollouts.len().max(1) as f64;
                    data_state.rates.update(g.task, mean, cfg.pass_rate_alpha);
                    let adv = grpo::group_advantages(
                        &g.rollouts.iter().map(|r| r.reward).collect::<Vec<_>>(),
                    );
                    if adv.iter().any(|&a| a != 0.0) {
                        m.groups_with_signal += 1;
                    }
                    for (r, a) in g.rollouts.iter().zip(adv) {
                        m.rollout_tokens += r.tokens.len();
                        m.kv_bytes_peak += r.kv_peak_bytes;
                        m.kv_bytes_full += r.kv_full_bytes;
                        if a != 0.0 && !r.tokens.is_empty() {
                            samples.push(Sample {
                                prompt: g.prompt.clone(),
                                response: r.tokens.clone(),
                                visibility: r.evictions.clone(),
                            });
                            advantages.push(a);
                            behaviour.push(r.logprobs.clone());
                            group_of.push(gi);
                        }
                    }
                }
                m.tokens_per_s = m.rollout_tokens as f64 / secs.max(1e-9);
                if cfg.dry_run {
                    m.peak_rss_bytes = memory::check(cap, "rollouts")?;
                    m.seconds = t0.elapsed().as_secs_f64();
                    append_metrics(&metrics_path, &m)?;
                    progress(Progress::Step(&m));
                    return Ok(Summary {
                        steps: start,
                        checkpoint: cfg.out.clone(),
                        eval,
                        peak_rss_bytes: m.peak_rss_bytes,
                    });
                }
            }
            Algorithm::Sft => {
                let model = learner.model();
                let eos = model.stop_tokens();
                for &ti in &picks {
                    let task = &train_tasks[ti];
                    let prompt =
                        rollout::prompt_ids(engine.model(), cfg.system_prompt.as_deref(), task)?;
                    // A base prompt ends in `Answer:`; the reply follows a space.
                    let lead = if model.template.is_none() { " " } else { "" };
                    let mut response = model.tokenizer.encode(
                        &format!("{lead}The answer is {}.", task.answer),
                        false,
                        false,
                    )?;
                    response.extend(eos.first());
                    samples.push(Sample::new(prompt, response));
                    advantages.push(1.0);
                }
            }
        }

        // Sparse or corrected rollouts: re-score under the pre-update dense
        // weights (pi_old) and weigh each token by its mismatch.
        let mut weights: Option<Vec<Vec<f64>>> = None;
        let mut old: Option<Vec<Vec<f64>>> = None;
        let needs_rho = cfg.correction != Correction::None || kv_policy != KvPolicy::Full;
        if cfg.algorithm == Algorithm::Grpo && needs_rho && !samples.is_empty() {
            let scored = learner.score(&samples, plan.micro_batch, false)?;
            let c = correction::correct(cfg.correction, &cfg.rho, &scored, &behaviour);
            m.rho = Some(RhoStats {
                rejected_rollouts: c.rejected_rollouts,
                rejected_tokens: c.rejected_tokens,
                mean_rho: c.mean_rho,
                min_rho: c.min_rho,
                kl_old_sparse: c.kl_old_sparse,
            });
            if cfg.correction != Correction::None {
                // Vetoed rollouts leave the batch entirely.
                let keep: Vec<bool> = c
                    .weights
                    .iter()
                    .map(|w| w.iter().any(|&x| x > 0.0))
                    .collect();
                weights = Some(keep_where(c.weights, &keep));
                old = Some(keep_where(scored, &keep));
                samples = keep_where(samples, &keep);
                advantages = keep_where(advantages, &keep);
                group_of = keep_where(group_of, &keep);
            }
        }

        // Per sample: pi_old if already known, and the correction's weights.
        let n_fresh = samples.len();
        let mut old_per: Vec<Option<Vec<f64>>> = match old {
            Some(o) => o.into_iter().map(Some).collect(),
            None => vec![None; n_fresh],
        };
        let mut weights_per: Vec<Option<Vec<f64>>> = match weights {
            Some(w) => w.into_iter().map(Some).collect(),
            None => vec![None; n_fresh],
        };
        // Replay: groups from earlier steps, with the pi_old they were trained
        // with, under the same clipped loss.
        if cfg.algorithm == Algorithm::Grpo && cfg.replay_share > 0.0 {
            let k = (cfg.replay_share * cfg.prompts_per_step as f64).round() as usize;
            let replayed = data_state.replay.sample(cfg.seed, step, k);
            m.replayed_groups = replayed.len();
            for r in replayed.into_iter().flatten() {
                samples.push(Sample {
                    prompt: r.prompt,
                    response: r.response,
                    visibility: r.visibility.map(Arc::new),
                });
                advantages.push(r.advantage);
                old_per.push(Some(r.logp_old));
                weights_per.push(None);
            }
        }

        if !samples.is_empty() {
            let (mut tokens, mut longest) = (0u64, 0u64);
            for chunk in samples.chunks(plan.micro_batch) {
                // Consecutive samples with one prompt share its pass (see
                // `Learner`): the prompt counts once.
                let mut fed = 0u64;
                for (i, s) in chunk.iter().enumerate() {
                    if i == 0 || chunk[i - 1].prompt != s.prompt {
                        fed += s.prompt.len() as u64;
                    }
                    fed += s.response.len() as u64;
                    longest = longest.max((s.prompt.len() + s.response.len()) as u64);
                }
                tokens = tokens.max(fed);
            }
            m.peak_estimate_bytes = est.learner_peak(&mcfg, tokens, longest);
            // The loss is a mean over the tokens that count: every response
            // token, or under a correction only those with a weight.
            let n_tokens: usize = samples
                .iter()
                .zip(&weights_per)
                .map(|(s, w)| match w {
                    Some(w) => w.iter().filter(|&&x| x > 0.0).count(),
                    None => s.response.len(),
                })
                .sum();
            let inv = 1.0 / n_tokens.max(1) as f64;
            let refs = if cfg.kl_coef > 0.0 && !cfg.full {
                Some(learner.score(&samples, plan.micro_batch, true)?)
            } else {
                None
            };
            for epoch in 0..cfg.ppo_epochs {
                let mut clipped = 0usize;
                let algo = cfg.algorithm;
                let objective = |i: usize, j: usize, logp: f64| -> (f64, f64) {
                    if algo == Algorithm::Sft {
                        return (-logp * inv, -inv);
                    }
                    let lp_old = old_per[i].as_ref().map_or(logp, |o| o[j]);
                    let w = weights_per[i].as_ref().map_or(1.0, |w| w[j]);
                    if w == 0.0 {
                        return (0.0, 0.0);
                    }
                    let t = grpo::clipped_token(logp, lp_old, advantages[i], cfg.clip_eps, inv * w);
                    if t.clipped {
                        clipped += 1;
                    }
                    let (mut l, mut d) = (t.loss, t.dloss_dlogp);
                    if let Some(r) = &refs {
                        let (kl, dkl) = grpo::kl_token(logp, r[i][j]);
                        l += cfg.kl_coef * kl * inv;
                        d += cfg.kl_coef * dkl * inv;
                    }
                    (l, d)
                };
                let (mut grads, out) =
                    learner.accumulate(&samples, plan.micro_batch, objective, || {})?;
                memory::check(cap, "the learner's forward and backward")?;
                let norm = clip_grad_norm(&mut grads, cfg.max_grad_norm)?;
                {
                    let p = learner.params();
                    let vars: Vec<&candle_core::Var> = p.iter().map(|(_, v)| *v).collect();
                    opt.step(&vars, &grads, m.lr)?;
                }
                if epoch == 0 {
                    m.loss = out.loss;
                    m.grad_norm = norm;
                    m.learner_tokens = out.tokens;
                    m.clipped_frac = clipped as f64 / out.tokens.max(1) as f64;
                    for (o, lp) in old_per.iter_mut().zip(out.logprobs) {
                        if o.is_none() {
                            *o = Some(lp);
                        }
                    }
                }
            }
        }
        // This step's fresh groups join the replay buffer with their pi_old.
        if cfg.algorithm == Algorithm::Grpo && cfg.replay_share > 0.0 {
            let mut by_group: Vec<(usize, Vec<Replayed>)> = Vec::new();
            for i in 0..n_fresh {
                let r = Replayed {
                    prompt: samples[i].prompt.clone(),
                    response: samples[i].response.clone(),
                    advantage: advantages[i],
                    logp_old: old_per[i].clone().unwrap_or_default(),
                    visibility: samples[i].visibility.as_deref().cloned(),
                };
                match by_group.last_mut() {
                    Some((g, v)) if *g == group_of[i] => v.push(r),
                    _ => by_group.push((group_of[i], vec![r])),
                }
            }
            for (_, g) in by_group {
                data_state.replay.push(g);
            }
        }
        m.peak_rss_bytes = memory::check(cap, "the optimizer update")?;
        m.seconds = t0.elapsed().as_secs_f64();
        append_metrics(&metrics_path, &m)?;
        progress(Progress::Step(&m));
        if (step + 1) % cfg.checkpoint_every == 0 || step + 1 == cfg.steps {
            last_dir = save_checkpoint(
                cfg,
                model_path,
                &learner,
                &opt,
                &names,
                step + 1,
                &data_state,
            )?;
        }
    }
    if let Some(et) = &eval_tasks {
        progress(Progress::Note(format!(
            "scoring {} held-out tasks",
            et.len()
        )));
        engine.set_adapters(cfg.steps as u64, learner.adapters_snapshot()?)?;
        eval.tasks = et.len();
        eval.after = Some(evaluate(&engine, cfg, et)?);
        write_json(&eval_path, &eval)?;
    }
    Ok(Summary {
        steps: cfg.steps,
        checkpoint: last_dir,
        eval,
        peak_rss_bytes: memory::check(cap, "the final evaluation")?,
    })
}

fn save_checkpoint(
    cfg: &TrainConfig,
    model_path: &Path,
    learner: &Learner,
    opt: &AdamW,
    names: &[String],
    step: usize,
    data_state: &DataState,
) -> Result<PathBuf> {
    let params: HashMap<String, candle_core::Tensor> = learner
        .params()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().detach()))
        .collect();
    let ck = Checkpoint {
        state: State {
            step,
            adam_t: opt.t,
            config: cfg.clone(),
            model_path: model_path.to_path_buf(),
            lora_scale: learner.lora_scale(),
            data: data_state.clone(),
        },
        params,
        m: names.iter().cloned().zip(opt.m.iter().cloned()).collect(),
        v: names.iter().cloned().zip(opt.v.iter().cloned()).collect(),
    };
    checkpoint::save(&cfg.out, &ck, 2)
}

/// Puts a checkpoint's tensors and moments back; names and shapes must match.
fn restore(learner: &Learner, opt: &mut AdamW, names: &[String], ck: &Checkpoint) -> Result<()> {
    let mismatch = |n: &str, what: &str| TrainError::Checkpoint {
        path: n.to_string(),
        reason: format!("{what} does not match this run's model and LoRA settings"),
    };
    for ((name, var), i) in learner.params().into_iter().zip(0..) {
        let t = ck
            .params
            .get(&name)
            .ok_or_else(|| mismatch(&name, "a missing tensor"))?;
        if t.dims() != var.dims() {
            return Err(mismatch(&name, "a tensor's shape"));
        }
        var.set(t)?;
        let (m, v) = (
            ck.m.get(&names[i])
                .ok_or_else(|| mismatch(&name, "a missing moment"))?,
            ck.v.get(&names[i])
                .ok_or_else(|| mismatch(&name, "a missing moment"))?,
        );
        opt.m[i] = m.clone();
        opt.v[i] = v.clone();
    }
    opt.t = ck.state.adam_t;
    Ok(())
}

/// The items of `v` whose `keep` flag is set.
fn keep_where<T>(v: Vec<T>, keep: &[bool]) -> Vec<T> {
    v.into_iter()
        .zip(keep)
        .filter(|(_, &k)| k)
        .map(|(x, _)| x)
        .collect()
}

fn append_metrics(path: &Path, m: &StepMetrics) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let line = serde_json::to_string(m).map_err(|e| TrainError::Config(e.to_string()))?;
    writeln!(f, "{line}")?;
    f.sync_data()?;
    Ok(())
}

/// Keeps the lines of steps `<= keep` (a resumed run rewrites the rest).
fn truncate_metrics(path: &Path, keep: usize) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<StepMetrics>(l)
                .map(|m| m.step <= keep)
                .unwrap_or(false)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept)?;
    Ok(())
}

fn fmt_bytes(b: Option<u64>) -> String {
    b.map(|b| tern_runtime::size::format_size(b as usize))
        .unwrap_or_else(|| "?".into())
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_string_pretty(v).map_err(|e| TrainError::Config(e.to_string()))?,
    )?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwritable_out_dir_is_refused() {
        let e = prepare_out(Path::new("/proc/tern-cannot-write")).unwrap_err();
        assert!(e.to_string().contains("output directory"), "{e}");
    }
}
