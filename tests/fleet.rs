//! `tern train --rollout-endpoints`: GRPO with its rollouts on `tern serve`
//! workers (the learner in the trainer process, each update published as a
//! LoRA adapter the workers load by path) trains exactly as the co-located
//! run of the same seed, step for step, including when a worker is killed
//! mid-run or drops a rollout request on the floor; and the adapter
//! endpoints behave as vLLM's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::server::Server;
use crate::support::tern;
use crate::support::tiny::{write_tiny_model, TinySpec};

/// Steps of each run: enough that the worker killed after the first dies
/// well before the run ends.
const STEPS: usize = 8;

fn metrics(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn args(model: &str, out: &Path, steps: usize, extra: &[String]) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        "--model",
        model,
        "--task",
        "arithmetic:count=40,seed=2",
        "--steps",
        &steps.to_string(),
        "--max-new-tokens",
        "24",
        "--lora-rank",
        "4",
        "--lr",
        "1e-2",
        "--seed",
        "11",
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend_from_slice(extra);
    a
}

fn run(model: &str, out: &Path, steps: usize, extra: &[String]) -> Vec<Value> {
    let a = args(model, out, steps, extra);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = tern(&refs, None);
    assert!(
        o.status.success(),
        "tern train failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    metrics(out)
}

/// What must match the co-located run: the rollouts (rewards, tokens) and
/// what the learner made of them.
fn same_steps(label: &str, co: &[Value], fleet: &[Value]) {
    assert_eq!(co.len(), fleet.len(), "{label}: step count");
    for (a, b) in co.iter().zip(fleet) {
        for key in [
            "reward_mean",
            "rollout_tokens",
            "learner_tokens",
            "loss",
            "grad_norm",
            "groups_with_signal",
        ] {
            assert_eq!(
                a[key], b[key],
                "{label}, step {}: {key}\n{a}\n{b}",
                a["step"]
            );
        }
        assert_eq!(a["rho"], b["rho"], "{label}, step {}: rho", a["step"]);
    }
}

/// Requests each worker answered over the run.
fn answered(ms: &[Value], workers: usize) -> Vec<u64> {
    let mut n = vec![0; workers];
    for m in ms {
        for (i, w) in m["fleet"]["workers"].as_array().unwrap().iter().enumerate() {
            n[i] += w["requests"].as_u64().unwrap();
        }
    }
    n
}

/// A stand-in worker that loads adapters like `tern serve` but drops every
/// rollout request without an answer (a process dying mid-request).
fn dropping_worker() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || answer_or_drop(stream));
        }
    });
    format!("http://127.0.0.1:{port}")
}

fn answer_or_drop(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    let mut len = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    let reply = if head.starts_with("GET /v1/models") {
        json!({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "tern"}]})
    } else if head.contains("lora_adapter") {
        json!({"object": "lora_adapter"})
    } else {
        // A rollout: gone without a word.
        return;
    };
    let reply = reply.to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    );
}

#[test]
fn fleet_rollouts_train_as_co_located_ones_through_failures() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_model(&gguf, &TinySpec::default());
    let model = gguf.to_str().unwrap();
    let co = run(model, &dir.path().join("co"), STEPS, &[]);
    assert_eq!(co.len(), STEPS);
    assert!(
        co.iter().any(|m| m["loss"].as_f64() != Some(0.0)),
        "nothing trained"
    );

    let lora_dir = dir.path().display().to_string();
    let w1 = Server::start(&gguf, None, &["--lora-dir", &lora_dir]);
    let mut w2 = Server::start(&gguf, None, &["--lora-dir", &lora_dir]);
    let endpoints = vec![
        "--rollout-endpoints".to_string(),
        format!("{},{}", w1.url(), w2.url()),
    ];

    // Two workers: the same steps, the groups spread over both.
    let fleet = run(model, &dir.path().join("fleet"), STEPS, &endpoints);
    same_steps("two workers", &co, &fleet);
    let n = answered(&fleet, 2);
    assert_eq!(n.iter().sum::<u64>(), 4 * STEPS as u64, "{n:?}");
    assert!(n.iter().all(|&k| k > 0), "both workers rolled out: {n:?}");
    // The adapters were published and the last one is loaded on the workers.
    let (status, models) = w1.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["tiny", &format!("tern-v{}", STEPS - 1)]);

    // Under a compressed rollout cache too: the policy travels with each
    // request, and the workers hold the same KV bytes per rollout.
    let sparse = [
        "--rollout-kv-policy".to_string(),
        "streaming:budget=16".to_string(),
    ];
    let co_sparse = run(model, &dir.path().join("co-sparse"), STEPS, &sparse);
    let mut with_fleet = sparse.to_vec();
    with_fleet.extend_from_slice(&endpoints);
    let fleet_sparse = run(model, &dir.path().join("fleet-sparse"), STEPS, &with_fleet);
    same_steps("streaming:budget=16", &co_sparse, &fleet_sparse);
    for (a, b) in co_sparse.iter().zip(&fleet_sparse) {
        assert_eq!(a["kv_bytes_peak"], b["kv_bytes_peak"], "{a}\n{b}");
        assert!(
            a["kv_bytes_peak"].as_u64() < a["kv_bytes_full"].as_u64(),
            "{a}"
        );
    }

    // A worker killed (SIGKILL) after the first step: the run completes on
    // the other, with the same steps.
    let out = dir.path().join("killed");
    let a = args(model, &out, STEPS, &endpoints);
    let mut trainer = Command::new(env!("CARGO_BIN_EXE_tern"))
        .args(&a)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while metrics(&out).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no first step"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    w2.child.kill().unwrap();
    let _ = w2.child.wait();
    let mut stderr = String::new();
    trainer
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(trainer.wait().unwrap().success(), "{stderr}");
    let killed = metrics(&out);
    same_steps("a worker killed", &co, &killed);
    assert_eq!(killed.len(), STEPS);
    let last = &killed[STEPS - 1]["fleet"]["workers"];
    assert_eq!(last[1]["requests"], 0, "{last}");
    assert_eq!(last[0]["requests"], 4, "{last}");
    assert!(stderr.contains("taken out"), "{stderr}");

    // A worker that takes adapters but drops rollout requests: each dropped
    // group is retried on the live worker, and the steps are the same.
    let fake = dropping_worker();
    let dropped = run(
        model,
        &dir.path().join("dropped"),
        STEPS,
        &[
            "--rollout-endpoints".to_string(),
            format!("{fake},{}", w1.url()),
        ],
    );
    same_steps("a worker dropping requests", &co, &dropped);
    let retried: u64 = dropped
        .iter()
        .map(|m| m["fleet"]["retried"].as_u64().unwrap())
        .sum();
    assert!(retried >= 1, "{:?}", dropped[0]["fleet"]);
    assert_eq!(dropped[0]["fleet"]["workers"][0]["lost"], true);
    assert_eq!(answered(&dropped, 2)[0], 0);
}

/// Workers on the network: bound to every interface behind an API key. The
/// trainer without `--rollout-api-key-file` stops at once on the 401 with
/// what to pass; with it, the run trains (the key goes on the adapter loads
/// and the rollouts too, or they would be 401s).
#[test]
fn keyed_workers_take_the_trainers_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_model(&gguf, &TinySpec::default());
    let model = gguf.to_str().unwrap();
    let key_file = dir.path().join("worker.key");
    std::fs::write(&key_file, "fleet-key-7c1d\n").unwrap();
    let key = key_file.to_str().unwrap().to_string();
    let lora_dir = dir.path().display().to_string();
    let worker = Server::start(
        &gguf,
        Some("fleet-key-7c1d"),
        &[
            "--host",
            "0.0.0.0",
            "--api-key-file",
            &key,
            "--lora-dir",
            &lora_dir,
        ],
    );
    let endpoints = ["--rollout-endpoints".to_string(), worker.url()];

    let a = args(model, &dir.path().join("keyless"), 2, &endpoints);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = tern(&refs, None);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "trained without the key: {stderr}");
    assert!(
        stderr.contains("HTTP 401") && stderr.contains("--rollout-api-key-file"),
        "{stderr}"
    );

    let mut keyed = endpoints.to_vec();
    keyed.extend(["--rollout-api-key-file".to_string(), key.clone()]);
    let ms = run(model, &dir.path().join("keyed"), 2, &keyed);
    assert_eq!(ms.len(), 2);
    assert_eq!(answered(&ms, 1), vec![8]);

    // A key file that is empty is a one-line error before anything runs.
    let empty = dir.path().join("empty.key");
    std::fs::write(&empty, "\n").unwrap();
    let mut bad = endpoints.to_vec();
    bad.extend([
        "--rollout-api-key-file".to_string(),
        empty.display().to_string(),
    ]);
    let a = args(model, &dir.path().join("empty"), 1, &bad);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = tern(&refs, None);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("holds no key"), "{stderr}");
}

/// The adapter endpoints: off without `--lora-dir`; with it, a file outside
/// the directory is refused, a bad file is a 400, a loaded adapter serves as
/// `model`, lists under `/v1/models` with its parent and in `/metrics`, and
/// unloads.
#[test]
fn adapters_load_by_name_within_the_lora_dir_only() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_model(&gguf, &TinySpec::default());
    let off = Server::start(&gguf, None, &[]);
    let (status, body) = off.request(
        "POST",
        "/v1/load_lora_adapter",
        Some(&json!({"lora_name": "a", "lora_path": "/etc/passwd"})),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "adapter_loading_disabled");
    drop(off);

    // An adapter to load: a one-step fleet run publishes its first one under
    // out/adapters (inside the server's --lora-dir).
    let adapters = dir.path().join("adapters");
    std::fs::create_dir_all(&adapters).unwrap();
    let server = Server::start(&gguf, None, &["--lora-dir", adapters.to_str().unwrap()]);
    let out = adapters.join("run");
    run(
        gguf.to_str().unwrap(),
        &out,
        1,
        &["--rollout-endpoints".into(), server.url()],
    );
    let published = out.join("adapters").join("tern-v0");
    assert!(published.join("tern-adapter.safetensors").is_file());

    let load = |name: &str, path: &str| {
        server.request(
            "POST",
            "/v1/load_lora_adapter",
            Some(&json!({"lora_name": name, "lora_path": path})),
        )
    };
    assert_eq!(load("x", "/etc/passwd").0, 403);
    assert_eq!(load("x", "../tiny.gguf").0, 403);
    assert_eq!(load("x", "missing").0, 404);
    std::fs::write(adapters.join("junk.safetensors"), b"junk").unwrap();
    let (status, body) = load("x", "junk.safetensors");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "lora_path");
    let (status, body) = load("mine", published.to_str().unwrap());
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        load("mine", published.to_str().unwrap()).0,
        400,
        "a second load of a name"
    );

    // Served as `model`, answered under its name; an unknown name is a 404.
    let ask = |model: &str| {
        server.request(
            "POST",
            "/v1/completions",
            Some(&json!({"model": model, "prompt": "1 + 1 =", "max_tokens": 4, "temperature": 0})),
        )
    };
    let (status, body) = ask("mine");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "mine");
    assert_eq!(ask("nobody").0, 404);
    let (_, models) = server.request("GET", "/v1/models", None);
    assert_eq!(models["data"][1]["id"], "mine", "{models}");
    assert_eq!(models["data"][1]["parent"], "tiny", "{models}");
    let (_, metrics) = server.request("GET", "/metrics", None);
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    let info = metrics
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        info.contains("running_lora_adapters=\"mine,tern-v0\""),
        "{info}"
    );

    let unload = |name: &str| {
        server.request(
            "POST",
            "/v1/unload_lora_adapter",
            Some(&json!({"lora_name": name})),
        )
    };
    assert_eq!(unload("mine").0, 200);
    assert_eq!(unload("mine").0, 404);
    assert_eq!(ask("mine").0, 404);
}
