//! Errors in Anthropic's shape: `{"type": "error", "error": {"type",
//! "message"}}`, the `type` named from the status (`invalid_request_error`,
//! `authentication_error`, `not_found_error`, `rate_limit_error`,
//! `api_error`, `overloaded_error` ...).
//!
//! Every failure is still one [`ApiError`] built where OpenAI's routes
//! build it; [`reshape`], the layer around the Anthropic routes, rewrites
//! the body of any response that came from one (the handlers', the JSON
//! extractor's, the API-key check's), keeping its status and headers. The
//! message is the same text, which names the request field at fault.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use crate::openai::error::ApiError;

/// Anthropic's error `type` for a status.
pub fn kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The error's body in Anthropic's shape. It has no `param`, so a message
/// that does not name its field already is prefixed with it.
pub fn body(e: &ApiError) -> serde_json::Value {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind(e.status), "message": message}})
}

/// Middleware: a response built from an [`ApiError`] gets Anthropic's body
/// (same status, same headers such as `Retry-After`).
pub async fn reshape(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let Some(e) = res.extensions_mut().remove::<ApiError>() else {
        return res;
    };
    let (mut parts, _) = res.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body(&e).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_anthropic_types() {
        let e = ApiError::invalid_param("max_tokens", "Missing required parameter: `max_tokens`");
        assert_eq!(
            body(&e),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                   "message": "Missing required parameter: `max_tokens`"}})
        );
        let e = ApiError::invalid_param("top_k", "must be -1 or at least 1");
        assert_eq!(
            body(&e)["error"]["message"],
            "top_k: must be -1 or at least 1"
        );
        assert_eq!(kind(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(kind(StatusCode::FORBIDDEN), "permission_error");
        assert_eq!(kind(StatusCode::NOT_FOUND), "not_found_error");
        assert_eq!(kind(StatusCode::PAYLOAD_TOO_LARGE), "request_too_large");
        assert_eq!(
            kind(StatusCode::UNSUPPORTED_MEDIA_TYPE),
            "invalid_request_error"
        );
        assert_eq!(kind(StatusCode::TOO_MANY_REQUESTS), "rate_limit_error");
        assert_eq!(kind(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
        assert_eq!(kind(StatusCode::SERVICE_UNAVAILABLE), "overloaded_error");
    }
}
