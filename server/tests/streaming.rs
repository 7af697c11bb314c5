//! Server-sent events: chunk order and shape, usage, `n`, and cancellation
//! when the client goes away.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{config, post, ready, ready_with, tiny, MODEL};

fn chunks(payloads: &[String]) -> Vec<Value> {
    let (last, rest) = payloads.split_last().expect("a stream");
    assert_eq!(last, "[DONE]");
    rest.iter()
        .map(|p| serde_json::from_str(p).expect("json chunk"))
        .collect()
}

#[tokio::test]
async fn chat_stream_with_usage_and_two_choices() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2,
                "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let chunks = chunks(&r.sse());
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(c["id"], id);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], MODEL);
        assert!(c["created"].is_u64() && c["system_fingerprint"].is_string());
        assert!(c.get("usage").is_some(), "{c}");
    }
    let (usage_chunk, body) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let u = &usage_chunk["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage_chunk["tern"]["kv_policy"], "full");
    for index in 0..2 {
        let mine: Vec<&Value> = body
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            .collect();
        assert_eq!(
            mine[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        let finishes = mine
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .count();
        assert_eq!(finishes, 1, "choice {index}");
        assert!(!mine.last().unwrap()["choices"][0]["finish_reason"].is_null());
        assert!(mine[1..]
            .iter()
            .all(|c| c["choices"][0]["delta"].get("role").is_none()));
        assert!(body.iter().all(|c| c["usage"].is_null()));
    }
}

#[tokio::test]
async fn stream_without_usage_puts_tern_on_the_last_finish() {
    let s = ready(config());
    let body =
        json!({"model": MODEL, "prompt": "hello", "max_tokens": 6, "ignore_eos": true, "seed": 3});
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(&s.app, "/v1/completions", &streamed).await;
    let chunks = chunks(&r.sse());
    assert!(chunks
        .iter()
        .all(|c| c.get("usage").is_none() && c["object"] == "text_completion"));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["tern"]["kv_policy"], "full");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c.get("tern").is_none()));
    // The same seed gives the same text, streamed or not.
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    let whole = post(&s.app, "/v1/completions", &body).await.json();
    assert_eq!(whole["choices"][0]["text"], text);
}

#[tokio::test]
async fn disconnect_cancels_the_request() {
    let spec = tiny::TinySpec {
        context_length: 4096,
        ..tiny::TinySpec::default()
    };
    let s = ready_with(config(), spec);
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = s.app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut frames = res.into_body().into_data_stream();
    let first = frames.next().await.expect("a first chunk").expect("bytes");
    assert!(first.starts_with(b"data: "));
    drop(frames);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = s.engine.metrics().snapshot();
        if m.cancelled == 1 {
            assert_eq!(m.finished, 0);
            assert_eq!(m.running, 0);
            break;
        }
        assert!(Instant::now() < deadline, "not cancelled: {m:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
