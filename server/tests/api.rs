//! Non-streamed chat and text completions: shapes, parameters, `tern`.

use serde_json::json;

use crate::support::{config, post, ready, ready_with, tiny, MODEL};

#[tokio::test]
async fn chat_completion_shape() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/chat/completions",
        &json!({
            "model": MODEL,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
            "max_tokens": 5,
            "temperature": 0,
            "user": "someone",
            "some_future_field": {"x": 1}
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].as_u64().unwrap() > 0);
    assert!(v["system_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("tern-"));
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    assert!(c["message"]["content"].is_string());
    assert!(c["logprobs"].is_null());
    assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap()));
    let u = &v["usage"];
    let (p, g) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 0 && (1..=5).contains(&g));
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + g);
    assert_eq!(v["tern"]["kv_policy"], "full");
    assert_eq!(v["tern"]["prompt_tokens"].as_u64().unwrap(), p);
    assert!(v["tern"]["kv_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["tern"]["kv_bytes"], v["tern"]["kv_bytes_full"]);
}

#[tokio::test]
async fn greedy_is_deterministic_and_seeds_reproduce() {
    let s = ready(config());
    let ask = |extra: serde_json::Value| {
        let mut body =
            json!({"model": MODEL, "prompt": "hello there", "max_tokens": 12, "ignore_eos": true});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let text = |v: serde_json::Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let a = text(
        post(&s.app, "/v1/completions", &ask(json!({"temperature": 0})))
            .await
            .json(),
    );
    let b = text(
        post(&s.app, "/v1/completions", &ask(json!({"temperature": 0})))
            .await
            .json(),
    );
    assert_eq!(a, b);
    let c = text(
        post(&s.app, "/v1/completions", &ask(json!({"seed": 5})))
            .await
            .json(),
    );
    let d = text(
        post(&s.app, "/v1/completions", &ask(json!({"seed": 5})))
            .await
            .json(),
    );
    assert_eq!(c, d);
}

#[tokio::test]
async fn n_completions_share_the_prompt() {
    let s = ready(config());
    let v = post(
        &s.app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 3,
                "max_completion_tokens": 4, "seed": 1, "ignore_eos": true}),
    )
    .await
    .json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["completion_tokens"], 12);
}

#[tokio::test]
async fn kv_policy_per_request_and_by_default() {
    let s = ready(config());
    let v = post(
        &s.app,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "a b c d e f g h i j k l m n o p q r s t u v w x y z",
                "max_tokens": 30, "ignore_eos": true, "kv_policy": "streaming:budget=16,sink=2"}),
    )
    .await
    .json();
    let tern = &v["tern"];
    assert!(
        tern["kv_policy"]
            .as_str()
            .unwrap()
            .starts_with("streaming:budget=16"),
        "{tern}"
    );
    assert!(
        tern["kv_bytes"].as_u64().unwrap() < tern["kv_bytes_full"].as_u64().unwrap(),
        "{tern}"
    );

    let mut c = config();
    c.kv_policy = "h2o:budget=64".parse().unwrap();
    let s = ready(c);
    let v = post(
        &s.app,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x", "max_tokens": 2}),
    )
    .await
    .json();
    assert!(v["tern"]["kv_policy"]
        .as_str()
        .unwrap()
        .starts_with("h2o:budget=64"));
}

#[tokio::test]
async fn chat_logprobs_in_openai_shape() {
    let s = ready(config());
    let v = post(
        &s.app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "ignore_eos": true, "logprobs": true, "top_logprobs": 3, "temperature": 0}),
    )
    .await
    .json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!content.is_empty());
    for entry in content {
        assert!(entry["token"].is_string());
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        assert!(entry["bytes"].is_array());
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["logprob"], entry["logprob"]);
    }
}

#[tokio::test]
async fn completion_logprobs_in_legacy_shape() {
    let s = ready(config());
    let v = post(
        &s.app,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ["hello"], "max_tokens": 3, "ignore_eos": true, "logprobs": 2}),
    )
    .await
    .json();
    let c = &v["choices"][0];
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let lp = &c["logprobs"];
    let n = lp["tokens"].as_array().unwrap().len();
    assert!(n > 0);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), n);
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert!((2..=3).contains(&top.len()), "{top:?}");
}

#[tokio::test]
async fn token_id_prompts_and_stop_strings() {
    let s = ready(config());
    let v = post(
        &s.app,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [104, 101], "max_tokens": 2, "stop": ["\u{0}zz"]}),
    )
    .await;
    assert_eq!(v.status, 200, "{}", v.text);
    assert_eq!(v.json()["usage"]["prompt_tokens"], 2);
}

#[tokio::test]
async fn json_object_mode_is_accepted() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "json"}], "max_tokens": 8,
                "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.trim_start().is_empty() || text.trim_start().starts_with('{'),
        "{text}"
    );
}

#[tokio::test]
async fn thinking_budget_is_reported_in_the_tern_object() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/chat/completions",
        &json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "temperature": 0,
            "ignore_eos": true,
            "max_tokens": 60,
            "thinking_budget_tokens": 6,
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    let t = &v["tern"]["reasoning"];
    assert!(t["reasoning_effort"].is_null());
    // max_tokens 60 leaves 48 answer tokens after the 6-token cap: the budget
    // forces the answer at 6, and ignore_eos runs the answer to its limit.
    assert_eq!(t["cap"], 6);
    assert_eq!(t["hit_cap"], true);
    assert_eq!(t["stopped_early"], false);
    assert_eq!(t["reasoning_tokens"], 6);
    assert_eq!(t["answer_tokens"], 48);
    assert_eq!(v["usage"]["completion_tokens"], 54);
    assert_eq!(t["tokens_spent"], 54);
    // A plain request has no reasoning report.
    let plain = post(
        &s.app,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}),
    )
    .await;
    assert!(plain.json()["tern"].get("reasoning").is_none());
}

#[tokio::test]
async fn reasoning_effort_auto_probes_on_a_forked_cache() {
    let s = ready(config());
    let r = post(
        &s.app,
        "/v1/chat/completions",
        &json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "temperature": 0,
            "ignore_eos": true,
            "max_tokens": 200,
            "reasoning_effort": "auto",
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let t = &r.json()["tern"]["reasoning"];
    assert_eq!(t["reasoning_effort"], "auto");
    // The cap shrinks to fit max_tokens with room for the answer.
    assert_eq!(t["cap"], 200 - 48);
    let probes = t["probes"].as_array().unwrap();
    assert!(!probes.is_empty(), "{t}");
    for (i, p) in probes.iter().enumerate() {
        assert_eq!(p["at"], 64 * (i as u64 + 1));
        assert!((1..=20).contains(&p["tokens"].as_u64().unwrap()));
    }
    let probe_tokens: u64 = probes.iter().map(|p| p["tokens"].as_u64().unwrap()).sum();
    assert_eq!(t["probe_tokens"], probe_tokens);
}

#[tokio::test]
async fn every_choice_of_n_reasons_and_reports_alone() {
    let s = ready(config());
    let body = |stream: bool| {
        let mut b = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "temperature": 0.9,
            "seed": 3,
            "n": 3,
            "ignore_eos": true,
            "max_tokens": 200,
            "reasoning_effort": "auto",
            "stream": stream,
        });
        if stream {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let r = post(&s.app, "/v1/chat/completions", &body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    let t = &v["tern"]["reasoning"];
    assert_eq!(t["reasoning_effort"], "auto");
    let choices = t["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{t}");
    let (mut written, mut probe_tokens, mut saved) = (0, 0, 0);
    for c in choices {
        assert_eq!(c["cap"], 200 - 48);
        // ignore_eos: every choice either stops early on agreeing probes or
        // reasons to the cap, and then writes its answer.
        assert_ne!(c["stopped_early"], c["hit_cap"], "{c}");
        if c["hit_cap"] == true {
            assert_eq!(c["reasoning_tokens"], 200 - 48);
        }
        for (i, p) in c["probes"].as_array().unwrap().iter().enumerate() {
            assert_eq!(p["at"], 64 * (i as u64 + 1));
        }
        written += c["reasoning_tokens"].as_u64().unwrap() + c["answer_tokens"].as_u64().unwrap();
        probe_tokens += c["probe_tokens"].as_u64().unwrap();
        saved += c["tokens_saved"].as_u64().unwrap();
    }
    assert!(probe_tokens > 0, "every choice probes at 64 tokens: {t}");
    assert_eq!(v["usage"]["completion_tokens"], written);
    assert_eq!(t["tokens_spent"], written + probe_tokens);
    assert_eq!(t["tokens_saved"], saved);
    // The same request streamed reports the same, on its usage chunk.
    let streamed = post(&s.app, "/v1/chat/completions", &body(true)).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    let payloads = streamed.sse();
    let last: serde_json::Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(&last["tern"]["reasoning"], t);
}

#[tokio::test]
async fn a_base_model_without_a_template_refuses_chat_but_completes() {
    let spec = tiny::TinySpec {
        chat_template: false,
        ..tiny::TinySpec::default()
    };
    let s = ready_with(config(), spec);
    let chat =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = post(&s.app, "/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("no chat template") && message.contains("/v1/completions"),
        "{message}"
    );
    let completion = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3});
    let r = post(&s.app, "/v1/completions", &completion).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn chat_answers_carry_a_prefix_key_for_balancers() {
    // The same long system prompt, two different questions: one key, which
    // a balancer can route on; a short prompt gets none.
    let s = ready(config());
    let system = "You answer questions about apples and pears. ".repeat(2);
    let ask = |q: &str, sys: &str| {
        json!({
            "model": MODEL,
            "messages": [{"role": "system", "content": sys}, {"role": "user", "content": q}],
            "max_tokens": 2,
            "temperature": 0
        })
    };
    let key = |r: &crate::support::Reply| {
        r.headers
            .get("x-tern-prefix-key")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let a = post(&s.app, "/v1/chat/completions", &ask("How many?", &system)).await;
    let b = post(
        &s.app,
        "/v1/chat/completions",
        &ask("Which colour?", &system),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let ka = key(&a).expect("a long prompt has a key");
    assert_eq!(ka.len(), 16);
    assert_eq!(key(&b).as_deref(), Some(ka.as_str()));
    let other = post(
        &s.app,
        "/v1/chat/completions",
        &ask("How many?", &system.replace("apples", "plums")),
    )
    .await;
    assert_ne!(key(&other).as_deref(), Some(ka.as_str()));
    let short = post(&s.app, "/v1/chat/completions", &ask("hi", "be brief")).await;
    assert_eq!(short.status, 200);
    assert_eq!(key(&short), None);
    // Completions and Responses carry it too: one key per shared beginning.
    for (path, field, limit) in [
        ("/v1/completions", "prompt", "max_tokens"),
        ("/v1/responses", "input", "max_output_tokens"),
    ] {
        let mut keys = Vec::new();
        for q in ["How many?", "Which colour?"] {
            let mut body = json!({"model": MODEL, "temperature": 0});
            body[field] = json!(format!("{system}{system}{q}"));
            body[limit] = json!(2);
            let r = post(&s.app, path, &body).await;
            assert_eq!(r.status, 200, "{path}: {}", r.text);
            keys.push(key(&r));
        }
        assert!(keys[0].is_some(), "{path}: a long prompt has a key");
        assert_eq!(keys[0], keys[1], "{path}");
    }
}
