//! Reading one request's engine events: where they come from
//! ([`EventSource`], the engine's `RequestStream` or a fixed list in tests)
//! and the running totals both answer styles report at the end ([`Tally`]:
//! which completions are done, tokens generated, KV bytes kept).

use std::future::Future;

use tern_runtime::engine::{Event, KvUsage, RequestStream};

use crate::openai::usage::{TernInfo, Usage};

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
}

impl Tally {
    /// A request of `n` completions over `prompt_tokens`, run under `policy`
    /// (its canonical spec string).
    pub fn new(n: usize, prompt_tokens: usize, policy: String) -> Self {
        Self {
            prompt_tokens,
            policy,
            done: vec![None; n.max(1)],
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
    }
}
