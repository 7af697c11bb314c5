//! Bearer-token authentication for `/v1/*` when the server has an API key.
//!
//! `/health`, `/metrics` and the chat page stay open so probes and browsers
//! work without the key; CORS preflights are answered before this runs.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::openai::error::ApiError;
use crate::state::AppState;

/// Middleware: passes the request on if no key is set or the
/// `Authorization: Bearer <key>` header carries it; otherwise a 401.
pub async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = state.api_key() {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same_key(g, key)) {
            return ApiError::invalid_api_key().into_response();
        }
    }
    next.run(req).await
}

/// Compares in time independent of where the keys first differ.
fn same_key(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::same_key;

    #[test]
    fn keys_compare_exactly() {
        assert!(same_key("abc", "abc"));
        assert!(!same_key("abc", "abd"));
        assert!(!same_key("abc", "abcd"));
        assert!(!same_key("", "a"));
    }
}
