//! Anthropic's Messages API over the tiny model: a message and its stream
//! (named events in Anthropic's order, with a ping), the same answer chat
//! completions give, a forced tool call and its round trip, stop sequences,
//! count_tokens against the usage, the key as `x-api-key`, and errors in
//! Anthropic's shape with the right status.

use axum::http::Method;
use serde_json::{json, Value};

use crate::support::{config, loading, post, ready, ready_with, send, tiny, Reply, MODEL};

/// A greedy request for a few tokens, with `extra` fields set.
fn ask(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 8, "temperature": 0,
        "system": "be brief", "messages": [{"role": "user", "content": "hello"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Each SSE frame's `event:` name and `data:` JSON.
fn events(r: &Reply) -> Vec<(String, Value)> {
    r.text
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let line = |p: &str| {
                frame
                    .lines()
                    .find_map(|l| l.strip_prefix(p))
                    .unwrap_or_else(|| panic!("no `{p}` in {frame:?}"))
                    .to_string()
            };
            let data = serde_json::from_str(&line("data: ")).expect("json data");
            (line("event: "), data)
        })
        .collect()
}

/// Asserts Anthropic's error body with this status and type; its message.
fn assert_error(r: &Reply, status: u16, kind: &str) -> String {
    assert_eq!(r.status.as_u16(), status, "{}", r.text);
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert_eq!(v["error"].as_object().map(|o| o.len()), Some(2), "{v}");
    v["error"]["message"].as_str().unwrap().to_string()
}

fn text_of(message: &Value) -> String {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

async fn count(app: &axum::Router, body: &Value) -> u64 {
    let r = post(app, "/v1/messages/count_tokens", body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    v["input_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_message_its_stream_and_the_chat_answer_agree() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/messages",
        &ask(json!({"metadata": {"user_id": "u1"}})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let m = r.json();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], MODEL);
    assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()));
    assert!(m["stop_sequence"].is_null());
    let (input, output) = (
        m["usage"]["input_tokens"].as_u64().unwrap(),
        m["usage"]["output_tokens"].as_u64().unwrap(),
    );
    assert!(input > 0 && (1..=8).contains(&output), "{m}");
    assert_eq!(input, count(&s.app, &ask(json!({}))).await);
    assert_eq!(m["tern"]["kv_policy"], "full");

    // The chat path answers the same conversation alike.
    let chat = post(
        &s.app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]}),
    )
    .await
    .json();
    assert_eq!(chat["choices"][0]["message"]["content"], text_of(&m));
    assert_eq!(chat["usage"]["prompt_tokens"], input);
    assert_eq!(chat["usage"]["completion_tokens"], output);

    let r = post(&s.app, "/v1/messages", &ask(json!({"stream": true}))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let ev = events(&r);
    for (name, data) in &ev {
        assert_eq!(data["type"], name.as_str());
    }
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    let start = &ev[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    assert_eq!(
        start["usage"],
        json!({"input_tokens": input, "output_tokens": 0})
    );
    let mut text = String::new();
    if !text_of(&m).is_empty() {
        assert_eq!(names[2], "content_block_start");
        assert_eq!(
            ev[2].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(names[names.len() - 3], "content_block_stop");
        for (_, d) in &ev[3..ev.len() - 3] {
            assert_eq!(d["type"], "content_block_delta");
            assert_eq!(
                (d["index"].as_u64(), d["delta"]["type"].as_str()),
                (Some(0), Some("text_delta"))
            );
            text.push_str(d["delta"]["text"].as_str().unwrap());
        }
    }
    assert_eq!(text, text_of(&m));
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], m["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], output);
    assert_eq!(delta["usage"]["input_tokens"], input);
}

#[tokio::test]
async fn a_forced_tool_call_is_a_tool_use_block_and_its_result_goes_back() {
    // Room for Tern's default tool prompt in the tiny vocabulary.
    let spec = tiny::TinySpec {
        context_length: 2048,
        ..tiny::TinySpec::default()
    };
    let s = ready_with(config(), spec);
    // (An enum keeps the tiny model's arguments short.)
    let tools = json!([{"name": "weather", "description": "The weather in a city.", "input_schema": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}]);
    let body = ask(json!({"max_tokens": 200, "tools": tools,
        "tool_choice": {"type": "tool", "name": "weather"},
        "messages": [{"role": "user", "content": "Weather in Paris?"}]}));
    let r = post(&s.app, "/v1/messages", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let m = r.json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let uses: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{m}");
    let call = uses[0];
    assert_eq!(call["name"], "weather");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert!(
        call["input"]["city"].is_string() && call["input"]["unit"].is_string(),
        "{call}"
    );

    // Streamed: the arguments arrive as input_json_delta fragments.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post(&s.app, "/v1/messages", &streamed).await);
    let (start, block) = ev
        .iter()
        .enumerate()
        .find(|(_, (n, d))| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .map(|(i, (_, d))| (i, d["index"].clone()))
        .expect("a tool_use block");
    assert_eq!(ev[start].1["content_block"]["input"], json!({}));
    let args: String = ev
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == block)
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "input_json_delta");
            d["delta"]["partial_json"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), call["input"]);
    assert!(ev
        .iter()
        .any(|(n, d)| n == "content_block_stop" && d["index"] == block));
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");

    // The round trip: the call and its result go back as blocks.
    let round = ask(json!({"max_tokens": 4, "tools": tools, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": m["content"]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "18 C"}]},
            {"type": "text", "text": "Thanks."}]},
    ]}));
    let r = post(&s.app, "/v1/messages", &round).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let input = r.json()["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(input, count(&s.app, &round).await);
    assert!(input > count(&s.app, &body).await);
}

#[tokio::test]
async fn stop_sequences_end_the_answer_and_are_named() {
    let s = ready(config());
    let whole = post(&s.app, "/v1/messages", &ask(json!({"max_tokens": 16})))
        .await
        .json();
    let text = text_of(&whole);
    // A stop sequence from the middle of what greedy decoding writes.
    let Some((at, _)) = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .filter(|(i, _)| *i > 0)
    else {
        panic!("the tiny model wrote too little to cut: {text:?}");
    };
    let stop: String = text[at..].chars().take(2).collect();
    let cut = &text[..text.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = ask(json!({"max_tokens": 16, "stream": stream,
            "stop_sequences": ["\u{1}never", stop]}));
        let r = post(&s.app, "/v1/messages", &body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let (reason, sequence, got) = if stream {
            let ev = events(&r);
            let d = ev[ev.len() - 2].1["delta"].clone();
            let got: String = ev
                .iter()
                .filter_map(|(_, d)| d["delta"]["text"].as_str())
                .collect();
            (d["stop_reason"].clone(), d["stop_sequence"].clone(), got)
        } else {
            let m = r.json();
            (
                m["stop_reason"].clone(),
                m["stop_sequence"].clone(),
                text_of(&m),
            )
        };
        assert_eq!(reason, "stop_sequence", "{}", r.text);
        assert_eq!(sequence, json!(stop));
        assert_eq!(got, cut);
    }
}

#[tokio::test]
async fn max_tokens_past_the_context_is_capped_to_what_is_left() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/messages",
        &ask(json!({"max_tokens": 1_000_000, "temperature": 1, "seed": 1})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json()["usage"];
    let total = u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap();
    assert!(total <= 256, "{u}");
}

#[tokio::test]
async fn the_key_is_taken_as_x_api_key_or_bearer() {
    let mut c = config();
    c.api_key = Some("sekret".into());
    let s = ready(c);
    let body = ask(json!({})).to_string();
    let path = "/v1/messages/count_tokens";
    let json = ("content-type", "application/json");
    for key in [("x-api-key", "sekret"), ("authorization", "Bearer sekret")] {
        let r = send(&s.app, Method::POST, path, body.clone(), &[json, key]).await;
        assert_eq!(r.status, 200, "{key:?}: {}", r.text);
    }
    for key in [
        ("x-api-key", "wrong"),
        ("authorization", "Bearer wrong"),
        ("x-other", "sekret"),
    ] {
        let r = send(
            &s.app,
            Method::POST,
            "/v1/messages",
            body.clone(),
            &[json, key],
        )
        .await;
        let message = assert_error(&r, 401, "authentication_error");
        assert!(message.contains("x-api-key"), "{message}");
    }
    // The OpenAI routes keep their one scheme.
    let r = send(
        &s.app,
        Method::GET,
        "/v1/models",
        "",
        &[("x-api-key", "sekret")],
    )
    .await;
    r.assert_error(401, None);
}

#[tokio::test]
async fn errors_are_anthropic_error_bodies_with_the_right_status() {
    let s = ready(config());
    let no_max = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&s.app, "/v1/messages", &no_max).await;
    assert_error(&r, 400, "invalid_request_error");
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "invalid_request_error",
               "message": "Missing required parameter: `max_tokens`"}})
    );
    // count_tokens does not need it.
    assert!(count(&s.app, &no_max).await > 0);
    let image = ask(json!({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}));
    let message = assert_error(
        &post(&s.app, "/v1/messages", &image).await,
        400,
        "invalid_request_error",
    );
    assert!(
        message.contains("messages[0].content[0]") && message.contains("text only"),
        "{message}"
    );
    let prefill = ask(json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Sure,"}]}));
    assert_error(
        &post(&s.app, "/v1/messages", &prefill).await,
        400,
        "invalid_request_error",
    );
    let long = ask(json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]}));
    let message = assert_error(
        &post(&s.app, "/v1/messages", &long).await,
        400,
        "invalid_request_error",
    );
    assert!(message.contains("256"), "{message}");
    let other = ask(json!({"model": "claude-elsewhere"}));
    assert_error(
        &post(&s.app, "/v1/messages", &other).await,
        404,
        "not_found_error",
    );
    let r = send(
        &s.app,
        Method::POST,
        "/v1/messages",
        "{}",
        &[("content-type", "text/plain")],
    )
    .await;
    assert_error(&r, 415, "invalid_request_error");
    let r = send(
        &s.app,
        Method::POST,
        "/v1/messages",
        "{not json",
        &[("content-type", "application/json")],
    )
    .await;
    assert_error(&r, 400, "invalid_request_error");
    // Still loading: 503, retry shortly.
    let (app, _state) = loading(&config());
    let r = post(&app, "/v1/messages", &ask(json!({}))).await;
    assert_error(&r, 503, "overloaded_error");
    assert_eq!(r.headers["retry-after"], "1");
    // The server goes on answering.
    assert_eq!(
        post(&s.app, "/v1/messages", &ask(json!({}))).await.status,
        200
    );
}
