//! Tool calling for chat: `tools`, `tool_choice` and `parallel_tool_calls`
//! validated into a [`ToolPlan`]; the grammar for the request's calls (one
//! that forces a call for `required` or a named function, one that engages
//! once a call begins for `auto`); and the model's text read back into
//! OpenAI's `tool_calls`, whole or as stream deltas. The syntax itself (how
//! a family writes a call, how a call is read) is the runtime's
//! ([`ToolSyntax`], [`CallReader`]).

use serde::Serialize;
use serde_json::Value;
use tern_runtime::chat::tool_reader::CallReader;
use tern_runtime::chat::tools::ToolSyntax;
use tern_runtime::constraint::Constraint;

use crate::ids::random_u64;
use crate::openai::error::ApiError;

/// What the request asks of the model about tools.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// The model decides (the default with tools).
    Auto,
    /// It must call one or more of the tools.
    Required,
    /// It must call this function.
    Named(String),
}

/// A chat request's tools, validated.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    /// OpenAI-style tool definitions, as sent (each checked).
    pub tools: Value,
    /// `(name, parameters)` of each tool, in order.
    pub functions: Vec<(String, Value)>,
    /// What the model must do.
    pub choice: Choice,
    /// Whether several calls may come in one answer.
    pub parallel: bool,
}

/// Most tools one request may define (OpenAI's limit). Each is rendered
/// into the prompt, so the context bounds their text; this bounds the list.
pub const MAX_TOOLS: usize = 128;

/// Checks `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no
/// tools are in play (none given, or `tool_choice: "none"`).
pub fn plan(
    tools: Option<&Vec<Value>>,
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolPlan>, ApiError> {
    let tools = tools.filter(|t| !t.is_empty());
    if let Some(list) = tools.filter(|t| t.len() > MAX_TOOLS) {
        return Err(ApiError::invalid_param(
            "tools",
            format!(
                "at most {MAX_TOOLS} tools are allowed per request, got {}",
                list.len()
            ),
        ));
    }
    let mut functions = Vec::new();
    for (i, t) in tools.into_iter().flatten().enumerate() {
        let at = |f: &str| format!("tools[{i}]{f}");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid_param(
                at(".type"),
                format!("{}: only tools of type `function` are supported", at("")),
            ));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid_param(
                at(".function"),
                format!("{} needs a `function` object", at("")),
            ));
        };
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(ApiError::invalid_param(
                at(".function.name"),
                format!(
                    "{} needs a `name` of 1 to 64 letters, digits, `_` or `-`",
                    at(".function")
                ),
            ));
        }
        if functions.iter().any(|(n, _)| n == name) {
            return Err(ApiError::invalid_param(
                at(".function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        let params = f.get("parameters").cloned().unwrap_or(Value::Null);
        if !(params.is_object() || params.is_null()) {
            return Err(ApiError::invalid_param(
                at(".function.parameters"),
                "`parameters` must be a JSON schema object",
            ));
        }
        functions.push((name.to_string(), params));
    }
    let choice = match tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!(
                    "tool_choice must be `none`, `auto`, `required` or a function, got `{other}`"
                ),
                ))
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "tool_choice",
                        "tool_choice as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !functions.iter().any(|(n, _)| n == name) {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("tool_choice names `{name}`, which is not in `tools`"),
                ));
            }
            Choice::Named(name.to_string())
        }
    };
    if functions.is_empty() {
        return match choice {
            Choice::Auto => Ok(None),
            _ => Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice asks for a tool call but `tools` is empty",
            )),
        };
    }
    Ok(Some(ToolPlan {
        tools: Value::Array(tools.cloned().unwrap_or_default()),
        functions,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

impl ToolPlan {
    /// Whether the request forces a call (`required` or a named function).
    pub fn is_forced(&self) -> bool {
        self.choice != Choice::Auto
    }

    /// The declared functions' names.
    pub fn names(&self) -> Vec<String> {
        self.functions.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The grammar for the request's calls: for `required` or a named
    /// function, one that forces a call; for `auto`, one that leaves prose
    /// free and holds a call, once it begins, to its function's schema.
    /// Either ends the answer when a call repeats an earlier one.
    pub fn constraint(&self, syntax: ToolSyntax) -> (Constraint, &'static str) {
        let functions: Vec<(String, Value)> = match &self.choice {
            Choice::Auto | Choice::Required => self.functions.clone(),
            Choice::Named(n) => self
                .functions
                .iter()
                .filter(|(f, _)| f == n)
                .cloned()
                .collect(),
        };
        let grammar = match self.choice {
            Choice::Auto => syntax.lazy_grammar(&functions, self.parallel),
            Choice::Required => syntax.grammar(&functions, self.parallel),
            Choice::Named(_) => syntax.grammar(&functions, false),
        };
        let tools = Constraint::ToolCalls {
            grammar,
            declared: self.names(),
            hermes: syntax == ToolSyntax::Hermes,
        };
        (tools, "tools")
    }

    /// A reader of this request's calls, for a streamed answer.
    pub fn reader(&self, syntax: ToolSyntax) -> CallReader {
        CallReader::new(self.names(), syntax == ToolSyntax::Hermes)
    }

    /// Reads `text` as the answer: prose and calls (Hermes blocks, or a
    /// bare object naming a declared tool; a repeat of an earlier call is
    /// dropped). A call to a function not in `tools` is prose; a call that
    /// is begun but broken, or more calls than `parallel_tool_calls`
    /// allows, leaves the whole text as content (never a call the client
    /// cannot run).
    pub fn answer(&self, syntax: ToolSyntax, text: &str) -> Answer {
        let read = CallReader::read_all(self.names(), syntax == ToolSyntax::Hermes, text);
        if read.calls.is_empty() || read.broken || (!self.parallel && read.calls.len() > 1) {
            return Answer {
                content: Some(text.to_string()),
                calls: Vec::new(),
            };
        }
        Answer {
            content: (!read.content.is_empty()).then_some(read.content),
            calls: read
                .calls
                .into_iter()
                .map(|(name, arguments)| ToolCallOut::new(name, arguments))
                .collect(),
        }
    }
}

/// An answer read for tool calls.
#[derive(Debug)]
pub struct Answer {
    /// Prose (`None` when the answer is only calls).
    pub content: Option<String>,
    /// The calls; empty when there are none.
    pub calls: Vec<ToolCallOut>,
}

impl Answer {
    /// `tool_calls` for an answer that makes calls and ended on its own; an
    /// answer cut by the token limit stays `length` (more calls may have
    /// been coming).
    pub fn finish_reason(&self, generated: &'static str) -> &'static str {
        if !self.calls.is_empty() && generated != "length" {
            "tool_calls"
        } else {
            generated
        }
    }
}

impl ToolCallOut {
    /// A call to `name` with a fresh id.
    pub fn new(name: String, arguments: String) -> Self {
        ToolCallOut {
            id: new_call_id(),
            kind: "function",
            function: FunctionOut { name, arguments },
        }
    }
}

/// `call_` plus 16 hex digits.
pub fn new_call_id() -> String {
    format!("call_{:016x}", random_u64())
}

/// One call in `message.tool_calls`.
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallOut {
    /// `call_` plus 16 hex digits.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionOut,
}

/// The called function.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionOut {
    /// Its name.
    pub name: String,
    /// Its arguments as JSON text (OpenAI's shape).
    pub arguments: String,
}

/// One call's part in a stream's `delta.tool_calls`: the first delta of a
/// call carries its id, type and name, the next ones fragments of its
/// arguments (OpenAI's shape; clients join the fragments).
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallDelta {
    /// Position of the call in the message's list.
    pub index: usize,
    /// The call's id (first delta only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first delta only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name and/or the next arguments fragment.
    pub function: FunctionDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Clone, Debug, Serialize)]
pub struct FunctionDelta {
    /// The function's name (first delta only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' JSON text (empty in the first).
    pub arguments: String,
}

impl ToolCallDelta {
    /// The delta that opens call `index` to `name`.
    pub fn begin(index: usize, name: String) -> Self {
        ToolCallDelta {
            index,
            id: Some(new_call_id()),
            kind: Some("function"),
            function: FunctionDelta {
                name: Some(name),
                arguments: String::new(),
            },
        }
    }

    /// More arguments text for call `index`.
    pub fn args(index: usize, text: String) -> Self {
        ToolCallDelta {
            index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: text,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
            json!({"type": "function", "function": {"name": "get_time"}}),
        ]
    }

    fn param_of(tools: Vec<Value>, choice: Option<Value>) -> Option<String> {
        plan(Some(&tools), choice.as_ref(), None)
            .err()
            .and_then(|e| e.param)
    }

    #[test]
    fn the_tool_list_is_bounded() {
        let many = |n: usize| -> Vec<Value> {
            (0..n)
                .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
                .collect()
        };
        assert!(plan(Some(&many(MAX_TOOLS)), None, None).is_ok());
        assert_eq!(
            param_of(many(MAX_TOOLS + 1), None).as_deref(),
            Some("tools")
        );
    }

    #[test]
    fn bad_tools_and_choices_name_their_field() {
        let no_name = vec![json!({"type": "function", "function": {"parameters": {}}})];
        assert_eq!(
            param_of(no_name, None).as_deref(),
            Some("tools[0].function.name")
        );
        let wrong_type = vec![json!({"type": "retrieval"})];
        assert_eq!(param_of(wrong_type, None).as_deref(), Some("tools[0].type"));
        let unknown = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(
            param_of(tools(), Some(unknown)).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            param_of(tools(), Some(json!("sometimes"))).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            param_of(vec![], Some(json!("required"))).as_deref(),
            Some("tool_choice")
        );
    }

    #[test]
    fn none_turns_tools_off_and_a_name_is_kept() {
        assert!(plan(Some(&tools()), Some(&json!("none")), None)
            .unwrap()
            .is_none());
        let p = plan(
            Some(&tools()),
            Some(&json!({"type": "function", "function": {"name": "get_time"}})),
            Some(false),
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.choice, Choice::Named("get_time".into()));
        assert!(!p.parallel);
        assert!(p.is_forced());
        let auto = plan(Some(&tools()), None, None).unwrap().unwrap();
        assert!(!auto.is_forced());
        let (c, _) = auto.constraint(ToolSyntax::Hermes);
        assert!(matches!(c, Constraint::ToolCalls { grammar, .. } if grammar.contains("FREE")));
    }

    #[test]
    fn answers_become_calls_only_when_they_are_whole_and_known() {
        let p = plan(Some(&tools()), None, Some(false)).unwrap().unwrap();
        let a = p.answer(
            ToolSyntax::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        );
        assert_eq!(a.content, None);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.finish_reason("stop"), "tool_calls");
        assert_eq!(a.finish_reason("length"), "length");
        assert_eq!(a.calls[0].function.arguments, r#"{"city": "Oslo"}"#);
        assert!(a.calls[0].id.starts_with("call_"));
        let unknown = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
        let a = p.answer(ToolSyntax::Hermes, unknown);
        assert!(a.calls.is_empty());
        assert_eq!(a.content.as_deref(), Some(unknown));
        let two = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
        assert!(p.answer(ToolSyntax::Hermes, two).calls.is_empty());
        // A bare object naming a declared tool is a call; one naming
        // another is prose.
        let bare = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```";
        let a = p.answer(ToolSyntax::Hermes, bare);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.content, None);
        let other = "{\"name\": \"rm_rf\", \"arguments\": {}}";
        assert_eq!(
            p.answer(ToolSyntax::Hermes, other).content.as_deref(),
            Some(other)
        );
    }
}
