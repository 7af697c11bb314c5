//! Chat completion chunks -> Anthropic's answer.
//!
//! The messages handler always runs chat streamed; [`Translator`] turns each
//! `chat.completion.chunk` into Anthropic's events: `message_start` and a
//! `ping`, then per block `content_block_start`, `content_block_delta`
//! (`text_delta` for prose, `input_json_delta` for a call's arguments as chat
//! reads them out of the text) and `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`. A streamed
//! request sends those events; a plain one folds them into one `message`
//! ([`Accumulator`]), so both answers are the same by construction.
//!
//! `stop_sequences` are matched here ([`StopMatcher`]), on the text blocks;
//! a match ends the answer with `stop_reason: "stop_sequence"` and the
//! sequence; the caller then drops the chat stream, which cancels the
//! request in the engine.

use serde_json::Value;

use super::stop::StopMatcher;
use super::wire::{Block, Delta, ErrorBody, Event, Message, MessageDelta, StopReason, Usage};

/// The block being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text(usize),
    Tool(usize),
}

/// What one step of the chat stream brought.
#[derive(Debug)]
pub enum Upstream {
    /// A `chat.completion.chunk`.
    Chunk(Value),
    /// `[DONE]`: the stream ended normally.
    Done,
    /// An error payload (the request failed midway), with its message.
    Error(String),
}

/// Turns one request's chat chunks into Anthropic events.
#[derive(Debug)]
pub struct Translator {
    id: String,
    model: String,
    usage: Usage,
    stops: StopMatcher,
    open: Option<Open>,
    blocks: usize,
    /// Chunks that carried text or a call: the output-token count when a
    /// stop sequence ends the answer before chat reports its usage.
    pieces: usize,
    stop_reason: Option<StopReason>,
    tern: Option<Value>,
    finished: bool,
}

impl Translator {
    /// A translator for answer `id` by `model` to a prompt of
    /// `input_tokens`, ending at any of `stops`.
    pub fn new(id: String, model: String, input_tokens: usize, stops: Vec<String>) -> Self {
        Self {
            id,
            model,
            usage: Usage {
                input_tokens,
                output_tokens: 0,
            },
            stops: StopMatcher::new(stops),
            open: None,
            blocks: 0,
            pieces: 0,
            stop_reason: None,
            tern: None,
            finished: false,
        }
    }

    /// `message_start` and a `ping`, before any chunk.
    pub fn start(&self) -> Vec<Event> {
        let message = Message::empty(self.id.clone(), self.model.clone(), self.usage.input_tokens);
        vec![Event::MessageStart { message }, Event::Ping]
    }

    /// Whether the answer has ended (its last event given); the chat stream
    /// is then dropped, cancelling the request if it still runs.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The events one step of the chat stream produces.
    pub fn on_upstream(&mut self, step: Upstream) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        match step {
            Upstream::Chunk(chunk) => self.chunk(&chunk),
            Upstream::Done => self.end(),
            Upstream::Error(message) => self.fail(message),
        }
    }

    /// The events when the chat stream ends without `[DONE]`.
    pub fn on_closed(&mut self) -> Vec<Event> {
        if self.finished {
            return Vec::new();
        }
        self.fail("the engine stopped before the request finished".into())
    }

    fn chunk(&mut self, chunk: &Value) -> Vec<Event> {
        let mut out = Vec::new();
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            let count = |k: &str| u[k].as_u64().map(|n| n as usize);
            self.usage.input_tokens = count("prompt_tokens").unwrap_or(self.usage.input_tokens);
            self.usage.output_tokens = count("completion_tokens").unwrap_or(0);
        }
        if let Some(t) = chunk.get("tern").filter(|t| t.is_object()) {
            self.tern = Some(t.clone());
        }
        // One completion (chat's `n` is never set), so only choice 0.
        let Some(choice) = chunk["choices"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["index"] == 0))
        else {
            return out;
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.pieces += 1;
            out.extend(self.text(text));
            if self.finished {
                return out;
            }
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.pieces += 1;
            out.extend(self.call(call));
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            let held = self.stops.flush();
            out.extend(self.send_text(held));
            out.extend(self.close());
            self.stop_reason = Some(match reason {
                "length" => StopReason::MaxTokens,
                "tool_calls" => StopReason::ToolUse,
                _ => StopReason::EndTurn,
            });
        }
        out
    }

    /// Prose through the stop matcher; a match ends the answer.
    fn text(&mut self, text: &str) -> Vec<Event> {
        let (safe, matched) = self.stops.feed(text);
        let mut out = self.send_text(safe);
        if let Some(stop) = matched {
            out.extend(self.close());
            // Chat's usage never comes: the request is cancelled here.
            self.usage.output_tokens = self.pieces;
            out.extend(self.finish(StopReason::StopSequence, Some(stop)));
        }
        out
    }

    /// `text` into the open text block (opening one if needed).
    fn send_text(&mut self, text: String) -> Vec<Event> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let index = match self.open {
            Some(Open::Text(i)) => i,
            _ => {
                out.extend(self.close());
                let i = self.begin(Open::Text);
                out.push(Event::ContentBlockStart {
                    index: i,
                    content_block: Block::Text {
                        text: String::new(),
                    },
                });
                i
            }
        };
        out.push(Event::ContentBlockDelta {
            index,
            delta: Delta::TextDelta { text },
        });
        out
    }

    /// A `tool_calls` delta: one with an `id` begins a `tool_use` block,
    /// argument fragments extend it.
    fn call(&mut self, call: &Value) -> Vec<Event> {
        let mut out = Vec::new();
        let f = &call["function"];
        if let Some(id) = call["id"].as_str() {
            let held = self.stops.flush();
            out.extend(self.send_text(held));
            out.extend(self.close());
            let index = self.begin(Open::Tool);
            let id = match id.strip_prefix("call_") {
                Some(rest) => format!("toolu_{rest}"),
                None => id.to_string(),
            };
            out.push(Event::ContentBlockStart {
                index,
                content_block: Block::ToolUse {
                    id,
                    name: f["name"].as_str().unwrap_or_default().to_string(),
                    input: Value::Object(Default::default()),
                },
            });
        }
        let args = f["arguments"].as_str().filter(|a| !a.is_empty());
        if let (Some(Open::Tool(index)), Some(args)) = (self.open, args) {
            out.push(Event::ContentBlockDelta {
                index,
                delta: Delta::InputJsonDelta {
                    partial_json: args.to_string(),
                },
            });
        }
        out
    }

    fn begin(&mut self, kind: fn(usize) -> Open) -> usize {
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some(kind(index));
        index
    }

    fn close(&mut self) -> Vec<Event> {
        match self.open.take() {
            Some(Open::Text(index) | Open::Tool(index)) => vec![Event::ContentBlockStop { index }],
            None => Vec::new(),
        }
    }

    /// `[DONE]`: the stop reason chat gave and its usage.
    fn end(&mut self) -> Vec<Event> {
        let mut out = self.close();
        let reason = self.stop_reason.unwrap_or(StopReason::EndTurn);
        out.extend(self.finish(reason, None));
        out
    }

    fn finish(&mut self, stop_reason: StopReason, stop_sequence: Option<String>) -> Vec<Event> {
        self.finished = true;
        vec![
            Event::MessageDelta {
                delta: MessageDelta {
                    stop_reason,
                    stop_sequence,
                },
                usage: self.usage,
                tern: self.tern.take(),
            },
            Event::MessageStop,
        ]
    }

    fn fail(&mut self, message: String) -> Vec<Event> {
        self.finished = true;
        vec![Event::Error {
            error: ErrorBody {
                kind: "api_error",
                message,
            },
        }]
    }
}

/// Folds a stream's events into the `message` a plain request answers.
#[derive(Debug, Default)]
pub struct Accumulator {
    message: Option<Message>,
    /// Each `tool_use` block's argument fragments, by block index.
    json: Vec<(usize, String)>,
}

impl Accumulator {
    /// Applies one event; an `error` event is returned as `Err` with its
    /// message.
    pub fn apply(&mut self, event: Event) -> Result<(), String> {
        let event = match event {
            Event::MessageStart { message } => {
                self.message = Some(message);
                return Ok(());
            }
            Event::Error { error } => return Err(error.message),
            other => other,
        };
        let Some(m) = &mut self.message else {
            return Ok(());
        };
        match event {
            Event::ContentBlockStart { content_block, .. } => m.content.push(content_block),
            Event::ContentBlockDelta { index, delta } => match (m.content.get_mut(index), delta) {
                (Some(Block::Text { text }), Delta::TextDelta { text: more }) => {
                    text.push_str(&more)
                }
                (Some(Block::ToolUse { .. }), Delta::InputJsonDelta { partial_json }) => {
                    match self.json.iter_mut().find(|(i, _)| *i == index) {
                        Some((_, s)) => s.push_str(&partial_json),
                        None => self.json.push((index, partial_json)),
                    }
                }
                _ => {}
            },
            Event::ContentBlockStop { index } => {
                if let Some(Block::ToolUse { input, .. }) = m.content.get_mut(index) {
                    let text = self
                        .json
                        .iter()
                        .find(|(i, _)| *i == index)
                        .map_or("", |(_, s)| s.as_str());
                    // Chat hands over a call only once its arguments are
                    // JSON, so a failure here would be a bug, not the model.
                    if let Ok(v @ Value::Object(_)) = serde_json::from_str(text) {
                        *input = v;
                    }
                }
            }
            Event::MessageDelta { delta, usage, tern } => {
                m.stop_reason = Some(delta.stop_reason);
                m.stop_sequence = delta.stop_sequence;
                m.usage = usage;
                m.tern = tern;
            }
            _ => {}
        }
        Ok(())
    }

    /// The message, once `message_start` was applied.
    pub fn finish(self) -> Option<Message> {
        self.message
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn content(text: &str) -> Upstream {
        Upstream::Chunk(
            json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}], "usage": null}),
        )
    }

    fn finish(reason: &str) -> Upstream {
        Upstream::Chunk(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}], "usage": null}),
        )
    }

    fn usage(prompt: usize, completion: usize) -> Upstream {
        Upstream::Chunk(json!({"choices": [], "usage": {"prompt_tokens": prompt,
            "completion_tokens": completion, "total_tokens": prompt + completion},
            "tern": {"kv_policy": "full"}}))
    }

    fn call(id: Option<&str>, name: Option<&str>, args: &str) -> Upstream {
        let mut c = json!({"index": 0, "function": {"arguments": args}});
        if let Some(id) = id {
            c["id"] = json!(id);
            c["type"] = json!("function");
        }
        if let Some(n) = name {
            c["function"]["name"] = json!(n);
        }
        Upstream::Chunk(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [c]}, "finish_reason": null}]}),
        )
    }

    /// The events of `steps` (as JSON, and as events) and the translator.
    fn run(stops: &[&str], steps: Vec<Upstream>) -> (Vec<Value>, Vec<Event>, Translator) {
        let mut t = Translator::new(
            "msg_1".into(),
            "m".into(),
            9,
            stops.iter().map(|s| s.to_string()).collect(),
        );
        let mut events = t.start();
        for s in steps {
            if t.is_finished() {
                break;
            }
            events.extend(t.on_upstream(s));
        }
        events.extend(t.on_closed());
        let v = events
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        (v, events, t)
    }

    /// The message a plain request would answer.
    fn folded(events: &[Event]) -> Value {
        let mut a = Accumulator::default();
        for e in events {
            a.apply(e.clone()).unwrap();
        }
        serde_json::to_value(a.finish().unwrap()).unwrap()
    }

    fn types(v: &[Value]) -> Vec<&str> {
        v.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn text_streams_in_anthropic_order() {
        let (v, e, _) = run(
            &[],
            vec![
                content(""),
                content("Hel"),
                content("lo"),
                finish("stop"),
                usage(9, 3),
                Upstream::Done,
            ],
        );
        assert_eq!(
            types(&v),
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(v[0]["message"]["usage"]["input_tokens"], 9);
        assert_eq!(v[2]["content_block"], json!({"type": "text", "text": ""}));
        assert_eq!(v[4]["delta"], json!({"type": "text_delta", "text": "lo"}));
        assert_eq!(v[6]["delta"]["stop_reason"], "end_turn");
        assert_eq!(v[6]["usage"]["output_tokens"], 3);
        assert_eq!(v[6]["tern"]["kv_policy"], "full");
        let m = folded(&e);
        assert_eq!(m["content"], json!([{"type": "text", "text": "Hello"}]));
        assert_eq!(m["stop_reason"], "end_turn");
        assert_eq!(m["usage"], json!({"input_tokens": 9, "output_tokens": 3}));
    }

    #[test]
    fn length_is_max_tokens() {
        let (_, e, _) = run(
            &[],
            vec![content("a"), finish("length"), usage(9, 1), Upstream::Done],
        );
        assert_eq!(folded(&e)["stop_reason"], "max_tokens");
    }

    #[test]
    fn tool_calls_become_tool_use_blocks_after_the_text() {
        let (v, e, _) = run(
            &[],
            vec![
                content("Let me check."),
                call(Some("call_abc"), Some("get_weather"), ""),
                call(None, None, "{\"city\": "),
                call(None, None, "\"Paris\"}"),
                finish("tool_calls"),
                usage(9, 12),
                Upstream::Done,
            ],
        );
        assert_eq!(v[4]["type"], "content_block_stop");
        assert_eq!(v[4]["index"], 0);
        assert_eq!(
            v[5]["content_block"],
            json!({"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}})
        );
        assert_eq!(v[5]["index"], 1);
        assert_eq!(v[6]["delta"]["type"], "input_json_delta");
        let m = folded(&e);
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(
            m["content"][0],
            json!({"type": "text", "text": "Let me check."})
        );
        assert_eq!(
            m["content"][1],
            json!({"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}})
        );
    }

    #[test]
    fn a_stop_sequence_split_across_chunks_ends_the_answer() {
        let (v, e, t) = run(
            &["END", "STOP"],
            vec![
                content("one two E"),
                content("N"),
                content("D three"),
                content("never sent"),
            ],
        );
        assert!(t.is_finished());
        let m = folded(&e);
        assert_eq!(m["content"], json!([{"type": "text", "text": "one two "}]));
        assert_eq!(m["stop_reason"], "stop_sequence");
        assert_eq!(m["stop_sequence"], "END");
        assert_eq!(m["usage"]["output_tokens"], 3);
        assert!(!v.iter().any(|e| e["type"] == "error"));
    }

    #[test]
    fn a_held_prefix_that_never_completes_is_sent_at_the_end() {
        let (_, e, _) = run(
            &["END"],
            vec![content("so E"), finish("stop"), usage(9, 2), Upstream::Done],
        );
        let m = folded(&e);
        assert_eq!(m["content"][0]["text"], "so E");
        assert_eq!(m["stop_reason"], "end_turn");
        assert!(m["stop_sequence"].is_null());
    }

    #[test]
    fn an_upstream_error_or_early_close_is_an_error_event() {
        let (v, _, _) = run(
            &[],
            vec![content("a"), Upstream::Error("engine failed".into())],
        );
        let last = v.last().unwrap();
        assert_eq!(last["type"], "error");
        assert_eq!(last["error"]["type"], "api_error");
        assert_eq!(last["error"]["message"], "engine failed");
        let (v, e, _) = run(&[], vec![content("a")]);
        assert_eq!(v.last().unwrap()["type"], "error");
        let mut a = Accumulator::default();
        let errs: Vec<_> = e.into_iter().map(|e| a.apply(e)).collect();
        assert_eq!(
            errs.last().unwrap().clone().unwrap_err(),
            "the engine stopped before the request finished"
        );
    }
}
