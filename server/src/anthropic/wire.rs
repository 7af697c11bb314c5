//! Anthropic's response shapes: the `message` object, its content blocks,
//! the streaming events, and the error body. Types only; `reply.rs` builds
//! them from chat chunks.

use axum::response::sse::Event as SseEvent;
use serde::Serialize;
use serde_json::Value;

/// A `message` object: the whole answer, or (in `message_start`) its empty
/// beginning.
#[derive(Clone, Debug, Serialize)]
pub struct Message {
    /// `msg_` + 32 hex digits.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    /// The model that answered (the `model` asked for).
    pub model: String,
    /// Text and `tool_use` blocks, in the order written.
    pub content: Vec<Block>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; `null`
    /// until the answer ends.
    pub stop_reason: Option<StopReason>,
    /// The stop sequence that ended the answer, if one did.
    pub stop_sequence: Option<String>,
    /// Tokens read and written.
    pub usage: Usage,
    /// Tern's `tern` object (the KV policy and bytes), as chat reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<Value>,
}

impl Message {
    /// An empty assistant message, as `message_start` carries it.
    pub fn empty(id: String, model: String, input_tokens: usize) -> Self {
        Self {
            id,
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage {
                input_tokens,
                output_tokens: 0,
            },
            tern: None,
        }
    }
}

/// Why an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model ended its turn.
    EndTurn,
    /// `max_tokens` (or the context) ran out.
    MaxTokens,
    /// One of `stop_sequences` was written.
    StopSequence,
    /// The answer ends with tool calls.
    ToolUse,
}

/// `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens (the rendered conversation, tools included).
    pub input_tokens: usize,
    /// Tokens generated.
    pub output_tokens: usize,
}

/// A content block.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text (empty in `content_block_start`).
        text: String,
    },
    /// A call of one of the request's tools.
    ToolUse {
        /// `toolu_` + 16 hex digits; a `tool_result` names it.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments (`{}` in `content_block_start`).
        input: Value,
    },
}

/// A `content_block_delta`'s `delta`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    /// More text of a text block.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A fragment of a `tool_use` block's arguments, as JSON text.
    InputJsonDelta {
        /// The fragment; the fragments join to the `input` object.
        partial_json: String,
    },
}

/// `message_delta`'s `delta`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MessageDelta {
    /// Why the answer ended.
    pub stop_reason: StopReason,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
}

/// An error as Anthropic writes it (the `error` member of the body).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorBody {
    /// `invalid_request_error`, `authentication_error`, `api_error` ...
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What went wrong.
    pub message: String,
}

/// One streaming event; its `type` is also the SSE `event:` name.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The answer begins (empty content, input tokens known).
    MessageStart {
        /// The empty message.
        message: Message,
    },
    /// A content block begins.
    ContentBlockStart {
        /// Its place in `content`.
        index: usize,
        /// The block, empty.
        content_block: Block,
    },
    /// More of the open block.
    ContentBlockDelta {
        /// The block's place in `content`.
        index: usize,
        /// What it gains.
        delta: Delta,
    },
    /// The block is complete.
    ContentBlockStop {
        /// Its place in `content`.
        index: usize,
    },
    /// The answer's stop reason and final usage.
    MessageDelta {
        /// Stop reason and sequence.
        delta: MessageDelta,
        /// Cumulative usage (output tokens, and the input tokens again).
        usage: Usage,
        /// Tern's `tern` object.
        #[serde(skip_serializing_if = "Option::is_none")]
        tern: Option<Value>,
    },
    /// The stream ends.
    MessageStop,
    /// Keeps the connection alive.
    Ping,
    /// The request failed midway; the stream ends.
    Error {
        /// What failed.
        error: ErrorBody,
    },
}

impl Event {
    /// The event's `type`, which is also its SSE `event:` line.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Ping => "ping",
            Self::Error { .. } => "error",
        }
    }

    /// As a server-sent event: `event: NAME` and the JSON as `data:`.
    pub fn sse(&self) -> SseEvent {
        SseEvent::default()
            .event(self.name())
            .data(serde_json::to_string(self).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_serialize_in_anthropic_shapes() {
        let start = Event::MessageStart {
            message: Message::empty("msg_1".into(), "m".into(), 7),
        };
        assert_eq!(
            serde_json::to_value(&start).unwrap(),
            json!({"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 7, "output_tokens": 0}}})
        );
        let block = Event::ContentBlockStart {
            index: 1,
            content_block: Block::ToolUse {
                id: "toolu_1".into(),
                name: "f".into(),
                input: json!({}),
            },
        };
        assert_eq!(
            serde_json::to_value(&block).unwrap(),
            json!({"type": "content_block_start", "index": 1,
                   "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}})
        );
        let delta = Event::ContentBlockDelta {
            index: 0,
            delta: Delta::InputJsonDelta {
                partial_json: "{\"a\"".into(),
            },
        };
        assert_eq!(
            serde_json::to_value(&delta).unwrap(),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"a\""}})
        );
        let end = Event::MessageDelta {
            delta: MessageDelta {
                stop_reason: StopReason::StopSequence,
                stop_sequence: Some("END".into()),
            },
            usage: Usage {
                input_tokens: 7,
                output_tokens: 3,
            },
            tern: None,
        };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"type": "message_delta",
                   "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                   "usage": {"input_tokens": 7, "output_tokens": 3}})
        );
        assert_eq!(
            serde_json::to_value(Event::MessageStop).unwrap(),
            json!({"type": "message_stop"})
        );
        assert_eq!(
            serde_json::to_value(Event::Ping).unwrap(),
            json!({"type": "ping"})
        );
        for e in [start, block, delta, end, Event::MessageStop, Event::Ping] {
            assert_eq!(serde_json::to_value(&e).unwrap()["type"], e.name());
        }
    }
}
