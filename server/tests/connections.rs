//! The server on a real socket: slow and idle clients are cut off while
//! others are served, the connection cap holds, shutdown always ends, and a
//! huge prompt being tokenized does not stall `/health`.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tower::ServiceExt;

use crate::support::{config, http, listen, ready, MODEL};
use tern_server::ConnectionLimits;

/// Generous bounds: a working server is far inside them, a broken one never
/// gets there.
const PATIENCE: Duration = Duration::from_secs(20);

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        max_connections: 16,
        header_timeout: Duration::from_millis(500),
        body_timeout: Duration::from_millis(500),
        shutdown_grace: Duration::from_secs(1),
    }
}

/// Reads until the server closes the connection; the bytes it sent.
async fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = timeout(PATIENCE, s.read_to_end(&mut out))
        .await
        .expect("the server closed the connection");
    out
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_closed() {
    let l = listen(config(), limits()).await;
    let mut slow = TcpStream::connect(l.addr).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHo").await.unwrap();
    let mut idle = TcpStream::connect(l.addr).await.unwrap();
    // Others are served meanwhile.
    let (status, _) = http(l.addr, "GET /health HTTP/1.1", "").await;
    assert_eq!(status, 200);
    until_closed(&mut slow).await;
    assert!(until_closed(&mut idle).await.is_empty());
}

#[tokio::test]
async fn slow_bodies_get_408() {
    let l = listen(config(), limits()).await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
        l.addr
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let reply = String::from_utf8_lossy(&until_closed(&mut s).await).into_owned();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("request_timeout"), "{reply}");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_while_others_are_served() {
    let l = listen(
        config(),
        ConnectionLimits {
            max_connections: 2,
            header_timeout: Duration::from_secs(60),
            ..limits()
        },
    )
    .await;
    // One idle connection and one keep-alive client fill the cap.
    let idle = TcpStream::connect(l.addr).await.unwrap();
    let mut client = TcpStream::connect(l.addr).await.unwrap();
    let get = format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", l.addr);
    let mut buf = [0u8; 1024];
    for _ in 0..2 {
        client.write_all(get.as_bytes()).await.unwrap();
        let n = timeout(PATIENCE, client.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
    // A third connection is not served while the cap is full ...
    let mut third = TcpStream::connect(l.addr).await.unwrap();
    third.write_all(get.as_bytes()).await.unwrap();
    let early = timeout(Duration::from_millis(300), third.read(&mut buf)).await;
    assert!(early.is_err(), "served beyond --max-connections");
    // ... and is once a connection closes.
    drop(idle);
    let n = timeout(PATIENCE, third.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn shutdown_ends_with_idle_and_slow_connections_open() {
    let l = listen(
        config(),
        ConnectionLimits {
            // Long enough that only the shutdown can end these connections.
            header_timeout: Duration::from_secs(600),
            ..limits()
        },
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..8 {
        open.push(TcpStream::connect(l.addr).await.unwrap());
    }
    let mut slow = TcpStream::connect(l.addr).await.unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHo").await.unwrap();
    // A connection that has been served and sits in keep-alive.
    let mut kept = TcpStream::connect(l.addr).await.unwrap();
    let get = format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", l.addr);
    kept.write_all(get.as_bytes()).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = timeout(PATIENCE, kept.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let _ = l.stop.send(());
    timeout(PATIENCE, l.done)
        .await
        .expect("shutdown finished")
        .unwrap();
    assert!(TcpStream::connect(l.addr).await.is_err(), "still listening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_huge_prompts_are_tokenized() {
    let mut c = config();
    c.max_body = 64 << 20;
    let s = ready(c);
    // Four prompts of 1 MB: each takes a while to tokenize (and is then too
    // long for the tiny model's context, which does not matter here).
    let big = json!({"model": MODEL, "prompt": "lorem ipsum dolor sit amet ".repeat(40_000), "max_tokens": 1})
        .to_string();
    let started = Instant::now();
    let mut prompts = Vec::new();
    for _ in 0..4 {
        let (app, body) = (s.app.clone(), big.clone());
        prompts.push(tokio::spawn(async move {
            let req = Request::builder()
                .method(Method::POST)
                .uri("/v1/completions")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap();
            let res = app.oneshot(req).await.unwrap();
            let _ = axum::body::to_bytes(res.into_body(), 1 << 20).await;
            Instant::now()
        }));
    }
    // Give the prompts a head start onto the worker threads.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let app = s.app.clone();
    let health = tokio::spawn(async move {
        let req = Request::get("/health").body(Body::empty()).unwrap();
        let res = app.oneshot(req).await.unwrap();
        (res.status(), Instant::now())
    });
    let (status, answered) = health.await.unwrap();
    assert_eq!(status, 200);
    let mut first_prompt_done = None::<Instant>;
    for p in prompts {
        let done = p.await.unwrap();
        first_prompt_done = Some(first_prompt_done.map_or(done, |f| f.min(done)));
    }
    let first = first_prompt_done.unwrap();
    assert!(
        answered < first,
        "health answered {:?} after start, the first prompt finished at {:?}",
        answered - started,
        first - started
    );
}
