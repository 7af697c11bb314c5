//! OpenAI's wire format: request and response types, and the error envelope.
//!
//! Only `server/` knows these types; handlers convert them to runtime types
//! (`params.rs`, `prompt.rs`) and runtime results back to them. Nothing here
//! talks to the engine.

pub mod chat;
pub mod completion;
pub mod embedding;
pub mod error;
pub mod models;
pub mod request;
pub mod usage;

use serde::Serialize;

/// The fields every response object and stream chunk starts with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResponseMeta {
    /// `chatcmpl-...` or `cmpl-...`, the same for every chunk of one stream.
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix time the request was received.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// Identifies the server build that produced the output.
    pub system_fingerprint: String,
}

impl ResponseMeta {
    /// The same meta with another `object` (a stream chunk of a response).
    pub fn with_object(&self, object: &'static str) -> Self {
        Self {
            object,
            ..self.clone()
        }
    }
}

/// `system_fingerprint`: the server's name and version.
pub fn system_fingerprint() -> String {
    format!("tern-{}", env!("CARGO_PKG_VERSION"))
}
