//! The request memory model (docs/SECURITY.md) through `tern serve`: each
//! of issue 57's probes (echoed fields kept by `/v1/responses`, KV policy
//! sizes past the context, giant stop strings, too many embedding inputs,
//! deeply nested JSON) now gets its 4xx naming the field; stored responses
//! stay within `--responses-store-bytes` and the server's resident memory
//! stays flat while they are sent again and again; a policy's scoring rows
//! count against `--kv-memory`; and a stalling request is refused while a
//! concurrent one completes. Sizes are small: the tiny model (256-token
//! context), bodies under the default 4 MiB limit.

use serde_json::{json, Value};

use super::fixture::tiny_model;
use crate::support::server::Server;

/// The server's resident memory (`VmRSS`), in bytes.
fn rss(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kb * 1024
}

/// A sample of the server's `/metrics`.
fn metric(server: &Server, name: &str) -> u64 {
    let (status, body) = server.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    let text = body.as_str().unwrap_or_default().to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// Asserts a 400 (or `status`) whose error names `param` and whose message
/// contains `needle`.
fn refused(
    server: &Server,
    path: &str,
    body: &Value,
    status: u16,
    param: Option<&str>,
    needle: &str,
) {
    let (got, answer) = server.request("POST", path, Some(body));
    assert_eq!(got, status, "{path}: {answer}");
    let error = &answer["error"];
    assert_eq!(error["param"].as_str(), param, "{path}: {answer}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(needle),
        "{path}: `{needle}` not in {answer}"
    );
}

#[test]
fn each_probe_gets_its_4xx_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&tiny_model(&dir), None, &[]);
    let responses = |extra: Value| {
        let mut body = json!({"model": "tiny", "input": "hi", "max_output_tokens": 2});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    // Echoed fields of /v1/responses: OpenAI's metadata limits, `text`'s own keys.
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (json!({"metadata": many}), "metadata", "16 keys"),
        (
            json!({"metadata": {"k": "v".repeat(513)}}),
            "metadata",
            "512 characters",
        ),
        (
            json!({"metadata": {"k".repeat(65): "v"}}),
            "metadata",
            "64 characters",
        ),
        (
            json!({"metadata": {"k": vec![1; 100_000]}}),
            "metadata",
            "must be a string",
        ),
        (
            json!({"text": {"junk": vec![1; 500_000]}}),
            "text.junk",
            "text.junk",
        ),
        (
            json!({"previous_response_id": "r".repeat(10_000)}),
            "previous_response_id",
            "128",
        ),
        (json!({"user": "u".repeat(10_000)}), "user", "256"),
    ];
    for (extra, param, needle) in cases {
        refused(
            &server,
            "/v1/responses",
            &responses(extra),
            400,
            Some(param),
            needle,
        );
    }
    // KV policy sizes: past the context (256), or a pooling kernel past 63.
    for (spec, needle) in [
        ("snapkv:budget=1000000,window=999999", "`budget` = 1000000"),
        ("snapkv:budget=200,window=8,kernel=1001", "`kernel`"),
        ("h2o:budget=100,recent=8,every=100000", "`every` = 100000"),
        ("expected:n_future=1000000000", "`n_future`"),
    ] {
        for path in ["/v1/chat/completions", "/v1/responses"] {
            let body = if path == "/v1/responses" {
                responses(json!({"kv_policy": spec}))
            } else {
                chat(json!({"kv_policy": spec}))
            };
            refused(&server, path, &body, 400, Some("kv_policy"), needle);
        }
    }
    // Stop strings: four of 900,000 characters (the issue's stall), or a fifth.
    let giant = chat(json!({"stop": vec!["x".repeat(900_000); 4]}));
    refused(
        &server,
        "/v1/chat/completions",
        &giant,
        400,
        Some("stop"),
        "1024 bytes",
    );
    let five = chat(json!({"stop": ["a", "b", "c", "d", "e"]}));
    refused(
        &server,
        "/v1/chat/completions",
        &five,
        400,
        Some("stop"),
        "at most 4",
    );
    let prompt =
        json!({"model": "tiny", "prompt": "hi", "max_tokens": 2, "stop": ["y".repeat(1025)]});
    refused(
        &server,
        "/v1/completions",
        &prompt,
        400,
        Some("stop"),
        "1024 bytes",
    );
    // Embeddings: 2,049 inputs (the issue sent 2,100), refused before tokenizing.
    let inputs = json!({"model": "tiny", "input": vec!["a"; 2049]});
    refused(
        &server,
        "/v1/embeddings",
        &inputs,
        400,
        Some("input"),
        "2048",
    );
    let ids = json!({"model": "tiny", "input": vec![vec![1]; 2049]});
    refused(&server, "/v1/embeddings", &ids, 400, Some("input"), "2048");
    // Tools and logprobs.
    let tools: Vec<Value> = (0..129)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    refused(
        &server,
        "/v1/chat/completions",
        &chat(json!({"tools": tools})),
        400,
        Some("tools"),
        "128",
    );
    let top = chat(json!({"logprobs": true, "top_logprobs": 21}));
    refused(
        &server,
        "/v1/chat/completions",
        &top,
        400,
        Some("top_logprobs"),
        "20",
    );
    // JSON nested past 64 levels is refused before it is expanded: a 400
    // about the body (no one field), whatever the endpoint.
    let deep: Value = (0..100).fold(json!(1), |v, _| json!([v]));
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"] {
        refused(
            &server,
            path,
            &json!({"model": "tiny", "input": deep, "messages": deep}),
            400,
            None,
            "at most 64",
        );
    }
    // Within every bound, the same endpoints answer.
    let ok = [
        (
            "/v1/chat/completions",
            chat(
                json!({"kv_policy": "snapkv:budget=200,window=8,kernel=63", "stop": ["z".repeat(1024)]}),
            ),
        ),
        (
            "/v1/responses",
            responses(
                json!({"metadata": {"k".repeat(64): "v".repeat(512)}, "text": {"verbosity": "low"}}),
            ),
        ),
        (
            "/v1/embeddings",
            json!({"model": "tiny", "input": vec!["a"; 2048]}),
        ),
    ];
    for (path, body) in ok {
        let (status, answer) = server.request("POST", path, Some(&body));
        assert_eq!(status, 200, "{path}: {answer}");
    }
}

#[test]
fn stored_responses_stay_within_their_bytes_and_memory_stays_flat() {
    let dir = tempfile::tempdir().unwrap();
    let budget: u64 = 4 << 20;
    let server = Server::start(
        &tiny_model(&dir),
        None,
        &["--responses-store-bytes", "4MiB"],
    );
    assert_eq!(metric(&server, "tern_responses_store_max_bytes"), budget);
    // The largest echoed field left: `text.format.description`, which no
    // prompt bounds. Each response is stored with its 2 MB: 50 of them held
    // by count alone would be over 100 MB.
    let body = json!({
        "model": "tiny", "input": "hi", "max_output_tokens": 2,
        "text": {"format": {"type": "json_schema", "name": "doc", "schema": {"type": "object"},
                            "description": "d".repeat(2 << 20)}},
    });
    let mut ids = Vec::new();
    let mut baseline = 0;
    for i in 0..50 {
        let (status, answer) = server.request("POST", "/v1/responses", Some(&body));
        assert_eq!(status, 200, "request {i}: {answer}");
        ids.push(answer["id"].as_str().unwrap().to_string());
        let stored = metric(&server, "tern_responses_stored_bytes");
        assert!(
            stored <= budget,
            "request {i}: {stored} bytes stored, budget {budget}"
        );
        assert!(metric(&server, "tern_responses_stored") >= 1);
        if i == 4 {
            baseline = rss(&server);
        }
    }
    let grown = rss(&server).saturating_sub(baseline);
    // 45 more requests carrying 90 MB in all: their transient copies may
    // leave some heap resident, but nothing proportional to their count.
    assert!(
        grown < 32 << 20,
        "resident memory grew {grown} bytes over 45 requests"
    );
    // The newest is kept whole; the oldest went first.
    let (status, last) = server.request("GET", &format!("/v1/responses/{}", ids[49]), None);
    assert_eq!(status, 200);
    assert_eq!(
        last["text"]["format"]["description"].as_str().map(str::len),
        Some(2 << 20)
    );
    let (status, _) = server.request("GET", &format!("/v1/responses/{}", ids[0]), None);
    assert_eq!(status, 404);
    // A response that alone exceeds the budget is refused up front, naming
    // `store`; with `store: false` it runs.
    let mut over = body.clone();
    over["text"]["format"]["description"] = json!("d".repeat(3 << 19));
    let small = Server::start(
        &tiny_model(&dir),
        None,
        &["--responses-store-bytes", "1MiB"],
    );
    refused(
        &small,
        "/v1/responses",
        &over,
        400,
        Some("store"),
        "--responses-store-bytes",
    );
    over["store"] = json!(false);
    let (status, answer) = small.request("POST", "/v1/responses", Some(&over));
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn scoring_rows_count_against_kv_memory() {
    // The tiny model's keys and values for a whole context take 64 KiB
    // (2 layers, 2 KV heads of 16 f16 values each, twice, 256 entries);
    // snapkv with a 200-token window keeps [2, 200, 256] f32 rows per
    // layer beside them and is handed [4, 200, 256] f32 weights, over
    // 1.5 MiB in all. With 1 MiB of KV memory that window is refused at
    // admission, where before only the 64 KiB were counted. (No
    // `max_tokens`: the request may fill the context.)
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&tiny_model(&dir), None, &["--kv-memory", "1MiB"]);
    let wide = chat(json!({"kv_policy": "snapkv:budget=250,window=200", "max_tokens": null}));
    let (status, answer) = server.request("POST", "/v1/chat/completions", Some(&wide));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "kv_memory_exceeded", "{answer}");
    let narrow = chat(json!({"kv_policy": "snapkv:budget=250,window=8", "max_tokens": null}));
    let (status, answer) = server.request("POST", "/v1/chat/completions", Some(&narrow));
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn a_stalling_request_is_refused_while_another_completes() {
    // Four 900,000-character stop strings once held the engine thread for
    // seconds on every token. Now each such request is a 400 before it
    // reaches the engine, so a normal request sent alongside a stream of
    // them completes as it would alone: its answer must arrive while they
    // are still being sent, well within the client's 120 s timeout.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&tiny_model(&dir), None, &[]);
    let giant = chat(json!({"stop": vec!["x".repeat(900_000); 4], "max_tokens": 64}));
    let normal = chat(json!({"max_tokens": 32, "ignore_eos": true}));
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let stalls = s.spawn(|| {
            let mut sent = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) || sent < 3 {
                let (status, answer) = server.request("POST", "/v1/chat/completions", Some(&giant));
                assert_eq!(status, 400, "{answer}");
                assert_eq!(answer["error"]["param"], "stop", "{answer}");
                sent += 1;
            }
            sent
        });
        let started = std::time::Instant::now();
        let (status, answer) = server.request("POST", "/v1/chat/completions", Some(&normal));
        let took = started.elapsed();
        done.store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["usage"]["completion_tokens"], 32, "{answer}");
        assert!(took < std::time::Duration::from_secs(60), "took {took:?}");
        assert!(stalls.join().unwrap() >= 3);
    });
}
