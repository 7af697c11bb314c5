//! The suite through `tern serve`: the RCE request (best-of-N with
//! `aggregate: reward` and client-written `tests`) is refused by a default
//! server, and with `--allow-code-execution` every attack runs inside the
//! sandbox, leaks nothing, and the next request is answered normally.

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::fixture::{attacks, tiny_model, Expect, Host, SECRET};
use crate::support::server::Server;

/// The tiny model's end-of-sequence id: biased up, candidates are empty
/// programs, so the tests run.
const EOS: u32 = 2;

/// `tern serve` of `model` behind the fixture's API key.
fn start(model: &std::path::Path, host: &Host, extra: &[&str]) -> Server {
    let key_file = host.key_file.display().to_string();
    let mut args = vec!["--api-key-file", key_file.as_str()];
    args.extend_from_slice(extra);
    Server::start(model, Some(SECRET), &args)
}

/// The most tests any candidate passed, from the response's `tern` object.
fn most_passed(body: &Value) -> Option<u64> {
    body["tern"]["candidates"]
        .as_array()?
        .iter()
        .map(|c| c["passed"].as_u64())
        .collect::<Option<Vec<u64>>>()?
        .into_iter()
        .max()
}

fn reward_request(tests: Vec<String>) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Write a Python function."}],
        "max_tokens": 4,
        "best_of": 2,
        "aggregate": "reward",
        "tests": tests,
        "logit_bias": {EOS.to_string(): 100},
    })
}

#[test]
fn a_default_server_refuses_code_execution() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let host = Host::new(&model);
    let server = start(&model, &host, &[]);
    let leak = format!(
        "assert open('{}').read().startswith('t')",
        host.key_file.display()
    );
    let (status, body) = server.request(
        "POST",
        "/v1/chat/completions",
        Some(&reward_request(vec![leak])),
    );
    assert_eq!(status, 403, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--allow-code-execution"), "{body}");
    // Best-of-N without code still works.
    let (status, body) = server.request(
        "POST",
        "/v1/chat/completions",
        Some(
            &json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 2, "best_of": 2}),
        ),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn every_attack_fails_through_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let mut host = Host::new(&model);
    let server = start(&model, &host, &["--allow-code-execution"]);
    // Attacks aim at the server itself: its port and its pid.
    host.port = server.port;
    host.pid = server.child.id();
    let mut broken = Vec::new();
    for attack in attacks() {
        let started = Instant::now();
        let (status, body) = server.request(
            "POST",
            "/v1/chat/completions",
            Some(&reward_request(vec![host.render(&attack)])),
        );
        let text = body.to_string();
        if text.contains(SECRET) {
            broken.push(format!("{}: the key reached the response", attack.name));
        }
        let passed = most_passed(&body);
        match (status, attack.expect, passed) {
            (200, Expect::Refused, Some(0)) | (200, Expect::Bounded, Some(_)) => {}
            (200, Expect::Refused, Some(_)) => {
                broken.push(format!("{}: the attack succeeded", attack.name))
            }
            _ => broken.push(format!("{}: answered {status}: {text}", attack.name)),
        }
        eprintln!(
            "{:<24} {status} passed={passed:?} in {:.1?}",
            attack.name,
            started.elapsed()
        );
        // The next request is served normally.
        let (status, body) = server.request("GET", "/v1/models", None);
        if status != 200 {
            broken.push(format!(
                "after {}: /v1/models answered {status}: {body}",
                attack.name
            ));
        }
    }
    broken.extend(host.breaches());
    assert!(
        broken.is_empty(),
        "through tern serve:\n{}",
        broken.join("\n")
    );
    // The server is still the same process and still judges real tests.
    let (status, body) = server.request(
        "POST",
        "/v1/chat/completions",
        Some(&reward_request(vec!["assert 1 + 1 == 2".into()])),
    );
    assert_eq!((status, most_passed(&body)), (200, Some(1)), "{body}");
}

/// How many sandboxes (`bwrap` children) process `pid` has running now.
fn sandboxes_of(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let ppid = rest
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok());
            head.ends_with("(bwrap") && ppid == Some(pid)
        })
        .count()
}

#[test]
fn a_client_that_disconnects_stops_its_judge() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let host = Host::new(&model);
    let server = start(&model, &host, &["--allow-code-execution"]);
    let pid = server.child.id();
    // 8 candidates x 2 screening tests of ~1.9 s each: ~15 s of judging on
    // two cores if nobody stops it.
    let mut request = reward_request(vec![
        "import time\ntime.sleep(1.9)".into(),
        "import time\ntime.sleep(1.9)".into(),
    ]);
    request["best_of"] = json!(8);
    let body = request.to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {SECRET}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.port,
        body.len()
    )
    .unwrap();
    let started = Instant::now();
    while sandboxes_of(pid) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the judge never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stream);
    let dropped = Instant::now();
    // Give the server a moment to notice, then no sandbox may run or start.
    std::thread::sleep(Duration::from_millis(1000));
    let mut seen = 0;
    while dropped.elapsed() < Duration::from_secs(5) {
        seen = seen.max(sandboxes_of(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        seen, 0,
        "sandboxes still ran more than 1 s after the client left"
    );
    let (status, _) = server.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
}

#[test]
fn concurrent_code_requests_share_the_sandbox_limit() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let host = Host::new(&model);
    let server = start(
        &model,
        &host,
        &["--allow-code-execution", "--max-sandboxes", "2"],
    );
    let pid = server.child.id();
    // 8 requests at once, each 2 candidates x 2 tests of 0.2 s: 32 tests,
    // which must run one at a time (two sandboxes each) and all finish.
    let request = reward_request(vec![
        "import time\ntime.sleep(0.2)".into(),
        "import time\ntime.sleep(0.2)\nassert True".into(),
    ]);
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(sandboxes_of(pid));
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| server.request("POST", "/v1/chat/completions", Some(&request))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().unwrap();
    for (status, body) in &answers {
        assert_eq!((*status, most_passed(body)), (200, Some(2)), "{body}");
    }
    assert!(
        (1..=2).contains(&most),
        "{most} sandboxes were alive at once under --max-sandboxes 2"
    );
}

#[test]
fn sigterm_exits_with_idle_and_slow_connections_open() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let host = Host::new(&model);
    let mut server = start(&model, &host, &["--shutdown-grace", "2s"]);
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    // A client sending its headers a byte at a time.
    let mut slow = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    slow.write_all(b"GET /v1/mod").unwrap();
    // Others are still served meanwhile.
    let (status, _) = server.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
    let term = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let sent = Instant::now();
    let exited = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(20),
            "tern serve still runs 20 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exited.success(), "{exited:?}");
    drop((idle, slow));
}
