//! The one error type every endpoint answers with, in OpenAI's envelope:
//! `{"error": {"message", "type", "param", "code"}}` plus the right status.
//!
//! Every failure a client can see is built here: request parsing, parameter
//! validation, engine admission ([`SubmitError`]) and engine failures. Handlers
//! return `Result<_, ApiError>` and never write error bodies themselves, so the
//! shape and the status mapping live in exactly one place.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tern_runtime::engine::SubmitError;
use tern_runtime::{RuntimeError, Setting};

/// OpenAI's `type` for errors caused by the request.
const INVALID_REQUEST: &str = "invalid_request_error";
/// OpenAI's `type` for errors on the server's side.
const SERVER_ERROR: &str = "server_error";

/// An error answered to the client as OpenAI JSON with an HTTP status.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status of the response.
    pub status: StatusCode,
    /// OpenAI's `type` (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// Human-readable explanation, safe to show to the client.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`invalid_api_key`, `model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Seconds the client should wait before retrying (429 and 503).
    pub retry_after: Option<u64>,
}

/// The JSON body of an error: `{"error": {...}}`.
#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A 400 about the request as a whole (malformed JSON, wrong body type).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message)
    }

    /// A 400 naming the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    /// A 400 for a known OpenAI feature this server does not implement.
    pub fn unsupported(param: &str, what: &str) -> Self {
        Self::invalid_param(param, format!("{what} is not supported by this server"))
            .with_code("unsupported_parameter")
    }

    /// A 400 `context_length_exceeded` for a prompt (plus tokens to generate)
    /// that does not fit the model's context window.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        Self::invalid_param(param, message).with_code("context_length_exceeded")
    }

    /// A 403 for `aggregate: reward` (client-written `tests`, or tests the
    /// model writes, both run against the candidates) sent to a server that
    /// does not run code: code execution is opt-in (`--allow-code-execution`).
    pub fn code_execution_disabled(param: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            INVALID_REQUEST,
            "This server does not run code for a request: `aggregate: \"reward\"` (with \
             client-written `tests`, or tests the model writes) needs the server started with \
             --allow-code-execution (the tests then run in the bubblewrap sandbox; see \
             docs/SECURITY.md)",
        )
        .with_param(param)
        .with_code("code_execution_disabled")
    }

    /// A 401 for a missing or wrong API key.
    pub fn invalid_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            INVALID_REQUEST,
            "Incorrect or missing API key: send it as `Authorization: Bearer <key>`",
        )
        .with_code("invalid_api_key")
    }

    /// A 404 for a `model` other than the one this server runs.
    pub fn model_not_found(requested: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            format!("The model `{requested}` does not exist; this server runs `{served}`"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// A 404 for a path no route serves.
    pub fn route_not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            format!("No route for `{path}`"),
        )
        .with_code("not_found")
    }

    /// A 404 for something the request names that this server does not hold
    /// (a stored response that never existed or was evicted).
    pub fn not_found(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, INVALID_REQUEST, message)
            .with_param(param)
            .with_code("not_found")
    }

    /// A 405 for a known path called with the wrong method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            INVALID_REQUEST,
            "Method not allowed for this path",
        )
        .with_code("method_not_allowed")
    }

    /// A 413 for a body over the server's limit (`--max-body`).
    pub fn payload_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID_REQUEST,
            "The request body is larger than this server accepts (--max-body)",
        )
        .with_code("request_too_large")
    }

    /// A 415 for a body not sent as `Content-Type: application/json`.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_REQUEST,
            "The request body must be JSON sent with `Content-Type: application/json`",
        )
        .with_code("unsupported_media_type")
    }

    /// A 408 for a body that did not arrive within `--body-timeout`.
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            INVALID_REQUEST,
            "The request body did not arrive in time (--body-timeout)",
        )
        .with_code("request_timeout")
    }

    /// A 403 for a request whose `Host` or `Origin` this server does not
    /// accept (`--allowed-hosts`, `--cors`).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, INVALID_REQUEST, message).with_code("forbidden")
    }

    /// A 503 while the model is still loading.
    pub fn loading() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            SERVER_ERROR,
            "The model is still loading; retry shortly",
        )
        .with_code("model_loading");
        e.retry_after = Some(1);
        e
    }

    /// A 503: loading the model a request names would take more memory
    /// than `--models-memory` has free, and no loaded model is idle enough
    /// to unload for it. Retrying once a busy model finishes may succeed.
    pub fn models_memory_full(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, message)
            .with_param("model")
            .with_code("models_memory_full");
        e.retry_after = Some(5);
        e
    }

    /// A 500: the model a request names failed to load (the server's log
    /// has the cause; the next request naming it tries again).
    pub fn model_load_failed(model: &str) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            SERVER_ERROR,
            format!("The model `{model}` could not be loaded; the server's log says why"),
        )
        .with_param("model")
        .with_code("model_load_failed")
    }

    /// A 400 for what only a one-model server does (LoRA adapters run on
    /// the one served model).
    pub fn needs_one_model(what: &str) -> Self {
        Self::bad_request(format!(
            "{what} needs a server running one model; this one serves several \
             (--model repeated or --models-dir)"
        ))
    }

    /// A 503: the shared Responses store (`--state-store`) did not answer;
    /// the response asked for may well exist.
    pub fn state_store_unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, message)
            .with_code("state_store_unavailable");
        e.retry_after = Some(1);
        e
    }

    /// A 500: the engine failed while running the request. The message is
    /// the engine's own summary, which carries no internals beyond the cause.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, SERVER_ERROR, message)
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets `code`.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn envelope(&self) -> Envelope<'_> {
        Envelope {
            error: Body {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }

    /// The `{"error": {...}}` body as JSON text (fields in OpenAI's order),
    /// also sent as the last chunk of a stream that fails midway.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.envelope()).unwrap_or_default()
    }

    /// The `{"error": {...}}` body as a JSON value.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(self.envelope()).unwrap_or(serde_json::Value::Null)
    }

    /// Maps a refused submission. `prompt_param` names the field the prompt
    /// came from (`messages` or `prompt`), for errors about the prompt.
    pub fn from_submit(e: SubmitError, prompt_param: &str) -> Self {
        match e {
            SubmitError::Invalid(e) => Self::from_runtime(e, prompt_param),
            e @ SubmitError::QueueFull { .. } => {
                let mut err = Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    e.to_string(),
                )
                .with_code("rate_limit_exceeded");
                err.retry_after = Some(1);
                err
            }
            e @ SubmitError::TooLarge { .. } => {
                // The engine does not know the flag that sized it; the server does.
                Self::bad_request(format!("{e} (the server's --kv-memory)"))
                    .with_code("kv_memory_exceeded")
            }
            e @ SubmitError::Stopped => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, e.to_string())
            }
        }
    }

    /// Maps a runtime error raised while preparing a request (template,
    /// tokenizer, validation). Errors that are not the request's fault
    /// (including variants added later) are 500s.
    pub fn from_runtime(e: RuntimeError, prompt_param: &str) -> Self {
        match e {
            RuntimeError::Setup { setting, error } => {
                // The runtime knows no flags; the server names its own.
                let mut api = Self::from_runtime(*error, prompt_param);
                api.message = format!("{} ({})", api.message, setup_hint(setting));
                api
            }
            RuntimeError::InvalidParam { param, reason } => Self::invalid_param(param, reason),
            e @ RuntimeError::ContextRequest { .. } => {
                Self::context_length("max_tokens", e.to_string())
            }
            e @ RuntimeError::ContextLength { .. } => {
                Self::context_length(prompt_param, e.to_string())
            }
            e @ RuntimeError::InputLength { .. } => Self::context_length("input", e.to_string()),
            e @ (RuntimeError::EmptyPrompt
            | RuntimeError::Template(_)
            | RuntimeError::Tokenizer(_)) => Self::invalid_param(prompt_param, e.to_string()),
            // Everything else (model, tensor, backend failures) is not the
            // request's fault.
            e => Self::internal(e.to_string()),
        }
    }
}

/// How a client or operator changes what the runtime was set up with.
fn setup_hint(setting: Setting) -> &'static str {
    match setting {
        Setting::DraftModel => "start the server with --draft-model PATH",
        Setting::KvDtype => "the server's --kv-dtype sets it",
        Setting::SpecialTokensInContent => {
            "start the server with --allow-special-tokens-in-content"
        }
        Setting::ChatTemplate => "send a raw prompt to /v1/completions",
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if matches!(
            self.status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
        ) {
            // The unread rest of the body is still on the socket: tell the
            // client this connection ends here rather than let it reuse it.
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // Routes that answer in another API's shape (Anthropic's) rewrite
        // the body from this; see `anthropic::error::reshape`.
        res.extensions_mut().insert(self);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_all_four_fields() {
        let e = ApiError::invalid_param("temperature", "must be between 0 and 2");
        let v = e.body();
        assert_eq!(v["error"]["message"], "must be between 0 and 2");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert!(v["error"]["code"].is_null());
        assert_eq!(v["error"].as_object().map(|o| o.len()), Some(4));
    }

    #[test]
    fn queue_full_is_429_with_retry_after() {
        let e = ApiError::from_submit(
            SubmitError::QueueFull {
                waiting: 3,
                limit: 3,
            },
            "messages",
        );
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        let res = e.into_response();
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn context_request_keeps_both_numbers() {
        let e = ApiError::from_submit(
            SubmitError::Invalid(RuntimeError::ContextRequest {
                prompt_tokens: 10,
                max_tokens: 9000,
                context_length: 8192,
            }),
            "messages",
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(
            e.message.contains("8192") && e.message.contains("9000"),
            "{}",
            e.message
        );
    }

    #[test]
    fn too_large_names_kv_memory() {
        let e = ApiError::from_submit(
            SubmitError::TooLarge {
                needed: 10,
                kv_memory: 5,
            },
            "prompt",
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("kv-memory"), "{}", e.message);
    }
}
