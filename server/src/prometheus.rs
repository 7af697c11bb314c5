//! The engine's counters in Prometheus' text exposition format 0.0.4:
//! `# HELP` and `# TYPE` lines, then samples; histograms as cumulative
//! `_bucket{le=...}` series with `+Inf`, `_sum` and `_count`.
//!
//! Pure: a [`MetricsSnapshot`] in, text out. The route adds the content type.

use std::fmt::Write;

use tern_runtime::engine::{HistogramSnapshot, MetricsSnapshot};

use crate::registry::slot::SlotState;
use crate::registry::{MemoryStatus, ModelStatus};

/// The content type Prometheus expects for this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders every Tern metric of a running engine.
pub fn render(m: &MetricsSnapshot) -> String {
    let mut out = String::new();
    let w = &mut out;
    requests(w, m);
    tokens(w, m);
    kv_memory(w, m);
    latency(w, m);
    gateway(w, m);
    out
}

/// Readiness, and requests and sequences by state.
fn requests(w: &mut String, m: &MetricsSnapshot) {
    scalar(
        w,
        "tern_model_ready",
        "gauge",
        "1 once the model has loaded.",
        1,
    );
    scalar(
        w,
        "tern_requests_running",
        "gauge",
        "Requests admitted and not finished.",
        m.running,
    );
    scalar(
        w,
        "tern_requests_waiting",
        "gauge",
        "Requests waiting for admission.",
        m.waiting,
    );
    scalar(
        w,
        "tern_sequences_running",
        "gauge",
        "Sequences (completions) being decoded.",
        m.sequences,
    );
    scalar(
        w,
        "tern_requests_finished_total",
        "counter",
        "Requests that ran to completion.",
        m.finished,
    );
    scalar(
        w,
        "tern_requests_cancelled_total",
        "counter",
        "Requests cancelled because their client went away.",
        m.cancelled,
    );
    scalar(
        w,
        "tern_requests_failed_total",
        "counter",
        "Requests that failed inside the engine.",
        m.failed,
    );
}

/// Tokens prefilled, reused, generated and drafted, and the steps that ran.
fn tokens(w: &mut String, m: &MetricsSnapshot) {
    scalar(
        w,
        "tern_prompt_tokens_total",
        "counter",
        "Prompt tokens prefilled.",
        m.prompt_tokens,
    );
    scalar(
        w,
        "tern_prompt_tokens_cached_total",
        "counter",
        "Prompt tokens reused from the prompt-prefix cache instead of prefilled.",
        m.prompt_tokens_cached,
    );
    scalar(
        w,
        "tern_generated_tokens_total",
        "counter",
        "Tokens generated.",
        m.generated_tokens,
    );
    scalar(
        w,
        "tern_speculative_drafted_tokens_total",
        "counter",
        "Draft tokens speculative decoding proposed and verified.",
        m.spec_drafted,
    );
    scalar(
        w,
        "tern_speculative_accepted_tokens_total",
        "counter",
        "Draft tokens the model agreed with, each emitted without a forward of its own.",
        m.spec_accepted,
    );
    scalar(
        w,
        "tern_engine_steps_total",
        "counter",
        "Forward steps the engine ran.",
        m.steps,
    );
}

/// KV cache memory: the budget, what is reserved, and by policy and storage
/// type what running sequences hold and save.
fn kv_memory(w: &mut String, m: &MetricsSnapshot) {
    scalar(
        w,
        "tern_kv_memory_bytes",
        "gauge",
        "KV cache memory the engine may reserve (--kv-memory).",
        m.kv_memory,
    );
    scalar(
        w,
        "tern_kv_reserved_bytes",
        "gauge",
        "KV cache bytes reserved by running requests and cached prompt prefixes.",
        m.kv_reserved,
    );
    header(
        w,
        "tern_kv_bytes_in_use",
        "gauge",
        "KV cache bytes held by running sequences, by policy and storage type.",
    );
    for ((policy, dtype), kv) in &m.by_policy {
        let _ = writeln!(
            w,
            "tern_kv_bytes_in_use{{policy=\"{}\",dtype=\"{}\"}} {}",
            escape(policy),
            escape(dtype),
            kv.bytes_in_use
        );
    }
    header(
        w,
        "tern_kv_bytes_saved",
        "gauge",
        "KV cache bytes a full cache of the same storage type would hold beyond what running sequences hold, by policy and storage type.",
    );
    for ((policy, dtype), kv) in &m.by_policy {
        let _ = writeln!(
            w,
            "tern_kv_bytes_saved{{policy=\"{}\",dtype=\"{}\"}} {}",
            escape(policy),
            escape(dtype),
            kv.bytes_saved
        );
    }
}

/// Latency histograms: time to first token and between tokens.
fn latency(w: &mut String, m: &MetricsSnapshot) {
    histogram(
        w,
        "tern_time_to_first_token_seconds",
        "Seconds from submission to a request's first token.",
        &m.ttft,
    );
    histogram(
        w,
        "tern_inter_token_latency_seconds",
        "Seconds between consecutive tokens of one completion.",
        &m.itl,
    );
}

/// The same load figures under the names Kubernetes inference gateways
/// scrape by default (the Gateway API Inference Extension's model server
/// protocol, whose defaults are vLLM's): queue depth, running requests and
/// the KV cache's used fraction, so an endpoint picker can balance `tern
/// serve` replicas as it balances vLLM ones. Its LoRA-affinity series is
/// [`adapters`].
fn gateway(w: &mut String, m: &MetricsSnapshot) {
    scalar(
        w,
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting for admission (tern_requests_waiting).",
        m.waiting,
    );
    scalar(
        w,
        "vllm:num_requests_running",
        "gauge",
        "Requests admitted and not finished (tern_requests_running).",
        m.running,
    );
    header(
        w,
        "vllm:kv_cache_usage_perc",
        "gauge",
        "Fraction of the KV cache memory reserved, 1 = full (tern_kv_reserved_bytes / tern_kv_memory_bytes).",
    );
    let used = if m.kv_memory == 0 {
        0.0
    } else {
        (m.kv_reserved as f64 / m.kv_memory as f64).min(1.0)
    };
    let _ = writeln!(w, "vllm:kv_cache_usage_perc {used}");
}

/// `vllm:lora_requests_info`, the series gateways read for LoRA affinity:
/// the adapters loaded at run time as `running_lora_adapters` (Tern keeps
/// every loaded adapter ready, so loaded is running), none waiting, and
/// `--max-loras`; its value is the time of the scrape, as vLLM's is.
pub fn adapters(w: &mut String, names: &[String], max: usize, now: u64) {
    header(
        w,
        "vllm:lora_requests_info",
        "gauge",
        "LoRA adapters loaded at run time (labels), value: unix time.",
    );
    let _ = writeln!(
        w,
        "vllm:lora_requests_info{{max_lora=\"{max}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"\"}} {now}",
        names.join(",")
    );
}

/// The in-memory Responses store: responses held, the bytes they are
/// charged, and the budget (`--responses-store-bytes`) that bounds them.
pub fn responses_store(w: &mut String, count: usize, bytes: usize, max_bytes: usize) {
    scalar(
        w,
        "tern_responses_stored",
        "gauge",
        "Responses held for previous_response_id (in memory).",
        count as u64,
    );
    scalar(
        w,
        "tern_responses_stored_bytes",
        "gauge",
        "Bytes the stored responses are charged (their JSON text and bookkeeping).",
        bytes as u64,
    );
    scalar(
        w,
        "tern_responses_store_max_bytes",
        "gauge",
        "The stored responses' byte budget (--responses-store-bytes).",
        max_bytes as u64,
    );
}

/// One per-model series: name, type, help, and its value for a model.
type PerModel = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ModelStatus) -> u64,
);

/// A several-model server's models: the shared memory budget and what is
/// charged against it, and per model whether it is loaded, its charge and
/// how often it has been loaded. (Each engine's own series are not
/// exported here: one series name per engine would need a `model` label
/// on every one.)
pub fn models(w: &mut String, models: &[ModelStatus], memory: &MemoryStatus) {
    scalar(
        w,
        "tern_model_ready",
        "gauge",
        "1 once the server answers (models load on first use).",
        1,
    );
    scalar(
        w,
        "tern_models_memory_budget_bytes",
        "gauge",
        "Bytes loaded models' weights and KV budgets may take together (--models-memory).",
        memory.budget_bytes as u64,
    );
    scalar(
        w,
        "tern_models_memory_bytes",
        "gauge",
        "Bytes charged by loaded and loading models (weights + KV budget each).",
        memory.in_use_bytes as u64,
    );
    let per_model: [PerModel; 3] = [
        (
            "tern_model_loaded",
            "gauge",
            "1 while the model is loaded.",
            |m| u64::from(m.state == SlotState::Loaded),
        ),
        (
            "tern_model_memory_bytes",
            "gauge",
            "Bytes the model is charged (0 unloaded).",
            |m| m.memory_bytes as u64,
        ),
        (
            "tern_model_loads_total",
            "counter",
            "Times the model has been loaded.",
            |m| m.loads,
        ),
    ];
    for (name, kind, help, value) in per_model {
        header(w, name, kind, help);
        for m in models {
            let _ = writeln!(w, "{name}{{model=\"{}\"}} {}", escape(&m.id), value(m));
        }
    }
}

/// What `/metrics` says while the model is still loading.
pub fn render_loading() -> String {
    let mut out = String::new();
    scalar(
        &mut out,
        "tern_model_ready",
        "gauge",
        "1 once the model has loaded.",
        0,
    );
    out
}

fn header(w: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(w, "# HELP {name} {help}");
    let _ = writeln!(w, "# TYPE {name} {kind}");
}

fn scalar(w: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    header(w, name, kind, help);
    let _ = writeln!(w, "{name} {value}");
}

fn histogram(w: &mut String, name: &str, help: &str, h: &HistogramSnapshot) {
    header(w, name, "histogram", help);
    for &(le, count) in &h.buckets {
        let _ = writeln!(w, "{name}_bucket{{le=\"{le}\"}} {count}");
    }
    let _ = writeln!(w, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(w, "{name}_sum {}", h.sum);
    let _ = writeln!(w, "{name}_count {}", h.count);
}

/// Label values escape backslash, double quote and newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tern_runtime::engine::PolicyKv;

    fn snapshot() -> MetricsSnapshot {
        let hist = HistogramSnapshot {
            buckets: vec![(0.1, 1), (1.0, 3)],
            sum: 2.5,
            count: 4,
        };
        let mut by_policy = BTreeMap::new();
        by_policy.insert(
            ("snapkv".to_string(), "q8_0".to_string()),
            PolicyKv {
                sequences: 1,
                bytes_in_use: 100,
                bytes_saved: 900,
            },
        );
        MetricsSnapshot {
            kv_memory: 1 << 30,
            running: 2,
            waiting: 1,
            sequences: 3,
            kv_reserved: 4096,
            prompt_tokens: 50,
            prompt_tokens_cached: 20,
            generated_tokens: 60,
            spec_drafted: 12,
            spec_accepted: 9,
            finished: 7,
            cancelled: 1,
            failed: 0,
            steps: 99,
            by_policy,
            ttft: hist.clone(),
            itl: hist,
        }
    }

    #[test]
    fn every_series_has_help_type_and_a_sample() {
        let text = render(&snapshot());
        for name in [
            "tern_requests_running",
            "tern_requests_waiting",
            "tern_sequences_running",
            "tern_requests_finished_total",
            "tern_requests_cancelled_total",
            "tern_requests_failed_total",
            "tern_prompt_tokens_total",
            "tern_prompt_tokens_cached_total",
            "tern_generated_tokens_total",
            "tern_speculative_drafted_tokens_total",
            "tern_speculative_accepted_tokens_total",
            "tern_kv_memory_bytes",
            "tern_kv_reserved_bytes",
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{name} "))),
                "{name}"
            );
        }
        assert!(text.contains("tern_requests_running 2\n"));
        assert!(text.contains("# TYPE tern_requests_finished_total counter\n"));
        assert!(text.contains("tern_kv_bytes_in_use{policy=\"snapkv\",dtype=\"q8_0\"} 100\n"));
        assert!(text.contains("tern_kv_bytes_saved{policy=\"snapkv\",dtype=\"q8_0\"} 900\n"));
    }

    #[test]
    fn inference_gateways_find_their_series() {
        let text = render(&snapshot());
        assert!(text.contains("# TYPE vllm:num_requests_waiting gauge\n"));
        assert!(text.contains("vllm:num_requests_waiting 1\n"));
        assert!(text.contains("vllm:num_requests_running 2\n"));
        // 4096 bytes reserved of 1 GiB.
        assert!(
            text.contains("vllm:kv_cache_usage_perc 0.000003814697265625\n"),
            "{text}"
        );
        let mut empty = snapshot();
        empty.kv_memory = 0;
        assert!(render(&empty).contains("vllm:kv_cache_usage_perc 0\n"));
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let text = render(&snapshot());
        let name = "tern_time_to_first_token_seconds";
        assert!(text.contains(&format!("# TYPE {name} histogram\n")));
        assert!(text.contains(&format!("{name}_bucket{{le=\"0.1\"}} 1\n")));
        assert!(text.contains(&format!("{name}_bucket{{le=\"1\"}} 3\n")));
        assert!(text.contains(&format!("{name}_bucket{{le=\"+Inf\"}} 4\n")));
        assert!(text.contains(&format!("{name}_sum 2.5\n")));
        assert!(text.contains(&format!("{name}_count 4\n")));
        assert!(text.contains("tern_inter_token_latency_seconds_count 4\n"));
    }

    #[test]
    fn every_line_is_a_comment_or_a_sample() {
        for line in render(&snapshot()).lines() {
            let ok = line.starts_with("# HELP ")
                || line.starts_with("# TYPE ")
                || line
                    .rsplit_once(' ')
                    .is_some_and(|(_, v)| v.parse::<f64>().is_ok());
            assert!(ok, "{line}");
        }
        assert_eq!(escape("a\"b\\c\n"), "a\\\"b\\\\c\\n");
        assert!(render_loading().contains("tern_model_ready 0\n"));
    }
}
