//! The training driver: checks and plans the run before loading anything
//! big, loads the rollout engine and the learner, resumes from a checkpoint,
//! then loops over the steps (choosing each step's tasks, keeping the replay
//! buffer, checkpointing as configured). A step's own work is in
//! [`crate::step`]; metrics, `eval.json` and progress in [`crate::recorder`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tern_models::{GgufFile, ModelConfig, Precision};
use tern_runtime::engine::DEFAULT_PREFILL_CHUNK;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::SeqCache;
use tern_runtime::LoadedModel;
use tern_solve::tasks::{self, Task};

use crate::checkpoint::{self, Checkpoint, State};
use crate::config::LearnerWeights;
use crate::config::{Algorithm, LearnerKv, TrainConfig};
use crate::data::{self, DataState, ReplayBuffer};
use crate::error::{Result, TrainError};
use crate::learner::Learner;
use crate::memory::{self, Estimate, Plan};
use crate::optim::AdamW;
use crate::recorder::{EvalReport, Progress, Recorder, When};
use crate::rollout;
use crate::step::{self, Context};

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

/// The model's shape and the memory estimator, read from the GGUF's header
/// (nothing big is loaded).
fn estimate(cfg: &TrainConfig, model_path: &Path) -> Result<(ModelConfig, Estimate)> {
    let gguf = GgufFile::open(model_path)?;
    let mcfg = ModelConfig::from_gguf(&gguf)?;
    drop(gguf);
    let gguf_bytes = std::fs::metadata(model_path)?.len();
    let trainable: u64 = if cfg.full {
        let e = Estimate::new(&mcfg, 0, 0, true);
        (e.learner_weights / 4).saturating_sub((mcfg.vocab_size * mcfg.n_embd) as u64)
    } else {
        let per_layer: usize = cfg
            .targets()
            .iter()
            .map(|&t| {
                let (o, i) = t.shape(&mcfg);
                cfg.lora_rank * (o + i)
            })
            .sum();
        (per_layer * mcfg.n_layer) as u64
    };
    let f32_base = cfg.full || cfg.learner_weights == LearnerWeights::F32;
    let est = Estimate::new(&mcfg, gguf_bytes, trainable, f32_base);
    Ok((mcfg, est))
}

/// The memory plan for the run's longest sequence and its rollout batch;
/// fails when the cap cannot hold one group's rollouts at once.
fn plan_memory(
    cfg: &TrainConfig,
    serving: &LoadedModel,
    train_tasks: &[Task],
    kv_policy: &KvPolicy,
    (mcfg, est): (&ModelConfig, &Estimate),
    cap: Option<u64>,
    own_tests: TestsKv,
) -> Result<Plan> {
    // The longest sequence the learner can see: the longest prompt plus the
    // response cap (SFT: the reference answer).
    let (mut longest_prompt, mut longest_target) = (0, 0);
    for t in train_tasks {
        let ids = rollout::prompt_ids(serving, cfg.system_prompt.as_deref(), t)?;
        longest_prompt = longest_prompt.max(ids.len());
        if let (Algorithm::Sft, Some(target)) = (cfg.algorithm, &t.target) {
            let n = serving.tokenizer.encode(target, false, false)?.len() + 1;
            longest_target = longest_target.max(n);
        }
    }
    let seq_len = longest_prompt + cfg.max_new_tokens.max(longest_target);
    let batch_seqs = batch_seqs(cfg);
    // What the rollout batch needs at once under the rollout policy: the
    // engine reserves each sequence's worst case, so a sparse policy fits
    // more sequences in the same memory.
    let per_seq = SeqCache::reservation_bytes(
        mcfg,
        kv_policy,
        // Rollouts store f16, the engine's default (the learner's f32 keys
        // are those same f16 values).
        tern_runtime::kv::KvDtype::default(),
        longest_prompt,
        cfg.max_new_tokens,
        DEFAULT_PREFILL_CHUNK,
    )
    .max(1);
    let mut plan = memory::plan(
        mcfg,
        est,
        cap,
        seq_len,
        batch_seqs,
        cfg.micro_batch,
        // The policy's own test replies are sampled beside its rollouts.
        batch_seqs * per_seq + own_tests.step,
        if cfg.full { Some(false) } else { cfg.recompute },
    )?;
    plan.rollout_at_once = (plan.rollout_kv_bytes / per_seq).min(batch_seqs);
    if plan.rollout_kv_bytes < own_tests.request {
        return Err(TrainError::MemoryCap {
            cap: cap.map(|c| tern_runtime::size::format_size(c as usize)).unwrap_or_default(),
            phase: "rollout KV cache (one request of test replies)",
            needed: tern_runtime::size::format_size(own_tests.request),
            advice: "lower K in generated_tests:K or --max-new-tokens, give a --test-model, or raise --memory-cap".into(),
        });
    }
    // A group is one engine request: it must fit whole.
    if plan.rollout_at_once < cfg.group_size.max(1) && cfg.algorithm == Algorithm::Grpo {
        return Err(TrainError::MemoryCap {
            cap: cap.map(|c| tern_runtime::size::format_size(c as usize)).unwrap_or_default(),
            phase: "rollout KV cache (one group at once)",
            needed: tern_runtime::size::format_size(cfg.group_size * per_seq),
            advice: "use a sparse --rollout-kv-policy, lower --group-size or --max-new-tokens, or raise --memory-cap".into(),
        });
    }
    Ok(plan)
}

/// Sequences one step trains on: a group per prompt (GRPO) or one (SFT).
fn batch_seqs(cfg: &TrainConfig) -> usize {
    match cfg.algorithm {
        Algorithm::Grpo => cfg.prompts_per_step * cfg.group_size,
        Algorithm::Sft => cfg.prompts_per_step,
    }
}

/// SFT on a file where some tasks carry a worked `target` (synthesis data
/// from `tern synth-data`, whose tasks without a right synthesis have none)
/// trains the others on their bare "The answer is X." line too
/// (`sft_bare_answers`, the default): on 300 held-out stories that
/// synthesizer learned to answer in one line after reading the candidates
/// and beat both majority@8 and one trained on the worked targets alone
/// (docs/REASONING.md). Off, only the worked targets are kept, as the
/// CoT-based Synthesizer paper keeps only correct syntheses. A file with no
/// target, or only targets, trains on every task. Returns the tasks and,
/// for synthesis data, a line saying what each kind trains on.
fn sft_targets(cfg: &TrainConfig, tasks: Vec<Task>) -> (Vec<Task>, Option<String>) {
    let worked = tasks.iter().filter(|t| t.target.is_some()).count();
    let total = tasks.len();
    if cfg.algorithm != Algorithm::Sft || worked == 0 || worked == total {
        return (tasks, None);
    }
    if cfg.sft_bare_answers {
        let note = format!(
            "sft: {worked} of {total} tasks have a worked target; the other {} train on \
             their answer line (--sft-worked-only keeps only the worked)",
            total - worked
        );
        return (tasks, Some(note));
    }
    let kept: Vec<Task> = tasks.into_iter().filter(|t| t.target.is_some()).collect();
    let note = format!(
        "sft: training on the {worked} of {total} tasks with a worked target \
         (the other {} have only an answer)",
        total - worked
    );
    (kept, Some(note))
}

/// Runs (or resumes) a training run; `model_path` is the resolved GGUF.
pub fn train(
    cfg: &TrainConfig,
    model_path: &Path,
    resume: Option<&Path>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Summary> {
    cfg.validate()?;
    // Read once, before anything is loaded: a bad key file fails at once.
    let rollout_key = cfg
        .rollout_api_key_file
        .as_deref()
        .map(crate::fleet::read_api_key)
        .transpose()?;
    let resumed = resume.map(checkpoint::load).transpose()?;
    let (train_tasks, worked_note) = sft_targets(cfg, tasks::load(&cfg.task)?);
    let eval_tasks = cfg.eval_task.as_deref().map(tasks::load).transpose()?;
    check_tasks(cfg, &train_tasks)?;
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
    let (mcfg, mut est) = estimate(cfg, model_path)?;
    if let Some(path) = &cfg.test_model {
        est.writer = std::fs::metadata(path)
            .map_err(|e| TrainError::Config(format!("test_model {path}: {e}")))?
            .len();
    }
    if let Some(c) = cap {
        // Refuse a cap that cannot even hold the weights before loading them.
        memory::plan(&mcfg, &est, Some(c), 1, 1, Some(1), 0, Some(true))?;
    }
    let mut rec = Recorder::new(&cfg.out, progress);
    if let Some(n) = worked_note {
        rec.note(n);
    }

    rec.note("loading the rollout model".into());
    let serving = Arc::new(LoadedModel::load(model_path)?);
    if let Some(rss) = tern_runtime::memory::rss_bytes() {
        est.measured_base(rss);
    }
    let writer = match &cfg.test_model {
        Some(path) => {
            rec.note(format!("loading the test writer {path}"));
            Some(Arc::new(LoadedModel::load(Path::new(path))?))
        }
        None => None,
    };
    let tests_kv = tests_kv(cfg, writer.as_deref().unwrap_or(&serving), &train_tasks)?;
    if writer.is_some() {
        // Its own engine holds a step's test replies beside the rollouts.
        est.writer += tests_kv.step as u64;
    }
    let own_tests = if writer.is_none() {
        tests_kv
    } else {
        TestsKv::default()
    };
    let plan = plan_memory(
        cfg,
        &serving,
        &train_tasks,
        &kv_policy,
        (&mcfg, &est),
        cap,
        own_tests,
    )?;

    rec.note("loading the learner".into());
    let engine = EngineHandle::spawn(
        serving,
        EngineConfig {
            kv_memory: plan.rollout_kv_bytes,
            // A step's requests wait in one unit: its rollouts, and its
            // test replies when the policy writes them.
            max_queue: (batch_seqs(cfg) + own_tests.requests).max(64),
            ..EngineConfig::default()
        },
    );
    let learner = load_learner(cfg, model_path, &engine, plan.recompute)?;
    memory::check(cap, "loading the weights")?;
    rec.note(format!(
        "loaded: resident {} (peak {})",
        fmt_bytes(tern_runtime::memory::rss_bytes()),
        fmt_bytes(tern_runtime::memory::peak_rss_bytes())
    ));

    let names: Vec<String> = learner.params().into_iter().map(|(n, _)| n).collect();
    let (mut opt, start, mut data_state) =
        optimizer_state(cfg, &learner, &names, resumed.as_ref(), &mut rec)?;
    let fleet = connect_fleet(cfg, &kv_policy, rollout_key, &mut rec)?;
    if let (Some(et), 0, false) = (&eval_tasks, start, cfg.dry_run) {
        rec.evaluate(When::Before, 0, &engine, &learner, cfg, et)?;
    }

    rec.start(
        start,
        // A dry run does one step's rollouts only.
        if cfg.dry_run { start + 1 } else { cfg.steps },
        &plan,
        learner.param_count(),
    );
    let test_engine = writer.map(|model| {
        EngineHandle::spawn(
            model,
            EngineConfig {
                kv_memory: tests_kv.step.max(tests_kv.request).max(1 << 20),
                max_queue: tests_kv.requests.max(64),
                ..EngineConfig::default()
            },
        )
    });
    let test_writer = match cfg.reward {
        crate::reward::Reward::GeneratedTests(k) => Some(crate::reward::TestWriter {
            engine: test_engine.as_ref().unwrap_or(&engine),
            k,
            max_tokens: cfg.max_new_tokens,
            temperature: cfg.temperature,
        }),
        crate::reward::Reward::Task => None,
    };
    let ctx = Context {
        cfg,
        tasks: &train_tasks,
        engine: &engine,
        fleet: fleet.as_ref(),
        kv_policy: &kv_policy,
        replay_kv,
        cap,
        plan: &plan,
        est: &est,
        mcfg: &mcfg,
        tests: test_writer.as_ref(),
    };
    let mut last_dir = cfg.out.clone();
    for step in start..cfg.steps {
        let (picks, replayed) = step_inputs(cfg, &data_state, step, train_tasks.len());
        let out = step::run(&ctx, &learner, &mut opt, step, &picks, replayed)?;
        for &(task, mean) in &out.pass_rates {
            data_state.rates.update(task, mean, cfg.pass_rate_alpha);
        }
        rec.tests(&out.tests)?;
        rec.step(&out.metrics)?;
        if out.dry_run {
            return Ok(Summary {
                steps: start,
                checkpoint: cfg.out.clone(),
                eval: rec.eval,
                peak_rss_bytes: out.metrics.peak_rss_bytes,
            });
        }
        // This step's fresh groups join the replay buffer with their pi_old.
        for g in out.fresh {
            data_state.replay.push(g);
        }
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
        rec.evaluate(When::After, cfg.steps as u64, &engine, &learner, cfg, et)?;
    }
    Ok(Summary {
        steps: cfg.steps,
        checkpoint: last_dir,
        eval: rec.eval,
        peak_rss_bytes: memory::check(cap, "the final evaluation")?,
    })
}

/// The optimizer, the first step to run and the data state: fresh, or as the
/// checkpoint being resumed left them.
fn optimizer_state(
    cfg: &TrainConfig,
    learner: &Learner,
    names: &[String],
    resumed: Option<&Checkpoint>,
    rec: &mut Recorder<'_>,
) -> Result<(AdamW, usize, DataState)> {
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
    if let Some(ck) = resumed {
        restore(learner, &mut opt, names, ck)?;
        start = ck.state.step;
        data_state = ck.state.data.clone();
        rec.note(format!("resumed after step {start}"));
    }
    rec.resume_at(start)?;
    Ok((opt, start, data_state))
}

/// Step `step`'s tasks (difficulty-aware selection) and the groups replayed
/// from earlier steps into its batch.
fn step_inputs(
    cfg: &TrainConfig,
    data_state: &DataState,
    step: usize,
    n_tasks: usize,
) -> (Vec<usize>, Vec<Vec<crate::data::Replayed>>) {
    let picks = data::pick(
        cfg.selection,
        &data_state.rates,
        cfg.seed,
        step,
        n_tasks,
        cfg.prompts_per_step,
    );
    let replays = cfg.algorithm == Algorithm::Grpo && cfg.replay_share > 0.0;
    let replayed = if replays {
        let k = (cfg.replay_share * cfg.prompts_per_step as f64).round() as usize;
        data_state.replay.sample(cfg.seed, step, k)
    } else {
        Vec::new()
    };
    (picks, replayed)
}

/// Refuses, before anything loads, a task set the run's reward or
/// algorithm cannot train on.
fn check_tasks(cfg: &TrainConfig, train_tasks: &[Task]) -> Result<()> {
    // A code problem without tests or answer (only a prelude) can be judged
    // only by tests a model writes.
    if cfg.reward == crate::reward::Reward::Task {
        if let Some(i) = train_tasks
            .iter()
            .position(|t| t.answer.is_empty() && t.tests.is_empty() && t.sheet.is_none())
        {
            return Err(TrainError::Config(format!(
                "task {} has neither an answer nor tests: give --reward generated_tests:K \
                 (tests a model writes) to train on code problems without tests",
                i + 1
            )));
        }
    }
    // Spreadsheet tasks are judged on their workbooks, not by unit tests.
    if cfg.reward != crate::reward::Reward::Task && train_tasks.iter().any(|t| t.sheet.is_some()) {
        return Err(TrainError::Config(
            "spreadsheet tasks are rewarded by their test-case workbooks: train them with \
             --reward task"
                .into(),
        ));
    }
    // SFT writes "The answer is X" for a task: code tasks have no such line.
    if cfg.algorithm == Algorithm::Sft
        && train_tasks.iter().any(|t| t.is_code() || t.sheet.is_some())
    {
        return Err(TrainError::Config(
            "sft needs answer tasks: code and spreadsheet tasks (graded by running their \
             programs) train with grpo"
                .into(),
        ));
    }
    Ok(())
}

/// The learner: its own f32 copy of the weights (full fine-tuning, or
/// `learner_weights = f32`), else the rollout engine's quantized model
/// under LoRA adapters.
fn load_learner(
    cfg: &TrainConfig,
    model_path: &Path,
    engine: &EngineHandle,
    recompute: bool,
) -> Result<Learner> {
    let mut learner = if cfg.full || cfg.learner_weights == LearnerWeights::F32 {
        Learner::load_as(
            model_path,
            &cfg.targets(),
            cfg.lora_rank,
            cfg.lora_alpha,
            cfg.seed,
            Precision::DenseF32,
        )?
    } else {
        // One copy of the quantized weights serves the rollouts and the learner.
        Learner::with_model(
            engine.model().clone(),
            &cfg.targets(),
            cfg.lora_rank,
            cfg.lora_alpha,
            cfg.seed,
        )?
    };
    learner.set_prompt_chunk(engine.config().prompt_chunk());
    learner.set_recompute(recompute);
    learner.set_temperature(cfg.temperature as f64);
    Ok(learner)
}

/// The rollout workers of `rollout_endpoints`, connected and told where
/// adapters are published; none without endpoints.
fn connect_fleet(
    cfg: &TrainConfig,
    kv_policy: &KvPolicy,
    api_key: Option<String>,
    rec: &mut Recorder<'_>,
) -> Result<Option<crate::fleet::Fleet>> {
    if cfg.rollout_endpoints.is_empty() {
        return Ok(None);
    }
    let fleet = crate::fleet::Fleet::connect(
        &cfg.rollout_endpoints,
        &crate::fleet::FleetConfig {
            timeout: std::time::Duration::from_secs(cfg.rollout_timeout_secs),
            kv_policy: kv_policy.to_string(),
            adapters: cfg.out.join("adapters"),
            stale: cfg.stale_rollouts,
            api_key,
        },
    )?;
    rec.note(format!(
        "rolling out on {} (adapters published from {})",
        fleet.urls().join(", "),
        cfg.out.join("adapters").display()
    ));
    Ok(Some(fleet))
}

/// KV cache the test replies of `generated_tests:K` need: a step's
/// `prompts_per_step x K` replies at once, and the largest single request
/// (up to `MAX_N` replies, which must fit whole). Zero for other rewards.
#[derive(Clone, Copy, Debug, Default)]
struct TestsKv {
    step: usize,
    request: usize,
    /// Engine requests a step's replies take (K in requests of `MAX_N`).
    requests: usize,
}

/// [`TestsKv`] for the tests `writer` would write for `tasks`: each reply
/// reserves its prompt (the longest task's) plus the reply cap under a full
/// cache, as the engine reserves it.
fn tests_kv(cfg: &TrainConfig, writer: &LoadedModel, tasks: &[Task]) -> Result<TestsKv> {
    let crate::reward::Reward::GeneratedTests(k) = cfg.reward else {
        return Ok(TestsKv::default());
    };
    let spec = tern_solve::reasoning::TestSpec {
        k: 1,
        max_tokens: cfg.max_new_tokens,
        temperature: cfg.temperature,
        top_p: 0.95,
    };
    let mut longest = 0;
    for t in tasks {
        let reqs =
            tern_solve::reasoning::test_requests(writer, crate::reward::problem(t), 0, &spec)
                .map_err(|e| TrainError::Config(e.to_string()))?;
        longest = reqs
            .iter()
            .map(|r| r.prompt.len())
            .fold(longest, usize::max);
    }
    let per_reply = SeqCache::reservation_bytes(
        writer.config(),
        &KvPolicy::Full,
        tern_runtime::kv::KvDtype::default(),
        longest,
        cfg.max_new_tokens,
        DEFAULT_PREFILL_CHUNK,
    )
    .max(1);
    Ok(TestsKv {
        step: cfg.prompts_per_step * k * per_reply,
        request: k.min(tern_runtime::engine::MAX_N) * per_reply,
        requests: cfg.prompts_per_step * k.div_ceil(tern_runtime::engine::MAX_N),
    })
}

/// Saves the learner, the optimizer and the data state after `step` steps
/// (keeping the last two checkpoints); returns its directory.
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

/// `b` as a size, or `?` where the platform does not say.
fn fmt_bytes(b: Option<u64>) -> String {
    b.map(|b| tern_runtime::size::format_size(b as usize))
        .unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(answer: &str, target: Option<&str>) -> Task {
        let json = match target {
            Some(t) => format!(r#"{{"question":"q","answer":"{answer}","target":"{t}"}}"#),
            None => format!(r#"{{"question":"q","answer":"{answer}"}}"#),
        };
        serde_json::from_str(&json).unwrap()
    }

    #[test]
    fn sft_on_synthesis_data_keeps_bare_answers_unless_told_worked_only() {
        let cfg = TrainConfig {
            algorithm: Algorithm::Sft,
            ..TrainConfig::default()
        };
        let mixed = vec![task("1", None), task("2", Some("2 so 2")), task("3", None)];
        let (kept, note) = sft_targets(&cfg, mixed.clone());
        assert_eq!(kept.len(), 3);
        assert!(note
            .unwrap()
            .contains("the other 2 train on their answer line"));
        // Worked only: the paper's recipe.
        let worked = TrainConfig {
            sft_bare_answers: false,
            ..cfg.clone()
        };
        let (kept, note) = sft_targets(&worked, mixed.clone());
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].answer, "2");
        assert!(note.unwrap().contains("1 of 3"));
        // No targets at all: every task's answer line, as plain SFT does.
        let plain = vec![task("1", None), task("2", None)];
        assert_eq!(sft_targets(&worked, plain.clone()), (plain, None));
        // GRPO rewards correctness on every prompt; it keeps them all.
        let grpo = TrainConfig {
            algorithm: Algorithm::Grpo,
            sft_bare_answers: false,
            ..TrainConfig::default()
        };
        assert_eq!(sft_targets(&grpo, mixed.clone()).0.len(), 3);
    }

    #[test]
    fn an_unwritable_out_dir_is_refused() {
        let e = prepare_out(Path::new("/proc/tern-cannot-write")).unwrap_err();
        assert!(e.to_string().contains("output directory"), "{e}");
    }
}
