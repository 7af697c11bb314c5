//! Request fields -> a validated [`SubmitRequest`], shared by both endpoints.
//!
//! Every range check lives here, each failing with a 400 that names its
//! field, so a bad request is refused before it reaches the engine (whose own
//! checks stay as a second line). Pure: the model enters only as its
//! [`ModelLimits`], so every rule is testable without weights.

use tern_runtime::constraint::{gbnf_to_lark, Constraint};
use tern_runtime::engine::{
    Speculative, SubmitRequest, DEFAULT_MAX_DRAFT, MAX_DRAFT, MAX_N, MAX_STOP_BYTES,
};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::sampler::{SamplingParams, MAX_TOP_LOGPROBS};
use tern_runtime::RuntimeError;

pub mod samplers;

use crate::ids::random_u64;
use crate::openai::error::ApiError;
use crate::openai::request::GenerationFields;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Most alternatives the legacy completions `logprobs` may ask for.
pub const MAX_LEGACY_LOGPROBS: usize = 5;

/// The facts about the served model that validation needs.
#[derive(Clone, Copy, Debug)]
pub struct ModelLimits {
    /// Context window in tokens.
    pub context_length: usize,
    /// Vocabulary size (valid `logit_bias` keys are below it).
    pub vocab_size: usize,
}

/// What an endpoint adds to the shared fields.
#[derive(Debug)]
pub struct EndpointInput {
    /// The templated, tokenized prompt.
    pub prompt: Vec<u32>,
    /// Where the prompt came from (`messages` or `prompt`), for errors.
    pub prompt_param: &'static str,
    /// The token limit and the field it came from.
    pub max_tokens: (Option<i64>, &'static str),
    /// `None`, or `Some(k)`: report log-probabilities with `k` alternatives.
    pub logprobs: Option<usize>,
    /// Whether the request goes on past the context under a KV policy
    /// (`context_overflow`): then the prompt and `max_tokens` need not fit,
    /// and the answer runs for one context's length when none is given.
    pub past_context: bool,
}

/// A request ready to submit, plus how to answer it.
#[derive(Debug)]
pub struct Plan {
    /// What the engine runs.
    pub submit: SubmitRequest,
    /// Answer as server-sent events.
    pub stream: bool,
    /// Add the usage chunk at the end of the stream.
    pub include_usage: bool,
    /// The output constraint to compile against the model, and the field
    /// it came from (compiled by [`compile_constraint`] before submitting).
    pub constraint: Option<(Constraint, &'static str)>,
}

/// Validates everything and builds the engine request.
pub fn plan(
    f: &GenerationFields,
    input: EndpointInput,
    limits: ModelLimits,
    (default_policy, default_dtype): (&KvPolicy, KvDtype),
) -> Result<Plan, ApiError> {
    crate::echoed::short_string("user", f.user.as_deref(), crate::echoed::MAX_USER_CHARS)?;
    let (stream, include_usage) = streaming(f)?;
    let sampling = sampling(f, input.logprobs, limits.vocab_size)?;
    let stop = stops(f)?;
    let n = count(f)?;
    let kv_policy = kv_policy(f, default_policy, limits.context_length)?;
    let kv_dtype = match &f.kv_dtype {
        None => default_dtype,
        Some(name) => name
            .parse::<KvDtype>()
            .map_err(|e| ApiError::invalid_param("kv_dtype", e.to_string()))?,
    };
    let constraint = constraint(f)?;
    let max_tokens = if input.past_context {
        match input.max_tokens.0 {
            None => limits.context_length,
            given => max_tokens(given, input.max_tokens.1, 0, usize::MAX)?,
        }
    } else {
        check_prompt(
            input.prompt.len(),
            input.prompt_param,
            limits.context_length,
        )?;
        max_tokens(
            input.max_tokens.0,
            input.max_tokens.1,
            input.prompt.len(),
            limits.context_length,
        )?
    };
    let mut submit = SubmitRequest::new(input.prompt, sampling, max_tokens);
    submit.stop = stop;
    submit.n = n;
    submit.kv_policy = kv_policy;
    submit.kv_dtype = kv_dtype;
    submit.logprobs = input.logprobs.is_some();
    submit.ignore_eos = f.ignore_eos.unwrap_or(false);
    submit.speculative = speculative(f.speculative.as_ref())?;
    Ok(Plan {
        submit,
        stream,
        include_usage,
        constraint,
    })
}

/// The request's `speculative` field: a mode's name (`"ngram"`, `"draft"`,
/// `"off"`, `"ngram:max_draft=N"`) or `{"type": "ngram" | "draft" | "off",
/// "max_draft": N}`; `None` leaves the server's default. `draft` without a
/// draft model loaded is refused by the engine (a 400 too).
fn speculative(v: Option<&serde_json::Value>) -> Result<Option<Speculative>, ApiError> {
    use serde_json::Value;
    let bad = |reason: String| ApiError::invalid_param("speculative", reason);
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|e| bad(format!("{e}"))),
        Some(Value::Object(o)) => {
            if let Some(k) = o
                .keys()
                .find(|k| !matches!(k.as_str(), "type" | "max_draft"))
            {
                return Err(bad(format!(
                    "unknown speculative field `{k}`: expected `type` and `max_draft`"
                )));
            }
            let kind = o.get("type").and_then(Value::as_str).ok_or_else(|| {
                bad("speculative needs a `type`: `ngram`, `draft` or `off`".into())
            })?;
            let max_draft =
                match o.get("max_draft") {
                    None | Some(Value::Null) => None,
                    Some(n) => Some(n.as_u64().filter(|n| *n <= MAX_DRAFT as u64).ok_or_else(
                        || {
                            bad(format!(
                        "speculative max_draft must be an integer in 1..={MAX_DRAFT}, got {n}"
                    ))
                        },
                    )? as usize),
                };
            match (kind, max_draft) {
                ("off", None) => Ok(Some(Speculative::Off)),
                ("ngram", None) => Ok(Some(Speculative::Ngram {
                    max_draft: DEFAULT_MAX_DRAFT,
                })),
                ("ngram", Some(n)) => Speculative::ngram(n).map(Some).map_err(|_| {
                    bad(format!(
                        "speculative max_draft must be an integer in 1..={MAX_DRAFT}, got {n}"
                    ))
                }),
                ("draft", None) => Ok(Some(Speculative::Draft {
                    max_draft: DEFAULT_MAX_DRAFT,
                })),
                ("draft", Some(n)) => Speculative::draft(n).map(Some).map_err(|_| {
                    bad(format!(
                        "speculative max_draft must be an integer in 1..={MAX_DRAFT}, got {n}"
                    ))
                }),
                ("off", Some(_)) => Err(bad("speculative `off` takes no max_draft".into())),
                (other, _) => Err(bad(format!(
                    "unknown speculative type `{other}`: expected `ngram`, `draft` or `off`"
                ))),
            }
        }
        Some(other) => Err(bad(format!(
            "speculative must be a string or an object, got {other}"
        ))),
    }
}

/// Compiles the plan's constraint against `model` (off the async threads:
/// a large schema takes a while) into its engine request; a schema or
/// grammar that cannot be enforced is a 400 naming its field.
pub async fn compile_constraint(
    plan: &mut Plan,
    model: &std::sync::Arc<tern_runtime::LoadedModel>,
) -> Result<(), ApiError> {
    let Some((c, param)) = plan.constraint.take() else {
        return Ok(());
    };
    let model = std::sync::Arc::clone(model);
    let grammar = crate::prompt::off_thread(move || {
        model
            .grammar(&c)
            .map_err(|e| ApiError::invalid_param(param, format!("{param}: {e}")))
    })
    .await?;
    plan.submit.constraint = Some(grammar);
    Ok(())
}

/// `max_completion_tokens` wins over the older `max_tokens` when both are set.
pub fn merge_max_tokens(
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
) -> (Option<i64>, &'static str) {
    match max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (max_tokens, "max_tokens"),
    }
}

/// Chat's `logprobs` (bool) and `top_logprobs` (`0..=20`, needs `logprobs`).
pub fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    let top = match top {
        None => 0,
        Some(k) => in_range_int("top_logprobs", k, 0, MAX_TOP_LOGPROBS as i64)? as usize,
    };
    match logprobs {
        Some(true) => Ok(Some(top)),
        _ if top > 0 => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        )),
        _ => Ok(None),
    }
}

/// Completions' integer `logprobs` (`0..=5`).
pub fn completion_logprobs(logprobs: Option<i64>) -> Result<Option<usize>, ApiError> {
    logprobs
        .map(|k| in_range_int("logprobs", k, 0, MAX_LEGACY_LOGPROBS as i64).map(|k| k as usize))
        .transpose()
}

fn streaming(f: &GenerationFields) -> Result<(bool, bool), ApiError> {
    let stream = f.stream.unwrap_or(false);
    let include_usage = match &f.stream_options {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::invalid_param(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ))
        }
        Some(o) => o.include_usage.unwrap_or(false),
    };
    Ok((stream, include_usage))
}

fn sampling(
    f: &GenerationFields,
    logprobs: Option<usize>,
    vocab_size: usize,
) -> Result<SamplingParams, ApiError> {
    let top_k = match f.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
        Some(k) => {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be -1 (disabled) or at least 1, got {k}"),
            ))
        }
    };
    let top_p = float("top_p", f.top_p, 1.0, 0.0, 1.0)?;
    if top_p <= 0.0 {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let penalty_name = if f.repetition_penalty.is_none() && f.repeat_penalty.is_some() {
        "repeat_penalty"
    } else {
        "repetition_penalty"
    };
    let repetition_penalty = float(
        penalty_name,
        samplers::repetition_penalty(f)?,
        1.0,
        0.0,
        f64::MAX,
    )?;
    if repetition_penalty <= 0.0 {
        return Err(ApiError::invalid_param(
            penalty_name,
            format!("{penalty_name} must be > 0, got {repetition_penalty}"),
        ));
    }
    let tempered_logprobs = logprobs_mode(f, logprobs, top_k, f64::from(top_p))?;
    let mut params = SamplingParams {
        tempered_logprobs,
        temperature: float("temperature", f.temperature, 1.0, 0.0, 2.0)?,
        top_k,
        top_p,
        min_p: float("min_p", f.min_p, 0.0, 0.0, 1.0)?,
        repetition_penalty,
        presence_penalty: float("presence_penalty", f.presence_penalty, 0.0, -2.0, 2.0)?,
        frequency_penalty: float("frequency_penalty", f.frequency_penalty, 0.0, -2.0, 2.0)?,
        logit_bias: logit_bias(f, vocab_size)?,
        // Negative seeds are valid OpenAI input; their bits are as good a seed.
        seed: f.seed.map_or_else(random_u64, |s| s as u64),
        top_logprobs: logprobs.unwrap_or(0),
        ..SamplingParams::default()
    };
    samplers::apply(f, &mut params)?;
    params
        .validate()
        .map_err(|e| ApiError::invalid_param("sampling", e.to_string()))?;
    Ok(params)
}

/// `logprobs_mode`: whether the sampled tokens' log-probabilities are taken
/// at the sampling temperature. `processed_logprobs` is refused where Tern
/// would report something else than the distribution sampled from (top-k,
/// top-p or min-p truncation, alternatives, which stay raw).
fn logprobs_mode(
    f: &GenerationFields,
    logprobs: Option<usize>,
    top_k: Option<usize>,
    top_p: f64,
) -> Result<bool, ApiError> {
    match f.logprobs_mode.as_deref() {
        None | Some("raw_logprobs") => Ok(false),
        Some("processed_logprobs") => {
            let truncated = top_k.is_some()
                || top_p < 1.0
                || f.min_p.is_some_and(|m| m > 0.0)
                || samplers::shapes_distribution(f);
            if truncated || logprobs.unwrap_or(0) > 0 {
                return Err(ApiError::invalid_param(
                    "logprobs_mode",
                    "processed_logprobs applies the temperature only: it cannot be combined with top_k, top_p, min_p, typical_p, XTC, DRY, mirostat or alternatives (top logprobs)",
                ));
            }
            Ok(true)
        }
        Some(other) => Err(ApiError::invalid_param(
            "logprobs_mode",
            format!("unknown logprobs_mode `{other}` (valid: raw_logprobs, processed_logprobs)"),
        )),
    }
}

fn logit_bias(f: &GenerationFields, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &f.logit_bias else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(key, &bias)| {
            let token: u32 = key.trim().parse().map_err(|_| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias keys must be token ids, got `{key}`"),
                )
            })?;
            if token as usize >= vocab_size {
                return Err(ApiError::invalid_param(
                    "logit_bias",
                    format!("token id {token} is outside the vocabulary (0..{vocab_size})"),
                ));
            }
            if !(-100.0..=100.0).contains(&bias) {
                return Err(ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias values must be between -100 and 100, got {bias} for token {token}"),
                ));
            }
            Ok((token, bias as f32))
        })
        .collect()
}

fn stops(f: &GenerationFields) -> Result<Vec<String>, ApiError> {
    let Some(stop) = &f.stop else {
        return Ok(Vec::new());
    };
    if stop.0.len() > MAX_STOP {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "at most {MAX_STOP} stop sequences are allowed, got {}",
                stop.0.len()
            ),
        ));
    }
    if stop.0.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    if let Some(long) = stop.0.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid_param(
            "stop",
            format!(
                "stop sequences may be at most {MAX_STOP_BYTES} bytes each, got one of {}",
                long.len()
            ),
        ));
    }
    Ok(stop.0.clone())
}

fn count(f: &GenerationFields) -> Result<usize, ApiError> {
    f.n.map_or(Ok(1), |n| {
        in_range_int("n", n, 1, MAX_N as i64).map(|n| n as usize)
    })
}

/// The request's `kv_policy` (or the server's), consistent and with every
/// size within the model's context: each sizes memory the request holds.
fn kv_policy(
    f: &GenerationFields,
    default: &KvPolicy,
    context_length: usize,
) -> Result<KvPolicy, ApiError> {
    let Some(spec) = &f.kv_policy else {
        return Ok(default.clone());
    };
    let invalid = |e: String| {
        ApiError::invalid_param("kv_policy", format!("invalid kv_policy `{spec}`: {e}"))
    };
    let policy: KvPolicy = spec
        .parse()
        .map_err(|e: tern_runtime::kv::policy::PolicyError| invalid(e.to_string()))?;
    policy
        .validate()
        .and_then(|()| policy.check_context(context_length))
        .map_err(|e| invalid(e.to_string()))?;
    Ok(policy)
}

/// `response_format` or the `grammar` extension (not both); a grammar
/// with `::=` is GBNF, translated to Lark here (a 400 naming what it
/// cannot translate).
fn constraint(f: &GenerationFields) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let format = response_format(f)?;
    match (&f.grammar, format) {
        (None, c) => Ok(c),
        (Some(_), Some(_)) => Err(ApiError::invalid_param(
            "grammar",
            "give either `grammar` or a JSON `response_format`, not both",
        )),
        (Some(g), None) if g.trim().is_empty() => {
            Err(ApiError::invalid_param("grammar", "`grammar` is empty"))
        }
        (Some(g), None) if g.contains("::=") => gbnf_to_lark(g)
            .map(|lark| Some((Constraint::Lark(lark), "grammar")))
            .map_err(|e| ApiError::invalid_param("grammar", e.to_string())),
        (Some(g), None) => Ok(Some((Constraint::Lark(g.clone()), "grammar"))),
    }
}

fn response_format(f: &GenerationFields) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    let Some(r) = &f.response_format else {
        return Ok(None);
    };
    match r.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some((Constraint::JsonObject, "response_format"))),
        "json_schema" => {
            let Some(spec) = &r.json_schema else {
                return Err(ApiError::invalid_param(
                    "response_format.json_schema",
                    "response_format of type `json_schema` needs a `json_schema` object",
                ));
            };
            let name_ok = spec.name.as_deref().is_some_and(|n| {
                !n.is_empty()
                    && n.len() <= 64
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
            if !name_ok {
                return Err(ApiError::invalid_param(
                    "response_format.json_schema.name",
                    "response_format.json_schema.name is required: 1 to 64 of a-z, A-Z, 0-9, `_` and `-`",
                ));
            }
            let schema = spec.schema.clone().unwrap_or(serde_json::Value::Bool(true));
            Ok(Some((
                Constraint::JsonSchema(schema),
                "response_format.json_schema.schema",
            )))
        }
        other => Err(ApiError::invalid_param(
            "response_format",
            format!(
                "response_format.type must be `text`, `json_object` or `json_schema`, got `{other}`"
            ),
        )),
    }
}

/// The prompt must be non-empty and leave room for at least one token
/// (the runtime's check, answered as the API's error).
fn check_prompt(len: usize, param: &str, context_length: usize) -> Result<(), ApiError> {
    tern_runtime::model::check_prompt(len, context_length)
        .map_err(|e| ApiError::from_runtime(e, param))
}

/// The requested token limit (at least 1, prompt + limit within the
/// context), or whatever room the context leaves when none is given.
fn max_tokens(
    requested: Option<i64>,
    param: &'static str,
    prompt_len: usize,
    context_length: usize,
) -> Result<usize, ApiError> {
    let room = context_length.saturating_sub(prompt_len);
    let Some(m) = requested else {
        return Ok(room);
    };
    if m < 1 {
        return Err(ApiError::invalid_param(
            param,
            format!("{param} must be at least 1, got {m}"),
        ));
    }
    let m = usize::try_from(m).unwrap_or(usize::MAX);
    if m > room {
        let e = RuntimeError::ContextRequest {
            prompt_tokens: prompt_len,
            max_tokens: m,
            context_length,
        };
        return Err(ApiError::context_length(param, e.to_string()));
    }
    Ok(m)
}

/// `value` (or `default`) as f32 if it is finite and within `lo..=hi`.
fn float(param: &str, value: Option<f64>, default: f32, lo: f64, hi: f64) -> Result<f32, ApiError> {
    let Some(v) = value else {
        return Ok(default);
    };
    if !(v.is_finite() && v >= lo && v <= hi) {
        let range = if hi == f64::MAX {
            format!("at least {lo}")
        } else {
            format!("between {lo} and {hi}")
        };
        return Err(ApiError::invalid_param(
            param,
            format!("{param} must be {range}, got {v}"),
        ));
    }
    Ok(v as f32)
}

fn in_range_int(param: &str, v: i64, lo: i64, hi: i64) -> Result<i64, ApiError> {
    if v < lo || v > hi {
        return Err(ApiError::invalid_param(
            param,
            format!("{param} must be between {lo} and {hi}, got {v}"),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{fields, parse_object};

    const LIMITS: ModelLimits = ModelLimits {
        context_length: 100,
        vocab_size: 50,
    };

    fn run(body: &str, prompt_len: usize) -> Result<Plan, ApiError> {
        let v = parse_object(body.as_bytes()).unwrap();
        let f: GenerationFields = fields(&v)?;
        let input = EndpointInput {
            prompt: vec![1; prompt_len],
            prompt_param: "messages",
            max_tokens: (f.max_tokens, "max_tokens"),
            logprobs: None,
            past_context: false,
        };
        plan(&f, input, LIMITS, (&KvPolicy::Full, KvDtype::F16))
    }

    fn param_of(body: &str) -> Option<String> {
        let e = run(body, 10).expect_err(body);
        assert_eq!(e.status.as_u16(), 400, "{body}");
        assert_eq!(e.kind, "invalid_request_error");
        e.param
    }

    #[test]
    fn speculative_values_are_read_or_refused_with_400() {
        let spec = |body: &str| run(body, 10).unwrap().submit.speculative;
        assert_eq!(spec("{}"), None, "absent: the server's default");
        assert_eq!(
            spec(r#"{"speculative": "ngram"}"#),
            Some(Speculative::Ngram {
                max_draft: DEFAULT_MAX_DRAFT
            })
        );
        assert_eq!(
            spec(r#"{"speculative": {"type": "ngram", "max_draft": 3}}"#),
            Some(Speculative::Ngram { max_draft: 3 })
        );
        assert_eq!(
            spec(r#"{"speculative": {"type": "off"}}"#),
            Some(Speculative::Off)
        );
        assert_eq!(spec(r#"{"speculative": "off"}"#), Some(Speculative::Off));
        assert_eq!(
            spec(r#"{"speculative": "draft"}"#),
            Some(Speculative::Draft {
                max_draft: DEFAULT_MAX_DRAFT
            })
        );
        assert_eq!(
            spec(r#"{"speculative": {"type": "draft"}}"#),
            Some(Speculative::Draft {
                max_draft: DEFAULT_MAX_DRAFT
            })
        );
        assert_eq!(
            spec(r#"{"speculative": {"type": "draft", "max_draft": 5}}"#),
            Some(Speculative::Draft { max_draft: 5 })
        );
        for bad in [
            r#"{"speculative": "draft-model"}"#,
            r#"{"speculative": 3}"#,
            r#"{"speculative": {"type": "eagle"}}"#,
            r#"{"speculative": {"type": "ngram", "max_draft": 0}}"#,
            r#"{"speculative": {"type": "ngram", "max_draft": 99}}"#,
            r#"{"speculative": {"type": "draft", "max_draft": 0}}"#,
            r#"{"speculative": {"type": "ngram", "max_draft": -1}}"#,
            r#"{"speculative": {"type": "ngram", "draft": 4}}"#,
            r#"{"speculative": {"max_draft": 4}}"#,
        ] {
            assert_eq!(param_of(bad).as_deref(), Some("speculative"), "{bad}");
        }
    }

    #[test]
    fn defaults() {
        let p = run("{}", 10).unwrap();
        assert_eq!(p.submit.max_tokens, 90);
        assert_eq!(p.submit.n, 1);
        assert_eq!(p.submit.sampling.temperature, 1.0);
        assert!(!p.stream && !p.include_usage);
        assert_eq!(p.submit.kv_policy, KvPolicy::Full);
    }

    #[test]
    fn each_bad_value_names_its_param() {
        let cases = [
            (r#"{"temperature": 2.5}"#, "temperature"),
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"top_k": -2}"#, "top_k"),
            (r#"{"min_p": 2}"#, "min_p"),
            (r#"{"presence_penalty": 3}"#, "presence_penalty"),
            (r#"{"frequency_penalty": -2.5}"#, "frequency_penalty"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"logit_bias": {"abc": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"3": 101}}"#, "logit_bias"),
            (r#"{"logit_bias": {"50": 1}}"#, "logit_bias"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"n": 17}"#, "n"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"max_tokens": -5}"#, "max_tokens"),
            (r#"{"stop": ["a","b","c","d","e"]}"#, "stop"),
            (r#"{"stop": ""}"#, "stop"),
            (r#"{"kv_policy": "bogus"}"#, "kv_policy"),
            (r#"{"kv_dtype": "q5_k"}"#, "kv_dtype"),
            (r#"{"kv_dtype": 8}"#, "kv_dtype"),
            (r#"{"kv_policy": "snapkv:budget=x"}"#, "kv_policy"),
            (
                r#"{"kv_policy": "snapkv:budget=101,window=8"}"#,
                "kv_policy",
            ),
            (r#"{"kv_policy": "snapkv:kernel=65"}"#, "kv_policy"),
            (r#"{"kv_policy": "h2o:budget=50,every=101"}"#, "kv_policy"),
            (
                r#"{"response_format": {"type": "json_schema"}}"#,
                "response_format.json_schema",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}"#,
                "response_format.json_schema.name",
            ),
            (
                r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}"#,
                "response_format.json_schema.name",
            ),
            (r#"{"grammar": " "}"#, "grammar"),
            (r#"{"grammar": "root ::= <|eot_id|>"}"#, "grammar"),
            (r#"{"grammar": "root ::= item"}"#, "grammar"),
            (r#"{"typical_p": 1.5}"#, "typical_p"),
            (r#"{"xtc_probability": -0.1}"#, "xtc_probability"),
            (r#"{"xtc_threshold": 2}"#, "xtc_threshold"),
            (r#"{"dry_multiplier": -1}"#, "dry_multiplier"),
            (r#"{"dry_base": 0.5}"#, "dry_base"),
            (r#"{"dry_allowed_length": -1}"#, "dry_allowed_length"),
            (r#"{"dry_penalty_last_n": -2}"#, "dry_penalty_last_n"),
            (r#"{"dry_sequence_breakers": []}"#, "dry_sequence_breakers"),
            (
                r#"{"dry_sequence_breakers": [""]}"#,
                "dry_sequence_breakers",
            ),
            (
                r#"{"dry_sequence_breakers": "\n"}"#,
                "dry_sequence_breakers",
            ),
            (r#"{"mirostat": 3}"#, "mirostat"),
            (r#"{"mirostat_tau": -1}"#, "mirostat_tau"),
            (r#"{"mirostat_eta": "fast"}"#, "mirostat_eta"),
            (r#"{"repeat_penalty": 0}"#, "repeat_penalty"),
            (
                r#"{"repeat_penalty": 1.1, "repetition_penalty": 1.2}"#,
                "repeat_penalty",
            ),
            (r#"{"repeat_last_n": -5}"#, "repeat_last_n"),
            (
                r#"{"mirostat": 2, "logprobs_mode": "processed_logprobs"}"#,
                "logprobs_mode",
            ),
            (
                r#"{"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}"#,
                "grammar",
            ),
            (r#"{"response_format": {"type": "xml"}}"#, "response_format"),
            (
                r#"{"stream_options": {"include_usage": true}}"#,
                "stream_options",
            ),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"n": 1.5}"#, "n"),
            (r#"{"stop": 3}"#, "stop"),
            (r#"{"stream": "yes"}"#, "stream"),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(body).as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn stop_strings_are_bounded_in_count_and_length() {
        let at_limit = "s".repeat(MAX_STOP_BYTES);
        let body = serde_json::json!({"stop": [at_limit, "b", "c", "d"]}).to_string();
        assert_eq!(run(&body, 10).unwrap().submit.stop.len(), 4);
        let over = "s".repeat(MAX_STOP_BYTES + 1);
        let body = serde_json::json!({"stop": ["a", over]}).to_string();
        let e = run(&body, 10).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        assert!(e.message.contains("1024 bytes"), "{}", e.message);
    }

    #[test]
    fn policy_sizes_are_bounded_by_the_context() {
        let e = run(
            r#"{"kv_policy": "snapkv:budget=1000000,window=999999"}"#,
            10,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("kv_policy"));
        assert!(
            e.message.contains("`budget` = 1000000") && e.message.contains("100 tokens"),
            "{}",
            e.message
        );
        assert!(run(
            r#"{"kv_policy": "snapkv:budget=100,window=99,every=100"}"#,
            10
        )
        .is_ok());
    }

    #[test]
    fn context_overflow_states_both_numbers() {
        let e = run(r#"{"max_tokens": 95}"#, 10).unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(
            e.message.contains("100") && e.message.contains("95"),
            "{}",
            e.message
        );
        let e = run("{}", 100).unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(run("{}", 0).unwrap_err().param.as_deref(), Some("messages"));
    }

    #[test]
    fn values_reach_the_request() {
        let p = run(
            r#"{"temperature": 0, "top_k": 5, "seed": 7, "stop": "x", "n": 3,
                "logit_bias": {"4": -100}, "kv_policy": "snapkv:budget=64,every=64",
                "response_format": {"type": "json_object"}, "stream": true,
                "stream_options": {"include_usage": true}, "max_tokens": 90}"#,
            10,
        )
        .unwrap();
        let s = &p.submit;
        assert_eq!(s.sampling.temperature, 0.0);
        assert_eq!(s.sampling.top_k, Some(5));
        assert_eq!(s.sampling.seed, 7);
        assert_eq!(s.sampling.logit_bias, vec![(4, -100.0)]);
        assert_eq!(s.stop, vec!["x"]);
        assert_eq!(s.n, 3);
        assert_eq!(s.max_tokens, 90);
        assert_eq!(s.kv_policy.name(), "snapkv");
        assert_eq!(
            p.constraint,
            Some((Constraint::JsonObject, "response_format"))
        );
        assert!(p.stream && p.include_usage);
    }

    #[test]
    fn a_schema_or_grammar_reaches_the_plan_with_its_field() {
        let p = run(
            r#"{"response_format": {"type": "json_schema", "json_schema":
                {"name": "point", "strict": true, "schema": {"type": "object"}}}}"#,
            10,
        )
        .unwrap();
        assert_eq!(
            p.constraint,
            Some((
                Constraint::JsonSchema(serde_json::json!({"type": "object"})),
                "response_format.json_schema.schema"
            ))
        );
        let p = run(r#"{"grammar": "start: \"yes\" | \"no\""}"#, 10).unwrap();
        assert_eq!(
            p.constraint,
            Some((
                Constraint::Lark("start: \"yes\" | \"no\"".into()),
                "grammar"
            ))
        );
        assert_eq!(
            run(r#"{"response_format": {"type": "text"}}"#, 10)
                .unwrap()
                .constraint,
            None
        );
        // GBNF (llama-server's grammar format) arrives translated to Lark.
        let p = run(r#"{"grammar": "root ::= (\"yes\" | \"no\")"}"#, 10).unwrap();
        assert_eq!(
            p.constraint,
            Some((
                Constraint::Lark("start: (\"yes\" | \"no\")\n".into()),
                "grammar"
            ))
        );
    }

    #[test]
    fn llama_server_sampler_fields_reach_the_sampler() {
        let p = run(
            r###"{"typical_p": 0.9, "xtc_probability": 0.5, "xtc_threshold": 0.2,
                "dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3,
                "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", "##"],
                "mirostat": 2, "mirostat_tau": 4, "mirostat_eta": 0.2,
                "repeat_penalty": 1.1, "repeat_last_n": 32}"###,
            10,
        )
        .unwrap();
        let s = &p.submit.sampling;
        assert_eq!(
            (s.typical_p, s.xtc_probability, s.xtc_threshold),
            (0.9, 0.5, 0.2)
        );
        assert_eq!(
            (s.dry_multiplier, s.dry_base, s.dry_allowed_length),
            (0.8, 2.0, 3)
        );
        assert_eq!(s.dry_penalty_last_n, None);
        assert_eq!(s.dry_sequence_breakers, vec!["\n".to_string(), "##".into()]);
        assert_eq!((s.mirostat, s.mirostat_tau, s.mirostat_eta), (2, 4.0, 0.2));
        assert_eq!((s.repetition_penalty, s.penalty_last_n), (1.1, 32));
        // Absent, they keep llama.cpp's defaults (all off).
        let d = run("{}", 10).unwrap().submit.sampling;
        assert_eq!(
            (d.typical_p, d.xtc_probability, d.dry_multiplier, d.mirostat),
            (1.0, 0.0, 0.0, 0)
        );
        assert_eq!(d.dry_penalty_last_n, Some(64));
        // A penalty window of 0 turns the penalties off, as in llama.cpp.
        let off = run(
            r#"{"repetition_penalty": 1.3, "presence_penalty": 1, "repeat_last_n": 0}"#,
            10,
        )
        .unwrap()
        .submit
        .sampling;
        assert_eq!((off.repetition_penalty, off.presence_penalty), (1.0, 0.0));
    }

    #[test]
    fn logprob_options() {
        assert_eq!(chat_logprobs(None, None).unwrap(), None);
        assert_eq!(chat_logprobs(Some(true), Some(3)).unwrap(), Some(3));
        assert_eq!(chat_logprobs(Some(false), None).unwrap(), None);
        let e = chat_logprobs(None, Some(2)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        let e = chat_logprobs(Some(true), Some(21)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert_eq!(completion_logprobs(Some(2)).unwrap(), Some(2));
        assert_eq!(
            completion_logprobs(Some(6)).unwrap_err().param.as_deref(),
            Some("logprobs")
        );
    }

    #[test]
    fn max_completion_tokens_wins() {
        assert_eq!(
            merge_max_tokens(Some(5), Some(7)),
            (Some(7), "max_completion_tokens")
        );
        assert_eq!(merge_max_tokens(Some(5), None), (Some(5), "max_tokens"));
    }

    #[test]
    fn absent_seed_is_random() {
        let a = run("{}", 10).unwrap().submit.sampling.seed;
        let b = run("{}", 10).unwrap().submit.sampling.seed;
        assert_ne!(a, b);
    }
}
