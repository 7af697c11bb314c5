//! An Anthropic Messages request -> the chat completions body that
//! `routes::chat` runs: `system` and content blocks as chat turns
//! (`content.rs`), `tools` with `input_schema` as function tools,
//! `tool_choice` (`auto`, `any`, `tool`, `none`) as chat's,
//! `output_config.format` as a JSON-schema `response_format`, sampling
//! fields as they are.
//!
//! Everything is checked here with Anthropic's field names, so a bad request
//! is a 400 naming its own field rather than the chat field it maps to.
//! `stop_sequences` are not passed on: the reply side matches them
//! (`stop.rs`), because the engine's stop strings end an answer
//! without saying which one (or whether end-of-turn) ended it, and Anthropic's
//! answer names the sequence. Nothing here renders or runs anything.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::content::{chat_messages, system_text, unsupported};
use crate::body::fields;
use crate::openai::error::ApiError;

/// Most `stop_sequences` one request may give (each is searched for in
/// every piece of text the model writes).
pub const MAX_STOP_SEQUENCES: usize = 64;

/// The request fields this endpoint reads; others (`metadata`,
/// `service_tier`, `cache_control` on blocks ...) are accepted and ignored.
#[derive(Debug, Default, Deserialize)]
struct MessagesFields {
    model: Option<String>,
    messages: Option<Value>,
    system: Option<Value>,
    max_tokens: Option<i64>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    temperature: Option<f64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    output_config: Option<Value>,
}

/// Sampling fields passed to chat as they are: Anthropic's `top_p` and
/// `top_k`, and Tern's extensions (chat checks their ranges), beside
/// llama-server's samplers ([`crate::params::samplers::FIELDS`]).
const PASSED_ON: [&str; 6] = ["top_p", "top_k", "seed", "min_p", "kv_policy", "kv_dtype"];

/// A checked Messages request, as chat will run it.
#[derive(Debug)]
pub struct Converted {
    /// The `model` asked for (chat resolves it).
    pub model: String,
    /// The chat completions body: model, messages, tools, tool_choice and
    /// sampling fields; the handler adds `max_tokens` and streaming.
    pub chat: Value,
    /// `max_tokens` as sent (required by `/v1/messages`, not by
    /// `count_tokens`).
    pub max_tokens: Option<i64>,
    /// Non-empty `stop_sequences`, in order.
    pub stop_sequences: Vec<String>,
    /// Whether to answer as server-sent events.
    pub stream: bool,
}

/// Checks `body` (a Messages or count_tokens request) and converts it.
pub fn convert(body: &Value) -> Result<Converted, ApiError> {
    let f: MessagesFields = fields(body)?;
    let model = f
        .model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid_param("model", "Missing required parameter: `model`"))?;
    if let Some(t) = f.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("temperature must be between 0 and 1, got {t}"),
        ));
    }
    if let Some(m) = f.max_tokens.filter(|&m| m < 1) {
        return Err(ApiError::invalid_param(
            "max_tokens",
            format!("max_tokens must be at least 1, got {m}"),
        ));
    }
    thinking(f.thinking.as_ref())?;
    let stop_sequences: Vec<String> = f
        .stop_sequences
        .unwrap_or_default()
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    if stop_sequences.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_param(
            "stop_sequences",
            format!(
                "at most {MAX_STOP_SEQUENCES} stop_sequences are allowed, got {}",
                stop_sequences.len()
            ),
        ));
    }
    let mut messages = Vec::new();
    if let Some(system) = system_text(f.system.as_ref())? {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(chat_messages(f.messages.as_ref())?);
    let mut chat = json!({"model": model, "messages": messages});
    if let Some(t) = f.temperature {
        chat["temperature"] = json!(t);
    }
    for k in PASSED_ON.into_iter().chain(crate::params::samplers::FIELDS) {
        if let Some(v) = body.get(k).filter(|v| !v.is_null()) {
            chat[k] = v.clone();
        }
    }
    if let Some(list) = &f.tools {
        chat["tools"] = Value::Array(chat_tools(list)?);
    }
    if let Some(format) = output_format(f.output_config.as_ref())? {
        chat["response_format"] = format;
    }
    if let Some(c) = &f.tool_choice {
        let (choice, parallel) = chat_tool_choice(c)?;
        chat["tool_choice"] = choice;
        if let Some(p) = parallel {
            chat["parallel_tool_calls"] = json!(p);
        }
    }
    Ok(Converted {
        model,
        chat,
        max_tokens: f.max_tokens,
        stop_sequences,
        stream: f.stream.unwrap_or(false),
    })
}

/// `thinking`: absent, `disabled`, or one that lets the model decide
/// (`adaptive`, `between_tools`: the served model never thinks aloud, so
/// it answers without thinking blocks); `enabled` (a thinking budget the
/// answer must spend) is a 400.
fn thinking(t: Option<&Value>) -> Result<(), ApiError> {
    match t.map(|t| t.get("type").and_then(Value::as_str)) {
        None | Some(Some("disabled" | "adaptive" | "between_tools")) => Ok(()),
        Some(Some("enabled")) => Err(unsupported(
            "thinking".into(),
            "thinking: extended thinking with a budget (`\"type\": \"enabled\"`) is not supported; \
             send `adaptive` or `disabled`"
                .into(),
        )),
        Some(_) => Err(ApiError::invalid_param(
            "thinking.type",
            "thinking.type must be `enabled`, `adaptive`, `between_tools` or `disabled`",
        )),
    }
}

/// `output_config.format` (`{"type": "json_schema", "schema": {...}}`) as
/// chat's `response_format`, enforced the same way; `effort` is ignored.
fn output_format(config: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(format) = config
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    else {
        return Ok(None);
    };
    match (
        format.get("type").and_then(Value::as_str),
        format.get("schema"),
    ) {
        (Some("json_schema"), Some(schema @ Value::Object(_))) => Ok(Some(json!({
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }))),
        _ => Err(ApiError::invalid_param(
            "output_config.format",
            "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
        )),
    }
}

/// Anthropic tools (`name`, `description`, `input_schema`) as chat's
/// function tools; Anthropic-defined and server tools (`bash_...`,
/// `web_search_...`) are a 400.
fn chat_tools(list: &[Value]) -> Result<Vec<Value>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(unsupported(
                        format!("{at}.type"),
                        format!("{at}: tool type `{other}` is not supported; define a custom tool with `name` and `input_schema`"),
                    ))
                }
            }
            let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                return Err(ApiError::invalid_param(
                    format!("{at}.name"),
                    format!("{at} needs a `name` of 1 to 64 letters, digits, `_` or `-`"),
                ));
            }
            let Some(schema) = t.get("input_schema").filter(|s| s.is_object()) else {
                return Err(ApiError::invalid_param(
                    format!("{at}.input_schema"),
                    format!("{at} needs an `input_schema` (a JSON schema object)"),
                ));
            };
            let mut f = Map::new();
            f.insert("name".into(), json!(name));
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f.insert("description".into(), d.clone());
            }
            f.insert("parameters".into(), schema.clone());
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

/// `tool_choice` as chat's, and `parallel_tool_calls` when
/// `disable_parallel_tool_use` is set.
fn chat_tool_choice(c: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}",
        )
    };
    let parallel = match c.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(!b),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tool_choice.disable_parallel_tool_use",
                "tool_choice.disable_parallel_tool_use must be a boolean",
            ))
        }
    };
    let choice = match c.get("type").and_then(Value::as_str).ok_or_else(bad)? {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = c.get("name").and_then(Value::as_str).ok_or_else(bad)?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad()),
    };
    Ok((choice, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: Value) -> Option<String> {
        convert(&body).unwrap_err().param
    }

    #[test]
    fn system_blocks_and_text_become_chat_turns() {
        let c = convert(&json!({
            "model": "m", "max_tokens": 5, "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
            "temperature": 0.5, "top_k": 3, "top_p": 0.9, "stop_sequences": ["END", ""],
        }))
        .unwrap();
        assert_eq!(
            c.chat["messages"],
            json!([
                {"role": "system", "content": "Be brief.\nBe kind."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "a\nb"},
            ])
        );
        assert_eq!(c.chat["temperature"], 0.5);
        assert_eq!(c.chat["top_k"], 3);
        assert_eq!(c.chat["top_p"], 0.9);
        assert!(c.chat.get("metadata").is_none() && c.chat.get("stop").is_none());
        assert_eq!(c.stop_sequences, vec!["END"]);
        assert_eq!(c.max_tokens, Some(5));
        assert!(!c.stream);
    }

    #[test]
    fn tool_use_and_tool_result_become_calls_and_tool_turns() {
        let c = convert(&json!({
            "model": "m", "max_tokens": 5,
            "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ]},
            ],
        }))
        .unwrap();
        let m = &c.chat["messages"];
        assert_eq!(m[1]["content"], "Let me look.");
        assert_eq!(m[1]["tool_calls"][0]["id"], "toolu_1");
        assert_eq!(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
        let args: Value = serde_json::from_str(
            m[1]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(
            m[2],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"})
        );
        assert_eq!(m[3], json!({"role": "user", "content": "And tomorrow?"}));
        assert_eq!(
            c.chat["tools"][0]["function"]["parameters"]["type"],
            "object"
        );
        assert_eq!(c.chat["tools"][0]["function"]["description"], "Weather.");
        assert_eq!(c.chat["tool_choice"], "required");
        assert_eq!(c.chat["parallel_tool_calls"], false);
    }

    #[test]
    fn tool_choice_kinds() {
        let choice = |c: Value| chat_tool_choice(&c).map(|(c, _)| c);
        assert_eq!(choice(json!({"type": "auto"})).unwrap(), "auto");
        assert_eq!(choice(json!({"type": "none"})).unwrap(), "none");
        assert_eq!(
            choice(json!({"type": "tool", "name": "f"})).unwrap(),
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert!(choice(json!({"type": "tool"})).is_err());
        assert!(choice(json!("auto")).is_err());
        assert!(choice(json!({"type": "required"})).is_err());
    }

    #[test]
    fn output_format_is_a_json_schema_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let c = convert(
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": schema}},
            "thinking": {"type": "adaptive"}}),
        )
        .unwrap();
        assert_eq!(c.chat["response_format"]["type"], "json_schema");
        assert_eq!(c.chat["response_format"]["json_schema"]["schema"], schema);
    }

    #[test]
    fn an_error_result_is_marked() {
        let c = convert(&json!({"model": "m", "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": true}]},
        ]}))
        .unwrap();
        assert_eq!(c.chat["messages"][1]["content"], Value::Null);
        assert_eq!(c.chat["messages"][2]["content"], "Error: boom");
    }

    #[test]
    fn bad_requests_name_anthropic_fields() {
        let user = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (json!({"messages": user}), "model"),
            (json!({"model": "m"}), "messages"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": user, "temperature": 1.5}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": user, "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": user, "max_tokens": "many"}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": user, "thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "thinking",
            ),
            (
                json!({"model": "m", "messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": 3}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
                "messages[0].content[0].text",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}),
                "messages[0].content[0].tool_use_id",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]}),
                "messages[1].role",
            ),
            (
                json!({"model": "m", "messages": user, "tools": [{"name": "f"}]}),
                "tools[0].input_schema",
            ),
            (
                json!({"model": "m", "messages": user, "tools": [{"name": "a b", "input_schema": {}}]}),
                "tools[0].name",
            ),
            (
                json!({"model": "m", "messages": user, "tools": [{"type": "bash_20250124", "name": "bash"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "messages": user, "tool_choice": {"type": "sometimes"}}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "messages": user, "stop_sequences": vec!["x"; MAX_STOP_SEQUENCES + 1]}),
                "stop_sequences",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(param(body.clone()).as_deref(), Some(want), "{body}");
        }
        let e = convert(
            &json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {}}]}]}),
        )
        .unwrap_err();
        assert!(e.message.contains("text only"), "{}", e.message);
    }
}
