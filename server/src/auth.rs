//! Bearer-token authentication for `/v1/*` (and `/metrics`, unless
//! `--metrics-public`) when the server has an API key; Anthropic's routes
//! also take the key as `x-api-key`.
//!
//! `/health` and the chat page stay open so probes and browsers work without
//! the key; CORS preflights are answered before this runs. The scheme is
//! matched case-insensitively (RFC 9110) and keys are compared through their
//! SHA-256 digests, so neither where they differ nor their lengths show in
//! the time a refusal takes.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

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
            .and_then(bearer_token);
        if !given.is_some_and(|g| same_key(g, key)) {
            return ApiError::invalid_api_key().into_response();
        }
    }
    next.run(req).await
}

/// Middleware for Anthropic's routes: as [`require_api_key`], but the key
/// may also come as `x-api-key: <key>`, the header Anthropic's SDKs send.
pub async fn require_api_key_or_x_api_key(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(key) = state.api_key() {
        let headers = req.headers();
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        let x_api_key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        if ![bearer, x_api_key]
            .into_iter()
            .flatten()
            .any(|g| same_key(g, key))
        {
            let mut e = ApiError::invalid_api_key();
            e.message = "Incorrect or missing API key: send it as `x-api-key: <key>` or \
                         `Authorization: Bearer <key>`"
                .into();
            return e.into_response();
        }
    }
    next.run(req).await
}

/// The token of an `Authorization: Bearer <token>` value, the scheme in any case.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Compares the keys' SHA-256 digests without an early exit, so the time
/// taken depends on neither the keys' lengths nor their first difference.
fn same_key(a: &str, b: &str) -> bool {
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_exactly() {
        assert!(same_key("abc", "abc"));
        assert!(!same_key("abc", "abd"));
        assert!(!same_key("abc", "abcd"));
        assert!(!same_key("", "a"));
    }

    #[test]
    fn bearer_scheme_in_any_case() {
        assert_eq!(bearer_token("Bearer k1"), Some("k1"));
        assert_eq!(bearer_token("bearer k1"), Some("k1"));
        assert_eq!(bearer_token("BEARER  k1 "), Some("k1"));
        assert_eq!(bearer_token("Basic k1"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }
}
