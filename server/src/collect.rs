//! Non-streamed answers: read a request's events to the end and gather each
//! completion's text, token log-probabilities and finish reason.
//!
//! The endpoint turns the result into its own response shape. If the client
//! goes away, the handler's future (and with it the event source) is dropped,
//! which cancels the request in the engine.

use tern_runtime::engine::{Collector, Completion, Event, FinishReason};

use crate::events::{EventSource, Tally};
use crate::openai::error::ApiError;

/// Everything a non-streamed answer reports.
#[derive(Debug)]
pub struct Collected {
    /// One per completion, in index order (text with stop strings cut and
    /// control tokens hidden, log-probabilities when asked for, finish reason).
    pub choices: Vec<Completion>,
    /// Token counts and KV figures.
    pub tally: Tally,
}

/// Reads `source` until every completion is done, through the runtime's
/// [`Collector`]; the tally sees what the usage and reasoning reports need.
/// An engine error, or the engine going away first, is a 500.
pub async fn collect(
    mut source: impl EventSource,
    mut tally: Tally,
) -> Result<Collected, ApiError> {
    let mut collector = Collector::new(tally.n());
    while !tally.all_done() {
        let Some(event) = source.next_event().await else {
            return Err(ApiError::internal(
                "the engine stopped before the request finished",
            ));
        };
        match &event {
            Event::Probe { .. } | Event::Concluded { .. } => tally.reasoning_event(&event),
            Event::Speculated { stats, .. } => tally.speculated(stats),
            Event::Done {
                index,
                completion_tokens,
                kv,
                ..
            } => {
                tally.finish(*index, *completion_tokens, kv.clone());
            }
            _ => {}
        }
        collector
            .push(event)
            .map_err(|e| ApiError::internal(e.to_string()))?;
    }
    let choices = collector
        .finish()
        .map_err(|e| ApiError::internal(e.to_string()))?
        .into_completions();
    Ok(Collected { choices, tally })
}

/// OpenAI's name for a finish reason.
pub fn finish_name(reason: Option<FinishReason>) -> &'static str {
    match reason {
        Some(FinishReason::Length) => "length",
        Some(FinishReason::Stop) | None => "stop",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::kv;

    fn token(index: usize, text: &str) -> Event {
        Event::Token {
            index,
            token: 0,
            text: text.into(),
            logprob: None,
        }
    }

    fn done(index: usize, reason: FinishReason) -> Event {
        Event::Done {
            index,
            finish_reason: reason,
            completion_tokens: 2,
            kv: kv(10, 20),
        }
    }

    fn run(events: Vec<Event>, n: usize) -> Result<Collected, ApiError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(collect(events.into_iter(), Tally::new(n, 3, "full".into())))
    }

    #[test]
    fn gathers_text_per_choice() {
        let c = run(
            vec![
                Event::Prefilled { prompt_tokens: 3 },
                token(0, "He"),
                token(1, "Hi"),
                token(0, "llo"),
                done(1, FinishReason::Length),
                done(0, FinishReason::Stop),
            ],
            2,
        )
        .unwrap();
        assert_eq!(c.choices[0].text, "Hello");
        assert_eq!(c.choices[1].text, "Hi");
        assert_eq!(finish_name(c.choices[1].finish_reason), "length");
        assert_eq!(c.tally.usage().completion_tokens, 4);
    }

    #[test]
    fn engine_errors_and_early_ends_are_500() {
        let e = run(vec![token(0, "a"), Event::Error("boom".into())], 1).unwrap_err();
        assert_eq!(e.status.as_u16(), 500);
        assert_eq!(e.kind, "server_error");
        let e = run(vec![token(0, "a")], 1).unwrap_err();
        assert_eq!(e.status.as_u16(), 500);
    }
}
