//! One file per endpoint; each handler parses, validates, submits and
//! answers, with every failure an [`ApiError`].

pub mod adapters;
pub mod best_of;
pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod health;
pub mod messages;
pub mod metrics;
pub mod models;
pub mod reasoning;
pub mod responses;
pub mod spreadsheet;
pub mod tokenize;
pub mod ui;

use axum::http::Uri;

use crate::openai::error::ApiError;

/// Any path no route serves: a 404 in OpenAI's envelope.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::route_not_found(uri.path())
}

/// A known path called with the wrong method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
