//! Reading one request's engine events: where they come from
//! ([`EventSource`], the engine's `RequestStream` or a fixed list in tests)
//! and the running totals both answer styles report at the end ([`Tally`]:
//! which completions are done, tokens generated, KV bytes kept).

use std::future::Future;

use tern_runtime::engine::{Event, KvUsage, RequestStream};
use tern_runtime::reasoning::{Effort, LengthTally};

use crate::openai::usage::{ReasoningInfo, TernInfo, Usage};

/// A request's events in order; `None` once there are no more. Dropping the
/// source cancels the request (for the engine's stream).
pub trait EventSource: Send + 'static {
    /// The next event.
    fn next_event(&mut self) -> impl Future<Output = Option<Event>> + Send;
}

impl EventSource for RequestStream {
    fn next_event(&mut self) -> impl Future<Output = Option<Event>> + Send {
        self.recv()
    }
}

/// A fixed list of events (tests, and replaying a known outcome).
impl EventSource for std::vec::IntoIter<Event> {
    fn next_event(&mut self) -> impl Future<Output = Option<Event>> + Send {
        std::future::ready(self.next())
    }
}

/// What is known so far about a request's `n` completions.
#[derive(Debug)]
pub struct Tally {
    prompt_tokens: usize,
    policy: String,
    done: Vec<Option<(usize, KvUsage)>>,
    /// Adaptive length's tally of the (single) completion, when the request
    /// set a reasoning effort or budget.
    reasoning: Option<(Option<Effort>, LengthTally)>,
}

impl Tally {
    /// A request of `n` completions over `prompt_tokens`, run under `policy`
    /// (its canonical spec string).
    pub fn new(n: usize, prompt_tokens: usize, policy: String) -> Self {
        Self {
            prompt_tokens,
            policy,
            done: vec![None; n.max(1)],
            reasoning: None,
        }
    }

    /// Also tallies adaptive length (requests with one completion), reported
    /// in the `tern` object.
    pub fn with_reasoning(mut self, effort: Option<Effort>, cap: usize) -> Self {
        self.reasoning = Some((effort, LengthTally::new(cap)));
        self
    }

    /// Records the probe and conclusion events of adaptive length; other
    /// events are not its business.
    pub fn reasoning_event(&mut self, event: &Event) {
        let Some((_, t)) = &mut self.reasoning else {
            return;
        };
        match event {
            Event::Probe {
                index: 0,
                at,
                text,
                tokens,
            } => t.probe(*at, text, *tokens),
            Event::Concluded {
                index: 0,
                at,
                early,
            } => t.concluded(*at, *early),
            _ => {}
        }
    }

    /// Completions the request has.
    pub fn n(&self) -> usize {
        self.done.len()
    }

    /// Whether `index` names one of the completions.
    pub fn has(&self, index: usize) -> bool {
        index < self.done.len()
    }

    /// Records completion `index` as finished; false if it was already (or
    /// is not one of ours), so a duplicate never yields a second finish.
    pub fn finish(&mut self, index: usize, completion_tokens: usize, kv: KvUsage) -> bool {
        match self.done.get_mut(index) {
            Some(slot @ None) => {
                *slot = Some((completion_tokens, kv));
                true
            }
            _ => false,
        }
    }

    /// Whether every completion has finished.
    pub fn all_done(&self) -> bool {
        self.done.iter().all(Option::is_some)
    }

    /// Token counts over the completions finished so far.
    pub fn usage(&self) -> Usage {
        let completion = self.done.iter().flatten().map(|(t, _)| t).sum();
        Usage::new(self.prompt_tokens, completion)
    }

    /// The `tern` object: the policy and the largest KV figures over completions.
    pub fn tern(&self) -> TernInfo {
        let kv = || self.done.iter().flatten().map(|(_, kv)| kv);
        TernInfo {
            kv_policy: self.policy.clone(),
            kv_bytes: kv().map(|k| k.bytes_peak).max().unwrap_or(0),
            kv_bytes_full: kv().map(|k| k.bytes_full).max().unwrap_or(0),
            prompt_tokens: self.prompt_tokens,
            reasoning: self.reasoning.as_ref().map(|(effort, t)| {
                let generated = self.done[0].as_ref().map_or(0, |(n, _)| *n);
                ReasoningInfo {
                    reasoning_effort: *effort,
                    length: t.finish(generated),
                }
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// KV figures for tests.
    pub fn kv(peak: usize, full: usize) -> KvUsage {
        KvUsage {
            policy: "full".into(),
            bytes_peak: peak,
            bytes_final: peak,
            bytes_full: full,
            evictions: None,
        }
    }

    #[test]
    fn tally_sums_tokens_and_takes_the_largest_kv() {
        let mut t = Tally::new(2, 5, "full".into());
        assert!(t.finish(1, 3, kv(100, 200)));
        assert!(!t.all_done());
        assert!(!t.finish(1, 3, kv(100, 200)));
        assert!(!t.finish(7, 3, kv(100, 200)));
        assert!(t.finish(0, 4, kv(300, 150)));
        assert!(t.all_done());
        assert_eq!(t.usage(), Usage::new(5, 7));
        let tern = t.tern();
        assert_eq!(
            (tern.kv_bytes, tern.kv_bytes_full, tern.prompt_tokens),
            (300, 200, 5)
        );
        assert!(tern.reasoning.is_none());
    }

    #[test]
    fn reasoning_events_make_the_tern_reasoning_report() {
        let mut t = Tally::new(1, 5, "full".into()).with_reasoning(Some(Effort::Auto), 2048);
        for at in [64, 128, 192] {
            t.reasoning_event(&Event::Probe {
                index: 0,
                at,
                text: " 42.".into(),
                tokens: 3,
            });
        }
        t.reasoning_event(&Event::Concluded {
            index: 0,
            at: 192,
            early: true,
        });
        assert!(t.finish(0, 200, kv(1, 2)));
        let r = t.tern().reasoning.unwrap();
        assert_eq!(r.reasoning_effort, Some(Effort::Auto));
        assert!(r.length.stopped_early);
        assert_eq!(r.length.probes.len(), 3);
        assert_eq!(r.length.tokens_spent, 209);
        assert_eq!(r.length.tokens_saved, 2048 - 192);
        let json = serde_json::to_value(t.tern()).unwrap();
        assert_eq!(json["reasoning"]["reasoning_effort"], "auto");
        assert_eq!(json["reasoning"]["probes"][0]["answer"], "42");
    }
}
