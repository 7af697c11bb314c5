//! Reading request bodies ourselves, so every failure (too large, not UTF-8,
//! malformed JSON, a field of the wrong type) answers in OpenAI's envelope
//! and axum's default rejection text never reaches a client.
//!
//! A body is read once into a JSON object ([`JsonBody`]); each endpoint then
//! reads typed views of it with [`fields`] (the shared fields and its own),
//! which names the offending field on a type error.
//!
//! Before anything is expanded into a `Value`, the body is bounded twice:
//! in bytes by `--max-body` (413, enforced while it is read) and in nesting
//! by [`MAX_DEPTH`] (400, a byte scan that allocates nothing), so neither a
//! large nor a deeply nested document costs more than its size.
//!
//! Only `Content-Type: application/json` bodies are read: a browser sends
//! `text/plain` or form bodies cross-site without a CORS preflight, so
//! accepting them would let any web page drive the API (415 instead).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::openai::error::ApiError;
use crate::state::AppState;

/// Deepest nesting of arrays and objects a body may have. OpenAI's own
/// request shapes need under 10 levels and a JSON schema a few more; a
/// deeper document is refused before it is parsed, since expanding and
/// dropping it recurses once per level.
pub const MAX_DEPTH: usize = 64;

/// A request body that is a JSON object.
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        if !is_json(req.headers()) {
            return Err(ApiError::unsupported_media_type());
        }
        // One deadline for the whole body: a client trickling a byte at a
        // time must not hold the connection for minutes.
        let read = Bytes::from_request(req, state);
        let bytes = tokio::time::timeout(state.body_timeout(), read)
            .await
            .map_err(|_| ApiError::body_timeout())?
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::payload_too_large()
                } else {
                    ApiError::bad_request("Could not read the request body")
                }
            })?;
        parse_object(&bytes).map(JsonBody)
    }
}

/// Whether the request declares a JSON body: `application/json`, any case,
/// parameters such as `; charset=utf-8` allowed.
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// Parses `bytes` as one JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "The request body is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request(
            "The request body is empty; send a JSON object",
        ));
    }
    let depth = depth(bytes);
    if depth > MAX_DEPTH {
        return Err(ApiError::bad_request(format!(
            "The request body nests arrays and objects {depth} levels deep; at most {MAX_DEPTH} are allowed"
        )));
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "The request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// The deepest nesting of `[` and `{` in `bytes`, brackets inside strings
/// not counted: one pass, no allocation. Malformed input gets some number;
/// the parser then refuses it on its own.
fn depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Reads a typed view of `body`; a field of the wrong type is a 400 whose
/// `param` is that field's path (e.g. `messages[0].content`).
pub fn fields<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("Invalid request: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("Invalid value for `{path}`: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::request::GenerationFields;

    #[test]
    fn rejects_non_objects_and_bad_bytes() {
        assert!(parse_object(b"[1]").is_err());
        assert!(parse_object(b"{\"a\":").is_err());
        assert!(parse_object(b"").is_err());
        assert!(parse_object(&[b'{', 0xff, b'}']).is_err());
        assert!(parse_object(b"{\"a\": 1}").is_ok());
    }

    #[test]
    fn nesting_is_bounded_before_parsing() {
        let nested = |n: usize| format!("{{\"a\": {}{}}}", "[".repeat(n), "]".repeat(n));
        // The object itself is one level.
        assert!(parse_object(nested(MAX_DEPTH - 1).as_bytes()).is_ok());
        let e = parse_object(nested(MAX_DEPTH).as_bytes()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("65 levels"), "{}", e.message);
        // Far deeper than serde's own recursion limit: refused by the scan, no panic.
        let e = parse_object(nested(100_000).as_bytes()).unwrap_err();
        assert!(e.message.contains("at most 64"), "{}", e.message);
        // Brackets inside strings (escaped quotes too) are text, not nesting.
        let text = format!("{{\"s\": \"\\\"{}\"}}", "[".repeat(500));
        assert!(parse_object(text.as_bytes()).is_ok(), "{text}");
        assert_eq!(depth(br#"{"a": [{"b": "]]]["}], "c": {}}"#), 3);
    }

    #[test]
    fn only_application_json_is_json() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, v.parse().unwrap());
            is_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(!with("text/plain"));
        assert!(!with("application/x-www-form-urlencoded"));
        assert!(!with("application/jsonp"));
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn type_errors_name_the_field() {
        let v = parse_object(br#"{"temperature": "hot", "unknown": [1]}"#).unwrap();
        let e = fields::<GenerationFields>(&v).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("temperature"), "{}", e.message);
    }

    #[test]
    fn unknown_fields_and_nulls_are_fine() {
        let v = parse_object(br#"{"temperature": null, "frobnicate": true}"#).unwrap();
        let f = fields::<GenerationFields>(&v).unwrap();
        assert!(f.temperature.is_none());
    }
}
