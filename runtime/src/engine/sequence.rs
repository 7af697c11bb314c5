//! One completion being decoded: its cache, sampler, text state and stop
//! checks. The scheduler owns these; this file owns what happens to a
//! completion when a row of logits comes back for it.

use std::sync::Arc;
use std::time::Instant;

use tern_models::{EvictionLog, KvDtype};

use super::{FinishReason, StopMatcher, TokenLogprob};
use crate::backend::{SeqId, SeqKv};
use crate::constraint::Grammar;
use crate::kv::policy::KvPolicy;
use crate::model::LoadedModel;
use crate::sampler::{Sampler, SamplingParams};
use crate::tokenizer::StreamDecoder;

use super::speculate::{Drafter, SpecStats};
use super::think::ThinkState;
use super::KvUsage;

/// The per-request facts every completion's step needs.
pub(super) struct Limits<'a> {
    pub model: &'a LoadedModel,
    pub stop_ids: &'a [u32],
    pub max_tokens: usize,
    pub logprobs: bool,
    /// Whether the completion goes on past the model's context (an
    /// overflow policy): then only `max_tokens` ends it.
    pub past_context: bool,
}

/// What one sampling step produced for the caller.
pub(super) struct Stepped {
    pub token: u32,
    pub text: String,
    pub logprob: Option<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

/// One of a request's `n` completions.
pub(super) struct Completion {
    pub index: usize,
    pub seq: SeqId,
    pub history: Vec<u32>,
    /// Leading tokens of `history` the backend's cache holds; the next row
    /// feeds the rest (one sampled token, or more after a forced suffix).
    pub cached: usize,
    pub generated: usize,
    /// Thinking-budget state, for requests with a think spec.
    pub think: Option<ThinkState>,
    /// Most tokens this completion may generate when lower than the
    /// request's `max_tokens` (the answer phase after a concluded reasoning).
    pub limit: Option<usize>,
    pub last_token_at: Option<Instant>,
    /// Set once its `Done` event is sent; the scheduler then drops it.
    pub done: bool,
    /// Its prompt-lookup drafter, when it speculates.
    pub spec: Option<Drafter>,
    /// Why it does not speculate although its request asked to.
    pub spec_off: Option<String>,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    grammar: Option<Grammar>,
    /// Scratch for constrained resampling.
    masked: Vec<f32>,
    /// Text of forced tokens, sent with the next token's text.
    pending_text: String,
    /// Stop strings that take effect once the text written after a forced
    /// suffix has some content (so an answer that opens with a newline is
    /// not cut to nothing).
    deferred_stops: Vec<String>,
}

impl Completion {
    pub fn new(
        index: usize,
        seq: SeqId,
        sampling: SamplingParams,
        prompt: &[u32],
        stop: Vec<String>,
        grammar: Option<Grammar>,
    ) -> Self {
        Self {
            index,
            seq,
            history: prompt.to_vec(),
            cached: prompt.len(),
            generated: 0,
            think: None,
            limit: None,
            last_token_at: None,
            done: false,
            spec: None,
            spec_off: None,
            sampler: Sampler::new(sampling),
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(stop),
            grammar,
            masked: Vec::new(),
            pending_text: String::new(),
            deferred_stops: Vec::new(),
        }
    }

    /// The tokens the next forward must feed for this completion: those in
    /// `history` that are not in its cache yet.
    pub fn uncached(&self) -> &[u32] {
        &self.history[self.cached..]
    }

    /// The next row's tokens: the uncached ones, then the draft when one is
    /// pending (see `speculate`).
    pub fn feed(&self) -> &[u32] {
        self.spec
            .as_ref()
            .and_then(Drafter::feed)
            .unwrap_or_else(|| self.uncached())
    }

    /// Whether the next row carries a draft to verify.
    pub fn drafting(&self) -> bool {
        self.spec.as_ref().and_then(Drafter::feed).is_some()
    }

    /// What speculation did, for a completion whose request asked for it.
    pub fn spec_stats(&self) -> Option<SpecStats> {
        match (&self.spec, &self.spec_off) {
            (Some(d), _) => Some(d.stats.clone()),
            (None, Some(reason)) => Some(SpecStats {
                off: Some(reason.clone()),
                ..SpecStats::default()
            }),
            (None, None) => None,
        }
    }

    /// Arms `stops` once the completion has some content (see
    /// `SubmitRequest::stop_after_content`).
    pub fn with_deferred_stops(mut self, stops: Vec<String>) -> Self {
        self.deferred_stops = stops;
        self
    }

    /// Appends `tokens` as if they had been generated, without counting them:
    /// their text goes out with the next sampled token, and they reach the
    /// cache with the next forward. Used to force the answer suffix; `then_stop`
    /// are stop strings for what follows it (armed once it has content).
    pub fn force(&mut self, tokens: &[u32], then_stop: &[String], model: &LoadedModel) {
        self.deferred_stops = then_stop.to_vec();
        // Text held back as a possible stop-string prefix is released: the
        // forced tokens break any stop string it could have started, and a
        // stop string inside the forced text itself must not end the
        // completion (the caller chose that text).
        let mut text = self.stops.flush(String::new());
        for &t in tokens {
            self.history.push(t);
            text.push_str(&self.decoder.push(&model.tokenizer, t));
        }
        self.pending_text.push_str(&text);
    }

    /// Gives its sampler DRY's sequence breakers (shared by the request's
    /// completions).
    pub fn set_dry_breakers(&mut self, breakers: Arc<crate::sampler::DryBreakers>) {
        self.sampler.set_dry_breakers(breakers);
    }

    /// Decodes greedily from here on, as an answer probe does: after an
    /// early conclusion the answer is then the settling probe's own, token
    /// for token (same cache, same suffix, same argmax).
    pub fn answer_greedily(&mut self) {
        self.sampler = Sampler::new(SamplingParams::greedy());
    }

    /// The KV figures to report when it ends.
    pub fn kv_usage(
        policy: &KvPolicy,
        dtype: KvDtype,
        kv: SeqKv,
        evictions: Option<Arc<EvictionLog>>,
    ) -> KvUsage {
        KvUsage {
            policy: policy.to_string(),
            dtype,
            bytes_peak: kv.peak,
            bytes_final: kv.bytes,
            bytes_full: kv.full,
            evictions,
            shifts: kv.shifts,
            entries_final: kv.held,
        }
    }

    /// Samples the next token from `logits`, updates the text and decides
    /// whether the completion ends here.
    pub fn step(&mut self, logits: &[f32], lim: &Limits) -> Stepped {
        self.cached = self.history.len();
        let mut out = self.sample_step(logits, lim);
        if !self.pending_text.is_empty() {
            out.text
                .insert_str(0, &std::mem::take(&mut self.pending_text));
        }
        out
    }

    fn sample_step(&mut self, logits: &[f32], lim: &Limits) -> Stepped {
        let tok = &lim.model.tokenizer;
        let mut s = self.sampler.sample(logits, &self.history);
        if let Some(g) = &mut self.grammar {
            if !g.allows(s.token) {
                // Draw again from the distribution restricted to what the
                // grammar allows (only when the free draw fails, so the
                // common case never computes a mask).
                let Some(mask) = g.mask() else {
                    return self.end_unconstrainable(lim);
                };
                self.masked.clear();
                self.masked.extend(logits.iter().enumerate().map(|(t, &l)| {
                    if mask.is_allowed(t as u32) {
                        l
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
                if self.masked.iter().all(|l| *l == f32::NEG_INFINITY) {
                    return self.end_unconstrainable(lim);
                }
                s = self.sampler.resample(&self.masked, &self.history);
            }
        }
        let token = s.token;
        let logprob = lim.logprobs.then_some(TokenLogprob {
            token,
            logprob: s.logprob,
            top: s.top,
        });
        self.history.push(token);
        self.generated += 1;
        let mut out = Stepped {
            token,
            text: String::new(),
            logprob,
            finish: None,
        };
        if lim.stop_ids.contains(&token) {
            out.finish = Some(FinishReason::Stop);
            return out;
        }
        if let Some(g) = &mut self.grammar {
            if !g.commit(token) {
                // The grammar refused what it had allowed: end without
                // claiming the output is complete.
                out.finish = Some(FinishReason::Length);
                out.text = self.stops.flush(self.decoder.finish());
                return out;
            }
        }
        let piece = self.decoder.push(tok, token);
        if let Some(emit) = self.stops.feed(&piece) {
            out.text = emit.text;
            if emit.stopped {
                out.finish = Some(FinishReason::Stop);
                return out;
            }
        }
        if !self.deferred_stops.is_empty() && !piece.trim().is_empty() {
            self.stops.add(std::mem::take(&mut self.deferred_stops));
        }
        let complete = self.grammar.as_ref().is_some_and(Grammar::is_complete);
        let ctx = lim.model.config().context_length;
        if complete {
            out.finish = Some(FinishReason::Stop);
        } else if self.generated >= lim.max_tokens.min(self.limit.unwrap_or(usize::MAX))
            || (self.history.len() >= ctx && !lim.past_context)
        {
            out.finish = Some(FinishReason::Length);
        }
        if out.finish.is_some() {
            let tail = self.stops.flush(self.decoder.finish());
            out.text.push_str(&tail);
        }
        out
    }

    /// Ends a completion no token can continue (the grammar allows nothing
    /// the model can emit): a length stop, not a claim of completeness.
    fn end_unconstrainable(&mut self, lim: &Limits) -> Stepped {
        Stepped {
            token: lim.stop_ids.first().copied().unwrap_or(0),
            text: self.stops.flush(self.decoder.finish()),
            logprob: None,
            finish: Some(FinishReason::Length),
        }
    }
}
