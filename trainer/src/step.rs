//! One training step, phase by phase: the batch (GRPO rollouts scored into
//! group advantages, or SFT's reference answers), the Sparse-RL correction,
//! the loss and its backward pass, the optimizer update. It returns what
//! happened as [`StepMetrics`]; the driver owns everything that outlives a
//! step (task selection, the replay buffer, checkpoints), the recorder writes
//! the metrics down.

use std::sync::Arc;
use std::time::Instant;

use tern_models::ModelConfig;
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_solve::tasks::Task;

use crate::config::{Advantages, Algorithm, LossAverage, TrainConfig};
use crate::correction::{self, Correction, NumericsCorrection};
use crate::data::Replayed;
use crate::error::Result;
use crate::grpo::{self, Objective};
use crate::learner::{Learner, Sample};
use crate::memory::{self, Estimate, Plan};
use crate::metrics::{EpochStats, RatioStats, RhoStats, RolloutRho, StepMetrics};
use crate::optim::{clip_grad_norm, AdamW};
use crate::rollout::{self, RolloutSpec};

/// What every step of a run shares: its settings and what setup built.
pub struct Context<'a> {
    /// The run's settings.
    pub cfg: &'a TrainConfig,
    /// The training tasks (picks index them).
    pub tasks: &'a [Task],
    /// The rollout engine (held-out scoring and prompts too).
    pub engine: &'a EngineHandle,
    /// Rollout workers, when rollouts run on `--rollout-endpoints`.
    pub fleet: Option<&'a crate::fleet::Fleet>,
    /// The rollouts' KV policy.
    pub kv_policy: &'a KvPolicy,
    /// Record each rollout's evictions for the sparse-replay learner.
    pub replay_kv: bool,
    /// The memory cap, in bytes.
    pub cap: Option<u64>,
    /// The memory plan (micro-batch size).
    pub plan: &'a Plan,
    /// The memory estimator, for each step's predicted learner peak.
    pub est: &'a Estimate,
    /// The model's shape.
    pub mcfg: &'a ModelConfig,
    /// Who writes the tests of `reward = generated_tests:K` (`None`: the
    /// task gives the reward).
    pub tests: Option<&'a crate::reward::TestWriter<'a>>,
}

/// A finished step.
pub struct Outcome {
    /// Its line of `metrics.jsonl`.
    pub metrics: StepMetrics,
    /// Each rolled-out group's task and mean reward, in order (the
    /// difficulty selection's pass rates learn from them).
    pub pass_rates: Vec<(usize, f64)>,
    /// This step's fresh groups with the `pi_old` they were trained with, for
    /// the replay buffer (empty unless the run replays).
    pub fresh: Vec<Vec<Replayed>>,
    /// A dry run: the step stopped after its rollouts.
    pub dry_run: bool,
    /// Each group's model-written tests and pass matrix, for `tests.jsonl`
    /// (empty unless the rewards come from `generated_tests:K`).
    pub tests: Vec<crate::reward::TestsLine>,
}

/// Per sample, a value per response token where one is known.
type PerToken = Vec<Option<Vec<f64>>>;

/// The samples a step trains on and, per sample, what the loss needs.
#[derive(Default)]
struct Batch {
    samples: Vec<Sample>,
    advantages: Vec<f64>,
    /// The sampler's log-probabilities (GRPO), for the correction.
    behaviour: Vec<Vec<f64>>,
    /// Group index (within this step) of each fresh sample, for replay.
    group_of: Vec<usize>,
    /// Each fresh sample's place in its group.
    slot: Vec<usize>,
    /// Every rollout's reward, per group of this step (empty responses
    /// included), for advantages over the kept rollouts.
    group_rewards: Vec<Vec<f64>>,
}

impl Batch {
    /// Keeps the fresh samples whose `keep` flag is set.
    fn retain(&mut self, keep: &[bool]) {
        self.samples = keep_where(std::mem::take(&mut self.samples), keep);
        self.advantages = keep_where(std::mem::take(&mut self.advantages), keep);
        self.behaviour = keep_where(std::mem::take(&mut self.behaviour), keep);
        self.group_of = keep_where(std::mem::take(&mut self.group_of), keep);
        self.slot = keep_where(std::mem::take(&mut self.slot), keep);
    }

    /// Recomputes each group's advantages over its rollouts that are not
    /// dropped (`keep` false for a sample drops it).
    fn advantages_over_kept(&mut self, keep: &[bool]) {
        let mut kept: Vec<Vec<bool>> = self
            .group_rewards
            .iter()
            .map(|r| vec![true; r.len()])
            .collect();
        for (i, &k) in keep.iter().enumerate() {
            if !k {
                kept[self.group_of[i]][self.slot[i]] = false;
            }
        }
        let adv: Vec<Vec<f64>> = self
            .group_rewards
            .iter()
            .zip(&kept)
            .map(|(r, k)| grpo::kept_advantages(r, k))
            .collect();
        for (i, a) in self.advantages.iter_mut().enumerate() {
            *a = adv[self.group_of[i]][self.slot[i]];
        }
    }
}

/// Runs step `step` (0-based) on the tasks `picks`, training on `replayed`
/// groups from earlier steps besides this step's own.
pub fn run(
    ctx: &Context<'_>,
    learner: &Learner,
    opt: &mut AdamW,
    step: usize,
    picks: &[usize],
    replayed: Vec<Vec<Replayed>>,
) -> Result<Outcome> {
    let cfg = ctx.cfg;
    let t0 = Instant::now();
    let resets = tern_runtime::memory::start_phase();
    publish_adapters(ctx, learner, step)?;
    let mut m = starting_metrics(cfg, step);
    let mut pass_rates = Vec::new();
    let mut tests = Vec::new();
    let mut batch = match cfg.algorithm {
        Algorithm::Grpo => {
            m.rollout_estimate_bytes = ctx.est.rollout_peak(ctx.plan.rollout_kv_bytes as u64);
            let batch = rollouts(ctx, step, picks, &mut m, &mut pass_rates, &mut tests)?;
            if cfg.dry_run {
                if resets {
                    m.rollout_peak_bytes =
                        tern_runtime::memory::phase_peak_rss_bytes().unwrap_or(0);
                }
                m.peak_rss_bytes = memory::check(ctx.cap, "rollouts")?;
                m.seconds = t0.elapsed().as_secs_f64();
                return Ok(Outcome {
                    metrics: m,
                    pass_rates,
                    fresh: Vec::new(),
                    dry_run: true,
                    tests,
                });
            }
            batch
        }
        Algorithm::Sft => sft_batch(ctx, learner, picks)?,
    };

    if resets && cfg.algorithm == Algorithm::Grpo {
        m.rollout_peak_bytes = tern_runtime::memory::phase_peak_rss_bytes().unwrap_or(0);
    }
    // The rollouts' KV is free now: let the learner's activations have it.
    tern_runtime::memory::release_free_memory();
    let resets = tern_runtime::memory::start_phase();
    let learning = Instant::now();
    let (micro, recompute) = learner_plan(ctx, &batch, &replayed);
    learner.set_recompute(recompute);
    m.micro_batch = micro;
    m.recompute = learner.recomputes();
    let corrected = correct(ctx, learner, micro, &mut batch, &mut m)?;
    // Per sample: pi_old if already known, and the correction's weights.
    let n_fresh = batch.samples.len();
    let (mut old_per, mut weights_per): (PerToken, PerToken) = match corrected {
        Some(c) => (
            c.old.into_iter().map(Some).collect(),
            c.weights.into_iter().map(Some).collect(),
        ),
        None => (vec![None; n_fresh], vec![None; n_fresh]),
    };
    // Replay: groups from earlier steps, with the pi_old they were trained
    // with, under the same clipped loss.
    m.replayed_groups = replayed.len();
    for r in replayed.into_iter().flatten() {
        batch.samples.push(Sample {
            prompt: r.prompt,
            response: r.response,
            visibility: r.visibility.map(Arc::new),
        });
        batch.advantages.push(r.advantage);
        old_per.push(Some(r.logp_old));
        weights_per.push(None);
    }

    if !batch.samples.is_empty() {
        update(
            ctx,
            learner,
            micro,
            opt,
            &batch,
            &mut old_per,
            &weights_per,
            &mut m,
        )?;
    }
    // Dense uncorrected rollouts skip the scoring pass: the first epoch's
    // pre-update log-probabilities are pi_old, measured against the sampler's
    // here (both at the sampling temperature).
    if m.rho.is_none() && cfg.algorithm == Algorithm::Grpo && n_fresh > 0 {
        let old: Vec<Vec<f64>> = old_per[..n_fresh]
            .iter()
            .map(|o| o.clone().unwrap_or_default())
            .collect();
        let rhos = correction::ratios(&old, &batch.behaviour);
        let mut rho = rho_stats(0, 0, correction::summarize(&rhos));
        rho.rollouts = Some(per_rollout(&cfg.rho, &rhos, &batch.advantages[..n_fresh]));
        m.rho = Some(rho);
    }
    let fresh = if cfg.algorithm == Algorithm::Grpo && cfg.replay_share > 0.0 {
        fresh_groups(&batch, n_fresh, &old_per)
    } else {
        Vec::new()
    };
    m.learner_seconds = learning.elapsed().as_secs_f64();
    if resets {
        m.learner_peak_bytes = tern_runtime::memory::phase_peak_rss_bytes().unwrap_or(0);
    }
    // And the learner's activations for the next step's rollouts.
    tern_runtime::memory::release_free_memory();
    m.peak_rss_bytes = memory::check(ctx.cap, "the optimizer update")?;
    m.seconds = t0.elapsed().as_secs_f64();
    Ok(Outcome {
        metrics: m,
        pass_rates,
        fresh,
        dry_run: false,
        tests,
    })
}

/// The learner's micro-batch and recompute for the sequences this step
/// trains (fresh, then replayed), now that their lengths are known.
fn learner_plan(ctx: &Context<'_>, batch: &Batch, replayed: &[Vec<Replayed>]) -> (usize, bool) {
    let cfg = ctx.cfg;
    let seqs: Vec<(&[u32], usize)> = batch
        .samples
        .iter()
        .map(|s| (s.prompt.as_slice(), s.response.len()))
        .chain(
            replayed
                .iter()
                .flatten()
                .map(|r| (r.prompt.as_slice(), r.response.len())),
        )
        .collect();
    memory::step_plan(
        ctx.mcfg,
        ctx.est,
        ctx.plan,
        cfg.micro_batch,
        if cfg.full { Some(false) } else { cfg.recompute },
        &seqs,
    )
}

/// Hands the learner's current adapters to whatever samples this step's
/// rollouts: the fleet's workers, or the in-process engine.
fn publish_adapters(ctx: &Context<'_>, learner: &Learner, step: usize) -> Result<()> {
    match ctx.fleet {
        Some(fleet) => {
            let set = learner.adapters_snapshot()?.ok_or_else(|| {
                crate::error::TrainError::Config("rollout endpoints need LoRA adapters".into())
            })?;
            fleet.publish(step as u64, &set)?;
        }
        None => ctx
            .engine
            .set_adapters(step as u64, learner.adapters_snapshot()?)?,
    }
    Ok(())
}

/// Step `step`'s metrics before any phase has filled them in.
fn starting_metrics(cfg: &TrainConfig, step: usize) -> StepMetrics {
    StepMetrics {
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
        advantages: cfg.advantages,
        ratio: None,
        epochs: Vec::new(),
        kv_bytes_peak: 0,
        kv_bytes_full: 0,
        kv_attended: 0,
        kv_attended_full: 0,
        peak_rss_bytes: 0,
        micro_batch: 0,
        recompute: false,
        peak_estimate_bytes: 0,
        rollout_estimate_bytes: 0,
        rollout_peak_bytes: 0,
        learner_peak_bytes: 0,
        rho: None,
        seconds: 0.0,
        learner_seconds: 0.0,
        fleet: None,
    }
}

/// GRPO's batch: `G` rollouts per picked task, their rewards, and each
/// group's advantages; only samples with a non-zero advantage train.
fn rollouts(
    ctx: &Context<'_>,
    step: usize,
    picks: &[usize],
    m: &mut StepMetrics,
    pass_rates: &mut Vec<(usize, f64)>,
    tests: &mut Vec<crate::reward::TestsLine>,
) -> Result<Batch> {
    let cfg = ctx.cfg;
    let spec = RolloutSpec {
        group_size: cfg.group_size,
        max_new_tokens: cfg.max_new_tokens,
        temperature: cfg.temperature,
        kv_policy: ctx.kv_policy,
        system: cfg.system_prompt.as_deref(),
        record_evictions: ctx.replay_kv,
        tests: ctx.tests,
    };
    let seed = cfg.seed.wrapping_add(1_000_003 * step as u64);
    let (groups, secs) = match ctx.fleet {
        Some(fleet) => {
            let model = ctx.engine.model();
            let (groups, secs, stats) =
                rollout::rollout_remote(fleet, model, ctx.tasks, picks, &spec, seed)?;
            m.fleet = Some(stats);
            (groups, secs)
        }
        None => rollout::rollout(ctx.engine, ctx.tasks, picks, &spec, seed)?,
    };
    memory::check(ctx.cap, "rollouts")?;
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
    let mut batch = Batch::default();
    for (gi, g) in groups.iter().enumerate() {
        if let Some(t) = &g.tests {
            tests.push(crate::reward::TestsLine {
                step: m.step,
                task: g.task,
                tests: t.clone(),
            });
        }
        let rewards: Vec<f64> = g.rollouts.iter().map(|r| r.reward).collect();
        let mean = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
        pass_rates.push((g.task, mean));
        let adv = grpo::group_advantages(&rewards);
        let signal = adv.iter().any(|&a| a != 0.0);
        if signal {
            m.groups_with_signal += 1;
        }
        for (k, (r, a)) in g.rollouts.iter().zip(adv).enumerate() {
            m.rollout_tokens += r.tokens.len();
            m.kv_bytes_peak += r.kv_peak_bytes;
            m.kv_bytes_full += r.kv_full_bytes;
            m.kv_attended += r.kv_attended;
            m.kv_attended_full += r.kv_attended_full;
            // Over the kept rollouts a zero advantage may become non-zero
            // once another rollout is dropped: such rollouts wait for the
            // correction's verdict.
            let candidate = a != 0.0 || (signal && cfg.advantages == Advantages::Kept);
            if candidate && !r.tokens.is_empty() {
                batch.samples.push(Sample {
                    prompt: g.prompt.clone(),
                    response: r.tokens.clone(),
                    visibility: r.evictions.clone(),
                });
                batch.advantages.push(a);
                batch.behaviour.push(r.logprobs.clone());
                batch.group_of.push(gi);
                batch.slot.push(k);
            }
        }
        batch.group_rewards.push(rewards);
    }
    m.tokens_per_s = m.rollout_tokens as f64 / secs.max(1e-9);
    Ok(batch)
}

/// SFT's batch: each picked task's prompt with its reference answer as the
/// response, advantage 1.
fn sft_batch(ctx: &Context<'_>, learner: &Learner, picks: &[usize]) -> Result<Batch> {
    let model = learner.model();
    let eos = model.stop_tokens();
    let mut batch = Batch::default();
    for &ti in picks {
        let task = &ctx.tasks[ti];
        let prompt =
            rollout::prompt_ids(ctx.engine.model(), ctx.cfg.system_prompt.as_deref(), task)?;
        // A base prompt ends in `Answer:`; the reply follows a space.
        let lead = if model.template.is_none() { " " } else { "" };
        // A worked target (synthesis data) is imitated as written;
        // otherwise the bare answer line.
        let text = match &task.target {
            Some(t) => format!("{lead}{}", t.trim()),
            None => format!("{lead}The answer is {}.", task.answer),
        };
        let mut response = model.tokenizer.encode(&text, false, false)?;
        response.extend(eos.first());
        batch.samples.push(Sample::new(prompt, response));
        batch.advantages.push(1.0);
    }
    Ok(batch)
}

/// The batch's pi_old and per-token weights under a correction.
struct Corrected {
    old: Vec<Vec<f64>>,
    weights: Vec<Vec<f64>>,
}

/// Sparse or corrected rollouts: re-scores the batch under the pre-update
/// dense weights (pi_old) and measures each token's mismatch into `m.rho`;
/// under a correction (`correction` or `numerics_correction`), weighs each
/// token by it and drops the rollouts left with no weighed token from the
/// batch. With `advantages = "kept"` the groups' advantages are then
/// recomputed over the rollouts that stayed, and rollouts whose advantage is
/// 0 leave the batch.
fn correct(
    ctx: &Context<'_>,
    learner: &Learner,
    micro: usize,
    batch: &mut Batch,
    m: &mut StepMetrics,
) -> Result<Option<Corrected>> {
    let cfg = ctx.cfg;
    let is_grpo = cfg.algorithm == Algorithm::Grpo;
    let corrects =
        cfg.correction != Correction::None || cfg.numerics_correction != NumericsCorrection::None;
    let needs_rho = corrects || *ctx.kv_policy != KvPolicy::Full;
    let mut out = None;
    let mut keep = vec![true; batch.samples.len()];
    if is_grpo && needs_rho && !batch.samples.is_empty() {
        let scored = learner.score(&batch.samples, micro, false)?;
        let c = if cfg.numerics_correction != NumericsCorrection::None {
            correction::correct_numerics(
                cfg.numerics_correction,
                &cfg.numerics,
                &scored,
                &batch.behaviour,
            )
        } else {
            correction::correct(cfg.correction, &cfg.rho, &scored, &batch.behaviour)
        };
        let mut rho = rho_stats(c.rejected_rollouts, c.rejected_tokens, c.stats);
        let rhos = correction::ratios(&scored, &batch.behaviour);
        rho.rollouts = Some(per_rollout(&cfg.rho, &rhos, &batch.advantages));
        m.rho = Some(rho);
        if corrects {
            keep = c
                .weights
                .iter()
                .map(|w| w.iter().any(|&x| x > 0.0))
                .collect();
            out = Some(Corrected {
                old: scored,
                weights: c.weights,
            });
        }
    }
    if is_grpo && cfg.advantages == Advantages::Kept {
        batch.advantages_over_kept(&keep);
        for (k, &a) in keep.iter_mut().zip(&batch.advantages) {
            *k &= a != 0.0;
        }
    }
    batch.retain(&keep);
    Ok(out.map(|c| Corrected {
        old: keep_where(c.old, &keep),
        weights: keep_where(c.weights, &keep),
    }))
}

/// Each scored rollout's length, band counts and advantage (`RolloutRho`).
fn per_rollout(th: &correction::Thresholds, rhos: &[Vec<f64>], advantages: &[f64]) -> RolloutRho {
    let (outside, vetoed) = correction::band_counts(th, rhos).into_iter().unzip();
    RolloutRho {
        tokens: rhos.iter().map(Vec::len).collect(),
        outside,
        vetoed,
        advantage: advantages.to_vec(),
    }
}

/// A step's `rho` record from a correction's counts and the ratios' statistics.
fn rho_stats(
    rejected_rollouts: usize,
    rejected_tokens: usize,
    s: correction::RhoSummary,
) -> RhoStats {
    RhoStats {
        rejected_rollouts,
        rejected_tokens,
        mean_rho: s.mean_rho,
        min_rho: s.min_rho,
        max_rho: s.max_rho,
        kl_old_sparse: s.kl_old_sparse,
        hist: s.hist,
        rollouts: None,
    }
}

/// The loss, its backward pass and the optimizer update, `ppo_epochs` times
/// on the same batch with pi_old fixed; the first epoch's figures go in `m`
/// (every epoch's in `m.epochs`), and its log-probabilities, taken before the
/// first update, fill in the samples' unknown pi_old.
#[allow(clippy::too_many_arguments)]
fn update(
    ctx: &Context<'_>,
    learner: &Learner,
    micro: usize,
    opt: &mut AdamW,
    batch: &Batch,
    old_per: &mut [Option<Vec<f64>>],
    weights_per: &[Option<Vec<f64>>],
    m: &mut StepMetrics,
) -> Result<()> {
    let cfg = ctx.cfg;
    let samples = &batch.samples;
    let seqs: Vec<(&[u32], usize)> = samples
        .iter()
        .map(|s| (s.prompt.as_slice(), s.response.len()))
        .collect();
    let (tokens, longest) = memory::micro_batch_tokens(&seqs, micro);
    m.peak_estimate_bytes = ctx
        .est
        .learner_peak(ctx.mcfg, tokens, longest, learner.recomputes());
    let n_tokens = grpo::counted_tokens(samples.iter().map(|s| s.response.len()), weights_per);
    let inv = 1.0 / n_tokens.max(1) as f64;
    let scales = (cfg.loss_average == LossAverage::Response)
        .then(|| grpo::response_scales(samples.iter().map(|s| s.response.len()), weights_per));
    let refs = if cfg.kl_coef > 0.0 && !cfg.full {
        Some(learner.score(samples, micro, true)?)
    } else {
        None
    };
    let is_grpo = cfg.algorithm == Algorithm::Grpo;
    let mut seen_all = grpo::Seen::default();
    let mut clipped_all = 0;
    for epoch in 0..cfg.ppo_epochs {
        let mut objective = Objective {
            sft: cfg.algorithm == Algorithm::Sft,
            inv,
            per_sample_inv: scales.as_deref(),
            advantages: &batch.advantages,
            old: old_per,
            weights: weights_per,
            refs: refs.as_deref(),
            clip_eps: cfg.clip_eps,
            kl_coef: cfg.kl_coef,
            kl_estimator: cfg.kl_estimator,
            clipped: 0,
            seen: grpo::Seen::default(),
        };
        let (mut grads, out) =
            learner.accumulate(samples, micro, |i, j, lp| objective.token(i, j, lp), || {})?;
        let (clipped, seen) = (objective.clipped, objective.seen);
        memory::check(ctx.cap, "the learner's forward and backward")?;
        let norm = clip_grad_norm(&mut grads, cfg.max_grad_norm)?;
        {
            let p = learner.params();
            let vars: Vec<&candle_core::Var> = p.iter().map(|(_, v)| *v).collect();
            opt.step(&vars, &grads, m.lr)?;
        }
        if is_grpo {
            let (mean, min, max) = seen.ratio();
            m.epochs.push(EpochStats {
                loss: out.loss,
                grad_norm: norm,
                ratio: RatioStats {
                    mean,
                    min,
                    max,
                    clipped_frac: clipped as f64 / seen.tokens.max(1) as f64,
                },
                kl_ref: seen.kl_mean(),
            });
            seen_all = seen_all.merge(&seen);
            clipped_all += clipped;
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
    if is_grpo {
        let (mean, min, max) = seen_all.ratio();
        m.ratio = Some(RatioStats {
            mean,
            min,
            max,
            clipped_frac: clipped_all as f64 / seen_all.tokens.max(1) as f64,
        });
    }
    Ok(())
}

/// This step's fresh samples (the first `n_fresh`) as replay groups, with
/// their pi_old.
fn fresh_groups(batch: &Batch, n_fresh: usize, old_per: &[Option<Vec<f64>>]) -> Vec<Vec<Replayed>> {
    let mut by_group: Vec<(usize, Vec<Replayed>)> = Vec::new();
    for (i, old) in old_per.iter().enumerate().take(n_fresh) {
        let s = &batch.samples[i];
        let r = Replayed {
            prompt: s.prompt.clone(),
            response: s.response.clone(),
            advantage: batch.advantages[i],
            logp_old: old.clone().unwrap_or_default(),
            visibility: s.visibility.as_deref().cloned(),
        };
        match by_group.last_mut() {
            Some((g, v)) if *g == batch.group_of[i] => v.push(r),
            _ => by_group.push((batch.group_of[i], vec![r])),
        }
    }
    by_group.into_iter().map(|(_, g)| g).collect()
}

/// The items of `v` whose `keep` flag is set.
fn keep_where<T>(v: Vec<T>, keep: &[bool]) -> Vec<T> {
    v.into_iter()
        .zip(keep)
        .filter(|(_, &k)| k)
        .map(|(x, _)| x)
        .collect()
}
