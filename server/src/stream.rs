//! Streamed answers: engine events -> server-sent events.
//!
//! [`StreamState`] is the pure part: it turns each event into zero or more
//! `data:` payloads and enforces OpenAI's ordering whatever the endpoint:
//! each choice opens once (chat: the `role` delta) before its content, gets
//! exactly one chunk with a `finish_reason`, then comes the optional usage
//! chunk and `[DONE]`. An engine error becomes an error chunk and ends the
//! stream. What a chunk looks like is the endpoint's [`ChunkFormat`].
//!
//! [`sse_response`] drives it from an [`EventSource`]. The source lives inside
//! the response body's stream, so when the client disconnects, hyper drops
//! the body, the source with it, and the engine cancels the request.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use tern_runtime::engine::Event;
use tern_runtime::engine::{FinishReason, TokenLogprob};

use crate::events::{EventSource, Tally};
use crate::openai::error::ApiError;
use crate::openai::usage::{TernInfo, Usage};

/// The payload that ends every successful stream.
pub const DONE: &str = "[DONE]";

/// How one endpoint writes its chunks (each a JSON string).
pub trait ChunkFormat: Send + 'static {
    /// The chunks that open choice `index` (chat: the `role` delta), if any.
    fn opening(&mut self, index: usize) -> Vec<String>;
    /// The chunks for new text of choice `index` and its token's
    /// log-probability; none when there is nothing worth a chunk.
    fn content(&mut self, index: usize, text: String, logprob: Option<TokenLogprob>)
        -> Vec<String>;
    /// The chunks that finish choice `index` (the last one carries the
    /// finish reason); `tern` is set on the stream's last finishing chunk
    /// when no usage chunk follows.
    fn finish(&mut self, index: usize, reason: FinishReason, tern: Option<TernInfo>)
        -> Vec<String>;
    /// The last chunk with `include_usage`: no choices, the usage and `tern`.
    fn usage(&mut self, usage: Usage, tern: TernInfo) -> String;
}

/// Where a stream is, between events.
pub struct StreamState<F> {
    format: F,
    tally: Tally,
    opened: Vec<bool>,
    include_usage: bool,
    finished: bool,
}

impl<F: ChunkFormat> StreamState<F> {
    /// A stream for `tally`'s completions written by `format`.
    pub fn new(format: F, tally: Tally, include_usage: bool) -> Self {
        let opened = vec![false; tally.n()];
        Self {
            format,
            tally,
            opened,
            include_usage,
            finished: false,
        }
    }

    /// Whether the stream has written its last payload.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The payloads one event produces.
    pub fn on_event(&mut self, event: Event) -> Vec<String> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        match event {
            Event::Prefilled { .. } => {
                for i in 0..self.tally.n() {
                    self.open(i, &mut out);
                }
            }
            Event::Token {
                index,
                text,
                logprob,
                ..
            } => {
                if self.tally.has(index) {
                    self.open(index, &mut out);
                    out.extend(self.format.content(index, text, logprob));
                }
            }
            Event::Done {
                index,
                finish_reason,
                completion_tokens,
                kv,
            } => {
                if !self.tally.has(index) {
                    return out;
                }
                self.open(index, &mut out);
                if self.tally.finish(index, completion_tokens, kv) {
                    let last = self.tally.all_done();
                    let tern = (last && !self.include_usage).then(|| self.tally.tern());
                    out.extend(self.format.finish(index, finish_reason, tern));
                    if last {
                        if self.include_usage {
                            out.push(self.format.usage(self.tally.usage(), self.tally.tern()));
                        }
                        out.push(DONE.to_string());
                        self.finished = true;
                    }
                }
            }
            e @ (Event::Probe { .. } | Event::Concluded { .. }) => self.tally.reasoning_event(&e),
            Event::Speculated { stats, .. } => self.tally.speculated(&stats),
            Event::Error(message) => {
                out.push(ApiError::internal(message).to_json());
                self.finished = true;
            }
        }
        out
    }

    /// The payloads when the engine's channel closes early (the engine stopped).
    pub fn on_closed(&mut self) -> Vec<String> {
        if self.finished {
            return Vec::new();
        }
        self.finished = true;
        let e = ApiError::internal("the engine stopped before the request finished");
        vec![e.to_json()]
    }

    fn open(&mut self, index: usize, out: &mut Vec<String>) {
        if let Some(opened @ false) = self.opened.get_mut(index) {
            *opened = true;
            out.extend(self.format.opening(index));
        }
    }
}

/// The SSE response for a request: every payload as `data: ...`, with
/// keep-alive comments while the engine is busy elsewhere.
pub fn sse_response<S: EventSource, F: ChunkFormat>(source: S, state: StreamState<F>) -> Response {
    let payloads = stream::unfold(Some((source, state)), |slot| async move {
        let (mut source, mut state) = slot?;
        loop {
            let out = match source.next_event().await {
                Some(event) => state.on_event(event),
                None => state.on_closed(),
            };
            if state.is_finished() {
                // Drop the source now: the request is over either way.
                return Some((out, None));
            }
            if !out.is_empty() {
                return Some((out, Some((source, state))));
            }
        }
    });
    let events = payloads.flat_map(|out| {
        stream::iter(
            out.into_iter()
                .map(|data| Ok::<_, Infallible>(SseEvent::default().data(data))),
        )
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::kv;
    use serde_json::{json, Value};

    /// A format that writes what it was asked, for checking the order.
    struct Probe;

    impl ChunkFormat for Probe {
        fn opening(&mut self, index: usize) -> Vec<String> {
            vec![json!({"open": index}).to_string()]
        }
        fn content(&mut self, index: usize, text: String, _: Option<TokenLogprob>) -> Vec<String> {
            (!text.is_empty())
                .then(|| json!({"index": index, "text": text}).to_string())
                .into_iter()
                .collect()
        }
        fn finish(
            &mut self,
            index: usize,
            reason: FinishReason,
            tern: Option<TernInfo>,
        ) -> Vec<String> {
            vec![json!({"finish": index, "reason": reason, "tern": tern.is_some()}).to_string()]
        }
        fn usage(&mut self, usage: Usage, _: TernInfo) -> String {
            json!({"usage": usage.total_tokens}).to_string()
        }
    }

    fn token(index: usize, text: &str) -> Event {
        Event::Token {
            index,
            token: 0,
            text: text.into(),
            logprob: None,
        }
    }

    fn done(index: usize) -> Event {
        Event::Done {
            index,
            finish_reason: FinishReason::Stop,
            completion_tokens: 2,
            kv: kv(1, 2),
        }
    }

    fn run(events: Vec<Event>, n: usize, include_usage: bool) -> Vec<String> {
        let mut s = StreamState::new(Probe, Tally::new(n, 3, "full".into()), include_usage);
        let mut out = Vec::new();
        for e in events {
            out.extend(s.on_event(e));
        }
        out.extend(s.on_closed());
        out
    }

    fn parsed(out: &[String]) -> Vec<Value> {
        out.iter()
            .map(|s| serde_json::from_str(s).unwrap_or(Value::String(s.clone())))
            .collect()
    }

    #[test]
    fn opens_first_finishes_once_then_done() {
        let out = run(
            vec![
                Event::Prefilled { prompt_tokens: 3 },
                token(1, "b"),
                token(0, "a"),
                token(0, ""),
                done(0),
                done(0),
                done(1),
            ],
            2,
            false,
        );
        let v = parsed(&out);
        assert_eq!(v[0], json!({"open": 0}));
        assert_eq!(v[1], json!({"open": 1}));
        assert_eq!(v[2], json!({"index": 1, "text": "b"}));
        assert_eq!(v[3], json!({"index": 0, "text": "a"}));
        assert_eq!(v[4], json!({"finish": 0, "reason": "stop", "tern": false}));
        assert_eq!(v[5], json!({"finish": 1, "reason": "stop", "tern": true}));
        assert_eq!(v[6], json!(DONE));
        assert_eq!(v.len(), 7);
    }

    #[test]
    fn usage_chunk_comes_last_before_done() {
        let out = run(vec![token(0, "x"), done(0)], 1, true);
        let v = parsed(&out);
        assert_eq!(v[0], json!({"open": 0}));
        assert_eq!(v[2], json!({"finish": 0, "reason": "stop", "tern": false}));
        assert_eq!(v[3], json!({"usage": 5}));
        assert_eq!(v[4], json!(DONE));
    }

    #[test]
    fn errors_end_the_stream_without_done() {
        let out = run(
            vec![token(0, "x"), Event::Error("boom".into()), done(0)],
            1,
            false,
        );
        let v = parsed(&out);
        assert_eq!(v.len(), 3);
        assert_eq!(v[2]["error"]["message"], "boom");
        assert_eq!(v[2]["error"]["type"], "server_error");
        let out = run(vec![token(0, "x")], 1, false);
        assert!(parsed(&out).last().unwrap()["error"].is_object());
    }

    #[tokio::test]
    async fn sse_body_frames_every_payload() {
        let events = vec![
            Event::Prefilled { prompt_tokens: 3 },
            token(0, "hi"),
            done(0),
        ];
        let state = StreamState::new(Probe, Tally::new(1, 3, "full".into()), false);
        let res = sse_response(events.into_iter(), state);
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.starts_with("data: {\"open\":0}\n\n"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(text.matches("data: ").count(), 4);
    }
}
