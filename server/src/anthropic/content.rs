//! Anthropic content -> chat turns: `system` (a string or text blocks) as
//! the system text, and `messages` as chat messages: text blocks joined,
//! an assistant turn's `tool_use` blocks as its `tool_calls`, a user turn's
//! `tool_result` blocks as `role: "tool"` turns in order. Blocks the served
//! model cannot read (`image`, `document`) are a 400 that says so; every
//! error names the block's path (`messages[2].content[1]`).

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::openai::error::ApiError;

/// `system`: a string, or a list of text blocks joined by newlines; `None`
/// when absent or empty.
pub(super) fn system_text(system: Option<&Value>) -> Result<Option<String>, ApiError> {
    let text = match system {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(i, b)| text_block(b, &format!("system[{i}]")))
            .collect::<Result<Vec<_>, _>>()?
            .join("\n"),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "system",
                "`system` must be a string or a list of text blocks",
            ))
        }
    };
    Ok(Some(text).filter(|t| !t.is_empty()))
}

/// A `{"type": "text", "text": ...}` block's text; `at` is its path.
fn text_block<'a>(block: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    match (block_type(block, at)?, block.get("text")) {
        ("text", Some(Value::String(t))) => Ok(t),
        ("text", _) => Err(ApiError::invalid_param(
            format!("{at}.text"),
            format!("{at} needs a string `text`"),
        )),
        (other, _) => Err(unsupported_block(at, other)),
    }
}

/// A content block's `type`.
fn block_type<'a>(block: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    block
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_param(at, format!("{at} must be an object with a `type`")))
}

/// The 400 for a block this server does not read: images clearly, as no
/// model Tern serves reads them.
fn unsupported_block(at: &str, kind: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => "the served model reads text only (send the content as text)",
        _ => "this server reads `text` here (and `tool_result` in user turns, `tool_use` in assistant turns)",
    };
    unsupported(
        format!("{at}.type"),
        format!("{at}: `{kind}` content blocks are not supported: {why}"),
    )
}

/// A 400 `unsupported_parameter` with its own message, which names the
/// field (Anthropic's error body has no `param`).
pub(super) fn unsupported(param: String, message: String) -> ApiError {
    ApiError::invalid_param(param, message).with_code("unsupported_parameter")
}

/// `messages` as chat messages: each user turn's `tool_result` blocks
/// become `role: "tool"` turns (in order, before or between its text), an
/// assistant turn's `tool_use` blocks its `tool_calls`.
pub(super) fn chat_messages(messages: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match messages {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must contain at least one message",
            ))
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param(
                "messages",
                "Missing required parameter: `messages`",
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must be a list of messages",
            ))
        }
    };
    let mut out = Vec::new();
    let mut tool_ids = HashSet::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        match m.get("role").and_then(Value::as_str) {
            Some("user") => user_turn(&m["content"], &at, &tool_ids, &mut out)?,
            Some("assistant") => {
                if i + 1 == list.len() {
                    return Err(unsupported(
                        format!("{at}.role"),
                        format!("{at}: a last message from the assistant (prefilling the answer) is not supported; end with a user message"),
                    ));
                }
                out.push(assistant_turn(&m["content"], &at, &mut tool_ids)?);
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("{at}.role"),
                    format!(
                        "{at}.role must be `user` or `assistant`, got {}",
                        other.map_or_else(|| "none".to_string(), |r| format!("`{r}`"))
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A message's content as blocks: a string is one text block.
fn blocks<'a>(content: &'a Value, at: &str) -> Result<Vec<(String, &'a Value)>, ApiError> {
    match content {
        Value::String(_) => Ok(vec![(format!("{at}.content"), content)]),
        Value::Array(list) => Ok(list
            .iter()
            .enumerate()
            .map(|(j, b)| (format!("{at}.content[{j}]"), b))
            .collect()),
        _ => Err(ApiError::invalid_param(
            format!("{at}.content"),
            format!("{at}.content must be a string or a list of content blocks"),
        )),
    }
}

/// A user turn: text blocks join into user messages; each `tool_result`
/// becomes a `tool` message answering the call it names.
fn user_turn(
    content: &Value,
    at: &str,
    tool_ids: &HashSet<String>,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let mut text: Vec<&str> = Vec::new();
    let flush = |text: &mut Vec<&str>, out: &mut Vec<Value>| {
        if !text.is_empty() {
            out.push(json!({"role": "user", "content": text.join("\n")}));
            text.clear();
        }
    };
    for (path, b) in blocks(content, at)? {
        if let Value::String(s) = b {
            text.push(s);
            continue;
        }
        match block_type(b, &path)? {
            "tool_result" => {
                flush(&mut text, out);
                out.push(tool_result(b, &path, tool_ids)?);
            }
            _ => text.push(text_block(b, &path)?),
        }
    }
    flush(&mut text, out);
    Ok(())
}

/// A `tool_result` block as a `tool` message; `is_error` marks the text.
fn tool_result(b: &Value, at: &str, tool_ids: &HashSet<String>) -> Result<Value, ApiError> {
    let id = b
        .get("tool_use_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::invalid_param(
                format!("{at}.tool_use_id"),
                format!("{at} needs the `tool_use_id` of the call it answers"),
            )
        })?;
    if !tool_ids.contains(id) {
        return Err(ApiError::invalid_param(
            format!("{at}.tool_use_id"),
            format!("{at}.tool_use_id `{id}` names no earlier `tool_use` block"),
        ));
    }
    let text = match b.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(k, p)| text_block(p, &format!("{at}.content[{k}]")))
            .collect::<Result<Vec<_>, _>>()?
            .join("\n"),
        Some(_) => {
            return Err(ApiError::invalid_param(
                format!("{at}.content"),
                format!("{at}.content must be a string or a list of text blocks"),
            ))
        }
    };
    let text = if b.get("is_error").and_then(Value::as_bool) == Some(true) {
        format!("Error: {text}")
    } else {
        text
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": text}))
}

/// An assistant turn: its text blocks as content, its `tool_use` blocks as
/// `tool_calls` (their ids remembered for the results that follow);
/// `thinking` blocks are dropped (this server never writes them).
fn assistant_turn(
    content: &Value,
    at: &str,
    tool_ids: &mut HashSet<String>,
) -> Result<Value, ApiError> {
    let mut text: Vec<&str> = Vec::new();
    let mut calls = Vec::new();
    for (path, b) in blocks(content, at)? {
        if let Value::String(s) = b {
            text.push(s);
            continue;
        }
        match block_type(b, &path)? {
            "tool_use" => {
                let field = |f: &str| format!("{path}.{f}");
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(ApiError::invalid_param(
                        field(if id.is_none() { "id" } else { "name" }),
                        format!("{path}: a `tool_use` block needs its `id` and `name`"),
                    ));
                };
                let input = match b.get("input") {
                    Some(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(ApiError::invalid_param(
                            field("input"),
                            format!("{path}.input must be an object"),
                        ))
                    }
                };
                tool_ids.insert(id.to_string());
                calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            "thinking" | "redacted_thinking" => {}
            _ => text.push(text_block(b, &path)?),
        }
    }
    let content = Some(text.join("\n")).filter(|t| !t.is_empty() || calls.is_empty());
    let mut turn = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
    }
    Ok(turn)
}
