//! Output constraints applied while sampling.
//!
//! A request may restrict what the model is allowed to emit (for example
//! OpenAI's `response_format: {"type": "json_object"}`). The generation loop
//! checks each proposed token's bytes against the request's constraint and
//! only keeps tokens that leave the output a valid prefix, so the finished
//! text is guaranteed to satisfy it.

pub mod json;

pub use json::JsonPrefix;

/// A constraint on generated output a request may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// The output must be one JSON object (OpenAI `response_format: json_object`).
    JsonObject,
}
