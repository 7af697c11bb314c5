//! Reading one request's engine events: where they come from
//! ([`EventSource`], the engine's `RequestStream` or a fixed list in tests)
//! and the running totals both answer styles report at the end ([`Tally`]:
//! which completions are done, tokens generated, KV bytes kept).

use std::future::Future;

use tern_runtime::engine::{Event, KvUsage, RequestStream, SpecStats};
use tern_solve::reasoning::{Effort, LengthTally};

use crate::openai::usage::{ChoiceKv, ReasoningInfo, TernInfo, Usage};
use crate::overflow::{Evicted, Overflowed};

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
    /// Adaptive length's tally of each completion, when the request set a
    /// reasoning effort or budget.
    reasoning: Option<(Option<Effort>, Vec<LengthTally>)>,
    /// Speculative decoding's figures, summed over the completions that sent them.
    speculation: Option<SpecStats>,
    /// The policy a request goes on past the context under, whose evictions
    /// the `tern` object reports.
    overflow: Option<String>,
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
            speculation: None,
            overflow: None,
        }
    }

    /// Also reports what `policy` (a `context_overflow` rule) evicted.
    pub fn with_overflow(mut self, policy: Option<String>) -> Self {
        self.overflow = policy;
        self
    }

    /// What the overflow policy evicted from the completion that read the
    /// most (`None` without one).
    fn overflowed(&self) -> Option<Overflowed> {
        let policy = self.overflow.clone()?;
        let (read, kv) = self
            .done
            .iter()
            .flatten()
            .map(|(n, kv)| (self.prompt_tokens + n.saturating_sub(1), kv))
            .max_by_key(|(read, _)| *read)?;
        let kept = kv.entries_final.min(read);
        Some(Overflowed::Policy(Evicted {
            policy,
            prompt_tokens: self.prompt_tokens,
            read_tokens: read,
            shifts: kv.shifts,
            kept_tokens: kept,
            evicted_tokens: read - kept,
        }))
    }

    /// Also tallies adaptive length, each completion on its own, reported in
    /// the `tern` object.
    pub fn with_reasoning(mut self, effort: Option<Effort>, cap: usize) -> Self {
        let tallies = vec![LengthTally::new(cap); self.done.len()];
        self.reasoning = Some((effort, tallies));
        self
    }

    /// Records the probe and conclusion events of adaptive length; other
    /// events are not its business.
    pub fn reasoning_event(&mut self, event: &Event) {
        let Some((_, tallies)) = &mut self.reasoning else {
            return;
        };
        match event {
            Event::Probe {
                index,
                at,
                text,
                tokens,
            } => {
                if let Some(t) = tallies.get_mut(*index) {
                    t.probe(*at, text, *tokens);
                }
            }
            Event::Concluded { index, at, early } => {
                if let Some(t) = tallies.get_mut(*index) {
                    t.concluded(*at, *early);
                }
            }
            _ => {}
        }
    }

    /// Adds one completion's speculative decoding figures (an
    /// [`Event::Speculated`]) to the request's.
    pub fn speculated(&mut self, stats: &SpecStats) {
        let sum = self.speculation.get_or_insert_with(SpecStats::default);
        sum.drafted += stats.drafted;
        sum.accepted += stats.accepted;
        sum.verify_steps += stats.verify_steps;
        sum.held_by_policy += stats.held_by_policy;
        if sum.off.is_none() {
            sum.off.clone_from(&stats.off);
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
            kv_dtype: kv().next().map(|k| k.dtype.to_string()).unwrap_or_default(),
            kv_bytes: kv().map(|k| k.bytes_peak).max().unwrap_or(0),
            kv_bytes_full: kv().map(|k| k.bytes_full).max().unwrap_or(0),
            prompt_tokens: self.prompt_tokens,
            context_overflow: self.overflowed(),
            choices: if self.done.len() > 1 {
                self.done
                    .iter()
                    .map(|d| {
                        d.as_ref()
                            .map_or_else(ChoiceKv::default, |(_, kv)| ChoiceKv {
                                kv_bytes: kv.bytes_peak,
                                kv_bytes_full: kv.bytes_full,
                            })
                    })
                    .collect()
            } else {
                Vec::new()
            },
            reasoning: self.reasoning.as_ref().map(|(effort, tallies)| {
                let reports = tallies
                    .iter()
                    .zip(&self.done)
                    .map(|(t, done)| t.finish(done.as_ref().map_or(0, |(n, _)| *n)))
                    .collect();
                ReasoningInfo::new(*effort, reports)
            }),
            speculative: self.speculation.clone(),
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
            dtype: Default::default(),
            bytes_peak: peak,
            bytes_final: peak,
            bytes_full: full,
            evictions: None,
            shifts: 0,
            entries_final: 0,
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
        let length = r.length.unwrap();
        assert!(length.stopped_early);
        assert_eq!(length.probes.len(), 3);
        assert_eq!(length.tokens_spent, 209);
        assert_eq!(length.tokens_saved, 2048 - 192);
        let json = serde_json::to_value(t.tern()).unwrap();
        assert_eq!(json["reasoning"]["reasoning_effort"], "auto");
        assert_eq!(json["reasoning"]["probes"][0]["answer"], "42");
        assert!(json["reasoning"].get("choices").is_none());
    }

    #[test]
    fn each_choice_gets_its_own_reasoning_report() {
        let mut t = Tally::new(2, 5, "full".into()).with_reasoning(None, 100);
        // Choice 1 probes twice and stops early; choice 0 runs to the cap.
        for at in [16, 32] {
            t.reasoning_event(&Event::Probe {
                index: 1,
                at,
                text: " 7".into(),
                tokens: 2,
            });
        }
        t.reasoning_event(&Event::Concluded {
            index: 1,
            at: 32,
            early: true,
        });
        t.reasoning_event(&Event::Concluded {
            index: 0,
            at: 100,
            early: false,
        });
        // An index the request does not have is ignored.
        t.reasoning_event(&Event::Concluded {
            index: 5,
            at: 1,
            early: true,
        });
        assert!(t.finish(0, 110, kv(1, 2)));
        assert!(t.finish(1, 40, kv(1, 2)));
        let r = t.tern().reasoning.unwrap();
        assert!(r.length.is_none());
        let [first, second] = &r.choices[..] else {
            panic!("two reports: {r:?}");
        };
        assert!(first.hit_cap && first.probes.is_empty());
        assert_eq!((first.reasoning_tokens, first.answer_tokens), (100, 10));
        assert!(second.stopped_early && second.probes.len() == 2);
        assert_eq!((second.reasoning_tokens, second.tokens_saved), (32, 68));
        assert_eq!(r.tokens_spent, Some(110 + 40 + 4));
        assert_eq!(r.tokens_saved, Some(68));
        let json = serde_json::to_value(t.tern()).unwrap();
        let json = &json["reasoning"];
        assert!(json["reasoning_effort"].is_null());
        assert!(json.get("cap").is_none(), "{json}");
        assert_eq!(json["choices"][1]["probes"][0]["answer"], "7");
        assert_eq!(json["tokens_saved"], 68);
    }
}
