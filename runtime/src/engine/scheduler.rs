//! The engine loop: intake, cancellation, admission under the KV budget, one
//! ragged forward per step, sampling and events.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::metrics::PolicyKv;
use super::sequence::{Completion, Limits};
use super::think::{Probe, ThinkSpec, ThinkState};
use super::{Command, Event, Pending, Shared, SubmitRequest};
use crate::backend::{Backend, LogitsWanted, Row, SeqId};
use crate::error::Result;
use crate::kv::cache::SeqCache;
use crate::kv::policy::KvPolicy;
use crate::model::LoadedModel;
use crate::sampler::SamplingParams;

/// An admitted request.
struct Running {
    req: SubmitRequest,
    events: UnboundedSender<Event>,
    reserve: usize,
    submitted: Instant,
    stop_ids: Vec<u32>,
    /// The prompt's sequence and how much of the prompt it holds, while reading it.
    prefill: Option<(SeqId, usize)>,
    /// Live completions (finished ones are removed and their sequences freed).
    completions: Vec<Completion>,
    /// Live answer probes (think requests only).
    probes: Vec<Probe>,
    first_token_sent: bool,
}

impl Running {
    fn sequences(&self) -> usize {
        if self.prefill.is_some() {
            self.req.n
        } else {
            self.completions.len() + self.probes.len()
        }
    }

    fn seq_ids(&self) -> Vec<SeqId> {
        let mut ids: Vec<SeqId> = self.completions.iter().map(|c| c.seq).collect();
        ids.extend(self.probes.iter().map(|p| p.completion.seq));
        ids.extend(self.prefill.map(|(s, _)| s));
        ids
    }

    fn is_done(&self) -> bool {
        self.prefill.is_none() && self.completions.is_empty()
    }
}

/// Which request (and which part of it) one row of the batch belongs to.
enum Slot {
    Prefill { req: usize, take: usize, last: bool },
    Decode { req: usize, completion: usize },
    Probe { req: usize, probe: usize },
}

struct Engine {
    shared: Arc<Shared>,
    backend: Box<dyn Backend>,
    waiting: VecDeque<Pending>,
    running: Vec<Running>,
    reserved: usize,
    /// The prompt-prefix cache (`EngineConfig::prefix_cache` entries at most).
    prefixes: Vec<Prefix>,
    /// Ticks once per prefix lookup or insertion: the LRU clock.
    clock: u64,
}

/// A recent prompt's KV, kept so that later prompts sharing its beginning
/// prefill only the rest. Its bytes count in `Engine::reserved`.
struct Prefix {
    tokens: Vec<u32>,
    seq: SeqId,
    bytes: usize,
    used: u64,
}

/// Shortest shared beginning worth reusing, in tokens.
const PREFIX_MIN: usize = 16;

/// How much of a `shared`-token cached prefix a prompt of `n` tokens may reuse
/// and still get the logits a cold prefill gives, bit for bit. Where the
/// backend's attention takes another kernel from `switch` new rows
/// ([`Backend::attention_kernel_switch_rows`], llama.cpp's rule on Tern's
/// kernels), the rest must reach that kernel when the cold prompt did and stay
/// under it when it did not. Long prompts prefilled in several chunks are not
/// reused.
fn exact_reuse(n: usize, shared: usize, prefill_chunk: usize, switch: Option<usize>) -> usize {
    let switch = switch.unwrap_or(0);
    if n < switch {
        shared
    } else if n <= prefill_chunk {
        shared.min(n - switch)
    } else {
        0
    }
}

/// The engine thread's body: runs until every handle is gone and no work is left.
pub(super) fn run(shared: Arc<Shared>, backend: Box<dyn Backend>, rx: mpsc::Receiver<Command>) {
    let mut engine = Engine {
        shared,
        backend,
        waiting: VecDeque::new(),
        running: Vec::new(),
        reserved: 0,
        prefixes: Vec::new(),
        clock: 0,
    };
    loop {
        if engine.running.is_empty() && engine.waiting.is_empty() {
            engine.publish_metrics();
            match rx.recv() {
                Ok(cmd) => engine.intake(cmd),
                Err(_) => break,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            engine.intake(cmd);
        }
        engine.drop_cancelled();
        engine.admit();
        // Show admissions now, not after a step that may take seconds.
        engine.publish_metrics();
        if !engine.running.is_empty() {
            engine.step();
        }
        engine.publish_metrics();
    }
    engine.shared.stopped.store(true, Ordering::Relaxed);
}

impl Engine {
    fn intake(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(p) => self.waiting.push_back(*p),
            Command::SubmitAll(ps) => self.waiting.extend(ps),
            Command::SetAdapters {
                version,
                adapters,
                ack,
            } => {
                let res = self
                    .backend
                    .set_adapters(adapters)
                    .map_err(|e| e.to_string());
                if res.is_ok() {
                    self.shared
                        .weights_version
                        .store(version, Ordering::Release);
                }
                // The caller may have given up waiting; nothing to undo then.
                let _ = ack.send(res);
            }
        }
    }

    /// Retires a request: frees its sequences and its reservation.
    fn retire(&mut self, r: Running) {
        for seq in r.seq_ids() {
            self.backend.free(seq);
        }
        self.reserved -= r.reserve;
        self.shared.admission.retired(r.req.n.max(1), r.reserve);
    }

    fn drop_cancelled(&mut self) {
        let metrics = &self.shared.metrics;
        let admission = &self.shared.admission;
        self.waiting.retain(|p| {
            let open = !p.events.is_closed();
            if !open {
                admission.leave(p.req.n.max(1), p.reserve);
                metrics.cancelled();
            }
            open
        });
        let (closed, open): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.events.is_closed());
        self.running = open;
        for r in closed {
            self.shared.metrics.cancelled();
            self.retire(r);
        }
    }

    /// Admits waiting requests in arrival order while their KV reservation and
    /// sequence count fit.
    fn admit(&mut self) {
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        let mut sequences: usize = self.running.iter().map(Running::sequences).sum();
        while let Some((n, reserve)) = self.waiting.front().map(|p| (p.req.n.max(1), p.reserve)) {
            let mut fits_kv = self.reserved + reserve <= cfg.kv_memory;
            // Cached prefixes give way to requests.
            while !fits_kv && !self.prefixes.is_empty() {
                self.evict_prefix();
                fits_kv = self.reserved + reserve <= cfg.kv_memory;
            }
            let fits_rows = sequences + n <= cfg.max_running || self.running.is_empty();
            if !(fits_kv && fits_rows) {
                break;
            }
            let p = self.waiting.pop_front().expect("front exists");
            self.shared.admission.admitted(n, p.reserve);
            let expected = p.req.prompt.len() + p.req.max_tokens;
            let (created, cached) = match self.reuse_prefix(&p.req, expected) {
                Some((seq, len)) => (Ok(seq), len),
                None => (self.backend.new_seq(&p.req.kv_policy, expected), 0),
            };
            let created = match created {
                Ok(seq) if p.req.record_evictions => match self.backend.record_evictions(seq) {
                    Ok(()) => Ok(seq),
                    Err(e) => {
                        self.backend.free(seq);
                        Err(e)
                    }
                },
                other => other,
            };
            let seq = match created {
                Ok(seq) => seq,
                Err(e) => {
                    let _ = p.events.send(Event::Error(e.to_string()));
                    self.shared.metrics.failed(1);
                    self.shared.admission.retired(n, p.reserve);
                    continue;
                }
            };
            sequences += n;
            self.reserved += p.reserve;
            self.shared.metrics.add_cached_prompt_tokens(cached);
            let stop_ids = if p.req.ignore_eos {
                Vec::new()
            } else {
                self.shared.model.stop_tokens()
            };
            self.running.push(Running {
                req: p.req,
                events: p.events,
                reserve: p.reserve,
                submitted: p.submitted,
                stop_ids,
                prefill: Some((seq, cached)),
                completions: Vec::new(),
                probes: Vec::new(),
                first_token_sent: false,
            });
        }
    }

    /// Whether `req` may read from and write to the prompt-prefix cache: only
    /// an uncompressed cache holds its prompt as a prefix, and the trainer's
    /// recorded rollouts stay independent of earlier requests.
    fn prefix_eligible(&self, req: &SubmitRequest) -> bool {
        self.shared.config.prefix_cache > 0
            && matches!(req.kv_policy, KvPolicy::Full)
            && !req.record_evictions
            && req.prompt.len() > PREFIX_MIN
    }

    /// A new sequence for `req` starting from the cached prefix sharing the
    /// most tokens with its prompt (at least `PREFIX_MIN`, and never the whole
    /// prompt: its last token must run to give logits), with that length.
    fn reuse_prefix(&mut self, req: &SubmitRequest, expected: usize) -> Option<(SeqId, usize)> {
        if !self.prefix_eligible(req) {
            return None;
        }
        let shared = |e: &Prefix| {
            e.tokens
                .iter()
                .zip(&req.prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(req.prompt.len() - 1)
        };
        let (i, len) = self
            .prefixes
            .iter()
            .enumerate()
            .map(|(i, e)| (i, shared(e)))
            .max_by_key(|&(_, len)| len)?;
        let len = exact_reuse(
            req.prompt.len(),
            len,
            self.shared.config.prompt_chunk(),
            self.backend.attention_kernel_switch_rows(),
        );
        if len < PREFIX_MIN {
            return None;
        }
        let seq = self
            .backend
            .fork_prefix(self.prefixes[i].seq, len, expected)
            .ok()??;
        self.clock += 1;
        self.prefixes[i].used = self.clock;
        Some((seq, len))
    }

    /// Keeps the prompt of running request `ri`, just prefilled, in the
    /// prompt-prefix cache if memory allows, evicting the least recently used
    /// entry beyond the configured count.
    fn remember_prefix(&mut self, ri: usize) {
        let r = &self.running[ri];
        let Some((seq, _)) = r.prefill else { return };
        if !self.prefix_eligible(&r.req) {
            return;
        }
        self.clock += 1;
        if let Some(e) = self.prefixes.iter_mut().find(|e| e.tokens == r.req.prompt) {
            e.used = self.clock;
            return;
        }
        let len = r.req.prompt.len();
        let bytes =
            SeqCache::reservation_bytes(self.shared.model.config(), &KvPolicy::Full, len, 0, 0);
        if self.reserved + bytes > self.shared.config.kv_memory {
            return;
        }
        let Ok(Some(copy)) = self.backend.fork_prefix(seq, len, len) else {
            return;
        };
        self.prefixes.push(Prefix {
            tokens: r.req.prompt.clone(),
            seq: copy,
            bytes,
            used: self.clock,
        });
        self.reserved += bytes;
        while self.prefixes.len() > self.shared.config.prefix_cache {
            self.evict_prefix();
        }
    }

    /// Frees the least recently used cached prefix.
    fn evict_prefix(&mut self) {
        let Some(i) = (0..self.prefixes.len()).min_by_key(|&i| self.prefixes[i].used) else {
            return;
        };
        let e = self.prefixes.swap_remove(i);
        self.backend.free(e.seq);
        self.reserved -= e.bytes;
    }

    /// One forward over every running sequence, then sampling and events.
    fn step(&mut self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.try_step()));
        let message = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("generation failed: {e}")),
            Err(_) => Some("generation failed: internal error in the engine".to_string()),
        };
        if let Some(message) = message {
            // The batch's state is unknown after a failure: end every running
            // request with the error rather than risk wrong output.
            let failed = std::mem::take(&mut self.running);
            self.shared.metrics.failed(failed.len());
            for r in failed {
                let _ = r.events.send(Event::Error(message.clone()));
                self.retire(r);
            }
        }
        self.shared.metrics.step();
    }

    fn try_step(&mut self) -> Result<()> {
        let cfg = &self.shared.config;
        let model = Arc::clone(&self.shared.model);
        let decode_rows: usize = self
            .running
            .iter()
            .map(|r| r.completions.len() + r.probes.len())
            .sum();
        let chunk = cfg.prompt_chunk();
        let mut budget = cfg.step_tokens.saturating_sub(decode_rows);

        let mut rows: Vec<Row> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        let mut prefilling = false;
        for (ri, r) in self.running.iter().enumerate() {
            if let Some((seq, done)) = r.prefill {
                // A prompt is read in the same chunks under any load: a
                // compressing policy evicts between chunks and attention picks
                // its kernel by a chunk's rows, so a chunk cut to fit a busy
                // step would change the answer. One that does not fit waits,
                // unless the step carries no prompt yet.
                let take = chunk.min(r.req.prompt.len() - done);
                if take == 0 || (take > budget && prefilling) {
                    continue;
                }
                prefilling = true;
                budget = budget.saturating_sub(take);
                let last = done + take == r.req.prompt.len();
                rows.push(Row {
                    seq,
                    tokens: &r.req.prompt[done..done + take],
                    start_pos: done,
                    logits: if last {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                });
                slots.push(Slot::Prefill {
                    req: ri,
                    take,
                    last,
                });
            } else {
                for (ci, c) in r.completions.iter().enumerate() {
                    // A completion waits while its answer probe runs, so a
                    // verdict applies exactly where the probe was taken.
                    if c.think.as_ref().is_some_and(|t| t.probe_live) {
                        continue;
                    }
                    rows.push(Row {
                        seq: c.seq,
                        tokens: c.uncached(),
                        start_pos: c.cached,
                        logits: LogitsWanted::Last,
                    });
                    slots.push(Slot::Decode {
                        req: ri,
                        completion: ci,
                    });
                }
                for (pi, p) in r.probes.iter().enumerate() {
                    rows.push(Row {
                        seq: p.completion.seq,
                        tokens: p.completion.uncached(),
                        start_pos: p.completion.cached,
                        logits: LogitsWanted::Last,
                    });
                    slots.push(Slot::Probe { req: ri, probe: pi });
                }
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let shape = step_log().then(|| {
            let tokens: usize = rows.iter().map(|r| r.tokens.len()).sum();
            (rows.len(), tokens)
        });
        let logits = self.backend.forward(&rows)?;
        drop(rows);
        let _log = shape.map(|(rows, tokens)| StepLog {
            rows,
            tokens,
            forward_ms: started.elapsed().as_secs_f64() * 1e3,
            started,
        });

        let now = Instant::now();
        for (slot, row) in slots.into_iter().zip(logits) {
            match slot {
                Slot::Prefill { req, take, last } => {
                    self.shared.metrics.add_prompt_tokens(take);
                    if last {
                        self.remember_prefix(req);
                    }
                    let r = &mut self.running[req];
                    if let Some((_, done)) = &mut r.prefill {
                        *done += take;
                    }
                    if last {
                        let row = row.ok_or(crate::error::RuntimeError::EmptyPrompt)?;
                        start_completions(
                            r,
                            self.backend.as_mut(),
                            &model,
                            &row,
                            now,
                            &self.shared,
                        )?;
                    }
                }
                Slot::Decode { req, completion } => {
                    let row = row.ok_or(crate::error::RuntimeError::EmptyPrompt)?;
                    let r = &mut self.running[req];
                    emit_step(
                        r,
                        completion,
                        self.backend.as_ref(),
                        &model,
                        &row,
                        now,
                        &self.shared,
                    );
                }
                Slot::Probe { req, probe } => {
                    let row = row.ok_or(crate::error::RuntimeError::EmptyPrompt)?;
                    step_probe(&mut self.running[req], probe, &model, &row);
                }
            }
        }
        for r in &mut self.running {
            think_pass(r, self.backend.as_mut(), &model)?;
        }
        self.finish_done();
        Ok(())
    }

    /// Frees finished completions and retires finished requests.
    fn finish_done(&mut self) {
        for r in &mut self.running {
            for c in r.completions.iter().filter(|c| c.done) {
                self.backend.free(c.seq);
            }
            r.completions.retain(|c| !c.done);
        }
        let (done, live): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(Running::is_done);
        self.running = live;
        // (Counted as finished when their last `Done` was sent.)
        for r in done {
            self.retire(r);
        }
    }

    fn publish_metrics(&self) {
        let mut by_policy: BTreeMap<String, PolicyKv> = BTreeMap::new();
        let mut sequences = 0;
        for r in &self.running {
            let entry = by_policy
                .entry(r.req.kv_policy.name().to_string())
                .or_default();
            sequences += r.sequences();
            for seq in r.seq_ids() {
                let kv = self.backend.kv(seq);
                entry.sequences += 1;
                entry.bytes_in_use += kv.bytes;
                entry.bytes_saved += kv.full.saturating_sub(kv.bytes);
            }
        }
        let m = &self.shared.metrics;
        m.set_policy_kv(by_policy);
        // Waiting counts requests still in the channel too: what submit counted.
        m.set_load(
            self.running.len(),
            self.shared.admission.pending(),
            sequences,
            self.reserved,
        );
    }
}

/// The prompt has been read: fork its sequence into the request's `n`
/// completions (child `i` seeded `seed + i`) and sample each one's first token.
fn start_completions(
    r: &mut Running,
    backend: &mut dyn Backend,
    model: &crate::model::LoadedModel,
    row: &[f32],
    now: Instant,
    shared: &Shared,
) -> Result<()> {
    let Some((seq, _)) = r.prefill.take() else {
        return Ok(());
    };
    // Until the children exist, the prompt's sequence is the request's only
    // one: keep it reachable so a failure below still frees it.
    r.completions.push(
        Completion::new(
            0,
            seq,
            seeded(&r.req, 0),
            &r.req.prompt,
            r.req.stop.clone(),
            r.req.constraint,
        )
        .with_deferred_stops(r.req.stop_after_content.clone()),
    );
    backend.finish_prefill(seq)?;
    let _ = r.events.send(Event::Prefilled {
        prompt_tokens: r.req.prompt.len(),
    });
    for i in 1..r.req.n.max(1) {
        let child = backend.fork(seq)?;
        r.completions.push(
            Completion::new(
                i,
                child,
                seeded(&r.req, i),
                &r.req.prompt,
                r.req.stop.clone(),
                r.req.constraint,
            )
            .with_deferred_stops(r.req.stop_after_content.clone()),
        );
    }
    if r.req.think.is_some() {
        for c in &mut r.completions {
            c.think = Some(ThinkState::default());
        }
    }
    for ci in 0..r.completions.len() {
        emit_step(r, ci, backend, model, row, now, shared);
    }
    Ok(())
}

/// Decodes one token of live probe `pi` (greedy, its own token budget).
fn step_probe(r: &mut Running, pi: usize, model: &LoadedModel, row: &[f32]) {
    let max_tokens = r
        .req
        .think
        .as_ref()
        .and_then(|t| t.probe.as_ref())
        .map_or(1, |p| p.max_tokens);
    let lim = Limits {
        model,
        stop_ids: &r.stop_ids,
        max_tokens,
        logprobs: false,
    };
    let p = &mut r.probes[pi];
    let stepped = p.completion.step(row, &lim);
    p.text.push_str(&stepped.text);
    if stepped.finish.is_some() {
        p.completion.done = true;
    }
}

/// After a step, for a think request: hands finished probes to the caller's
/// rule (concluding a completion whose answer has settled), concludes
/// completions at the budget, and forks new probes where they are due.
fn think_pass(r: &mut Running, backend: &mut dyn Backend, model: &LoadedModel) -> Result<()> {
    let Some(spec) = r.req.think.clone() else {
        return Ok(());
    };
    let (finished, live): (Vec<Probe>, Vec<Probe>) = std::mem::take(&mut r.probes)
        .into_iter()
        .partition(|p| p.completion.done);
    r.probes = live;
    for p in finished {
        backend.free(p.completion.seq);
        let _ = r.events.send(Event::Probe {
            index: p.parent,
            at: p.at,
            text: p.text.clone(),
            tokens: p.completion.generated,
        });
        let Some(ci) = r.completions.iter().position(|c| c.index == p.parent) else {
            continue;
        };
        let settled = match r.completions[ci].think.as_mut() {
            Some(state) => {
                state.probe_live = false;
                state.probes.push(p.text);
                spec.probe
                    .as_ref()
                    .is_some_and(|ps| ps.rule.settled(&state.probes))
            }
            None => false,
        };
        if settled {
            conclude(r, ci, &spec, true, model);
        }
    }
    for ci in 0..r.completions.len() {
        let c = &r.completions[ci];
        let Some(state) = c.think.as_ref().filter(|_| !c.done) else {
            continue;
        };
        if state.over_budget(&spec, c.generated) {
            conclude(r, ci, &spec, false, model);
        } else if state.probe_due(&spec, c.generated) {
            let child = backend.fork(c.seq)?;
            let mut history = c.history.clone();
            history.extend_from_slice(&spec.answer_suffix);
            let stop = spec.probe.as_ref().map_or(Vec::new(), |p| p.stop.clone());
            let mut probe = Completion::new(
                c.index,
                child,
                SamplingParams::greedy(),
                &history,
                stop,
                None,
            );
            // The fork holds exactly what the parent's cache holds; the
            // parent's last sampled token and the suffix are its first row.
            probe.cached = c.cached;
            let (index, at) = (c.index, c.generated);
            if let Some(state) = r.completions[ci].think.as_mut() {
                state.probe_live = true;
                state.last_probe = Some(at);
            }
            r.probes.push(Probe {
                parent: index,
                at,
                completion: probe,
                text: String::new(),
            });
        }
    }
    Ok(())
}

/// Ends completion `ci`'s reasoning: the answer suffix is forced and the
/// completion may write `answer_tokens` more.
fn conclude(r: &mut Running, ci: usize, spec: &ThinkSpec, early: bool, model: &LoadedModel) {
    let c = &mut r.completions[ci];
    let at = c.generated;
    c.force(&spec.answer_suffix, &spec.answer_stop, model);
    if let Some(state) = c.think.as_mut() {
        state.concluded_at = Some(at);
        c.limit = state.answer_limit(spec);
    }
    let _ = r.events.send(Event::Concluded {
        index: c.index,
        at,
        early,
    });
}

fn seeded(req: &SubmitRequest, i: usize) -> crate::sampler::SamplingParams {
    let mut sampling = req.sampling.clone();
    sampling.seed = sampling.seed.wrapping_add(i as u64);
    sampling
}

/// Samples completion `ci` of `r` from `row` and sends its events; a finished
/// completion is marked `done` and freed by `finish_done`.
fn emit_step(
    r: &mut Running,
    ci: usize,
    backend: &dyn Backend,
    model: &crate::model::LoadedModel,
    row: &[f32],
    now: Instant,
    shared: &Shared,
) {
    let lim = Limits {
        model,
        stop_ids: &r.stop_ids,
        max_tokens: r.req.max_tokens,
        logprobs: r.req.logprobs,
    };
    let c = &mut r.completions[ci];
    let stepped = c.step(row, &lim);
    shared.metrics.add_generated(1);
    match c.last_token_at {
        Some(t) => shared.metrics.itl.observe((now - t).as_secs_f64()),
        None if !r.first_token_sent => {
            shared
                .metrics
                .ttft
                .observe((now - r.submitted).as_secs_f64());
            r.first_token_sent = true;
        }
        None => {}
    }
    c.last_token_at = Some(now);
    let _ = r.events.send(Event::Token {
        index: c.index,
        token: stepped.token,
        text: stepped.text,
        logprob: stepped.logprob,
    });
    if let Some(finish_reason) = stepped.finish {
        c.done = true;
        let done = Event::Done {
            index: c.index,
            finish_reason,
            completion_tokens: c.generated,
            kv: Completion::kv_usage(
                &r.req.kv_policy,
                backend.kv(c.seq),
                if r.req.record_evictions {
                    backend.evictions(c.seq)
                } else {
                    None
                },
            ),
        };
        // Count the request finished before its last event leaves, so a client
        // that reads /metrics right after its response sees it.
        if r.prefill.is_none() && r.completions.iter().all(|c| c.done) {
            shared.metrics.finished();
        }
        let _ = r.events.send(done);
    }
}

/// Whether `TERN_STEP_LOG` asks for one stderr line per engine step (rows,
/// tokens, forward time, whole step time): how the batching measurements in
/// docs/BENCHMARKS.md were taken.
fn step_log() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TERN_STEP_LOG").is_some_and(|v| v != "0"))
}

/// Prints the step's line when the step ends (on every exit path).
struct StepLog {
    rows: usize,
    tokens: usize,
    forward_ms: f64,
    started: Instant,
}

impl Drop for StepLog {
    fn drop(&mut self) {
        eprintln!(
            "tern step: rows={} tokens={} forward_ms={:.2} step_ms={:.2}",
            self.rows,
            self.tokens,
            self.forward_ms,
            self.started.elapsed().as_secs_f64() * 1e3
        );
    }
}
