//! The engine loop: intake, cancellation, admission under the KV budget, then
//! each step as plan -> run -> apply: [`plan`](super::plan) picks the rows and
//! types whose each one is, the backend runs ONE ragged forward over them, and
//! [`apply`](super::apply) turns each row's logits into tokens, probes and
//! events. Kernel facts (where attention changes kernel) come from the backend.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use super::apply::{emit_step, start_completions, step_probe, think_pass};
use super::draft::DraftModel;
use super::embed::{plan_batch, run_batch, EmbedJob};
use super::metrics::{KvKey, PolicyKv};
use super::plan::{plan, Slot, StepPlan};
use super::prefix::PrefixCache;
use super::running::Running;
use super::speculate;
use super::{Command, Event, Pending, Shared};
use crate::backend::{Backend, Row};
use crate::error::{Result, RuntimeError};
use tern_models::LoraSet;

struct Engine {
    shared: Arc<Shared>,
    backend: Box<dyn Backend>,
    waiting: VecDeque<Pending>,
    running: Vec<Running>,
    /// Embedding requests, in arrival order, until their last input is pooled.
    embeds: Vec<EmbedJob>,
    /// KV bytes reserved by running requests and cached prefixes together.
    reserved: usize,
    prefixes: PrefixCache,
    /// The adapters of requests that bring none (the trainer's policy).
    default_adapters: Option<Arc<LoraSet>>,
    /// The adapters the backend runs now.
    applied: Option<Arc<LoraSet>>,
    /// The draft model, for requests that speculate with `draft`.
    draft: Option<DraftModel>,
}

/// The engine thread's body: runs until every handle is gone and no work is left.
pub(super) fn run(
    shared: Arc<Shared>,
    backend: Box<dyn Backend>,
    draft: Option<DraftModel>,
    rx: mpsc::Receiver<Command>,
) {
    let shared_prefix_capacity = shared.config.prefix_cache;
    let mut engine = Engine {
        shared,
        backend,
        waiting: VecDeque::new(),
        running: Vec::new(),
        embeds: Vec::new(),
        reserved: 0,
        prefixes: PrefixCache::new(shared_prefix_capacity),
        default_adapters: None,
        applied: None,
        draft,
    };
    loop {
        if engine.running.is_empty() && engine.waiting.is_empty() && engine.embeds.is_empty() {
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
        if let Some(d) = engine.draft.as_mut() {
            d.sweep(&engine.running);
        }
        // At most one bounded embedding forward between two generation steps.
        if !engine.embeds.is_empty() {
            engine.embed_step();
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
            Command::Embed(job) => self.embeds.push(job),
            Command::SetAdapters {
                version,
                adapters,
                ack,
            } => {
                let res = self
                    .backend
                    .set_adapters(adapters.clone())
                    .map_err(|e| e.to_string());
                if res.is_ok() {
                    self.applied = adapters.clone();
                    self.default_adapters = adapters;
                    // Cached prompts were computed under the old weights.
                    while !self.prefixes.is_empty() {
                        self.reserved -= self.prefixes.evict(self.backend.as_mut());
                    }
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
        if r.reserve >= super::TRIM_AFTER_BYTES {
            crate::memory::release_free_memory();
        }
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
                self.reserved -= self.prefixes.evict(self.backend.as_mut());
                fits_kv = self.reserved + reserve <= cfg.kv_memory;
            }
            let fits_rows = sequences + n <= cfg.max_running || self.running.is_empty();
            if !(fits_kv && fits_rows) {
                break;
            }
            let p = self.waiting.pop_front().expect("front exists");
            self.shared.admission.admitted(n, p.reserve);
            let expected = p.req.prompt.len() + p.req.max_tokens;
            // A cache that may overflow starts empty: a cached prefix is a
            // full cache, which cannot be re-numbered.
            let reused = match p.req.overflow {
                Some(_) => None,
                None => {
                    self.prefixes
                        .reuse(self.backend.as_mut(), &p.req, expected, cfg.prompt_chunk())
                }
            };
            let (created, cached) = match (reused, &p.req.overflow) {
                (Some((seq, len)), _) => (Ok(seq), len),
                (None, Some(overflow)) => (
                    self.backend.new_overflow_seq(
                        &p.req.kv_policy,
                        overflow,
                        p.req.kv_dtype,
                        expected,
                    ),
                    0,
                ),
                (None, None) => (
                    self.backend
                        .new_seq(&p.req.kv_policy, p.req.kv_dtype, expected),
                    0,
                ),
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
            let row_cap = p
                .req
                .overflow
                .as_ref()
                .map_or(usize::MAX, |o| super::overflow_room(&self.shared.model, o));
            self.running.push(Running {
                row_cap,
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

    /// One step: plan the batch, run the forward, apply its logits.
    fn try_step(&mut self) -> Result<()> {
        let context_length = self.shared.model.config().context_length;
        speculate::draft_all(&mut self.running, context_length, self.backend.as_ref());
        if let Some(d) = self.draft.as_mut() {
            let vocab = self.shared.model.config().vocab_size;
            d.draft_all(&mut self.running, self.shared.config.prompt_chunk(), vocab)?;
        }
        let step = plan(&self.running, &self.shared.config);
        if step.rows.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let shape = step_log().then(|| step.shape());
        let StepPlan { rows, slots } = step;
        let wanted: Vec<Option<Arc<LoraSet>>> = slots
            .iter()
            .map(|s| {
                let req = &self.running[s.req()].req;
                req.adapters
                    .clone()
                    .or_else(|| self.default_adapters.clone())
            })
            .collect();
        // A step that verifies a draft runs its decode rows in their one-row
        // order, so the drafted tokens get plain decoding's logits; its
        // prefill rows (if any) keep the batched kernels, in a forward of
        // their own.
        let drafting = slots.iter().any(|s| match *s {
            Slot::Decode { req, completion } => {
                self.running[req].completions[completion].drafting()
            }
            _ => false,
        });
        // A compressing cache holds its eviction and scoring back for a
        // draft's rows until the verification rewinds it.
        for s in &slots {
            if let Slot::Decode { req, completion } = *s {
                let c = &self.running[req].completions[completion];
                if c.drafting() {
                    self.backend.begin_verify(c.seq);
                }
            }
        }
        let alone: Vec<bool> = slots
            .iter()
            .map(|s| drafting && matches!(s, Slot::Decode { .. }))
            .collect();
        let logits = forward_by_adapters(
            self.backend.as_mut(),
            &mut self.applied,
            rows,
            &wanted,
            &alone,
        )?;
        let _log = shape.map(|(rows, tokens)| StepLog {
            rows,
            tokens,
            forward_ms: started.elapsed().as_secs_f64() * 1e3,
            started,
        });
        self.apply(slots, logits)
    }

    /// Routes each row's logits to the part of the request its slot names,
    /// then lets think requests conclude or probe and retires what finished.
    fn apply(&mut self, slots: Vec<Slot>, logits: Vec<Option<Vec<f32>>>) -> Result<()> {
        let model = Arc::clone(&self.shared.model);
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
                        let row = row.ok_or(RuntimeError::EmptyPrompt)?;
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
                    let row = row.ok_or(RuntimeError::EmptyPrompt)?;
                    let r = &mut self.running[req];
                    if r.completions[completion].drafting() {
                        speculate::verify(
                            r,
                            completion,
                            self.backend.as_mut(),
                            &model,
                            &row,
                            now,
                            &self.shared,
                        )?;
                        continue;
                    }
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
                    let row = row.ok_or(RuntimeError::EmptyPrompt)?;
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

    /// One embedding forward over the queued inputs (about `step_tokens`
    /// tokens), then answers every request whose inputs are all pooled. A
    /// failure ends the requests that had inputs in the forward.
    fn embed_step(&mut self) {
        // Embeddings run under the engine's own adapters.
        if let Err(e) = switch_adapters(
            self.backend.as_mut(),
            &mut self.applied,
            &self.default_adapters,
        ) {
            for job in std::mem::take(&mut self.embeds) {
                self.shared.embeds_pending.fetch_sub(1, Ordering::AcqRel);
                job.fail(self.backend.as_mut(), format!("embedding failed: {e}"));
            }
            return;
        }
        let backend = self.backend.as_mut();
        let (cancelled, live): (Vec<EmbedJob>, Vec<EmbedJob>) = std::mem::take(&mut self.embeds)
            .into_iter()
            .partition(EmbedJob::is_cancelled);
        let pending = &self.shared.embeds_pending;
        for mut job in cancelled {
            job.free(backend);
            pending.fetch_sub(1, Ordering::AcqRel);
        }
        self.embeds = live;
        let cfg = &self.shared.config;
        let chunks = plan_batch(&self.embeds, cfg.prompt_chunk(), cfg.step_tokens);
        if chunks.is_empty() {
            return;
        }
        let d = self.shared.model.config().n_embd;
        let jobs = &mut self.embeds;
        let outcome = catch_unwind(AssertUnwindSafe(|| run_batch(jobs, &chunks, backend, d)));
        let message = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("embedding failed: {e}")),
            Err(_) => Some("embedding failed: internal error in the engine".to_string()),
        };
        // A request leaves the count before its answer is sent, so a caller
        // that submits again on receiving it finds its place free.
        let jobs = std::mem::take(&mut self.embeds);
        for (i, job) in jobs.into_iter().enumerate() {
            match &message {
                Some(m) if chunks.iter().any(|c| c.job() == i) => {
                    pending.fetch_sub(1, Ordering::AcqRel);
                    job.fail(backend, m.clone());
                }
                _ if job.is_done() => {
                    pending.fetch_sub(1, Ordering::AcqRel);
                    job.answer();
                }
                _ => self.embeds.push(job),
            }
        }
    }

    /// Offers running request `ri`'s just-prefilled prompt to the prefix cache.
    fn remember_prefix(&mut self, ri: usize) {
        let r = &self.running[ri];
        let Some((seq, _)) = r.prefill else { return };
        let room = self.shared.config.kv_memory.saturating_sub(self.reserved);
        let (taken, freed) = self.prefixes.remember(
            self.backend.as_mut(),
            self.shared.model.config(),
            &r.req,
            seq,
            room,
        );
        self.reserved = self.reserved + taken - freed;
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
        let mut by_policy: BTreeMap<KvKey, PolicyKv> = BTreeMap::new();
        let mut sequences = 0;
        for r in &self.running {
            let entry = by_policy
                .entry((
                    r.req.kv_policy.name().to_string(),
                    r.req.kv_dtype.name().to_string(),
                ))
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

/// Whether two adapter choices are the same adapters.
fn same_adapters(a: &Option<Arc<LoraSet>>, b: &Option<Arc<LoraSet>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Points the backend at `wanted` unless it runs them already.
fn switch_adapters(
    backend: &mut dyn Backend,
    applied: &mut Option<Arc<LoraSet>>,
    wanted: &Option<Arc<LoraSet>>,
) -> Result<()> {
    if !same_adapters(applied, wanted) {
        backend.set_adapters(wanted.clone())?;
        *applied = wanted.clone();
    }
    Ok(())
}

/// The step's forward: one over every row when all run the same adapters
/// and the same order (the usual case), else one per (adapter set, order),
/// each row's logits put back in its place. `alone[i]`: row `i` runs
/// [`Backend::forward_alone`]. Each row's state is its own sequence's, so
/// splitting a batch changes no sequence's cache; a row's logits may differ
/// in the last bits between batch sizes, which is what `alone` is for.
fn forward_by_adapters(
    backend: &mut dyn Backend,
    applied: &mut Option<Arc<LoraSet>>,
    rows: Vec<Row<'_>>,
    wanted: &[Option<Arc<LoraSet>>],
    alone: &[bool],
) -> Result<Vec<Option<Vec<f32>>>> {
    let mut groups: Vec<(Option<Arc<LoraSet>>, bool, Vec<usize>)> = Vec::new();
    for (i, (w, &a)) in wanted.iter().zip(alone).enumerate() {
        match groups
            .iter_mut()
            .find(|(g, ga, _)| same_adapters(g, w) && *ga == a)
        {
            Some((_, _, members)) => members.push(i),
            None => groups.push((w.clone(), a, vec![i])),
        }
    }
    let run = |backend: &mut dyn Backend, rows: &[Row<'_>], a: bool| {
        if a {
            backend.forward_alone(rows)
        } else {
            backend.forward(rows)
        }
    };
    if groups.len() <= 1 {
        let a = match groups.first() {
            Some((w, a, _)) => {
                switch_adapters(backend, applied, w)?;
                *a
            }
            None => false,
        };
        return run(backend, &rows, a);
    }
    let mut out: Vec<Option<Vec<f32>>> = vec![None; rows.len()];
    let mut rows: Vec<Option<Row<'_>>> = rows.into_iter().map(Some).collect();
    for (w, a, members) in groups {
        switch_adapters(backend, applied, &w)?;
        let sub: Vec<Row<'_>> = members.iter().filter_map(|&i| rows[i].take()).collect();
        for (i, l) in members.into_iter().zip(run(backend, &sub, a)?) {
            out[i] = l;
        }
    }
    Ok(out)
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
