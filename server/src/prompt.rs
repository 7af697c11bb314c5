//! Prompts: OpenAI messages (or a completions `prompt`) -> token ids.
//!
//! Chat messages are checked (roles, content shapes), rendered with the
//! GGUF's own chat template with the assistant header appended, and encoded
//! with the template's control-token text parsed into tokens but the
//! messages' own kept as text unless the server allows it
//! ([`ContentTokens`]); BOS is added only when the tokenizer asks for it and
//! the template did not already write it, as `tern generate --chat` and
//! `tern chat` do.
//!
//! These run on a blocking thread (see the handlers): a multi-megabyte prompt
//! takes seconds to render and tokenize.

use serde_json::Value;
use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::LoadedModel;

use crate::openai::chat::WireMessage;
use crate::openai::error::ApiError;

/// Checks the request's messages and converts them to template messages.
/// `developer` is OpenAI's new name for `system`; tool turns are refused
/// because this server does not do tool calling.
pub fn chat_messages(messages: Option<Vec<WireMessage>>) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = messages.ok_or_else(|| {
        ApiError::invalid_param("messages", "Missing required parameter: `messages`")
    })?;
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" | "function" => {
                    return Err(ApiError::unsupported(
                        &format!("messages[{i}].role"),
                        &format!("role `{}` (tool calling)", m.role),
                    ))
                }
                other => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        format!(
                            "unknown role `{other}` in messages[{i}]; expected system, developer, user or assistant"
                        ),
                    ))
                }
            };
            let content = content_text(&m.content, role, i)?;
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// Whether a conversation carries tool calls or tool results (then it goes
/// through the tool-aware template path even without `tools`).
pub fn has_tool_turns(messages: &Value) -> bool {
    messages.as_array().into_iter().flatten().any(|m| {
        m.get("role").and_then(Value::as_str) == Some("tool")
            || m.get("tool_calls").is_some_and(|c| !c.is_null())
    })
}

/// Checks a conversation with tool turns field by field (what the template
/// path would otherwise report less precisely).
pub fn check_tool_conversation(messages: &Value) -> Result<(), ApiError> {
    let list = match messages {
        Value::Array(list) if !list.is_empty() => list,
        Value::Array(_) => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must contain at least one message",
            ))
        }
        Value::Null => {
            return Err(ApiError::invalid_param(
                "messages",
                "Missing required parameter: `messages`",
            ))
        }
        _ => {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must be an array",
            ))
        }
    };
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let field = |f: &str| format!("messages[{i}].{f}");
        match role {
            "system" | "developer" | "user" => {
                content_text(&m["content"], "user", i)?;
            }
            "assistant" => {
                let calls = m.get("tool_calls").filter(|c| !c.is_null());
                if calls.is_none() {
                    content_text(&m["content"], "assistant", i)?;
                }
                for (k, c) in calls
                    .map(|c| c.as_array().cloned().unwrap_or_default())
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                {
                    let f = &c["function"];
                    if f["name"].as_str().is_none_or(|n| n.is_empty()) {
                        return Err(ApiError::invalid_param(
                            field(&format!("tool_calls[{k}].function.name")),
                            "a tool call needs its function's `name`",
                        ));
                    }
                    let args_ok = match &f["arguments"] {
                        Value::String(a) => serde_json::from_str::<Value>(a).is_ok(),
                        Value::Object(_) => true,
                        _ => false,
                    };
                    if !args_ok {
                        return Err(ApiError::invalid_param(
                            field(&format!("tool_calls[{k}].function.arguments")),
                            "a tool call's `arguments` must be JSON text",
                        ));
                    }
                }
            }
            "tool" => {
                if m["tool_call_id"].as_str().is_none_or(|s| s.is_empty()) {
                    return Err(ApiError::invalid_param(
                        field("tool_call_id"),
                        "a `tool` message needs the `tool_call_id` it answers",
                    ));
                }
                content_text(&m["content"], "user", i)?;
            }
            other => {
                return Err(ApiError::invalid_param(
                    field("role"),
                    format!(
                        "unknown role `{other}` in messages[{i}]; expected system, developer, user, assistant or tool"
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// A message's text: a string, or a list of `{"type": "text", "text": ...}`
/// parts joined by newlines; `null` only for an assistant turn.
fn content_text(content: &Value, role: &str, i: usize) -> Result<String, ApiError> {
    let param = || format!("messages[{i}].content");
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null if role == "assistant" => Ok(String::new()),
        Value::Array(parts) => {
            let texts = parts
                .iter()
                .enumerate()
                .map(|(j, part)| part_text(part, &format!("messages[{i}].content[{j}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n"))
        }
        Value::Null => Err(ApiError::invalid_param(
            param(),
            format!("messages[{i}] needs `content` (a string or a list of text parts)"),
        )),
        _ => Err(ApiError::invalid_param(
            param(),
            format!("messages[{i}].content must be a string or a list of text parts"),
        )),
    }
}

/// One content part's text; `at` is its path, e.g. `messages[0].content[1]`.
fn part_text<'a>(part: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    let kind = part.get("type").and_then(Value::as_str);
    match (kind, part.get("text").and_then(Value::as_str)) {
        (Some("text"), Some(text)) => Ok(text),
        (Some("text"), None) => Err(ApiError::invalid_param(
            format!("{at}.text"),
            format!("{at} needs a string `text`"),
        )),
        (Some(other), _) => Err(ApiError::unsupported(
            &format!("{at}.type"),
            &format!("content part type `{other}`"),
        )),
        (None, _) => Err(ApiError::invalid_param(
            at,
            format!("{at} must be an object with `type` and `text`"),
        )),
    }
}

/// Renders `messages` with the model's chat template and tokenizes them,
/// control-token text in message content encoded as `content` says.
pub fn chat_prompt(
    model: &LoadedModel,
    messages: &[ChatMessage],
    content: ContentTokens,
) -> Result<Vec<u32>, ApiError> {
    model
        .chat_prompt(messages, content)
        .map_err(|e| ApiError::from_runtime(e, "messages"))
}

/// Runs `work` (templating, tokenizing) on tokio's blocking pool, so a huge
/// prompt never holds an async worker that `/health` and streams need.
pub async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Err(ApiError::internal("preparing the prompt failed")))
}

/// A completions `prompt`: a string, a list of one string, or a list of
/// token ids (passed through as they are).
pub fn completion_prompt(model: &LoadedModel, prompt: &Value) -> Result<Vec<u32>, ApiError> {
    let vocab = model.config().vocab_size;
    match prompt {
        Value::String(s) => encode(model, s, "prompt"),
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] => encode(model, s, "prompt"),
            [] => Err(ApiError::invalid_param("prompt", "`prompt` must not be empty")),
            items if items.iter().all(Value::is_string) => Err(ApiError::unsupported(
                "prompt",
                "a list of several prompts (send one request per prompt)",
            )),
            items => items
                .iter()
                .map(|t| {
                    t.as_u64()
                        .filter(|&id| (id as usize) < vocab)
                        .map(|id| id as u32)
                        .ok_or_else(|| {
                            ApiError::invalid_param(
                                "prompt",
                                format!("`prompt` must be a string, a list of one string or a list of token ids below {vocab}"),
                            )
                        })
                })
                .collect(),
        },
        Value::Null => Err(ApiError::invalid_param("prompt", "Missing required parameter: `prompt`")),
        _ => Err(ApiError::invalid_param(
            "prompt",
            "`prompt` must be a string or a list of one string",
        )),
    }
}

/// Encodes with control-token text parsed; BOS as the tokenizer wants it,
/// unless `text` already starts with it.
pub fn encode(model: &LoadedModel, text: &str, param: &str) -> Result<Vec<u32>, ApiError> {
    let tok = &model.tokenizer;
    let starts_with_bos = tok
        .bos()
        .map(|b| tok.bytes_of(b, true))
        .is_some_and(|b| !b.is_empty() && text.as_bytes().starts_with(b));
    tok.encode(text, !starts_with_bos, true)
        .map_err(|e| ApiError::from_runtime(e, param))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: Value) -> Result<Vec<ChatMessage>, ApiError> {
        let m: Vec<WireMessage> = serde_json::from_value(v).unwrap();
        chat_messages(Some(m))
    }

    #[test]
    fn roles_and_content_shapes() {
        let m = msgs(json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null},
        ]))
        .unwrap();
        assert_eq!(m[0], ChatMessage::new("system", "be brief"));
        assert_eq!(m[1], ChatMessage::new("user", "a\nb"));
        assert_eq!(m[2], ChatMessage::new("assistant", ""));
    }

    #[test]
    fn bad_messages_name_the_field() {
        let param = |v: Value| msgs(v).unwrap_err().param;
        assert_eq!(param(json!([])).as_deref(), Some("messages"));
        assert_eq!(
            param(json!([{"role": "wizard", "content": "x"}])).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(json!([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]))
                .as_deref(),
            Some("messages[1].role")
        );
        assert_eq!(
            param(json!([{"role": "user", "content": 5}])).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            param(json!([{"role": "user"}])).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            param(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]))
                .as_deref(),
            Some("messages[0].content[0].type")
        );
        assert_eq!(
            chat_messages(None).unwrap_err().param.as_deref(),
            Some("messages")
        );
    }
}
