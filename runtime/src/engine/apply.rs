//! The "apply" third of a step: what each row's logits do to the request that
//! owns the row. A finished prompt forks into its completions, a decode row
//! samples a token and sends its events, a probe row advances an answer probe,
//! and after the step each think request concludes or probes where due.

use std::time::Instant;

use super::running::{seeded, Running};
use super::sequence::{Completion, Limits};
use super::think::{Probe, ThinkSpec, ThinkState};
use super::{Event, FinishReason, Shared};
use crate::backend::Backend;
use crate::error::Result;
use crate::model::LoadedModel;
use crate::sampler::SamplingParams;

/// The prompt has been read: fork its sequence into the request's `n`
/// completions (child `i` seeded `seed + i`) and sample each one's first token.
pub(super) fn start_completions(
    r: &mut Running,
    backend: &mut dyn Backend,
    model: &LoadedModel,
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
            r.req.constraint.clone(),
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
                r.req.constraint.clone(),
            )
            .with_deferred_stops(r.req.stop_after_content.clone()),
        );
    }
    if r.req.think.is_some() {
        for c in &mut r.completions {
            c.think = Some(ThinkState::default());
        }
    }
    if r.req.sampling.dry_enabled() {
        let breakers = model.dry_breakers(&r.req.sampling.dry_sequence_breakers);
        for c in &mut r.completions {
            c.set_dry_breakers(std::sync::Arc::clone(&breakers));
        }
    }
    super::speculate::arm(r, &*backend);
    for ci in 0..r.completions.len() {
        emit_step(r, ci, backend, model, row, now, shared);
    }
    Ok(())
}

/// Decodes one token of live probe `pi` (greedy, its own token budget).
pub(super) fn step_probe(r: &mut Running, pi: usize, model: &LoadedModel, row: &[f32]) {
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
        past_context: r.req.overflow.is_some(),
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
pub(super) fn think_pass(
    r: &mut Running,
    backend: &mut dyn Backend,
    model: &LoadedModel,
) -> Result<()> {
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
/// completion may write `answer_tokens` more. An early stop (`early`: the
/// probes settled) answers as the settling probe did, which was taken at
/// exactly this point: greedily, within the probe's length, so its words are
/// the probe's up to the answer's end of sentence (Dynasor-CoT returns the
/// probe's answer; `solve` reports that answer).
fn conclude(r: &mut Running, ci: usize, spec: &ThinkSpec, early: bool, model: &LoadedModel) {
    let c = &mut r.completions[ci];
    let at = c.generated;
    let probe = spec.probe.as_ref().filter(|_| early);
    match probe {
        Some(p) => {
            // The answer's own stops too: the text is then the probe's up
            // to the end of its sentence.
            let mut stops = spec.answer_stop.clone();
            stops.extend(
                p.stop
                    .iter()
                    .filter(|s| !spec.answer_stop.contains(s))
                    .cloned(),
            );
            c.force(&spec.answer_suffix, &stops, model);
            c.answer_greedily();
        }
        None => c.force(&spec.answer_suffix, &spec.answer_stop, model),
    }
    if let Some(state) = c.think.as_mut() {
        state.concluded_at = Some(at);
        c.limit = match probe {
            Some(p) => Some(at + p.max_tokens.min(spec.answer_tokens)),
            None => state.answer_limit(spec),
        };
    }
    let _ = r.events.send(Event::Concluded {
        index: c.index,
        at,
        early,
    });
}

/// Samples completion `ci` of `r` from `row` and sends its events; a finished
/// completion is marked `done` and freed by `finish_done`.
pub(super) fn emit_step(
    r: &mut Running,
    ci: usize,
    backend: &dyn Backend,
    model: &LoadedModel,
    row: &[f32],
    now: Instant,
    shared: &Shared,
) {
    let (_, finish) = emit_token(r, ci, model, row, now, shared);
    if let Some(finish_reason) = finish {
        emit_done(r, ci, finish_reason, backend, shared);
    }
}

/// Samples completion `ci` of `r` from `row` and sends its token; returns
/// the token and why the completion ends here, if it does (the caller then
/// sends [`emit_done`]).
pub(super) fn emit_token(
    r: &mut Running,
    ci: usize,
    model: &LoadedModel,
    row: &[f32],
    now: Instant,
    shared: &Shared,
) -> (u32, Option<FinishReason>) {
    let lim = Limits {
        model,
        stop_ids: &r.stop_ids,
        max_tokens: r.req.max_tokens,
        logprobs: r.req.logprobs,
        past_context: r.req.overflow.is_some(),
    };
    let c = &mut r.completions[ci];
    let stepped = c.step(row, &lim);
    if let (Some(spec), Some(state)) = (r.req.think.as_ref(), c.think.as_mut()) {
        // A model that closes its reasoning itself concludes it here.
        state.watch(spec, &stepped.text, c.generated);
    }
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
    (stepped.token, stepped.finish)
}

/// Ends completion `ci` of `r`: its speculation figures (when it was asked
/// to speculate), then its `Done`; it is freed by `finish_done`.
pub(super) fn emit_done(
    r: &mut Running,
    ci: usize,
    finish_reason: FinishReason,
    backend: &dyn Backend,
    shared: &Shared,
) {
    let c = &mut r.completions[ci];
    c.done = true;
    if let Some(stats) = c.spec_stats() {
        let _ = r.events.send(Event::Speculated {
            index: c.index,
            stats,
        });
    }
    let done = Event::Done {
        index: c.index,
        finish_reason,
        completion_tokens: c.generated,
        kv: Completion::kv_usage(
            &r.req.kv_policy,
            r.req.kv_dtype,
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
