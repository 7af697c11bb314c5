//! Anthropic's Messages API (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`) over the chat completions path.
//!
//! Nothing here runs the engine: [`request`] checks an Anthropic request and
//! converts it into the chat completions body ([`content`] for its turns),
//! which `routes::chat` renders, constrains (tools), samples and streams
//! exactly as it does for OpenAI clients; [`upstream`] reads that stream
//! back and [`reply`] turns its chunks into Anthropic's events or one
//! `message` ([`wire`] holds the shapes), ending at `stop_sequences` as
//! [`stop`] finds them. [`error`] gives every failure Anthropic's error body.

pub mod content;
pub mod error;
pub mod reply;
pub mod request;
pub mod stop;
pub mod upstream;
pub mod wire;
