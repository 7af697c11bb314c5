//! A request's events gathered into finished completions.
//!
//! Every caller that wants whole completions (trainer rollouts, best-of-N,
//! adaptive length, the CLI, the server's non-streamed answers) reads a
//! request through [`Collector`], so a new field on an event is threaded
//! through one place. Streaming callers watch the events go by
//! ([`RequestStream::collect_blocking_with`]) and still get the totals.

use super::{Event, FinishReason, KvUsage, RequestStream, SpecStats, TokenLogprob};
use crate::error::RuntimeError;

/// An answer probe that ran during a completion's reasoning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeOutput {
    /// Tokens the completion had generated when it was probed.
    pub at: usize,
    /// What the probe wrote after the forced answer suffix.
    pub text: String,
    /// Tokens the probe generated.
    pub tokens: usize,
}

/// Where a completion stopped reasoning (think requests only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conclusion {
    /// Reasoning tokens generated.
    pub at: usize,
    /// True when the probes settled it, false when it hit the budget.
    pub early: bool,
}

/// One completion of a request, gathered from its events.
#[derive(Clone, Debug, Default)]
pub struct Completion {
    /// Its text (stop strings cut, control tokens hidden).
    pub text: String,
    /// Its sampled token ids, in order.
    pub tokens: Vec<u32>,
    /// Each token's log-probability, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended; `None` only while it runs.
    pub finish_reason: Option<FinishReason>,
    /// Tokens it generated (a final stop token included).
    pub completion_tokens: usize,
    /// Its KV cache figures, once done.
    pub kv: Option<KvUsage>,
    /// Answer probes, in order.
    pub probes: Vec<ProbeOutput>,
    /// Where it stopped reasoning, if it did.
    pub conclusion: Option<Conclusion>,
    /// What speculative decoding did, when the request speculated or asked to.
    pub speculation: Option<SpecStats>,
}

/// Everything a finished request produced.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    /// Prompt length in tokens (0 if the engine never read the prompt).
    pub prompt_tokens: usize,
    /// One per completion, in index order.
    pub completions: Vec<Completion>,
}

impl Collected {
    /// The first completion (the only one of an `n = 1` request).
    pub fn first(&self) -> &Completion {
        &self.completions[0]
    }

    /// Takes the completions out, in index order.
    pub fn into_completions(self) -> Vec<Completion> {
        self.completions
    }
}

/// Folds a request's events, in order, into its completions.
#[derive(Debug)]
pub struct Collector {
    collected: Collected,
    done: usize,
}

impl Collector {
    /// A collector for a request of `n` completions.
    pub fn new(n: usize) -> Self {
        Self {
            collected: Collected {
                prompt_tokens: 0,
                completions: vec![Completion::default(); n.max(1)],
            },
            done: 0,
        }
    }

    /// Folds one event in. An [`Event::Error`] ends the request with that
    /// error; an index past the request's `n` is an engine bug, reported.
    pub fn push(&mut self, event: Event) -> Result<(), RuntimeError> {
        fn slot(c: &mut Collected, index: usize) -> Result<&mut Completion, RuntimeError> {
            let n = c.completions.len();
            c.completions.get_mut(index).ok_or_else(|| {
                RuntimeError::Generation(format!(
                    "the engine sent completion {index} of a request of {n}"
                ))
            })
        }
        match event {
            Event::Prefilled { prompt_tokens } => self.collected.prompt_tokens = prompt_tokens,
            Event::Token {
                index,
                token,
                text,
                logprob,
            } => {
                let c = slot(&mut self.collected, index)?;
                c.text.push_str(&text);
                c.tokens.push(token);
                c.logprobs.extend(logprob);
            }
            Event::Done {
                index,
                finish_reason,
                completion_tokens,
                kv,
            } => {
                let c = slot(&mut self.collected, index)?;
                if c.finish_reason.is_none() {
                    self.done += 1;
                }
                c.finish_reason = Some(finish_reason);
                c.completion_tokens = completion_tokens;
                c.kv = Some(kv);
            }
            Event::Probe {
                index,
                at,
                text,
                tokens,
            } => slot(&mut self.collected, index)?
                .probes
                .push(ProbeOutput { at, text, tokens }),
            Event::Concluded { index, at, early } => {
                slot(&mut self.collected, index)?.conclusion = Some(Conclusion { at, early })
            }
            Event::Speculated { index, stats } => {
                slot(&mut self.collected, index)?.speculation = Some(stats)
            }
            Event::Error(message) => return Err(RuntimeError::Generation(message)),
        }
        Ok(())
    }

    /// Whether every completion has ended.
    pub fn is_done(&self) -> bool {
        self.done == self.collected.completions.len()
    }

    /// What was gathered so far (for a caller that answers as it goes).
    pub fn get(&self) -> &Collected {
        &self.collected
    }

    /// The request's completions; an error if any had not ended (the engine
    /// went away mid-request).
    pub fn finish(self) -> Result<Collected, RuntimeError> {
        if !self.is_done() {
            return Err(RuntimeError::Generation(
                "the engine stopped before the request finished".into(),
            ));
        }
        Ok(self.collected)
    }
}

impl RequestStream {
    /// Reads the request to its end, blocking the thread (CLI, trainer,
    /// reasoning; not inside an async runtime).
    pub fn collect_blocking(self) -> Result<Collected, RuntimeError> {
        self.collect_blocking_with(|_| {})
    }

    /// As [`Self::collect_blocking`], showing `watch` each event before it
    /// is folded in (to print tokens as they come, or time the prefill).
    pub fn collect_blocking_with(
        mut self,
        mut watch: impl FnMut(&Event),
    ) -> Result<Collected, RuntimeError> {
        let mut c = Collector::new(self.n);
        while !c.is_done() {
            let Some(event) = self.blocking_recv() else {
                break;
            };
            watch(&event);
            c.push(event)?;
        }
        c.finish()
    }

    /// Reads the request to its end (async callers).
    pub async fn collect(mut self) -> Result<Collected, RuntimeError> {
        let mut c = Collector::new(self.n);
        while !c.is_done() {
            let Some(event) = self.recv().await else {
                break;
            };
            c.push(event)?;
        }
        c.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv() -> KvUsage {
        KvUsage {
            policy: "full".into(),
            dtype: Default::default(),
            bytes_peak: 10,
            bytes_final: 10,
            bytes_full: 10,
            evictions: None,
            shifts: 0,
            entries_final: 0,
        }
    }

    fn token(index: usize, token: u32, text: &str) -> Event {
        Event::Token {
            index,
            token,
            text: text.into(),
            logprob: None,
        }
    }

    fn done(index: usize, reason: FinishReason, tokens: usize) -> Event {
        Event::Done {
            index,
            finish_reason: reason,
            completion_tokens: tokens,
            kv: kv(),
        }
    }

    fn run(events: Vec<Event>, n: usize) -> Result<Collected, RuntimeError> {
        let mut c = Collector::new(n);
        for e in events {
            c.push(e)?;
        }
        c.finish()
    }

    #[test]
    fn interleaved_completions_are_gathered_per_index() {
        let c = run(
            vec![
                Event::Prefilled { prompt_tokens: 3 },
                token(0, 5, "He"),
                token(1, 6, "Hi"),
                Event::Probe {
                    index: 0,
                    at: 1,
                    text: "4".into(),
                    tokens: 2,
                },
                token(0, 7, "llo"),
                Event::Concluded {
                    index: 0,
                    at: 2,
                    early: true,
                },
                done(1, FinishReason::Length, 1),
                done(0, FinishReason::Stop, 2),
            ],
            2,
        )
        .unwrap();
        assert_eq!(c.prompt_tokens, 3);
        let (a, b) = (&c.completions[0], &c.completions[1]);
        assert_eq!(
            (a.text.as_str(), a.tokens.as_slice()),
            ("Hello", &[5, 7][..])
        );
        assert_eq!((b.text.as_str(), b.tokens.as_slice()), ("Hi", &[6][..]));
        assert_eq!(a.finish_reason, Some(FinishReason::Stop));
        assert_eq!(b.finish_reason, Some(FinishReason::Length));
        assert_eq!(a.probes.len(), 1);
        assert_eq!(a.conclusion, Some(Conclusion { at: 2, early: true }));
        assert!(b.probes.is_empty() && b.conclusion.is_none());
    }

    #[test]
    fn errors_early_ends_and_bad_indices_are_reported() {
        let e = run(vec![token(0, 1, "a"), Event::Error("boom".into())], 1).unwrap_err();
        assert_eq!(e.to_string(), "generation failed: boom");
        let e = run(vec![token(0, 1, "a")], 1).unwrap_err();
        assert!(e.to_string().contains("stopped before"), "{e}");
        let e = run(vec![token(2, 1, "a")], 2).unwrap_err();
        assert!(
            e.to_string().contains("completion 2 of a request of 2"),
            "{e}"
        );
    }
}
