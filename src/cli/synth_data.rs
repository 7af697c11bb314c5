//! `tern synth-data`: training data for a synthesizer (the CoT-based
//! Synthesizer paper's recipe, `tern_solve::eval::synthesis_data`). Writes
//! one task line per kept example, which `tern train --task FILE` reads as
//! it is; a sidecar `FILE.sources` lists every task already done, so a run
//! that stops resumes where it was. `--control-of DATA` samples nothing: it
//! writes DATA's SFT-only control (the same problems and targets, asked
//! without the candidates) for `tern eval`'s `single:with=NAME`.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_solve::eval::{self, DataSettings, Keep, SynthesisExample};

use super::args::ModelArgs;
use super::resolve;

/// `tern synth-data`.
#[derive(Debug, Args)]
pub struct SynthDataArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Source tasks (answer tasks: a JSONL file or a generator such as
    /// `story:count=2000,seed=1,steps=1,cot=0`). Keep them apart from the
    /// evaluation's tasks (another generator seed; GSM8K test is for
    /// evaluation only).
    #[arg(long)]
    pub task: String,
    /// Use only the first N tasks (after --offset).
    #[arg(long, default_value_t = 200)]
    pub limit: usize,
    /// Skip the first N tasks (task numbers and seeds stay those of the whole set).
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// Candidates per task, sampled by --model as `tern eval`'s synthesize@N samples them.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=tern_runtime::engine::MAX_N as u64))]
    pub n: u64,
    /// Syntheses sampled per task by the synthesizer; the first correct one is
    /// the example's SFT `target`.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=tern_runtime::engine::MAX_N as u64))]
    pub k: u64,
    /// Which tasks become examples: `disagree` (the candidates give more than
    /// one answer, or their majority is wrong: what a synthesizer can fix) or `all`.
    #[arg(long, default_value = "disagree")]
    pub keep: Keep,
    /// The model that writes the syntheses (path or registry name; default:
    /// --model).
    #[arg(long)]
    pub synthesizer_model: Option<String>,
    /// Temperature of candidates and syntheses.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Base seed: task i's candidates use seed + 1000 i, as `tern eval` seeds them.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Most tokens per candidate and per synthesis.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Tasks in flight at once (they share the engine's batches; each keeps
    /// its own seeds, so the file is the same as with 1).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub parallel: u64,
    /// The training file to append kept examples to (JSON lines:
    /// `question`, `answer`, `target` and what the sampling found). With
    /// --control-of, the control file to write (it must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Build no data: read the synthesis data DATA (written by this command
    /// from --task) and write to --out its SFT-only control, every example
    /// with the same source task, answer and target but asked with the
    /// task's own question, no candidates shown. Train it as the synthesizer
    /// was trained (`tern train --task OUT --algorithm sft`, the same
    /// recipe), then compare `synthesize@8:with=trained` against
    /// `single:with=control` in one `tern eval`.
    #[arg(long, value_name = "DATA")]
    pub control_of: Option<PathBuf>,
}

/// `--control-of`: DATA's examples, each asked without its candidates.
fn write_control(a: &SynthDataArgs, data: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(data).with_context(|| format!("reading {}", data.display()))?;
    let examples: Vec<SynthesisExample> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{}:{}: not a line written by `tern synth-data`",
                    data.display(),
                    n + 1
                )
            })
        })
        .collect::<Result<_>>()?;
    if examples.is_empty() {
        bail!("{}: no examples to build a control from", data.display());
    }
    let tasks: Vec<_> = eval::read_tasks(&a.task, 0, usize::MAX)?
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let controls = eval::sft_controls(&examples, &tasks)
        .with_context(|| format!("{} against --task {}", data.display(), a.task))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&a.out)
        .with_context(|| format!("creating {} (it must not exist yet)", a.out.display()))?;
    for c in &controls {
        writeln!(out, "{}", serde_json::to_string(c)?)?;
    }
    out.flush()?;
    let with_target = controls.iter().filter(|c| c.target.is_some()).count();
    if a.model.json {
        let v = serde_json::json!({"control_of": data, "out": a.out,
            "examples": controls.len(), "with_target": with_target});
        println!("{v}");
    } else {
        println!(
            "{} examples ({with_target} with a worked target) asked without their candidates -> {}",
            controls.len(),
            a.out.display()
        );
    }
    Ok(())
}

/// `FILE.sources`: the task numbers already processed, kept or not.
fn sources_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".sources");
    PathBuf::from(p)
}

/// Tallies over the tasks this run processed.
#[derive(Default, serde::Serialize)]
struct Tally {
    tasks: usize,
    kept: usize,
    with_target: usize,
    majority_right: usize,
    any_candidate_right: usize,
    disagree: usize,
    tokens: usize,
}

impl Tally {
    fn add(&mut self, e: &SynthesisExample, kept: bool) {
        self.tasks += 1;
        self.kept += kept as usize;
        self.with_target += (kept && e.target.is_some()) as usize;
        self.majority_right += e.majority_right as usize;
        self.any_candidate_right += (e.candidates_right > 0) as usize;
        self.disagree += e.disagree as usize;
        self.tokens += e.tokens;
    }
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &SynthDataArgs) -> Result<()> {
    if let Some(data) = &a.control_of {
        return write_control(a, data);
    }
    if a.limit == 0 {
        bail!("--limit 0 builds nothing: give at least 1");
    }
    let tasks = eval::read_tasks(&a.task, a.offset, a.limit)?;
    if let Some((i, _)) = tasks.iter().find(|(_, t)| t.is_code()) {
        bail!("--task: synthesis data needs answer tasks; task {i} is a code task graded by tests");
    }
    let sources = sources_path(&a.out);
    let done: HashSet<usize> = match std::fs::read_to_string(&sources) {
        Ok(text) => text.lines().filter_map(|l| l.trim().parse().ok()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", sources.display())),
    };
    let todo: Vec<_> = tasks.iter().filter(|(i, _)| !done.contains(i)).collect();
    if !a.model.json && !done.is_empty() {
        eprintln!(
            "{} of {} tasks already processed ({}); building the other {}",
            tasks.len() - todo.len(),
            tasks.len(),
            sources.display(),
            todo.len()
        );
    }
    let open = |p: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("opening {} to append", p.display()))
    };
    let files = Mutex::new((open(&a.out)?, open(&sources)?));
    let model = resolve::load(&a.model.model)?;
    let engine = EngineHandle::spawn(Arc::new(model), EngineConfig::default());
    let synthesizer = resolve::synthesizer(a.synthesizer_model.as_deref())?;
    let synthesizer = synthesizer.as_ref().unwrap_or(&engine);
    let settings = DataSettings {
        n: a.n as usize,
        k: a.k as usize,
        temperature: a.temperature,
        seed: a.seed,
        max_tokens: a.max_tokens,
    };
    // Results are written in task order whatever finishes first, so the
    // training file does not depend on --parallel.
    let pending: Mutex<(usize, BTreeMap<usize, SynthesisExample>)> =
        Mutex::new((0, BTreeMap::new()));
    let tally = Mutex::new(Tally::default());
    let started = Instant::now();
    let write_ready = |slot: usize, e: SynthesisExample| -> Result<()> {
        let mut guard = pending.lock().expect("pending lock");
        let (next_slot, ready) = &mut *guard;
        ready.insert(slot, e);
        while let Some(e) = ready.remove(next_slot) {
            let kept = e.kept(a.keep);
            let mut f = files.lock().expect("file lock");
            if kept {
                writeln!(f.0, "{}", serde_json::to_string(&e)?)?;
                f.0.flush()?;
            }
            writeln!(f.1, "{}", e.source)?;
            f.1.flush()?;
            let mut t = tally.lock().expect("tally lock");
            t.add(&e, kept);
            if !a.model.json {
                eprintln!(
                    "task {:>5} ({}/{}): candidates right {}/{}, majority {}, syntheses right {}/{}{} [{:.0}s]",
                    e.source + 1,
                    t.tasks,
                    todo.len(),
                    e.candidates_right,
                    e.n,
                    if e.majority_right { "right" } else { "wrong" },
                    e.syntheses_right,
                    e.k,
                    if kept { ", kept" } else { "" },
                    started.elapsed().as_secs_f64()
                );
            }
            *next_slot += 1;
        }
        Ok(())
    };
    eval::pool::for_each(&todo, a.parallel as usize, |slot, &&(i, ref task)| {
        eval::synthesis_example(&engine, synthesizer, i, task, &settings)
            .map_err(anyhow::Error::from)
            .and_then(|e| write_ready(slot, e))
    })?;
    let t = tally.into_inner().expect("tally lock");
    if a.model.json {
        let mut v = serde_json::to_value(&t)?;
        v["out"] = serde_json::json!(a.out);
        v["seconds"] = serde_json::json!(started.elapsed().as_secs_f64());
        println!("{v}");
    } else {
        println!(
            "{} tasks: kept {} ({} with a correct synthesis as target); majority right on {}, some candidate right on {}, candidates disagreeing on {}; {} tokens in {:.0}s -> {}",
            t.tasks,
            t.kept,
            t.with_target,
            t.majority_right,
            t.any_candidate_right,
            t.disagree,
            t.tokens,
            started.elapsed().as_secs_f64(),
            a.out.display()
        );
    }
    Ok(())
}
