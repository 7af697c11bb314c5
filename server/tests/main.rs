//! `tern-server` driven in process through its router, over the tiny
//! generated model: endpoints, streaming, errors, auth and metrics, and
//! Anthropic's Messages API.

mod anthropic;
mod api;
mod best_of;
mod connections;
mod embeddings;
mod errors;
mod lifecycle;
mod security;
mod streaming;
mod support;
