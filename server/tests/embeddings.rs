//! `/v1/embeddings`, `/tokenize`, `/detokenize` and `GET /v1/models/{id}`
//! over the tiny model: shapes, the properties every embedding must have
//! (unit norm, determinism, batch = singles), and bad input as 400s.

use axum::http::Method;
use serde_json::{json, Value};
use tern_runtime::engine::Pooling;

use crate::support::{config, get, post, ready, send, MODEL};

/// The tiny model's hidden size.
const D: usize = 64;

fn vectors(v: &Value) -> Vec<Vec<f32>> {
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .expect("float embedding")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect()
        })
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

async fn embed(app: &axum::Router, input: Value) -> Vec<Vec<f32>> {
    let r = post(
        app,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": input}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    vectors(&r.json())
}

async fn tokenize(app: &axum::Router, text: &str) -> Vec<u32> {
    let r = post(
        app,
        "/tokenize",
        &json!({"content": text, "add_special": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

#[tokio::test]
async fn embeddings_have_openai_shape_and_unit_norm() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": ["hello there", "a second input"], "user": "u1"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], MODEL);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        assert_eq!(d.as_object().unwrap().len(), 3, "{d}");
    }
    for e in vectors(&v) {
        assert_eq!(e.len(), D);
        assert!((norm(&e) - 1.0).abs() < 1e-5, "norm {}", norm(&e));
    }
    let tokens = tokenize(&s.app, "hello there").await.len()
        + tokenize(&s.app, "a second input").await.len();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    assert_eq!(v["usage"]["total_tokens"], tokens);
    assert_eq!(v["usage"].as_object().unwrap().len(), 2);
}

#[tokio::test]
async fn embeddings_are_deterministic_and_batch_like_singles() {
    let s = ready(config());
    let texts = ["the cat sat", "on the mat, quietly", "z"];
    let mut singles = Vec::new();
    for t in texts {
        let a = embed(&s.app, json!(t)).await;
        let b = embed(&s.app, json!(t)).await;
        assert_eq!(a, b, "same input twice gave different vectors");
        singles.push(a.into_iter().next().unwrap());
    }
    let batch = embed(&s.app, json!(texts)).await;
    assert_eq!(batch.len(), texts.len());
    for (b, one) in batch.iter().zip(&singles) {
        assert!(
            max_diff(b, one) < 1e-5,
            "batch differs by {}",
            max_diff(b, one)
        );
    }
    // Different texts give different vectors.
    assert!(max_diff(&singles[0], &singles[1]) > 1e-3);
}

#[tokio::test]
async fn token_id_inputs_embed_like_their_text() {
    let s = ready(config());
    let ids = tokenize(&s.app, "hello there").await;
    let from_text = embed(&s.app, json!("hello there")).await;
    let from_ids = embed(&s.app, json!(ids)).await;
    assert_eq!(from_text, from_ids);
    let lists = embed(&s.app, json!([ids, ids[..2]])).await;
    assert_eq!(lists.len(), 2);
    assert!(max_diff(&lists[0], &from_text[0]) < 1e-5);
    assert!(max_diff(&lists[0], &lists[1]) > 1e-4);
}

/// Standard base64 back to bytes (the test's own decoder).
fn unbase64(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let digits: Vec<u8> = quad
            .iter()
            .copied()
            .filter(|&c| c != b'=')
            .map(value)
            .collect();
        let n = digits
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | (u32::from(d) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..digits.len()]);
    }
    out
}

#[tokio::test]
async fn base64_and_dimensions() {
    let s = ready(config());
    let full = embed(&s.app, json!("hello there")).await.remove(0);
    let r = post(
        &s.app,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": "hello there", "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let decoded: Vec<f32> = unbase64(&b64)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, full);

    let r = post(
        &s.app,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": "hello there", "dimensions": 16}),
    )
    .await;
    let short = vectors(&r.json()).remove(0);
    assert_eq!(short.len(), 16);
    assert!((norm(&short) - 1.0).abs() < 1e-5);
    let scale = norm(&full[..16]) as f32;
    let expected: Vec<f32> = full[..16].iter().map(|x| x / scale).collect();
    assert!(max_diff(&short, &expected) < 1e-6);
}

#[tokio::test]
async fn long_inputs_are_read_in_chunks() {
    let mut chunked = config();
    chunked.engine.prefill_chunk = 8;
    let small = ready(chunked);
    let whole = ready(config());
    // Several chunks of 8, yet under the 64 rows from which attention takes
    // its other kernel (which rounds differently), so reading in chunks must
    // give the same states as reading whole.
    let text = "read in chunks of eight tokens";
    let n = tokenize(&whole.app, text).await.len();
    assert!((17..64).contains(&n), "{n} tokens");
    let a = embed(&small.app, json!(text)).await.remove(0);
    let b = embed(&whole.app, json!(text)).await.remove(0);
    assert!(
        max_diff(&a, &b) < 1e-6,
        "chunked differs by {}",
        max_diff(&a, &b)
    );
}

#[tokio::test]
async fn last_token_pooling() {
    let mut c = config();
    c.embedding_pooling = Pooling::Last;
    let last = ready(c);
    let mean = ready(config());
    let ids = tokenize(&mean.app, "hello there").await;
    // One token: its state is both the mean and the last.
    let one = json!([ids[0]]);
    let (a, b) = (
        embed(&last.app, one.clone()).await,
        embed(&mean.app, one).await,
    );
    assert!(max_diff(&a[0], &b[0]) < 1e-6);
    // A longer input: a unit vector, and not the mean.
    let whole = embed(&last.app, json!(ids)).await.remove(0);
    let multi = embed(&mean.app, json!(ids)).await.remove(0);
    assert!((norm(&whole) - 1.0).abs() < 1e-5);
    assert!(max_diff(&whole, &multi) > 1e-4, "last pooled like mean");
}

#[tokio::test]
async fn bad_embedding_input_is_a_400_naming_the_field() {
    let s = ready(config());
    let long: Vec<u32> = vec![5; 300]; // the tiny model's context is 256
    let cases = [
        (json!({"model": MODEL, "input": []}), "input"),
        (json!({"model": MODEL, "input": ""}), "input"),
        (json!({"model": MODEL, "input": ["ok", ""]}), "input"),
        (json!({"model": MODEL, "input": [10_000_000]}), "input"),
        (json!({"model": MODEL, "input": [[1, 2], []]}), "input"),
        (json!({"model": MODEL, "input": [1, "a"]}), "input"),
        (json!({"model": MODEL, "input": [-3]}), "input"),
        (json!({"model": MODEL}), "input"),
        (json!({"model": MODEL, "input": long}), "input"),
        (
            json!({"model": MODEL, "input": "x", "dimensions": 0}),
            "dimensions",
        ),
        (
            json!({"model": MODEL, "input": "x", "dimensions": D + 1}),
            "dimensions",
        ),
        (
            json!({"model": MODEL, "input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "x"}), "model"),
    ];
    for (body, param) in cases {
        let r = post(&s.app, "/v1/embeddings", &body).await;
        let e = r.assert_error(400, Some(param));
        assert_eq!(e["type"], "invalid_request_error", "{body}");
    }
    let e = post(
        &s.app,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": long}),
    )
    .await
    .assert_error(400, Some("input"));
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("300"), "{e}");
    post(
        &s.app,
        "/v1/embeddings",
        &json!({"model": "other", "input": "x"}),
    )
    .await
    .assert_error(404, Some("model"));
    // The server still serves.
    assert_eq!(embed(&s.app, json!("still here")).await.len(), 1);
}

#[tokio::test]
async fn embeddings_and_generation_run_together() {
    let s = ready(config());
    let completion = json!({"model": MODEL, "prompt": "hello", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let alone = post(&s.app, "/v1/completions", &completion).await.json();
    let inputs: Vec<String> = (0..12).map(|i| format!("input number {i}")).collect();
    let embedding = json!({"model": MODEL, "input": inputs});
    let gen = post(&s.app, "/v1/completions", &completion);
    let emb = post(&s.app, "/v1/embeddings", &embedding);
    let (g, e) = tokio::join!(gen, emb);
    assert_eq!(g.status, 200, "{}", g.text);
    assert_eq!(g.json()["usage"]["completion_tokens"], 16);
    // Embedding forwards between its steps leave the generation as it was.
    assert_eq!(g.json()["choices"][0]["text"], alone["choices"][0]["text"]);
    assert_eq!(e.status, 200, "{}", e.text);
    assert_eq!(vectors(&e.json()).len(), 12);
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let s = ready(config());
    let text = "hello world, café";
    let r = post(&s.app, "/tokenize", &json!({"content": text})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let ids: Vec<u64> = r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().expect("bare ids without with_pieces"))
        .collect();
    assert!(!ids.is_empty());
    let r = post(
        &s.app,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    )
    .await;
    let entries = r.json()["tokens"].as_array().unwrap().clone();
    assert_eq!(entries.len(), ids.len());
    let mut bytes = Vec::new();
    for (e, id) in entries.iter().zip(&ids) {
        assert_eq!(e["id"].as_u64(), Some(*id));
        match &e["piece"] {
            Value::String(p) => bytes.extend_from_slice(p.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().unwrap() as u8)),
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    let r = post(&s.app, "/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json(), json!({"content": text}));

    post(&s.app, "/detokenize", &json!({"tokens": [1, 10_000_000]}))
        .await
        .assert_error(400, Some("tokens"));
    post(&s.app, "/detokenize", &json!({"tokens": "1 2"}))
        .await
        .assert_error(400, Some("tokens"));
    post(&s.app, "/tokenize", &json!({"with_pieces": true}))
        .await
        .assert_error(400, Some("content"));
    post(&s.app, "/tokenize", &json!({"content": 5}))
        .await
        .assert_error(400, Some("content"));
    // Still serving.
    assert_eq!(
        post(&s.app, "/tokenize", &json!({"content": "x"}))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn tokenizer_routes_need_the_key() {
    let mut c = config();
    c.api_key = Some("sekret".into());
    let s = ready(c);
    for path in ["/tokenize", "/detokenize", "/v1/embeddings"] {
        let r = post(
            &s.app,
            path,
            &json!({"content": "x", "tokens": [1], "input": "x"}),
        )
        .await;
        r.assert_error(401, None);
    }
    let body = json!({"content": "x"}).to_string();
    let r = send(
        &s.app,
        Method::POST,
        "/tokenize",
        body,
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sekret"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn model_retrieve_by_id() {
    let s = ready(config());
    let m = get(&s.app, &format!("/v1/models/{MODEL}")).await;
    assert_eq!(m.status, 200, "{}", m.text);
    let v = m.json();
    assert_eq!(v["id"], MODEL);
    assert_eq!(v["object"], "model");
    assert_eq!(v["owned_by"], "tern");
    assert!(v["created"].as_u64().unwrap() > 0);
    let e = get(&s.app, "/v1/models/gpt-4o")
        .await
        .assert_error(404, Some("model"));
    assert_eq!(e["code"], "model_not_found");
}

#[tokio::test]
async fn embedding_requests_are_bounded_by_the_queue_limit() {
    let mut none = config();
    none.engine.max_queue = 0;
    let s = ready(none);
    let r = post(
        &s.app,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": "x"}),
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(r.headers["retry-after"], "1");

    // One place: each answered request gives it back before its answer.
    let mut one = config();
    one.engine.max_queue = 1;
    let s = ready(one);
    for i in 0..5 {
        assert_eq!(embed(&s.app, json!(format!("request {i}"))).await.len(), 1);
    }
}
