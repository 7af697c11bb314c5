//! The engine loop: intake, cancellation, admission under the KV budget, one
//! ragged forward per step, sampling and events.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use candle_core::Tensor;
use tern_models::{LogitsWanted, SeqBatch};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::PolicyKv;
use super::sequence::{Completion, Limits};
use super::{Command, Event, Pending, Shared, SubmitRequest};
use crate::error::Result;
use crate::kv::SeqCache;

/// An admitted request.
struct Running {
    req: SubmitRequest,
    events: UnboundedSender<Event>,
    reserve: usize,
    submitted: Instant,
    stop_ids: Vec<u32>,
    /// The prompt's cache and how much of the prompt it holds, while reading it.
    prefill: Option<(SeqCache, usize)>,
    /// Live completions (finished ones are removed, freeing their caches).
    completions: Vec<Completion>,
    first_token_sent: bool,
}

impl Running {
    fn sequences(&self) -> usize {
        if self.prefill.is_some() {
            self.req.n
        } else {
            self.completions.len()
        }
    }

    fn is_done(&self) -> bool {
        self.prefill.is_none() && self.completions.is_empty()
    }
}

/// Which request (and which part of it) one row of the batch belongs to.
enum Slot {
    Prefill { req: usize, take: usize, last: bool },
    Decode { req: usize, completion: usize },
}

struct Engine {
    shared: Arc<Shared>,
    waiting: VecDeque<Pending>,
    running: Vec<Running>,
    reserved: usize,
}

/// The engine thread's body: runs until every handle is gone and no work is left.
pub(super) fn run(shared: Arc<Shared>, rx: mpsc::Receiver<Command>) {
    let mut engine = Engine {
        shared,
        waiting: VecDeque::new(),
        running: Vec::new(),
        reserved: 0,
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
        }
    }

    fn drop_cancelled(&mut self) {
        let metrics = &self.shared.metrics;
        let before = self.waiting.len();
        self.waiting.retain(|p| !p.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.shared.waiting.fetch_sub(gone, Ordering::AcqRel);
            (0..gone).for_each(|_| metrics.cancelled());
        }
        let mut freed = 0;
        self.running.retain(|r| {
            let closed = r.events.is_closed();
            if closed {
                freed += r.reserve;
                metrics.cancelled();
            }
            !closed
        });
        self.reserved -= freed;
    }

    /// Admits waiting requests in arrival order while their KV reservation and
    /// sequence count fit.
    fn admit(&mut self) {
        let cfg = &self.shared.config;
        let mut sequences: usize = self.running.iter().map(Running::sequences).sum();
        while let Some(p) = self.waiting.front() {
            let n = p.req.n.max(1);
            let fits_kv = self.reserved + p.reserve <= cfg.kv_memory;
            let fits_rows = sequences + n <= cfg.max_running || self.running.is_empty();
            if !(fits_kv && fits_rows) {
                break;
            }
            let p = self.waiting.pop_front().expect("front exists");
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            sequences += n;
            self.reserved += p.reserve;
            let model = &self.shared.model;
            let stop_ids = if p.req.ignore_eos {
                Vec::new()
            } else {
                model.stop_tokens()
            };
            let mut cache = SeqCache::with_policy(model.config(), p.req.kv_policy.clone());
            if p.req.kv_policy.budget().is_none() {
                cache.set_capacity_hint(p.req.prompt.len() + p.req.max_tokens);
            }
            self.running.push(Running {
                req: p.req,
                events: p.events,
                reserve: p.reserve,
                submitted: p.submitted,
                stop_ids,
                prefill: Some((cache, 0)),
                completions: Vec::new(),
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
            let failed = self.running.len();
            for r in self.running.drain(..) {
                let _ = r.events.send(Event::Error(message.clone()));
            }
            self.reserved = 0;
            self.shared.metrics.failed(failed);
        }
        self.shared.metrics.step();
    }

    fn try_step(&mut self) -> Result<()> {
        let cfg = &self.shared.config;
        let model = Arc::clone(&self.shared.model);
        let decode_rows: usize = self.running.iter().map(|r| r.completions.len()).sum();
        let mut budget = cfg
            .step_tokens
            .saturating_sub(decode_rows)
            .max(cfg.prefill_chunk.min(cfg.step_tokens) / 4)
            .max(1);

        let mut batch: Vec<SeqBatch> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        for (ri, r) in self.running.iter_mut().enumerate() {
            let Running {
                req,
                prefill,
                completions,
                ..
            } = r;
            if let Some((cache, done)) = prefill {
                let take = cfg.prefill_chunk.min(req.prompt.len() - *done).min(budget);
                if take == 0 {
                    continue;
                }
                budget -= take;
                let last = *done + take == req.prompt.len();
                batch.push(SeqBatch {
                    tokens: &req.prompt[*done..*done + take],
                    start_pos: *done,
                    cache,
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
                for (ci, c) in completions.iter_mut().enumerate() {
                    let pos = c.history.len() - 1;
                    batch.push(SeqBatch {
                        tokens: &c.history[pos..],
                        start_pos: pos,
                        cache: &mut c.cache,
                        logits: LogitsWanted::Last,
                    });
                    slots.push(Slot::Decode {
                        req: ri,
                        completion: ci,
                    });
                }
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let logits = model.llama.forward(&mut batch)?;
        drop(batch);

        let now = Instant::now();
        for (slot, row) in slots.into_iter().zip(logits) {
            match slot {
                Slot::Prefill { req, take, last } => {
                    self.shared.metrics.add_prompt_tokens(take);
                    let r = &mut self.running[req];
                    if let Some((_, done)) = &mut r.prefill {
                        *done += take;
                    }
                    if last {
                        let row = row_vec(row)?;
                        start_completions(r, &model, &row, now, &self.shared)?;
                    }
                }
                Slot::Decode { req, completion } => {
                    let row = row_vec(row)?;
                    let r = &mut self.running[req];
                    emit_step(r, completion, &model, &row, now, &self.shared);
                }
            }
        }
        self.finish_done();
        Ok(())
    }

    /// Sends `Done` for finished completions and retires finished requests.
    fn finish_done(&mut self) {
        let mut freed = 0;
        let metrics = &self.shared.metrics;
        for r in &mut self.running {
            r.completions.retain(|c| !c.done);
        }
        self.running.retain(|r| {
            if r.is_done() {
                freed += r.reserve;
                metrics.finished();
                false
            } else {
                true
            }
        });
        self.reserved -= freed;
    }

    fn publish_metrics(&self) {
        let mut by_policy: BTreeMap<String, PolicyKv> = BTreeMap::new();
        let mut sequences = 0;
        for r in &self.running {
            let entry = by_policy
                .entry(r.req.kv_policy.name().to_string())
                .or_default();
            let caches: Vec<&SeqCache> = match &r.prefill {
                Some((c, _)) => vec![c],
                None => r.completions.iter().map(|c| &c.cache).collect(),
            };
            sequences += r.sequences();
            for c in caches {
                entry.sequences += 1;
                entry.bytes_in_use += c.bytes();
                entry.bytes_saved += c.full_bytes().saturating_sub(c.bytes());
            }
        }
        let m = &self.shared.metrics;
        m.set_policy_kv(by_policy);
        m.set_load(
            self.running.len(),
            self.waiting.len(),
            sequences,
            self.reserved,
        );
    }
}

fn row_vec(row: Option<Tensor>) -> Result<Vec<f32>> {
    let t = row.ok_or(crate::error::RuntimeError::EmptyPrompt)?;
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// The prompt has been read: fork its cache into the request's `n`
/// completions (child `i` seeded `seed + i`) and sample each one's first token.
fn start_completions(
    r: &mut Running,
    model: &crate::model::LoadedModel,
    row: &[f32],
    now: Instant,
    shared: &Shared,
) -> Result<()> {
    let Some((mut cache, _)) = r.prefill.take() else {
        return Ok(());
    };
    cache.finish_prefill()?;
    let _ = r.events.send(Event::Prefilled {
        prompt_tokens: r.req.prompt.len(),
    });
    let n = r.req.n.max(1);
    let mut caches = Vec::with_capacity(n);
    for _ in 1..n {
        caches.push(cache.fork()?);
    }
    caches.push(cache);
    for (i, cache) in caches.into_iter().enumerate() {
        let mut sampling = r.req.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(i as u64);
        r.completions.push(Completion::new(
            i,
            cache,
            sampling,
            &r.req.prompt,
            r.req.stop.clone(),
            r.req.constraint,
        ));
    }
    for ci in 0..n {
        emit_step(r, ci, model, row, now, shared);
    }
    Ok(())
}

/// Samples completion `ci` of `r` from `row` and sends its events; a finished
/// completion is marked by being removed in `finish_done`'s sweep.
fn emit_step(
    r: &mut Running,
    ci: usize,
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
        let _ = r.events.send(Event::Done {
            index: c.index,
            finish_reason,
            completion_tokens: c.generated,
            kv: c.kv_usage(),
        });
        c.done = true;
    }
}
