//! What a run leaves behind and tells its caller: `metrics.jsonl` (one line
//! per step, cut back to the resumed step on resume), `tests.jsonl` (under
//! `generated_tests:K`, one line per group: the tests a model wrote and the
//! pass matrix its rewards came from, cut back alike), `eval.json` (held-out
//! accuracy before and after training) and the [`Progress`] callbacks. The
//! driver decides when; this module decides how each record is written.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_solve::eval;
use tern_solve::tasks::Task;

use crate::config::TrainConfig;
use crate::error::{Result, TrainError};
use crate::learner::Learner;
use crate::memory::Plan;
use crate::metrics::StepMetrics;
use crate::rollout::{self, RolloutSpec};

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
    /// The rollouts' KV policy when it is not `full`: the held-out tasks are
    /// then also scored under it (the model as it will be served sparse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// `before`, decoding under `policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_policy: Option<f64>,
    /// `after`, decoding under `policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_policy: Option<f64>,
}

/// When a held-out evaluation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// With the weights the run starts from.
    Before,
    /// After the last step.
    After,
}

/// A run's records in its output directory, and the caller's progress
/// callback.
pub struct Recorder<'p> {
    metrics_path: PathBuf,
    tests_path: PathBuf,
    eval_path: PathBuf,
    /// Held-out accuracy so far.
    pub eval: EvalReport,
    progress: &'p mut dyn FnMut(Progress<'_>),
}

impl<'p> Recorder<'p> {
    /// Records into `out`; nothing is read or written yet.
    pub fn new(out: &Path, progress: &'p mut dyn FnMut(Progress<'_>)) -> Self {
        Recorder {
            metrics_path: out.join("metrics.jsonl"),
            tests_path: out.join("tests.jsonl"),
            eval_path: out.join("eval.json"),
            eval: EvalReport::default(),
            progress,
        }
    }

    /// Picks the records up after step `start`: `metrics.jsonl` keeps the
    /// lines of steps `<= start` (a resumed run rewrites the rest), and a
    /// resumed run keeps the `before` accuracy it measured.
    pub fn resume_at(&mut self, start: usize) -> Result<()> {
        truncate_steps(&self.metrics_path, start)?;
        truncate_steps(&self.tests_path, start)?;
        if start > 0 {
            self.eval = std::fs::read_to_string(&self.eval_path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default();
        }
        Ok(())
    }

    /// Passes a status line on.
    pub fn note(&mut self, line: String) {
        (self.progress)(Progress::Note(line));
    }

    /// Says the run is about to take its first step.
    pub fn start(&mut self, from: usize, steps: usize, plan: &Plan, params: usize) {
        (self.progress)(Progress::Start {
            from,
            steps,
            plan,
            params,
        });
    }

    /// Appends a finished step's line and passes it on.
    pub fn step(&mut self, m: &StepMetrics) -> Result<()> {
        append_lines(&self.metrics_path, std::slice::from_ref(m))?;
        (self.progress)(Progress::Step(m));
        Ok(())
    }

    /// Appends a step's groups' tests and pass matrices (nothing when the
    /// rewards did not come from model-written tests).
    pub fn tests(&mut self, lines: &[crate::reward::TestsLine]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        append_lines(&self.tests_path, lines)
    }

    /// Scores `tasks` with the learner's current weights (as adapter version
    /// `version`) and writes `eval.json`.
    pub fn evaluate(
        &mut self,
        when: When,
        version: u64,
        engine: &EngineHandle,
        learner: &Learner,
        cfg: &TrainConfig,
        tasks: &[Task],
    ) -> Result<()> {
        self.note(format!("scoring {} held-out tasks", tasks.len()));
        engine.set_adapters(version, learner.adapters_snapshot()?)?;
        self.eval.tasks = tasks.len();
        let accuracy = Some(evaluate(engine, cfg, tasks, &KvPolicy::Full)?);
        let policy: KvPolicy = cfg
            .rollout_kv_policy
            .parse()
            .map_err(|e| TrainError::Config(format!("rollout_kv_policy: {e}")))?;
        let sparse = if policy == KvPolicy::Full {
            None
        } else {
            self.note(format!("scoring them under {}", cfg.rollout_kv_policy));
            self.eval.policy = Some(cfg.rollout_kv_policy.clone());
            Some(evaluate(engine, cfg, tasks, &policy)?)
        };
        match when {
            When::Before => (self.eval.before, self.eval.before_policy) = (accuracy, sparse),
            When::After => (self.eval.after, self.eval.after_policy) = (accuracy, sparse),
        }
        write_json(&self.eval_path, &self.eval)
    }
}

/// Share of `tasks` the engine's current weights solve greedily under the KV
/// `policy` (see [`rollout::solved`]), summed as `tern eval` sums its
/// `single` strategy.
fn evaluate(
    engine: &EngineHandle,
    cfg: &TrainConfig,
    tasks: &[Task],
    policy: &KvPolicy,
) -> Result<f64> {
    let greedy = eval::Strategy::single();
    let mut totals = eval::Totals::default();
    let picks: Vec<usize> = (0..tasks.len()).collect();
    for chunk in picks.chunks(16) {
        let spec = RolloutSpec {
            group_size: 1,
            max_new_tokens: cfg.max_new_tokens,
            temperature: 1e-6,
            kv_policy: policy,
            system: cfg.system_prompt.as_deref(),
            record_evictions: false,
            tests: None,
        };
        let (groups, secs) = rollout::rollout(engine, tasks, chunk, &spec, cfg.seed)?;
        for g in &groups {
            let r = &g.rollouts[0];
            let grade = rollout::grade(&r.text, &tasks[g.task])?;
            let rec = eval::Record::single(&greedy, g.task, grade, r.tokens.len(), secs);
            totals.add(&greedy, &rec);
        }
    }
    Ok(eval::rows(&[greedy], &[totals], tasks.len())[0].accuracy)
}

/// Appends one JSON line per item of `lines`, synced.
fn append_lines<T: Serialize>(path: &Path, lines: &[T]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    for v in lines {
        let line = serde_json::to_string(v).map_err(|e| TrainError::Config(e.to_string()))?;
        writeln!(f, "{line}")?;
    }
    f.sync_data()?;
    Ok(())
}

/// Keeps the lines of steps `<= keep` (each line's `step` field).
fn truncate_steps(path: &Path, keep: usize) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let step = |l: &str| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64))
    };
    let kept: String = text
        .lines()
        .filter(|l| step(l).is_some_and(|s| s as usize <= keep))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept)?;
    Ok(())
}

/// Writes `v` to `path` whole or not at all (through a renamed temporary).
fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_string_pretty(v).map_err(|e| TrainError::Config(e.to_string()))?,
    )?;
    std::fs::rename(tmp, path)?;
    Ok(())
}
