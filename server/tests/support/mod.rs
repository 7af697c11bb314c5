//! Test support: a router over the tiny generated model, requests sent in
//! process with tower's `oneshot`, and SSE bodies split into payloads.

// The workspace's tiny-model writer, shared rather than copied.
#[allow(dead_code)]
#[path = "../../../tests/support/tiny.rs"]
pub mod tiny;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use serde_json::Value;
use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::LoadedModel;
use tern_server::{router, AppState, ServerConfig};
use tower::ServiceExt;

/// The model id the test server serves.
pub const MODEL: &str = "tiny";

/// Settings of a test server over the tiny model.
pub fn config() -> ServerConfig {
    ServerConfig {
        engine: EngineConfig {
            kv_memory: 256 << 20,
            ..EngineConfig::default()
        },
        ..ServerConfig::new("127.0.0.1", 0, MODEL)
    }
}

/// A router still loading its model, and its state.
pub fn loading(config: &ServerConfig) -> (Router, AppState) {
    let state = AppState::new(config);
    (router(state.clone()), state)
}

/// A ready test server; keep the directory alive while it runs.
pub struct TestServer {
    /// Holds the model file.
    pub _dir: tempfile::TempDir,
    /// The routes.
    pub app: Router,
    /// The engine, for its metrics.
    pub engine: EngineHandle,
}

/// A ready server over the default tiny model.
pub fn ready(config: ServerConfig) -> TestServer {
    ready_with(config, tiny::TinySpec::default())
}

/// A ready server over a tiny model of the given shape.
pub fn ready_with(config: ServerConfig, spec: tiny::TinySpec) -> TestServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tiny.gguf");
    tiny::write_tiny_model(&path, &spec);
    let model = LoadedModel::load(&path).expect("load tiny model");
    let (app, state) = loading(&config);
    let engine = EngineHandle::spawn(Arc::new(model), config.engine.clone());
    state.set_engine(engine.clone());
    TestServer {
        _dir: dir,
        app,
        engine,
    }
}

/// A response, read whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    /// The body as JSON (panics with the body if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse(&self) -> Vec<String> {
        self.text
            .split("\n\n")
            .filter_map(|frame| frame.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// Asserts an OpenAI error envelope with this status and param.
    pub fn assert_error(&self, status: u16, param: Option<&str>) -> Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.text);
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("code").is_some() && e.get("param").is_some(), "{v}");
        assert_eq!(e["param"].as_str(), param, "{v}");
        e.clone()
    }
}

/// Sends one request through the router.
pub async fn send(
    app: &Router,
    method: Method,
    path: &str,
    body: impl Into<Body>,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = app
        .clone()
        .oneshot(req.body(body.into()).expect("request"))
        .await
        .expect("infallible");
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = axum::body::to_bytes(res.into_body(), 64 << 20)
        .await
        .expect("body");
    Reply {
        status,
        headers,
        text: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `GET path`.
pub async fn get(app: &Router, path: &str) -> Reply {
    send(app, Method::GET, path, Body::empty(), &[]).await
}

/// `POST path` with a JSON body.
pub async fn post(app: &Router, path: &str, body: &Value) -> Reply {
    send(
        app,
        Method::POST,
        path,
        body.to_string(),
        &[("content-type", "application/json")],
    )
    .await
}

/// A ready server on a real loopback socket, run by the server's own accept
/// loop until `stop` is sent; `done` resolves once the loop has returned.
pub struct Listening {
    /// The bound address.
    pub addr: std::net::SocketAddr,
    /// Sending (or dropping) starts the graceful shutdown.
    pub stop: tokio::sync::oneshot::Sender<()>,
    /// The accept loop's task.
    pub done: tokio::task::JoinHandle<()>,
    /// Keeps the model file alive.
    pub _server: TestServer,
}

/// Binds 127.0.0.1, then serves the tiny model there under `limits`.
pub async fn listen(mut config: ServerConfig, limits: tern_server::ConnectionLimits) -> Listening {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    config.port = addr.port();
    config.connections = limits.clone();
    let server = ready(config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = server.app.clone();
    let done = tokio::spawn(tern_server::listener::run(listener, app, limits, async {
        let _ = stopped.await;
    }));
    Listening {
        addr,
        stop,
        done,
        _server: server,
    }
}

/// Sends `head` (request line and headers, without the blank line) plus
/// `body` on a fresh connection with `Connection: close`, and returns the
/// status and the whole response text.
pub async fn http(addr: std::net::SocketAddr, head: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "{head}\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}
