//! A conversation in the shape chat templates read: OpenAI-style messages and
//! tool definitions, normalized the way llama.cpp's Jinja path normalizes them
//! before rendering, so one request renders to one prompt in both.
//!
//! Each message keeps `role` and a string `content` (`""` when absent or
//! null; text parts joined by newlines), then `reasoning_content`, `name`,
//! `tool_call_id` and `tool_calls` only when present. A tool call is
//! `{"type": "function", "function": {"name", "arguments"}, "id"}` with
//! `arguments` as JSON text, or as an object for templates that read its
//! fields ([`Caps::object_arguments`]). Tools become `{"type": "function",
//! "function": {"name", "description", "parameters"}}` (`""` and `{}` where
//! the client sent none).

use serde_json::{json, Map, Value};

/// What a template does with its input, found once by rendering probes
/// (see [`super::ChatTemplate::caps`]); the normalization depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// A leading system message is rendered (else it is merged into the next
    /// message, as llama.cpp does).
    pub system_role: bool,
    /// Assistant tool calls are rendered.
    pub tool_calls: bool,
    /// Tool-call arguments are read as an object (`arguments.city`, or
    /// `arguments | tojson` of a mapping) rather than as JSON text.
    pub object_arguments: bool,
    /// A tool list is rendered for the model (the template has a tools
    /// section; without one the caller writes the tools into the system
    /// prompt itself).
    pub tools: bool,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            system_role: true,
            tool_calls: true,
            object_arguments: false,
            tools: false,
        }
    }
}

/// Why a conversation cannot be rendered.
pub type Invalid = String;

fn text_of(content: &Value, at: usize) -> Result<String, Invalid> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let t = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                            format!("messages[{at}]: a text part needs a string 'text'")
                        })?;
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    Some(other) => {
                        return Err(format!(
                            "messages[{at}]: content part type '{other}' is not supported"
                        ))
                    }
                    None => return Err(format!("messages[{at}]: a content part needs a 'type'")),
                }
            }
            Ok(text)
        }
        other => Err(format!(
            "messages[{at}]: 'content' must be a string, an array of parts or null, not {other}"
        )),
    }
}

fn tool_call(call: &Value, at: usize, caps: &Caps) -> Result<Value, Invalid> {
    let function = call
        .get("function")
        .ok_or_else(|| format!("messages[{at}]: a tool call needs a 'function'"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("messages[{at}]: a tool call's function needs a 'name'"))?;
    let args = match function.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => {
            return Err(format!(
                "messages[{at}]: a tool call's function needs 'arguments'"
            ))
        }
    };
    let arguments = if caps.object_arguments {
        serde_json::from_str(&args).map_err(|e| {
            format!("messages[{at}]: tool call arguments are not JSON ({e}): {args}")
        })?
    } else {
        Value::String(args)
    };
    let mut out = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(id) = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        out["id"] = Value::String(id.to_string());
    }
    Ok(out)
}

/// Normalizes `messages` (a JSON array of OpenAI-style messages) for a
/// template with `caps`. `developer` turns become `system` ones.
pub fn normalize_messages(messages: &Value, caps: &Caps) -> Result<Value, Invalid> {
    let list = messages
        .as_array()
        .ok_or_else(|| "messages must be an array".to_string())?;
    let mut out: Vec<Value> = Vec::with_capacity(list.len());
    for (at, m) in list.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| format!("messages[{at}] must be an object"))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("messages[{at}] needs a string 'role'"))?;
        let role = if role == "developer" { "system" } else { role };
        let calls = match obj.get("tool_calls") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(calls)) => calls
                .iter()
                .map(|c| tool_call(c, at, caps))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("messages[{at}]: 'tool_calls' must be an array")),
        };
        let content = obj.get("content");
        if content.is_none() && calls.is_empty() {
            return Err(format!("messages[{at}] needs 'content' or 'tool_calls'"));
        }
        let mut msg = Map::new();
        msg.insert("role".into(), Value::String(role.into()));
        msg.insert(
            "content".into(),
            Value::String(text_of(content.unwrap_or(&Value::Null), at)?),
        );
        for key in ["reasoning_content", "name", "tool_call_id"] {
            match obj.get(key) {
                Some(Value::String(s)) if !s.is_empty() => {
                    msg.insert(key.into(), Value::String(s.clone()));
                }
                None | Some(Value::Null) | Some(Value::String(_)) => {}
                Some(_) => return Err(format!("messages[{at}]: '{key}' must be a string")),
            }
        }
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(Value::Object(msg));
    }
    if !caps.system_role && out.first().is_some_and(|m| m["role"] == "system") {
        let system = out.remove(0);
        if let Some(next) = out.first_mut() {
            let merged = format!(
                "{}\n{}",
                system["content"].as_str().unwrap_or_default(),
                next["content"].as_str().unwrap_or_default()
            );
            next["content"] = Value::String(merged);
        }
    }
    Ok(Value::Array(out))
}

/// Normalizes OpenAI-style tool definitions (`[{"type": "function",
/// "function": {...}}]`); a function without parameters gets `{}`.
pub fn normalize_tools(tools: &Value) -> Result<Value, Invalid> {
    let list = tools
        .as_array()
        .ok_or_else(|| "tools must be an array".to_string())?;
    let mut out = Vec::with_capacity(list.len());
    for (at, tool) in list.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(format!("tools[{at}]: only type 'function' is supported"));
        }
        let f = tool
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("tools[{at}] needs a 'function' object"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("tools[{at}].function needs a string 'name'"))?;
        let description = f.get("description").and_then(Value::as_str).unwrap_or("");
        let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({}));
        out.push(json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_take_the_templates_shape() {
        let msgs = json!([
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
        ]);
        let out = normalize_messages(&msgs, &Caps::default()).unwrap();
        assert_eq!(out[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(out[1]["content"], "a\nb");
        assert_eq!(out[2]["content"], "");
        assert_eq!(
            out[2]["tool_calls"][0]["function"]["arguments"],
            r#"{"x":1}"#
        );
        assert_eq!(out[2]["tool_calls"][0]["id"], "c1");
        let objects = Caps {
            object_arguments: true,
            ..Caps::default()
        };
        let out = normalize_messages(&msgs, &objects).unwrap();
        assert_eq!(
            out[2]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
    }

    #[test]
    fn a_system_turn_merges_into_the_next_where_the_template_has_none() {
        let msgs = json!([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]);
        let caps = Caps {
            system_role: false,
            ..Caps::default()
        };
        let out = normalize_messages(&msgs, &caps).unwrap();
        assert_eq!(out, json!([{"role": "user", "content": "S\nU"}]));
    }

    #[test]
    fn bad_messages_and_tools_say_where() {
        let err = normalize_messages(&json!([{"content": "x"}]), &Caps::default()).unwrap_err();
        assert!(err.contains("messages[0]") && err.contains("role"), "{err}");
        let bad_args = json!([{"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{not json"}}
        ]}]);
        let caps = Caps {
            object_arguments: true,
            ..Caps::default()
        };
        let err = normalize_messages(&bad_args, &caps).unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
        let err = normalize_tools(&json!([{"type": "retrieval"}])).unwrap_err();
        assert!(err.contains("tools[0]"), "{err}");
    }

    #[test]
    fn tools_are_rebuilt_in_a_fixed_key_order() {
        let tools = json!([{"function": {"parameters": {"type": "object"}, "name": "f"}, "type": "function"}]);
        let out = normalize_tools(&tools).unwrap();
        assert_eq!(
            serde_json::to_string(&out).unwrap(),
            r#"[{"type":"function","function":{"name":"f","description":"","parameters":{"type":"object"}}}]"#
        );
    }
}
