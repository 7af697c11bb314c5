//! A model file is a program too: its Jinja chat template runs on every chat
//! request. One that never ends is refused when the model loads (minijinja's
//! fuel, `runtime/src/chat`), so `tern serve` stops with the reason instead
//! of hanging the first request.

use candle_core::quantized::gguf_file;

use super::fixture::tiny_model;
use crate::support::tern;

/// 10^10 loop iterations: a hang without fuel.
const ENDLESS: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

/// Copies the GGUF `src` to `dst` with `tokenizer.chat_template` = `template`.
fn with_template(src: &std::path::Path, dst: &std::path::Path, template: &str) {
    let mut f = std::fs::File::open(src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| {
            let t = content.tensor(&mut f, n, &candle_core::Device::Cpu);
            (n.clone(), t.unwrap())
        })
        .collect();
    let template = gguf_file::Value::String(template.into());
    let meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| match k.as_str() {
            "tokenizer.chat_template" => (k.as_str(), &template),
            _ => (k.as_str(), v),
        })
        .collect();
    let refs: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(dst).unwrap();
    gguf_file::write(&mut out, &meta, &refs).unwrap();
}

#[test]
fn a_chat_template_that_never_ends_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir);
    let endless = dir.path().join("endless.gguf");
    with_template(&model, &endless, ENDLESS);
    let o = tern(
        &["serve", "-m", endless.to_str().unwrap(), "--port", "0"],
        None,
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "served an endless template: {stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains("chat template: refused") && line.contains("fuel"),
        "{stderr}"
    );
}
