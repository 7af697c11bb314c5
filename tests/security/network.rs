//! `tern serve` beyond loopback and what it depends on: a non-loopback bind
//! without an API key refuses to start unless `--insecure-no-key` says so;
//! the Host check stays on (a foreign Host is a 403 unless `--allowed-hosts`
//! lists it or is `*`); and a `--state-store` Redis that stops answering
//! costs a request a 503 within the store's timeout while `/health` keeps
//! answering.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fixture::tiny_model;
use crate::support::server::Server;
use crate::support::tern;

/// One GET with this `Host` header: the status and the body as JSON.
fn get_with_host(port: u16, path: &str, host: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(body.into())),
    )
}

#[test]
fn an_open_bind_needs_a_key_or_insecure_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let model = model.to_str().unwrap();
    let o = tern(
        &["serve", "-m", model, "--host", "0.0.0.0", "--port", "0"],
        None,
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "started without a key: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0 without an API key")
            && stderr.contains("--insecure-no-key"),
        "{stderr}"
    );

    // Said explicitly, it serves; the Host check is still on.
    let server = Server::start(
        std::path::Path::new(model),
        None,
        &["--host", "0.0.0.0", "--insecure-no-key"],
    );
    let port = server.port;
    assert_eq!(
        get_with_host(port, "/health", &format!("127.0.0.1:{port}")).0,
        200
    );
    assert_eq!(
        get_with_host(port, "/health", &format!("10.1.2.3:{port}")).0,
        200,
        "an IP literal at the port (this machine's address on some interface)"
    );
    let (status, body) = get_with_host(port, "/v1/models", &format!("evil.example:{port}"));
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--allowed-hosts")),
        "{body}"
    );
}

#[test]
fn a_keyed_open_bind_refuses_foreign_hosts_unless_listed() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "k\n").unwrap();
    let key_file = key_file.to_str().unwrap();
    let base = ["--host", "0.0.0.0", "--api-key-file", key_file];

    let guarded = Server::start(&model, Some("k"), &base);
    let port = guarded.port;
    assert_eq!(
        get_with_host(port, "/health", &format!("tern.lan:{port}")).0,
        403
    );
    drop(guarded);

    let mut listed = base.to_vec();
    listed.extend(["--allowed-hosts", "tern.lan"]);
    let named = Server::start(&model, Some("k"), &listed);
    let port = named.port;
    assert_eq!(
        get_with_host(port, "/health", &format!("tern.lan:{port}")).0,
        200
    );
    assert_eq!(
        get_with_host(port, "/health", &format!("evil.example:{port}")).0,
        403
    );
    drop(named);

    let mut any = base.to_vec();
    any.extend(["--allowed-hosts", "*"]);
    let open = Server::start(&model, Some("k"), &any);
    let port = open.port;
    assert_eq!(
        get_with_host(port, "/health", &format!("evil.example:{port}")).0,
        200
    );
}

/// A stand-in Redis: answers every command (`+PONG` to PING, a nil reply
/// to anything else) until `alive` is cleared, then holds its connections
/// open and never answers again.
fn fake_redis(alive: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let alive = alive.clone();
            std::thread::spawn(move || redis_connection(stream, &alive));
        }
    });
    port
}

fn redis_connection(mut stream: TcpStream, alive: &AtomicBool) {
    let mut buf = [0u8; 65536];
    let mut pending = Vec::new();
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !alive.load(Ordering::SeqCst) {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        // Commands are RESP arrays of bulk strings: answer each whole one.
        while let Some((words, used)) = resp_command(&pending) {
            pending.drain(..used);
            let reply: &[u8] = if words
                .first()
                .is_some_and(|w| w.eq_ignore_ascii_case("PING"))
            {
                b"+PONG\r\n"
            } else {
                b"$-1\r\n"
            };
            if stream.write_all(reply).is_err() {
                return;
            }
        }
    }
}

/// One whole RESP command at the start of `buf`: its words and its length.
fn resp_command(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    let line = |at: usize| -> Option<(String, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((String::from_utf8_lossy(&buf[at..end]).into_owned(), end + 2))
    };
    let (head, mut at) = line(0)?;
    let n: usize = head.strip_prefix('*')?.parse().ok()?;
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, next) = line(at)?;
        let len: usize = len.strip_prefix('$')?.parse().ok()?;
        if buf.len() < next + len + 2 {
            return None;
        }
        words.push(String::from_utf8_lossy(&buf[next..next + len]).into_owned());
        at = next + len + 2;
    }
    Some((words, at))
}

#[test]
fn a_redis_that_stops_answering_is_a_prompt_503_and_health_still_answers() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let alive = Arc::new(AtomicBool::new(true));
    let redis = format!("redis://127.0.0.1:{}", fake_redis(alive.clone()));
    let server = Arc::new(Server::start(&model, None, &["--state-store", &redis]));
    // While Redis answers: an unknown id is a plain 404.
    let (status, body) = server.request("GET", "/v1/responses/resp_unknown", None);
    assert_eq!(status, 404, "{body}");

    alive.store(false, Ordering::SeqCst);
    let started = Instant::now();
    let stuck = {
        let server = server.clone();
        std::thread::spawn(move || {
            let reply = server.request("GET", "/v1/responses/resp_unknown", None);
            (reply, started.elapsed())
        })
    };
    // /health answers while that request waits on Redis.
    let mut health_while_waiting = false;
    while !stuck.is_finished() {
        let (status, _) = server.request("GET", "/health", None);
        assert_eq!(status, 200);
        health_while_waiting |= !stuck.is_finished();
        std::thread::sleep(Duration::from_millis(50));
    }
    let ((status, body), took) = stuck.join().unwrap();
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not answer within 2 s"), "{body}");
    // The store's timeout is 2 s (one for the pooled connection's GET): a
    // hung request would never come back.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(
        health_while_waiting,
        "health was not answered while waiting"
    );
}
