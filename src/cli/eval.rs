//! `tern eval`: accuracy, tokens spent and wall time of answer strategies
//! (single sample, majority@N, synthesize@N, adaptive width, adaptive length)
//! on a JSONL task file or a built-in generator,
//! each line `{"question"|"prompt": ..., "answer": ...}` (GSM8K's `#### X`
//! answers work as they are).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::reasoning::{
    best_of_n_shared, best_of_n_with, Aggregate, BonRequest, BonResult, Effort, LengthPolicy,
};
use tern_runtime::sampler::SamplingParams;
use tern_runtime::tasks::{self, Task};
use tern_runtime::verify;

use super::args::EvalArgs;
use super::resolve;

/// One way to answer.
#[derive(Clone, Debug)]
struct Strategy {
    label: String,
    n: usize,
    aggregate: Aggregate,
    adaptive: bool,
    /// Candidates per wave when adaptive (`adaptive@N:wave=W`, default 2).
    wave: usize,
    length: Option<LengthPolicy>,
}

/// Adaptive width's default wave: 2 candidates per engine request, as `tern bon`.
const DEFAULT_WAVE: usize = 2;

/// `length@EFFORT`: one greedy sample under adaptive length, EFFORT an effort
/// name or a bare token cap.
fn parse_length(s: &str, effort: &str, probe_every: usize) -> Result<Strategy> {
    let policy = match effort.parse::<usize>() {
        Ok(cap) => LengthPolicy::new(None, Some(cap), probe_every)?,
        Err(_) => {
            let e: Effort = effort
                .parse()
                .map_err(|e: String| anyhow::anyhow!("strategy `{s}`: {e}"))?;
            LengthPolicy::new(Some(e), None, probe_every)?
        }
    };
    Ok(Strategy {
        label: s.to_string(),
        n: 1,
        aggregate: Aggregate::Majority,
        adaptive: false,
        wave: DEFAULT_WAVE,
        length: policy,
    })
}

fn parse_strategy(s: &str, probe_every: usize) -> Result<Strategy> {
    if let Some(effort) = s.strip_prefix("length@") {
        return parse_length(s, effort, probe_every);
    }
    // `adaptive@8:wave=1`: options after the count, as in policy specs.
    let (head, options) = match s.split_once(':') {
        Some((head, options)) => (head, Some(options)),
        None => (s, None),
    };
    let (name, n) = match head.split_once('@') {
        Some((name, n)) => (
            name,
            n.parse::<usize>()
                .with_context(|| format!("strategy `{s}`: `{n}` is not a count"))?,
        ),
        None => (head, 8),
    };
    let (n, aggregate, adaptive) = match name {
        "single" => (1, Aggregate::Majority, false),
        "majority" => (n, Aggregate::Majority, false),
        "synthesize" => (n, Aggregate::Synthesize, false),
        "adaptive" => (n, Aggregate::Majority, true),
        "reward" => (n, Aggregate::Reward, false),
        other => bail!(
            "unknown strategy `{other}`: use single, majority@N, synthesize@N, adaptive[@N], reward@N (code tasks) or length@EFFORT"
        ),
    };
    if n == 0 || n > tern_runtime::engine::MAX_N {
        bail!("strategy `{s}`: N must be between 1 and 16");
    }
    let mut wave = DEFAULT_WAVE.min(n);
    if let Some(options) = options {
        if !adaptive {
            bail!("strategy `{s}`: only adaptive@N takes options (`:wave=W`)");
        }
        for kv in options.split(':') {
            match kv.split_once('=') {
                Some(("wave", w)) => {
                    wave = w
                        .parse::<usize>()
                        .ok()
                        .filter(|w| (1..=n).contains(w))
                        .with_context(|| {
                            format!("strategy `{s}`: wave must be a count from 1 to {n}, got `{w}`")
                        })?
                }
                _ => bail!("strategy `{s}`: unknown option `{kv}` (adaptive@N takes wave=W)"),
            }
        }
    }
    Ok(Strategy {
        label: s.to_string(),
        n,
        aggregate,
        adaptive,
        wave,
        length: None,
    })
}

/// Code tasks are graded by their tests, so their strategies are `single`
/// (or `length@`) and `reward@N`; a vote or a synthesis needs answers to
/// compare, and `reward@N` needs tests.
fn check_strategies_fit(strategies: &[Strategy], tasks: &[(usize, Task)]) -> Result<()> {
    let code = tasks.iter().filter(|(_, t)| t.is_code()).count();
    for s in strategies {
        if code > 0 && s.n > 1 && s.aggregate != Aggregate::Reward {
            bail!(
                "strategy `{}` compares answers, but these are code tasks graded by tests: use single or reward@N",
                s.label
            );
        }
        if code < tasks.len() && s.aggregate == Aggregate::Reward {
            bail!(
                "strategy `{}` scores candidates by unit tests: it needs code tasks (HumanEval-style records)",
                s.label
            );
        }
    }
    Ok(())
}

/// The tasks numbered `offset..offset + limit` of `source`.
fn read_tasks(source: &str, offset: usize, limit: usize) -> Result<Vec<(usize, Task)>> {
    let tasks = tasks::load(source)?;
    if offset > 0 && offset >= tasks.len() {
        bail!(
            "--offset {offset} skips every task: {source} has {}",
            tasks.len()
        );
    }
    Ok(tasks
        .into_iter()
        .enumerate()
        .skip(offset)
        .take(limit)
        .collect())
}

/// One strategy's result on one task: a line of `--records`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    strategy: String,
    /// The task's index in the whole file.
    task: usize,
    ok: bool,
    answer: Option<String>,
    want: String,
    tokens: usize,
    candidates: usize,
    probes: usize,
    stopped_early: usize,
    tokens_saved: usize,
    /// Wall time of the run that produced it (a shared sample set's whole time).
    seconds: f64,
    /// Produced from candidates shared with the other strategies of its group.
    shared: bool,
}

/// The records already in `path` (none if it does not exist), by (strategy, task).
fn load_records(path: &Path) -> Result<HashMap<(String, usize), Record>> {
    let mut out = HashMap::new();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Record = serde_json::from_str(line).with_context(|| {
            format!(
                "{}:{}: not a record written by `tern eval --records`",
                path.display(),
                n + 1
            )
        })?;
        out.insert((r.strategy.clone(), r.task), r);
    }
    Ok(out)
}

/// Strategies that run together: a group of several majority / synthesize /
/// adaptive strategies with the same N shares one set of N samples per task
/// (see `reasoning::best_of_n_shared`); everything else runs alone.
fn plan(strategies: &[Strategy]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, s) in strategies.iter().enumerate() {
        let shareable = s.n > 1 && s.length.is_none();
        let joined = shareable
            && groups.iter_mut().any(|g| {
                let first = &strategies[g[0]];
                let fits = first.n == s.n && first.n > 1 && first.length.is_none();
                if fits {
                    g.push(i);
                }
                fits
            });
        if !joined {
            groups.push(vec![i]);
        }
    }
    groups
}

/// One strategy's results.
#[derive(Debug, Serialize)]
struct Row {
    strategy: String,
    tasks: usize,
    correct: usize,
    accuracy: f64,
    tokens: usize,
    tokens_per_task: f64,
    candidates_per_task: f64,
    /// Adaptive width: tasks whose vote settled before all N samples were drawn.
    width_stops: usize,
    /// Adaptive length: answer probes per task, tasks whose probes stopped
    /// the reasoning early, reasoning tokens those early stops saved.
    probes_per_task: f64,
    stopped_early: usize,
    tokens_saved: usize,
    seconds: f64,
    /// Its candidates were shared with the other strategies of its group, so
    /// `seconds` is the shared sampling's time, not its own.
    shared_samples: bool,
    /// Against the first strategy listed (absent on its own row): tasks this
    /// one gets right where that one is wrong, and the other way round.
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_first: Option<HeadToHead>,
}

/// Task by task against a baseline: where two strategies' verdicts differ.
#[derive(Debug, Serialize)]
struct HeadToHead {
    baseline: String,
    wins: usize,
    losses: usize,
}

/// Totals of one strategy over the tasks.
#[derive(Default)]
struct Acc {
    correct: usize,
    tokens: usize,
    used: usize,
    /// Tasks an adaptive-width strategy answered with fewer than its N samples.
    width_stops: usize,
    probes: usize,
    early: usize,
    saved: usize,
    seconds: f64,
    shared: bool,
    /// The tasks it got right, for the head-to-head line.
    right: std::collections::BTreeSet<usize>,
}

impl Acc {
    fn add(&mut self, s: &Strategy, r: &Record) {
        self.correct += r.ok as usize;
        self.width_stops += (s.adaptive && r.candidates < s.n) as usize;
        if r.ok {
            self.right.insert(r.task);
        }
        self.tokens += r.tokens;
        self.used += r.candidates;
        self.probes += r.probes;
        self.early += r.stopped_early;
        self.saved += r.tokens_saved;
        self.seconds += r.seconds;
        self.shared |= r.shared;
    }
}

fn record(
    s: &Strategy,
    i: usize,
    task: &Task,
    res: &BonResult,
    secs: f64,
    shared: bool,
) -> Result<Record> {
    // Code tasks: the chosen response's program against every test.
    let (ok, answer, want) = if task.is_code() {
        let program = task.program(&verify::extract_code(&res.text));
        let r = verify::judge_python(&program, &task.tests, &verify::Limits::default())
            .context("judging a code task")?;
        let got = format!("{}/{} tests", r.passed, r.total);
        (r.passed == r.total, Some(got), format!("{} tests", r.total))
    } else {
        let ok = res
            .answer
            .as_deref()
            .is_some_and(|got| verify::answers_match(got, &task.answer));
        (ok, res.answer.clone(), task.answer.clone())
    };
    let lengths = res.candidates.iter().filter_map(|c| c.length.as_ref());
    Ok(Record {
        strategy: s.label.clone(),
        task: i,
        ok,
        answer,
        want,
        tokens: res.tokens,
        candidates: res.candidates.len(),
        probes: lengths.clone().map(|l| l.probes.len()).sum(),
        stopped_early: lengths.clone().filter(|l| l.stopped_early).count(),
        tokens_saved: lengths.map(|l| l.tokens_saved).sum(),
        seconds: secs,
        shared,
    })
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &EvalArgs) -> Result<()> {
    let strategies: Vec<Strategy> = a
        .strategy
        .iter()
        .map(|s| parse_strategy(s, a.probe_every))
        .collect::<Result<_>>()?;
    if a.limit == 0 {
        bail!("--limit 0 evaluates no task: give at least 1");
    }
    let tasks = read_tasks(&a.task, a.offset, a.limit)?;
    check_strategies_fit(&strategies, &tasks)?;
    let done = match &a.records {
        Some(p) => load_records(p)?,
        None => HashMap::new(),
    };
    if a.report {
        // Only tasks that every strategy has a record for, so the rows compare
        // the same tasks.
        let mut acc: Vec<Acc> = strategies.iter().map(|_| Acc::default()).collect();
        let mut complete = 0;
        for (i, _) in &tasks {
            let recs: Option<Vec<&Record>> = strategies
                .iter()
                .map(|s| done.get(&(s.label.clone(), *i)))
                .collect();
            if let Some(recs) = recs {
                complete += 1;
                for ((t, s), r) in acc.iter_mut().zip(&strategies).zip(recs) {
                    t.add(s, r);
                }
            }
        }
        if complete == 0 {
            bail!("no task in range has a record for every strategy asked for");
        }
        if !a.model.json {
            println!(
                "{complete} of {} tasks in range have a record for every strategy",
                tasks.len()
            );
        }
        return print_report(a, &strategies, &acc, complete);
    }
    let sink = match &a.records {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {} to append records", p.display()))?,
        ),
        None => None,
    };
    let model = resolve::load(&a.model.model)?;
    let engine = EngineHandle::spawn(Arc::new(model), EngineConfig::default());
    let synthesizer = resolve::synthesizer(a.synthesizer_model.as_deref())?;
    let synthesizer = synthesizer.as_ref().unwrap_or(&engine);
    let groups = plan(&strategies);
    // One task's records, in strategy order: those already on file, the rest
    // computed (and appended to the records file as soon as they exist).
    let sink = std::sync::Mutex::new(sink);
    let run_task = |i: usize, task: &Task| -> Result<Vec<(usize, Record)>> {
        let mut out = Vec::new();
        for group in &groups {
            let have: Vec<Option<Record>> = group
                .iter()
                .map(|&k| done.get(&(strategies[k].label.clone(), i)).cloned())
                .collect();
            let fresh = if have.iter().all(Option::is_some) {
                None
            } else {
                let lead = &strategies[group[0]];
                let req = BonRequest {
                    messages: vec![ChatMessage::new("user", task.question.as_str())],
                    n: lead.n,
                    sampling: SamplingParams {
                        temperature: if lead.n == 1 { 0.0 } else { a.temperature },
                        top_p: 0.95,
                        seed: a.seed.wrapping_add(i as u64 * 1000),
                        ..SamplingParams::default()
                    },
                    max_tokens: a.max_tokens,
                    aggregate: lead.aggregate,
                    adaptive: lead.adaptive,
                    wave: lead.wave,
                    kv_policy: a.kv.kv_policy.clone(),
                    tests: task.tests.clone(),
                    prelude: task.prelude.clone(),
                    length: lead.length.clone(),
                    cancel: Default::default(),
                };
                let t = Instant::now();
                let results = if group.len() > 1 {
                    let ways: Vec<(Aggregate, Option<usize>)> = group
                        .iter()
                        .map(|&k| {
                            let s = &strategies[k];
                            (s.aggregate, s.adaptive.then_some(s.wave))
                        })
                        .collect();
                    best_of_n_shared(&engine, synthesizer, &req, &ways)?
                } else {
                    vec![best_of_n_with(&engine, synthesizer, &req)?]
                };
                Some((results, t.elapsed().as_secs_f64()))
            };
            for (j, &k) in group.iter().enumerate() {
                let r = match (&have[j], &fresh) {
                    (Some(r), _) => r.clone(),
                    (None, Some((results, secs))) => {
                        let r =
                            record(&strategies[k], i, task, &results[j], *secs, group.len() > 1)?;
                        if let Some(f) = sink.lock().expect("records file lock").as_mut() {
                            writeln!(f, "{}", serde_json::to_string(&r)?)
                                .and_then(|()| f.flush())
                                .context("appending a record")?;
                        }
                        r
                    }
                    (None, None) => unreachable!("a group runs unless all its records exist"),
                };
                out.push((k, r));
            }
        }
        Ok(out)
    };
    // `--parallel` tasks in flight at once share the engine's batches; each
    // task's seeds are its own, so the records do not depend on it.
    let acc = std::sync::Mutex::new(
        strategies
            .iter()
            .map(|_| Acc::default())
            .collect::<Vec<_>>(),
    );
    let next = std::sync::atomic::AtomicUsize::new(0);
    let finished = std::sync::atomic::AtomicUsize::new(0);
    // Tasks some strategy has no record for yet: the ones that cost time, so
    // the estimate of the time left counts only them.
    let pending: std::collections::HashSet<usize> = tasks
        .iter()
        .filter(|(i, _)| {
            strategies
                .iter()
                .any(|s| !done.contains_key(&(s.label.clone(), *i)))
        })
        .map(|(i, _)| *i)
        .collect();
    if !done.is_empty() && !a.model.json {
        eprintln!(
            "{} of {} tasks already have every record; running the other {}",
            tasks.len() - pending.len(),
            tasks.len(),
            pending.len()
        );
    }
    let computed = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    let failed: std::sync::Mutex<Option<anyhow::Error>> = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..a.parallel.max(1) {
            scope.spawn(|| loop {
                if failed.lock().expect("error slot").is_some() {
                    return;
                }
                let pos = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some((i, task)) = tasks.get(pos) else {
                    return;
                };
                let recs = match run_task(*i, task) {
                    Ok(r) => r,
                    Err(e) => {
                        failed.lock().expect("error slot").get_or_insert(e);
                        return;
                    }
                };
                let n = finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                let mut left = String::new();
                if pending.contains(i) {
                    let c = computed.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    let rest = pending.len().saturating_sub(c);
                    if rest > 0 {
                        let secs = started.elapsed().as_secs_f64() / c as f64 * rest as f64;
                        left = format!(", ~{} left", human_secs(secs));
                    }
                }
                let mut acc = acc.lock().expect("totals lock");
                for (j, (k, r)) in recs.iter().enumerate() {
                    acc[*k].add(&strategies[*k], r);
                    if !a.model.json {
                        eprintln!(
                            "{:<14} task {:>4} ({}/{}): {} (got {}, want {}){}",
                            strategies[*k].label,
                            i + 1,
                            n,
                            tasks.len(),
                            if r.ok { "ok " } else { "no " },
                            r.answer.as_deref().unwrap_or("-"),
                            r.want,
                            if j + 1 == recs.len() {
                                left.as_str()
                            } else {
                                ""
                            }
                        );
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("error slot") {
        return Err(e);
    }
    let acc = acc.into_inner().expect("totals lock");
    print_report(a, &strategies, &acc, tasks.len())
}

/// `secs` as `2h05m`, `4m10s` or `35s`.
fn human_secs(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// Prints the table (or with `--json` one object) of `acc` over `tasks` tasks.
fn print_report(a: &EvalArgs, strategies: &[Strategy], acc: &[Acc], tasks: usize) -> Result<()> {
    let n = tasks as f64;
    let rows: Vec<Row> = strategies
        .iter()
        .zip(acc)
        .enumerate()
        .map(|(k, (s, t))| Row {
            strategy: s.label.clone(),
            tasks,
            correct: t.correct,
            accuracy: t.correct as f64 / n,
            tokens: t.tokens,
            tokens_per_task: t.tokens as f64 / n,
            candidates_per_task: t.used as f64 / n,
            width_stops: t.width_stops,
            probes_per_task: t.probes as f64 / n,
            stopped_early: t.early,
            tokens_saved: t.saved,
            seconds: t.seconds,
            shared_samples: t.shared,
            vs_first: (k > 0).then(|| HeadToHead {
                baseline: strategies[0].label.clone(),
                wins: t.right.difference(&acc[0].right).count(),
                losses: acc[0].right.difference(&t.right).count(),
            }),
        })
        .collect();
    if a.model.json {
        println!("{}", serde_json::json!({ "task": a.task, "rows": rows }));
        return Ok(());
    }
    println!(
        "{:<16} {:>6} {:>9} {:>12} {:>12} {:>10} {:>11} {:>8} {:>7} {:>9}",
        "strategy",
        "tasks",
        "accuracy",
        "tokens/task",
        "samples/task",
        "width-stop",
        "probes/task",
        "len-stop",
        "saved",
        "seconds"
    );
    for r in &rows {
        println!(
            "{:<16} {:>6} {:>8.1}% {:>12.1} {:>12.2} {:>10} {:>11.2} {:>8} {:>7} {:>9.1}",
            r.strategy,
            r.tasks,
            100.0 * r.accuracy,
            r.tokens_per_task,
            r.candidates_per_task,
            r.width_stops,
            r.probes_per_task,
            r.stopped_early,
            r.tokens_saved,
            r.seconds
        );
    }
    for r in &rows {
        if let Some(h) = &r.vs_first {
            println!(
                "{} vs {}: right where it is wrong on {} task(s), wrong where it is right on {}",
                r.strategy, h.baseline, h.wins, h.losses
            );
        }
    }
    let shared: Vec<&str> = rows
        .iter()
        .filter(|r| r.shared_samples)
        .map(|r| r.strategy.as_str())
        .collect();
    if !shared.is_empty() {
        println!(
            "({} sampled one set of candidates per task and scored it each its own way; \
             their seconds are that set's time, tokens what each would spend alone)",
            shared.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{human_secs, parse_strategy};

    #[test]
    fn adaptive_strategies_take_a_wave() {
        let s = parse_strategy("adaptive@8:wave=1", 64).unwrap();
        assert!(s.adaptive);
        assert_eq!((s.n, s.wave, s.label.as_str()), (8, 1, "adaptive@8:wave=1"));
        assert_eq!(parse_strategy("adaptive@8", 64).unwrap().wave, 2);
        assert_eq!(parse_strategy("adaptive@1", 64).unwrap().wave, 1);
        for bad in [
            "adaptive@8:wave=0",
            "adaptive@8:wave=9",
            "adaptive@8:wave=x",
            "adaptive@8:step=1",
            "majority@8:wave=1",
        ] {
            let e = parse_strategy(bad, 64).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn time_left_reads_at_a_glance() {
        assert_eq!(human_secs(35.4), "35s");
        assert_eq!(human_secs(250.0), "4m10s");
        assert_eq!(human_secs(7500.0), "2h05m");
        assert_eq!(human_secs(-3.0), "0s");
    }
}
