//! Loading, health, auth, CORS, models, metrics and the page.

use axum::http::Method;
use serde_json::json;

use crate::support::{config, get, loading, post, ready, send, MODEL};

#[tokio::test]
async fn answers_503_while_loading() {
    let (app, _state) = loading(&config());
    get(&app, "/health").await.assert_error(503, None);
    get(&app, "/v1/models").await.assert_error(503, None);
    let r = post(
        &app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": []}),
    )
    .await;
    r.assert_error(503, None);
    assert_eq!(r.headers["retry-after"], "1");
    let m = get(&app, "/metrics").await;
    assert_eq!(m.status, 200);
    assert!(m.text.contains("tern_model_ready 0"), "{}", m.text);
}

#[tokio::test]
async fn health_and_models_once_ready() {
    let s = ready(config());
    let h = get(&s.app, "/health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json(), json!({"status": "ok"}));
    let m = get(&s.app, "/v1/models").await.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(get(&s.app, "/v1/models/tiny").await.json()["id"], MODEL);
    get(&s.app, "/v1/models/other")
        .await
        .assert_error(404, Some("model"));
    let page = get(&s.app, "/").await;
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
}

#[tokio::test]
async fn api_key_guards_v1_and_metrics() {
    let mut c = config();
    c.api_key = Some("sekret".into());
    let s = ready(c);
    let e = get(&s.app, "/v1/models").await.assert_error(401, None);
    assert_eq!(e["code"], "invalid_api_key");
    assert_eq!(e["type"], "invalid_request_error");
    let wrong = send(
        &s.app,
        Method::GET,
        "/v1/models",
        "",
        &[("authorization", "Bearer nope")],
    )
    .await;
    wrong.assert_error(401, None);
    let right = send(
        &s.app,
        Method::GET,
        "/v1/models",
        "",
        &[("authorization", "Bearer sekret")],
    )
    .await;
    assert_eq!(right.status, 200);
    assert_eq!(get(&s.app, "/health").await.status, 200);
    assert_eq!(get(&s.app, "/").await.status, 200);
    // /metrics shows traffic: behind the key too (see security.rs).
    get(&s.app, "/metrics").await.assert_error(401, None);
}

#[tokio::test]
async fn cors_preflight_is_answered_without_a_key() {
    let mut c = config();
    c.api_key = Some("k".into());
    c.cors = tern_server::Cors::parse("http://ui.test").unwrap();
    let s = ready(c);
    let r = send(
        &s.app,
        Method::OPTIONS,
        "/v1/chat/completions",
        "",
        &[
            ("origin", "http://ui.test"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization,content-type",
            ),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["access-control-allow-origin"], "http://ui.test");
}

#[tokio::test]
async fn metrics_count_requests() {
    let s = ready(config());
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": true});
    assert_eq!(post(&s.app, "/v1/completions", &body).await.status, 200);
    let m = get(&s.app, "/metrics").await;
    assert_eq!(
        m.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        m.text.contains("tern_requests_finished_total 1\n"),
        "{}",
        m.text
    );
    assert!(
        m.text.contains("tern_generated_tokens_total 3\n"),
        "{}",
        m.text
    );
    assert!(
        m.text
            .contains("tern_time_to_first_token_seconds_count 1\n"),
        "{}",
        m.text
    );
    assert!(
        m.text
            .contains("tern_inter_token_latency_seconds_bucket{le=\"+Inf\"} 2\n"),
        "{}",
        m.text
    );
}
