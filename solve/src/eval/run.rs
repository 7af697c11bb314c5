//! Answers a task set with every strategy through the engine: strategies that
//! can share samples share them, records already on file are not run again,
//! tasks run side by side in the engine's batches; each record is appended to
//! the records file as soon as it exists.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::reasoning::{
    allocate, best_of_n_generated_tests, best_of_n_shared_by, best_of_n_with,
    choose_by_generated_tests, disagreement, Aggregate, BonRequest, BonResult, TestSpec, Way,
    MAX_GENERATED_TESTS,
};
use crate::tasks::{self, Task};
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::EngineHandle;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;

use super::{share_samples, EvalError, Record, Records, Strategy, Totals};

/// How every strategy samples.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Sampling temperature of strategies with several candidates (a single
    /// candidate is greedy).
    pub temperature: f32,
    /// Base seed; task `i` samples from `seed + 1000 i`, so a task's
    /// candidates do not depend on which tasks run beside it.
    pub seed: u64,
    /// Most tokens per candidate.
    pub max_tokens: usize,
    /// The candidates' KV policy.
    pub kv_policy: KvPolicy,
    /// Tasks in flight at once.
    pub parallel: usize,
}

/// What a caller hears while an evaluation runs.
pub enum Event<'a> {
    /// Records were on file: `complete` of `total` tasks need nothing, the
    /// other `pending` run.
    Resuming {
        /// Tasks every strategy has a record for.
        complete: usize,
        /// Tasks in range.
        total: usize,
        /// Tasks that run.
        pending: usize,
    },
    /// A task's records are in, in strategy-group order.
    Task {
        /// Its index in the whole file.
        task: usize,
        /// Tasks finished so far, this one included.
        finished: usize,
        /// Tasks in range.
        total: usize,
        /// `(strategy index, record)` pairs.
        records: &'a [(usize, Record)],
        /// Estimated seconds left for the tasks still to run (from those
        /// that ran so far; absent when none is left or this one was on file).
        eta_secs: Option<f64>,
    },
}

/// The tasks numbered `offset..offset + limit` of `source`, with their numbers.
pub fn read_tasks(
    source: &str,
    offset: usize,
    limit: usize,
) -> Result<Vec<(usize, Task)>, EvalError> {
    let tasks = tasks::load(source)?;
    if offset > 0 && offset >= tasks.len() {
        return Err(EvalError::OffsetPastEnd {
            offset,
            tasks: source.to_string(),
            len: tasks.len(),
        });
    }
    Ok(tasks
        .into_iter()
        .enumerate()
        .skip(offset)
        .take(limit)
        .collect())
}

/// What to evaluate.
pub struct Plan<'a> {
    /// The tasks, with their numbers in the whole file.
    pub tasks: &'a [(usize, Task)],
    /// The strategies, in row order.
    pub strategies: &'a [Strategy],
    /// How they sample.
    pub settings: &'a Settings,
    /// Records already on file (not run again).
    pub done: &'a Records,
}

/// The engines an evaluation answers with.
#[derive(Clone, Copy)]
pub struct Engines<'a> {
    /// Samples the candidates.
    pub engine: &'a EngineHandle,
    /// Writes syntheses (may be `engine` itself).
    pub synthesizer: &'a EngineHandle,
    /// Synthesizers by name, for `synthesize@N:with=NAME`.
    pub named: &'a [(String, EngineHandle)],
    /// Writes the unit tests of `reward@N:tests=K` (may be `engine` itself).
    pub tester: &'a EngineHandle,
}

impl<'a> Engines<'a> {
    /// The synthesizer strategy `s` asks for.
    fn synthesizer_of(&self, s: &Strategy) -> Result<&'a EngineHandle, EvalError> {
        match &s.synthesizer {
            None => Ok(self.synthesizer),
            Some(name) => self
                .named
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, e)| e)
                .ok_or_else(|| EvalError::UnknownSynthesizer {
                    strategy: s.label.clone(),
                    name: name.clone(),
                }),
        }
    }
}

/// Runs every strategy of `plan` on every task that lacks a record,
/// appending new records to `sink`; returns each strategy's totals over all
/// the tasks.
pub fn run(
    plan: &Plan<'_>,
    engines: Engines<'_>,
    sink: Option<&mut (dyn Write + Send)>,
    on_event: &(dyn Fn(Event<'_>) + Sync),
) -> Result<Vec<Totals>, EvalError> {
    let Plan {
        tasks,
        strategies,
        settings,
        done,
    } = *plan;
    for s in strategies {
        engines.synthesizer_of(s)?;
    }
    let answers = Answers {
        strategies,
        settings,
        done,
        engines,
        groups: share_samples(strategies),
        dynamic: plan_dynamic(plan, engines.engine)?,
        sink: Mutex::new(sink),
    };
    // Tasks in flight at once share the engine's batches; each task's seeds
    // are its own, so the records do not depend on how many.
    let acc = Mutex::new(
        strategies
            .iter()
            .map(|_| Totals::default())
            .collect::<Vec<_>>(),
    );
    let finished = AtomicUsize::new(0);
    let pending = pending(plan);
    if !done.is_empty() {
        on_event(Event::Resuming {
            complete: tasks.len() - pending.len(),
            total: tasks.len(),
            pending: pending.len(),
        });
    }
    let computed = AtomicUsize::new(0);
    let started = Instant::now();
    super::pool::for_each(tasks, settings.parallel, |_, (i, task)| {
        let recs = answers.task(*i, task)?;
        let n = finished.fetch_add(1, Ordering::SeqCst) + 1;
        let mut eta_secs = None;
        if pending.contains(i) {
            let c = computed.fetch_add(1, Ordering::SeqCst) + 1;
            let rest = pending.len().saturating_sub(c);
            if rest > 0 {
                eta_secs = Some(started.elapsed().as_secs_f64() / c as f64 * rest as f64);
            }
        }
        let mut acc = acc.lock().expect("totals lock");
        for (k, r) in &recs {
            acc[*k].add(&strategies[*k], r);
        }
        on_event(Event::Task {
            task: *i,
            finished: n,
            total: tasks.len(),
            records: &recs,
            eta_secs,
        });
        Ok::<(), EvalError>(())
    })?;
    Ok(acc.into_inner().expect("totals lock"))
}

/// Tasks some strategy has no record for yet: the ones that cost time, so
/// the estimate of the time left counts only them.
fn pending(plan: &Plan<'_>) -> HashSet<usize> {
    plan.tasks
        .iter()
        .filter(|(i, _)| {
            plan.strategies
                .iter()
                .any(|s| !plan.done.contains_key(&(s.label.clone(), *i)))
        })
        .map(|(i, _)| *i)
        .collect()
}

/// Answers tasks one at a time (several run side by side): each task's
/// records, in strategy order, those already on file and the rest computed
/// and appended to the records file as soon as they exist.
struct Answers<'a, 'w> {
    strategies: &'a [Strategy],
    settings: &'a Settings,
    done: &'a Records,
    engines: Engines<'a>,
    /// Strategies that share samples, in row order.
    groups: Vec<Vec<usize>>,
    /// The dynamic strategies' first pass (see [`plan_dynamic`]).
    dynamic: HashMap<usize, Allocation>,
    /// Where new records are appended.
    sink: Mutex<Option<&'w mut (dyn Write + Send)>>,
}

impl Answers<'_, '_> {
    /// Task `i`'s `(strategy index, record)` pairs, group by group.
    fn task(&self, i: usize, task: &Task) -> Result<Vec<(usize, Record)>, EvalError> {
        let mut out = Vec::new();
        for group in &self.groups {
            let have: Vec<Option<Record>> = group
                .iter()
                .map(|&k| {
                    self.done
                        .get(&(self.strategies[k].label.clone(), i))
                        .cloned()
                })
                .collect();
            let fresh = if have.iter().all(Option::is_some) {
                None
            } else {
                Some(self.sample(group, i, task)?)
            };
            for (j, &k) in group.iter().enumerate() {
                let r = match (&have[j], &fresh) {
                    (Some(r), _) => r.clone(),
                    (None, Some((results, secs))) => {
                        let r = Record::new(
                            &self.strategies[k],
                            i,
                            task,
                            &results[j],
                            *secs,
                            group.len() > 1,
                        )?;
                        self.append(&r)?;
                        r
                    }
                    (None, None) => unreachable!("a group runs unless all its records exist"),
                };
                out.push((k, r));
            }
        }
        Ok(out)
    }

    /// One group's results on task `i` (one per strategy when the group
    /// shares samples, else the lead's alone) and the seconds they took.
    fn sample(
        &self,
        group: &[usize],
        i: usize,
        task: &Task,
    ) -> Result<(Vec<BonResult>, f64), EvalError> {
        let (engine, settings) = (self.engines.engine, self.settings);
        let lead = &self.strategies[group[0]];
        let req = request(lead, i, task, settings);
        let t = Instant::now();
        // Time spent on this task's candidates in the dynamic strategies'
        // first pass.
        let mut first_pass_secs = 0.0;
        let results = if group.len() > 1 {
            best_of_n_shared_by(engine, &req, &self.ways(group)?)?
        } else if let (true, Some(planned)) = (lead.dynamic, self.dynamic.get(&group[0])) {
            // Sampled in the first pass; this task's share of the
            // run's tests is known now.
            let (k, sampled, sample_secs) = planned
                .get(&i)
                .cloned()
                .expect("the first pass sampled every task without a record");
            let spec = test_spec(k, settings);
            let res = choose_by_generated_tests(self.engines.tester, &req, &spec, sampled)?;
            first_pass_secs = sample_secs;
            vec![res]
        } else if let Some(k) = lead.tests {
            // The tests are sampled as the candidates are (task i's
            // seeds, the run's temperature), from their own seeds.
            let spec = test_spec(k, settings);
            vec![best_of_n_generated_tests(
                engine,
                self.engines.tester,
                &req,
                &spec,
            )?]
        } else if lead.synthesizer.is_some() && lead.aggregate != Aggregate::Synthesize {
            // `single:with=NAME`: the named model answers alone.
            let by = self.engines.synthesizer_of(lead)?;
            vec![best_of_n_with(by, by, &req)?]
        } else {
            let by = self.engines.synthesizer_of(lead)?;
            vec![best_of_n_with(engine, by, &req)?]
        };
        Ok((results, t.elapsed().as_secs_f64() + first_pass_secs))
    }

    /// How each strategy of a sharing group aggregates the shared samples.
    fn ways(&self, group: &[usize]) -> Result<Vec<Way<'_>>, EvalError> {
        group
            .iter()
            .map(|&k| {
                let s = &self.strategies[k];
                let by = self.engines.synthesizer_of(s)?;
                Ok((
                    s.aggregate,
                    s.adaptive.then_some((s.wave, s.confidence)),
                    by,
                ))
            })
            .collect()
    }

    /// Appends `r` to the records file (when there is one) and flushes it.
    fn append(&self, r: &Record) -> Result<(), EvalError> {
        if let Some(f) = self.sink.lock().expect("records file lock").as_mut() {
            let line = serde_json::to_string(r).map_err(std::io::Error::other);
            line.and_then(|line| writeln!(f, "{line}"))
                .and_then(|()| f.flush())
                .map_err(EvalError::AppendRecord)?;
        }
        Ok(())
    }
}

/// The generated tests' settings: `k` tests sampled as the candidates are.
fn test_spec(k: usize, settings: &Settings) -> TestSpec {
    TestSpec {
        k,
        max_tokens: settings.max_tokens,
        temperature: settings.temperature,
        top_p: 0.95,
    }
}

/// The request strategy `lead` sends for task `i`: seeded `seed + 1000 i`,
/// greedy when it samples one candidate.
fn request(lead: &Strategy, i: usize, task: &Task, settings: &Settings) -> BonRequest {
    BonRequest {
        messages: vec![ChatMessage::new("user", task.question.as_str())],
        n: lead.n,
        sampling: SamplingParams {
            temperature: if lead.n == 1 {
                0.0
            } else {
                settings.temperature
            },
            top_p: 0.95,
            seed: settings.seed.wrapping_add(i as u64 * 1000),
            ..SamplingParams::default()
        },
        max_tokens: settings.max_tokens,
        aggregate: lead.aggregate,
        adaptive: lead.adaptive,
        wave: lead.wave,
        confidence: lead.confidence,
        kv_policy: settings.kv_policy.clone(),
        tests: task.tests.clone(),
        prelude: task.prelude.clone(),
        length: lead.length.clone(),
        cancel: Default::default(),
    }
}

/// Task index -> (tests, its candidates sampled, the seconds they took).
type Allocation = HashMap<usize, (usize, BonResult, f64)>;

/// The first pass of every `reward@N:tests=K:dynamic` strategy (by index):
/// every task's candidates (those on file read from its record, the rest
/// sampled now, `parallel` tasks at once), their disagreement, and the
/// run's `K x tasks` tests spread over the tasks by it
/// ([`allocate`], each task 1 to `MAX_GENERATED_TESTS`). The allocation is
/// over the tasks in range (`--offset`/`--limit`).
fn plan_dynamic(
    plan: &Plan<'_>,
    engine: &EngineHandle,
) -> Result<HashMap<usize, Allocation>, EvalError> {
    let mut out = HashMap::new();
    for (s_i, s) in plan.strategies.iter().enumerate() {
        let (true, Some(k)) = (s.dynamic, s.tests) else {
            continue;
        };
        let missing: Vec<&(usize, Task)> = plan
            .tasks
            .iter()
            .filter(|(i, _)| !plan.done.contains_key(&(s.label.clone(), *i)))
            .collect();
        if missing.is_empty() {
            continue;
        }
        // Sampled as `best_of_n_generated_tests` samples them.
        let sample = |i: usize, task: &Task| -> Result<(BonResult, f64), EvalError> {
            let req = BonRequest {
                aggregate: Aggregate::Majority,
                ..request(s, i, task, plan.settings)
            };
            let t = Instant::now();
            let res = best_of_n_with(engine, engine, &req)?;
            Ok((res, t.elapsed().as_secs_f64()))
        };
        let sampled: Mutex<HashMap<usize, (BonResult, f64)>> = Mutex::new(HashMap::new());
        super::pool::for_each(&missing, plan.settings.parallel, |_, (i, task)| {
            let r = sample(*i, task)?;
            sampled.lock().expect("samples").insert(*i, r);
            Ok::<(), EvalError>(())
        })?;
        let mut sampled = sampled.into_inner().expect("samples");
        let difficulty: Vec<usize> = plan
            .tasks
            .iter()
            .map(|(i, _)| match sampled.get(i) {
                Some((res, _)) => {
                    let texts: Vec<String> =
                        res.candidates.iter().map(|c| c.text.clone()).collect();
                    disagreement(&texts)
                }
                None => plan
                    .done
                    .get(&(s.label.clone(), *i))
                    .and_then(|r| r.generated_tests.as_ref())
                    .map_or(1, |g| disagreement(&g.candidates)),
            })
            .collect();
        let counts = allocate(&difficulty, k, MAX_GENERATED_TESTS);
        let alloc: Allocation = plan
            .tasks
            .iter()
            .zip(counts)
            .filter_map(|((i, _), n)| sampled.remove(i).map(|(res, secs)| (*i, (n, res, secs))))
            .collect();
        out.insert(s_i, alloc);
    }
    Ok(out)
}
