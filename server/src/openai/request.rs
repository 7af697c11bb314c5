//! Request fields `/v1/chat/completions` and `/v1/completions` share:
//! sampling, stopping, `n`, streaming and Tern's `kv_policy` extension.
//!
//! Wire types only: every field is optional and as loosely typed as OpenAI
//! allows (integers as `i64` so a negative value gets a range error, not a
//! type error). Ranges are checked in `params.rs`, which turns these into a
//! `SubmitRequest`. Unknown fields are ignored, as OpenAI does.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The shared fields of a completion request.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationFields {
    /// Which model to run; must be the one this server serves.
    pub model: Option<String>,
    /// Sampling temperature, `0..=2` (default 1; 0 is greedy).
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, `(0, 1]`.
    pub top_p: Option<f64>,
    /// Keep the k most likely tokens (vLLM extension; `-1` or `0` disables).
    pub top_k: Option<i64>,
    /// Drop tokens below `min_p` times the top probability (extension).
    pub min_p: Option<f64>,
    /// Seed of the sampler; absent means random. Child `i` of `n` uses `seed + i`.
    pub seed: Option<i64>,
    /// Up to 4 strings that end a completion.
    pub stop: Option<Stop>,
    /// Most tokens to generate per completion.
    pub max_tokens: Option<i64>,
    /// OpenAI presence penalty, `-2..=2`.
    pub presence_penalty: Option<f64>,
    /// OpenAI frequency penalty, `-2..=2`.
    pub frequency_penalty: Option<f64>,
    /// llama.cpp repetition penalty, `> 0` (extension).
    pub repetition_penalty: Option<f64>,
    /// Token id (as a string) to a bias in `-100..=100`.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Completions to generate for the prompt, `1..=16`.
    pub n: Option<i64>,
    /// Answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options (`include_usage`).
    pub stream_options: Option<StreamOptions>,
    /// `{"type": "text"}`, `{"type": "json_object"}` or
    /// `{"type": "json_schema", "json_schema": {...}}`.
    pub response_format: Option<ResponseFormat>,
    /// Tern extension (llama-server's field name): a grammar the output
    /// must match, in llguidance's Lark dialect or in GBNF (llama.cpp's
    /// format, recognised by its `::=` and translated to Lark).
    pub grammar: Option<String>,
    /// llama-server's `repeat_penalty` (an alias of `repetition_penalty`).
    pub repeat_penalty: Option<f64>,
    /// llama-server's `repeat_last_n`: tokens the penalties look at
    /// (`-1` the whole history, `0` turns the penalties off; default 64).
    pub repeat_last_n: Option<i64>,
    /// Locally typical sampling's mass, `[0, 1]` (llama-server; 1 is off).
    pub typical_p: Option<f64>,
    /// XTC's chance per step of removing the top choices, `[0, 1]` (llama-server).
    pub xtc_probability: Option<f64>,
    /// XTC's threshold, `[0, 1]`; above 0.5 XTC does nothing (llama-server).
    pub xtc_threshold: Option<f64>,
    /// DRY's multiplier, `>= 0` (llama-server; 0 is off).
    pub dry_multiplier: Option<f64>,
    /// DRY's base, `>= 1` (llama-server; default 1.75).
    pub dry_base: Option<f64>,
    /// Repeats up to this long go unpenalised by DRY, `>= 0` (default 2).
    pub dry_allowed_length: Option<i64>,
    /// Tokens DRY scans: `-1` the whole history, `0` off (default 64).
    pub dry_penalty_last_n: Option<i64>,
    /// Strings that cut DRY's repeats (default newline, `:`, `"`, `*`).
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// Mirostat: `0` off, `1` or `2` (llama-server).
    pub mirostat: Option<i64>,
    /// Mirostat's target surprise tau, `>= 0` (default 5).
    pub mirostat_tau: Option<f64>,
    /// Mirostat's learning rate eta, `>= 0` (default 0.1).
    pub mirostat_eta: Option<f64>,
    /// Top-nσ: keep the tokens within this many standard deviations of the
    /// top logit (llama-server's `top_n_sigma`; `<= 0`, the default, is off).
    pub top_n_sigma: Option<f64>,
    /// Dynamic temperature's half-width (llama-server's `dynatemp_range`).
    pub dynatemp_range: Option<f64>,
    /// Dynamic temperature's exponent (llama-server's `dynatemp_exponent`).
    pub dynatemp_exponent: Option<f64>,
    /// End-user id; at most 256 characters (`echoed.rs`), otherwise ignored.
    pub user: Option<String>,
    /// Tern extension: the KV cache policy spec for this request.
    pub kv_policy: Option<String>,
    /// Tern extension: how this request's KV cache stores keys and values
    /// (`f16`, `q8_0`, `q4_0`, `f32`).
    pub kv_dtype: Option<String>,
    /// Generate past end-of-sequence tokens (vLLM extension, for benchmarks).
    pub ignore_eos: Option<bool>,
    /// Tern extension: speculative decoding for this request, `"ngram"`
    /// (prompt lookup), `"off"`, or `{"type": "ngram", "max_draft": 8}`;
    /// absent takes the server's `--speculative`. Checked in `params.rs`.
    pub speculative: Option<serde_json::Value>,
    /// Which log-probabilities are returned (vLLM's names): `raw_logprobs`
    /// (the model's, the default) or `processed_logprobs` (the sampled
    /// token's at the sampling temperature, what an RL trainer compares its
    /// learner with; only temperature may shape the distribution then).
    pub logprobs_mode: Option<String>,
    /// Logprob tokens as `token_id:N` instead of text (vLLM extension), so a
    /// client gets the exact ids sampled.
    pub return_tokens_as_token_ids: Option<bool>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Add a last chunk with `usage` and no choices.
    pub include_usage: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema of a `json_schema` format.
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    /// The format's name (`a-z`, `A-Z`, `0-9`, `_`, `-`; at most 64).
    pub name: Option<String>,
    /// The JSON schema; absent means any JSON value.
    pub schema: Option<serde_json::Value>,
    /// Accepted: Tern always enforces the schema, strict or not.
    #[allow(dead_code)]
    pub strict: Option<bool>,
    /// Accepted and unused (the model sees only what the prompt says).
    #[allow(dead_code)]
    pub description: Option<String>,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop(pub Vec<String>);

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StopVisitor;
        impl<'de> Visitor<'de> for StopVisitor {
            type Value = Stop;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Stop, E> {
                Ok(Stop(vec![v.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Stop, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(Stop(out))
            }
        }
        d.deserialize_any(StopVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_accepts_string_or_list() {
        let one: Stop = serde_json::from_str(r#""\n""#).unwrap();
        assert_eq!(one.0, vec!["\n"]);
        let many: Stop = serde_json::from_str(r#"["a","b"]"#).unwrap();
        assert_eq!(many.0, vec!["a", "b"]);
        assert!(serde_json::from_str::<Stop>("3").is_err());
        assert!(serde_json::from_str::<Stop>("[3]").is_err());
    }
}
