//! Every bad request answers in OpenAI's envelope with the right status and
//! `param`, and nothing panics.

use axum::http::Method;
use serde_json::{json, Value};

use axum::body::Body;
use axum::http::Request;
use tern_runtime::engine::{SubmitError, SubmitRequest};
use tern_runtime::sampler::SamplingParams;
use tower::ServiceExt;

use crate::support::{config, get, post, ready, ready_with, send, tiny, MODEL};

fn json_post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn chat(extra: Value) -> Value {
    let mut body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn malformed_bodies_are_400() {
    let s = ready(config());
    let path = "/v1/chat/completions";
    for body in [
        &b"{not json"[..],
        b"[1, 2]",
        b"",
        b"{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}",
    ] {
        let r = send(
            &s.app,
            Method::POST,
            path,
            body.to_vec(),
            &[("content-type", "application/json")],
        )
        .await;
        let e = r.assert_error(400, None);
        assert_eq!(e["type"], "invalid_request_error");
        assert!(
            !r.text.contains("Failed to"),
            "axum rejection text leaked: {}",
            r.text
        );
    }
}

#[tokio::test]
async fn oversized_bodies_are_413_json() {
    let mut c = config();
    c.max_body = 1024;
    let s = ready(c);
    let big = chat(json!({"messages": [{"role": "user", "content": "x".repeat(4096)}]}));
    let e = post(&s.app, "/v1/chat/completions", &big)
        .await
        .assert_error(413, None);
    assert_eq!(e["code"], "request_too_large");
}

#[tokio::test]
async fn bad_parameters_name_their_field() {
    let s = ready(config());
    let cases = [
        (json!({"temperature": "warm"}), "temperature"),
        (json!({"temperature": 3}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"n": 17}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (
            json!({"max_completion_tokens": -1}),
            "max_completion_tokens",
        ),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"logit_bias": {"99999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"1": 500}}), "logit_bias"),
        (json!({"presence_penalty": 9}), "presence_penalty"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 30}),
            "top_logprobs",
        ),
        (json!({"logprobs": 2}), "logprobs"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {}}}),
            "response_format.json_schema.name",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"grammar": "start: missing_rule"}), "grammar"),
        (json!({"kv_policy": "snapkv:budget=lots"}), "kv_policy"),
        (json!({"kv_policy": 7}), "kv_policy"),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (json!({"messages": []}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": 1}]}),
            "messages[0].content",
        ),
        (
            json!({"tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (json!({"model": ""}), "model"),
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (json!({"reasoning_effort": 2}), "reasoning_effort"),
        (
            json!({"thinking_budget_tokens": 0}),
            "thinking_budget_tokens",
        ),
        (
            json!({"thinking_budget_tokens": 100000}),
            "thinking_budget_tokens",
        ),
        (
            json!({"reasoning_effort": "low", "best_of": 2, "n": 2}),
            "n",
        ),
        (json!({"best_of": 0}), "best_of"),
        (
            json!({"reasoning_effort": "low", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"best_of": 17}), "best_of"),
        (
            json!({"best_of": 2, "aggregate": "synthesize", "synthesizer_model": "nope"}),
            "synthesizer_model",
        ),
        (
            json!({"return_tokens_as_token_ids": true}),
            "return_tokens_as_token_ids",
        ),
        (json!({"logprobs_mode": "odd"}), "logprobs_mode"),
        (
            json!({"logprobs_mode": "processed_logprobs", "top_p": 0.9}),
            "logprobs_mode",
        ),
    ];
    for (extra, param) in cases {
        let r = post(&s.app, "/v1/chat/completions", &chat(extra.clone())).await;
        let e = r.assert_error(400, Some(param));
        assert_eq!(e["type"], "invalid_request_error", "{extra}");
    }
    let mut no_model = chat(json!({}));
    no_model.as_object_mut().unwrap().remove("model");
    post(&s.app, "/v1/chat/completions", &no_model)
        .await
        .assert_error(400, Some("model"));
    let mut no_messages = chat(json!({}));
    no_messages.as_object_mut().unwrap().remove("messages");
    post(&s.app, "/v1/chat/completions", &no_messages)
        .await
        .assert_error(400, Some("messages"));
}

#[tokio::test]
async fn completion_specific_errors() {
    let s = ready(config());
    let cases = [
        (json!({"model": MODEL}), "prompt"),
        (json!({"model": MODEL, "prompt": 5}), "prompt"),
        (json!({"model": MODEL, "prompt": ["a", "b"]}), "prompt"),
        (json!({"model": MODEL, "prompt": [1, 99999]}), "prompt"),
        (
            json!({"model": MODEL, "prompt": "x", "logprobs": 6}),
            "logprobs",
        ),
        (json!({"model": MODEL, "prompt": "x", "echo": true}), "echo"),
        (
            json!({"model": MODEL, "prompt": "x", "logprobs": 2, "logprobs_mode": "processed_logprobs"}),
            "logprobs_mode",
        ),
        (json!({"model": MODEL, "prompt": ""}), "prompt"),
    ];
    for (body, param) in cases {
        post(&s.app, "/v1/completions", &body)
            .await
            .assert_error(400, Some(param));
    }
}

#[tokio::test]
async fn unknown_model_is_404() {
    let s = ready(config());
    let e = post(
        &s.app,
        "/v1/chat/completions",
        &chat(json!({"model": "gpt-4o"})),
    )
    .await
    .assert_error(404, Some("model"));
    assert_eq!(e["code"], "model_not_found");
}

#[tokio::test]
async fn context_overflow_states_both_numbers() {
    let s = ready(config());
    // The tiny model's context is 256 tokens.
    let e = post(
        &s.app,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 1000})),
    )
    .await
    .assert_error(400, Some("max_tokens"));
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("256") && msg.contains("1000"), "{msg}");
    let long = json!({"model": MODEL, "prompt": "y".repeat(400)});
    let e = post(&s.app, "/v1/completions", &long)
        .await
        .assert_error(400, Some("prompt"));
    assert_eq!(e["code"], "context_length_exceeded");
}

#[tokio::test]
async fn admission_errors() {
    let mut c = config();
    c.engine.max_queue = 0;
    c.engine.max_running = 1;
    let long = tiny::TinySpec {
        context_length: 4096,
        ..tiny::TinySpec::default()
    };
    let s = ready_with(c, long);
    // The one decode row is taken; with no queue the next request is refused.
    let busy = json!({"model": MODEL, "prompt": "hello", "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let running = s
        .app
        .clone()
        .oneshot(json_post("/v1/completions", &busy))
        .await
        .unwrap();
    assert_eq!(running.status(), 200);
    let r = post(&s.app, "/v1/chat/completions", &chat(json!({}))).await;
    r.assert_error(429, None);
    assert!(r.headers.contains_key("retry-after"));
    drop(running);

    let mut c = config();
    c.engine.kv_memory = 1024;
    let s = ready(c);
    let e = post(&s.app, "/v1/chat/completions", &chat(json!({})))
        .await
        .assert_error(400, None);
    assert!(e["message"].as_str().unwrap().contains("kv-memory"), "{e}");
}

#[tokio::test]
async fn a_burst_into_free_slots_is_not_refused() {
    let mut c = config();
    c.engine.max_queue = 1;
    c.engine.max_running = 4;
    let long = tiny::TinySpec {
        context_length: 4096,
        ..tiny::TinySpec::default()
    };
    let s = ready_with(c, long);
    let model = s.engine.model();
    let prompt = model.tokenizer.encode("hello", false, false).unwrap();
    let mut req = SubmitRequest::new(prompt, SamplingParams::default(), 4000);
    req.ignore_eos = true;
    // Submitted faster than the engine takes them in: four find free rows,
    // the fifth waits in the queue of one, the sixth is refused.
    let accepted: Vec<_> = (0..5)
        .map(|i| {
            s.engine
                .submit(req.clone())
                .unwrap_or_else(|e| panic!("request {i} refused: {e}"))
        })
        .collect();
    match s.engine.submit(req.clone()) {
        Err(SubmitError::QueueFull {
            waiting: 1,
            limit: 1,
        }) => {}
        other => panic!("expected QueueFull, got {:?}", other.map(|s| s.id)),
    }
    drop(accepted);
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let s = ready(config());
    get(&s.app, "/v2/nothing").await.assert_error(404, None);
    let r = get(&s.app, "/v1/chat/completions").await;
    r.assert_error(405, None);
}
