//! Tool calls in a model family's own syntax: how a template asks for them,
//! how they are read back out of generated text, the grammar that makes the
//! model write one (`tool_choice` `required` or a named function), and the
//! grammar for `auto` that leaves prose free and holds a call, once it
//! begins, to its function's schema. (Reading calls as a reply streams, in
//! the looser shapes small models write, is `tool_reader.rs`'s.)
//!
//! Two syntaxes cover the common families: Hermes-style blocks
//! (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, Qwen 2.5/3,
//! Hermes, and Tern's default for templates without a tools section) and
//! Llama 3's bare JSON object (`{"name": ..., "parameters": {...}}`).

use serde_json::{json, Map, Value};

/// How a family writes a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one
    /// block per call.
    Hermes,
    /// The whole answer is one JSON object `{"name": ..., "parameters": ...}`
    /// (Llama 3.1/3.2's custom tools), optionally after `<|python_tag|>`.
    Llama3,
}

/// One call read out of the model's text.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: a JSON object.
    pub arguments: Value,
}

/// Generated text split into prose and tool calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// Text outside the calls (trimmed; empty when the answer is only calls).
    pub content: String,
    /// The calls in order; empty when the text has none, or when any call
    /// in it is malformed (then `content` is the whole text: a broken call is
    /// returned as what the model wrote, never as a half-read call).
    pub calls: Vec<ToolCall>,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolSyntax {
    /// The syntax a chat template's source uses (Hermes blocks unless it
    /// writes Llama 3's JSON call).
    pub fn of_template(source: &str) -> ToolSyntax {
        if source.contains(OPEN) {
            ToolSyntax::Hermes
        } else if source.contains("<|python_tag|>")
            || source.contains("Given the following functions")
        {
            ToolSyntax::Llama3
        } else {
            ToolSyntax::Hermes
        }
    }

    /// Reads the calls out of `text`.
    pub fn parse(self, text: &str) -> Parsed {
        let whole = || Parsed {
            content: text.trim().to_string(),
            calls: Vec::new(),
        };
        match self {
            ToolSyntax::Hermes => parse_blocks(text).unwrap_or_else(whole),
            ToolSyntax::Llama3 => {
                let body = text.trim();
                let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
                if !body.starts_with('{') {
                    return whole();
                }
                let mut calls = Vec::new();
                for part in split_calls(body) {
                    match serde_json::from_str::<Value>(part)
                        .ok()
                        .and_then(|v| call_of(&v, "parameters"))
                    {
                        Some(c) => calls.push(c),
                        None => return whole(),
                    }
                }
                Parsed {
                    content: String::new(),
                    calls,
                }
            }
        }
    }

    /// A call written in this syntax (for rendering a past assistant turn
    /// through a template that has no tool support).
    pub fn write(self, name: &str, arguments: &Value) -> String {
        match self {
            ToolSyntax::Hermes => format!(
                "{OPEN}\n{}\n{CLOSE}",
                json!({"name": name, "arguments": arguments})
            ),
            ToolSyntax::Llama3 => json!({"name": name, "parameters": arguments}).to_string(),
        }
    }

    /// A grammar (llguidance's Lark) whose every sentence is a call to one
    /// of `tools` (`(name, parameters schema)`), with arguments valid under
    /// the function's schema; `parallel` allows several calls (Hermes only:
    /// Llama 3 writes one).
    pub fn grammar(self, tools: &[(String, Value)], parallel: bool) -> String {
        let args_key = match self {
            ToolSyntax::Hermes => "arguments",
            ToolSyntax::Llama3 => "parameters",
        };
        let call = call_json(tools, args_key);
        match self {
            ToolSyntax::Hermes if parallel => {
                format!("start: call (\"\\n\" call)*\ncall: \"{OPEN}\\n\" {call} \"\\n{CLOSE}\"\n")
            }
            ToolSyntax::Hermes => format!("start: \"{OPEN}\\n\" {call} \"\\n{CLOSE}\"\n"),
            ToolSyntax::Llama3 => format!("start: {call}\n"),
        }
    }

    /// The grammar for `tool_choice: auto`: prose is free until a call
    /// begins, then the call is held to its function's schema and the reply
    /// ends with its calls. A call begins at `<tool_call>` (Hermes) anywhere,
    /// or at a bare object naming a declared tool at the start of the reply
    /// (`{"name": "f"`, optionally inside a ```` ```json ```` fence or with
    /// doubled braces, the shapes small models write). Prose that merely
    /// starts with other JSON stays free. Inside a call the model may lay
    /// its JSON out as it likes within [`JSON_SPACE`] (a bare call is often
    /// pretty-printed: held to one line, a small model that wants a line
    /// break after a number writes more digits instead); after the calls
    /// at most two whitespace characters may come before the reply ends,
    /// so a model that wants another call where none is allowed ends its
    /// reply instead of writing newlines to the token limit.
    pub fn lazy_grammar(self, tools: &[(String, Value)], parallel: bool) -> String {
        const WS: &str = "[ \\t\\n\\r]*";
        let sp = format!("({JSON_SPACE})?");
        let names = tools
            .iter()
            .map(|(n, _)| regex_escape(n))
            .collect::<Vec<_>>()
            .join("|");
        // A call's opening; `ws` is the whitespace allowed between its
        // parts (free where prose is told from calls, bounded in a call).
        let opening = |ws: &str, fence: &str, brace: &str, name: &str| {
            format!("/{ws}{fence}\\{{{ws}{brace}\"name\"{ws}:{ws}\"{name}\"/")
        };
        let fence = |ws: &str| format!("```(json)?{ws}");
        let mut g = String::new();
        // Prose: no call opens at its start, no `<tool_call>` inside it. A
        // name that merely starts with a declared one (`lookup_price_args`,
        // the title agent SDKs give a tool's parameters) opens a call too,
        // so the grammar holds it to the declared name.
        let opens = opening(
            WS,
            &format!("({})?", fence(WS)),
            &format!("(\\{{{WS})?"),
            &format!("({names})"),
        );
        let opens = format!("{}(?s:.*)/", &opens[..opens.len() - 2]);
        match self {
            ToolSyntax::Hermes => {
                g.push_str(&format!(
                    "FREE: /(?s:.*)/ & ~{opens} & ~/(?s:.*){OPEN}(?s:.*)/\nHEAD: FREE \"{OPEN}\"\n"
                ));
                g.push_str("start: FREE | HEAD hcall hmore | bare bmore\n");
                g.push_str(&format!(
                    "hcall: \"\\n\" {} \"\\n{CLOSE}\"\n",
                    call_json(tools, "arguments")
                ));
                let more = if parallel { "(NEXT hcall)* " } else { "" };
                g.push_str(&format!("hmore: {more}TRAIL?\nNEXT: /({TRAIL})?{OPEN}/\n"));
            }
            ToolSyntax::Llama3 => {
                g.push_str(&format!(
                    "FREE: /(?s:.*)/ & ~{opens}\nstart: FREE | bare bmore\n"
                ));
            }
        }
        let more = if parallel { "bare* " } else { "" };
        g.push_str(&format!("bmore: {more}TRAIL?\nTRAIL: /{TRAIL}/\n"));
        g.push_str(&format!(
            "ARGSEP: /{sp},{sp}\"(arguments|parameters)\"{sp}:{sp}/\nCLOSE: /{sp}\\}}/\nCLOSE_F: /{sp}\\}}{sp}```/\nCLOSE_FD: /{sp}\\}}{sp}\\}}{sp}```/\nCLOSE_D: /{sp}\\}}{sp}\\}}/\n"
        ));
        let mut bare = Vec::new();
        for (i, (name, params)) in tools.iter().enumerate() {
            let name = regex_escape(name);
            let double = format!("\\{{{sp}");
            let fenced = fence(&sp);
            g.push_str(&format!("O{i}: {}\n", opening(&sp, "", "", &name)));
            g.push_str(&format!("OF{i}: {}\n", opening(&sp, &fenced, "", &name)));
            g.push_str(&format!("OD{i}: {}\n", opening(&sp, "", &double, &name)));
            g.push_str(&format!(
                "OFD{i}: {}\n",
                opening(&sp, &fenced, &double, &name)
            ));
            g.push_str(&format!("a{i}: %json {}\n", with_layout(schema_of(params))));
            g.push_str(&format!(
                "b{i}: O{i} ARGSEP a{i} CLOSE | OF{i} ARGSEP a{i} CLOSE_F | OD{i} ARGSEP a{i} CLOSE_D | OFD{i} ARGSEP a{i} CLOSE_FD\n"
            ));
            bare.push(format!("b{i}"));
        }
        g.push_str(&format!("bare: {}\n", bare.join(" | ")));
        g
    }

    /// A system-prompt section listing `tools` and how to call them, for
    /// templates without a tools section of their own (Hermes syntax).
    pub fn default_prompt(tools: &Value) -> String {
        let mut list = String::new();
        for t in tools.as_array().into_iter().flatten() {
            let f = t.get("function").unwrap_or(t);
            list.push_str(&f.to_string());
            list.push('\n');
        }
        format!(
            "You can call functions. The available functions, as JSON:\n{list}\
             To call a function, answer with one block per call:\n\
             {OPEN}\n{{\"name\": \"<function name>\", \"arguments\": {{<arguments as JSON>}}}}\n{CLOSE}\n\
             Function results come back in <tool_response></tool_response> blocks."
        )
    }
}

/// `messages` for a template without a tools section: the tool list goes
/// into the system turn (one is added when there is none), past calls
/// become the assistant's text in Hermes syntax and tool results become
/// user turns in `<tool_response>` blocks. `tools` may be `None` (a
/// conversation that only carries past calls).
pub fn fold_into_messages(messages: &Value, tools: Option<&Value>) -> Value {
    let mut out: Vec<Value> = Vec::new();
    for m in messages.as_array().into_iter().flatten() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let text = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        match role {
            "tool" => out.push(json!({
                "role": "user",
                "content": format!("<tool_response>\n{text}\n</tool_response>"),
            })),
            "assistant" if m.get("tool_calls").is_some_and(Value::is_array) => {
                let mut parts: Vec<String> = Vec::new();
                if !text.trim().is_empty() {
                    parts.push(text.trim().to_string());
                }
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let f = &c["function"];
                    let name = f["name"].as_str().unwrap_or_default();
                    let args = match &f["arguments"] {
                        Value::String(s) => serde_json::from_str(s).unwrap_or(json!({})),
                        v => v.clone(),
                    };
                    parts.push(ToolSyntax::Hermes.write(name, &args));
                }
                out.push(json!({"role": "assistant", "content": parts.join("\n")}));
            }
            _ => {
                let mut m = m.clone();
                if let Some(o) = m.as_object_mut() {
                    o.remove("tool_calls");
                }
                out.push(m);
            }
        }
    }
    if let Some(tools) = tools.filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        let section = ToolSyntax::default_prompt(tools);
        match out.first_mut() {
            Some(first) if first["role"] == "system" || first["role"] == "developer" => {
                let text = first["content"].as_str().unwrap_or_default().to_string();
                first["content"] =
                    Value::String(format!("{text}\n\n{section}").trim_start().to_string());
            }
            _ => out.insert(0, json!({"role": "system", "content": section})),
        }
    }
    Value::Array(out)
}

/// `%json` for one call object `{"name": ..., args_key: {...}}` to any of
/// `tools`, name first, in Tern's JSON layout.
fn call_json(tools: &[(String, Value)], args_key: &str) -> String {
    let variants: Vec<Value> = tools
        .iter()
        .map(|(name, params)| {
            let mut props = Map::new();
            props.insert("name".into(), json!({"const": name}));
            props.insert(args_key.into(), schema_of(params));
            json!({
                "type": "object",
                "properties": props,
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = if variants.len() == 1 {
        variants.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": variants})
    };
    format!("%json {}", with_layout(schema))
}

/// Whitespace a call's JSON may hold between two of its tokens (a regex):
/// a space or tab, or one or two line breaks and at most 20 spaces or tabs
/// of indentation (llama.cpp's bound in its JSON grammars). Bounded, so a
/// model cannot stall in whitespace; free enough for one-line and
/// pretty-printed JSON alike.
pub const JSON_SPACE: &str = "[ \\t]|(\\r?\\n){1,2}[ \\t]{0,20}";

/// Whitespace after a reply's calls, before it ends (a regex).
const TRAIL: &str = "[ \\t\\n\\r]{1,2}";

/// `schema` with JSON's separators and [`JSON_SPACE`] around its tokens.
fn with_layout(mut schema: Value) -> Value {
    schema["x-guidance"] = json!({
        "whitespace_flexible": false,
        "whitespace_pattern": JSON_SPACE,
        "item_separator": ",",
        "key_separator": ":",
    });
    schema
}

/// `s` with regex metacharacters escaped (tool names are `[A-Za-z0-9_-]`,
/// checked by the server; this keeps the grammar sound whatever comes).
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if !c.is_ascii_alphanumeric() && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A function's `parameters` as a schema (absent or empty: any object).
fn schema_of(params: &Value) -> Value {
    match params {
        Value::Object(m) if m.is_empty() => json!({"type": "object"}),
        Value::Object(_) => params.clone(),
        _ => json!({"type": "object"}),
    }
}

/// `{"name": str, key: object-or-JSON-text}` as a call.
fn call_of(v: &Value, key: &str) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let args = v
        .get(key)
        .or_else(|| v.get("arguments"))
        .or_else(|| v.get("parameters"))?;
    let arguments = match args {
        Value::Object(_) => args.clone(),
        Value::String(s) => match serde_json::from_str::<Value>(s).ok()? {
            o @ Value::Object(_) => o,
            _ => return None,
        },
        _ => return None,
    };
    Some(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// Hermes blocks; `None` when a block is malformed. A block left open at the
/// end of the text (the model stopped at `</tool_call>` as a stop string)
/// still counts when its JSON is complete.
fn parse_blocks(text: &str) -> Option<Parsed> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let body_start = &rest[start + OPEN.len()..];
        let (body, after) = match body_start.find(CLOSE) {
            Some(end) => (&body_start[..end], &body_start[end + CLOSE.len()..]),
            None => (body_start, ""),
        };
        let v: Value = serde_json::from_str(body.trim()).ok()?;
        calls.push(call_of(&v, "arguments")?);
        rest = after;
    }
    content.push_str(rest);
    Some(Parsed {
        content: content.trim().to_string(),
        calls,
    })
}

/// Llama 3 objects separated by `;` (or newlines) at the top level.
fn split_calls(body: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut in_str, mut escaped, mut start) = (0i32, false, false, 0);
    for (i, ch) in body.char_indices() {
        if in_str {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' => in_str = true,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    parts.push(body[start..=i].trim());
                    start = i + 1;
                }
            }
            ';' | '\n' | ' ' | '\t' | '\r' if depth == 0 => start = i + 1,
            _ if depth == 0 => return vec![body],
            _ => {}
        }
    }
    if depth != 0 || parts.is_empty() {
        return vec![body];
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_blocks_are_read_with_prose_around_them() {
        let p = ToolSyntax::Hermes.parse(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>",
        );
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].name, "get_weather");
        assert_eq!(p.calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(p.calls[1].arguments, json!({"tz": "CET"}));
    }

    #[test]
    fn a_malformed_call_comes_back_as_content() {
        for text in [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}\n</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>not json</tool_call>",
        ] {
            let p = ToolSyntax::Hermes.parse(text);
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content, text.trim());
        }
        let plain = ToolSyntax::Hermes.parse("  The answer is 4.  ");
        assert_eq!(plain.content, "The answer is 4.");
        assert!(plain.calls.is_empty());
    }

    #[test]
    fn llama3_json_calls_are_read() {
        let p = ToolSyntax::Llama3
            .parse("<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}");
        assert_eq!(
            p.calls,
            vec![ToolCall {
                name: "add".into(),
                arguments: json!({"a": 1, "b": 2})
            }]
        );
        assert_eq!(p.content, "");
        let two = ToolSyntax::Llama3.parse(
            "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"s\": \"}{;\"}}",
        );
        assert_eq!(two.calls.len(), 2);
        assert_eq!(two.calls[1].arguments, json!({"s": "}{;"}));
        for text in [
            "The sum is 3.",
            "{\"name\": \"add\"}",
            "{\"name\": \"add\", \"parameters\": {} trailing",
        ] {
            let p = ToolSyntax::Llama3.parse(text);
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content, text);
        }
    }

    #[test]
    fn written_calls_parse_back() {
        let args = json!({"q": "x", "n": 2});
        for s in [ToolSyntax::Hermes, ToolSyntax::Llama3] {
            let p = s.parse(&s.write("search", &args));
            assert_eq!(
                p.calls,
                vec![ToolCall {
                    name: "search".into(),
                    arguments: args.clone()
                }]
            );
        }
    }

    #[test]
    fn a_tool_conversation_folds_into_plain_turns() {
        let msgs = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        ]);
        let tools =
            json!([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]);
        let out = fold_into_messages(&msgs, Some(&tools));
        let out = out.as_array().unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(out[0]["role"], "system");
        assert!(out[0]["content"]
            .as_str()
            .unwrap()
            .contains("\"get_weather\""));
        let call = ToolSyntax::Hermes.parse(out[2]["content"].as_str().unwrap());
        assert_eq!(call.calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(
            out[3],
            json!({"role": "user", "content": "<tool_response>\n18 C\n</tool_response>"})
        );
    }

    /// Whether `grammar` lets the model write `text` and then end, over a
    /// byte-level vocabulary with `<tool_call>` as one token, as the engine
    /// runs grammars.
    fn accepts(grammar: &str, text: &str) -> bool {
        crate::constraint::byte_vocab::accepts(grammar, &[OPEN], text)
    }

    #[test]
    fn the_auto_grammar_frees_prose_and_holds_calls_to_their_schema() {
        let tools = vec![
            (
                "lookup_price".to_string(),
                json!({"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}),
            ),
            (
                "multiply".to_string(),
                json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
            ),
        ];
        let g = ToolSyntax::Hermes.lazy_grammar(&tools, true);
        for ok in [
            "",
            "The answer is 42.",
            "{\"result\": 42}",
            "Use {\"name\": \"lookup_price\"} later.",
            "Let me check.\n<tool_call>\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 1, \"b\": 3}}\n</tool_call>\n",
            "{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}",
            "```json\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}\n```",
            "{{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}}}",
            "{\"name\":\"multiply\",\"arguments\": {\"a\": 2, \"b\": 3}}\n{\"name\": \"multiply\", \"arguments\": {\"a\": 4, \"b\": 3}}",
            // Pretty-printed, as the 1.5B writes a fenced call.
            "```json\n{\n  \"name\": \"multiply\",\n  \"arguments\": {\n    \"a\": 10,\n    \"b\": 20\n  }\n}\n```",
            "{\"name\": \"multiply\", \"arguments\": {\"a\":2,\"b\":3}}\n",
        ] {
            assert!(accepts(&g, ok), "refused: {ok}");
        }
        for bad in [
            // Arguments off the schema, an undeclared name in a block,
            // prose after a call.
            "{\"name\": \"lookup_price\", \"arguments\": {\"item\": 5}}",
            "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
            "{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}} The result is 6.",
            "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2}}\n</tool_call>",
            // A name that only starts with a declared one is held to it.
            "```json\n{\"name\": \"lookup_price_args\", \"arguments\": {\"item\": \"gizmo\"}}\n```",
            "{\"name\": \"multiplyer\", \"arguments\": {\"a\": 2, \"b\": 3}}",
            // Whitespace inside a call and after the calls is bounded.
            "{\"name\": \"multiply\", \"arguments\": {\"a\": 2,\n\n\n\"b\": 3}}",
            "{\"name\": \"multiply\", \"arguments\": {\"a\": 2,                       \"b\": 3}}",
            "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n\n\n",
        ] {
            assert!(!accepts(&g, bad), "allowed: {bad}");
        }
        let one = ToolSyntax::Hermes.lazy_grammar(&tools, false);
        let two = "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 1, \"b\": 3}}\n</tool_call>";
        assert!(!accepts(&one, two));
        // One call allowed: after it only a little whitespace, then the end.
        let first = &two[..two.find("</tool_call>").unwrap() + "</tool_call>".len()];
        assert!(accepts(&one, first) && accepts(&one, &format!("{first}\n")));
        assert!(!accepts(&one, &format!("{first}\n\n\n")));
        let llama = ToolSyntax::Llama3.lazy_grammar(&tools, false);
        assert!(accepts(
            &llama,
            "{\"name\": \"multiply\", \"parameters\": {\"a\": 2, \"b\": 3}}"
        ));
        assert!(accepts(&llama, "Plain prose."));
    }

    #[test]
    fn the_syntax_follows_the_template() {
        assert_eq!(
            ToolSyntax::of_template("{{ '<tool_call>' }}"),
            ToolSyntax::Hermes
        );
        assert_eq!(
            ToolSyntax::of_template("Given the following functions, please respond"),
            ToolSyntax::Llama3
        );
        assert_eq!(ToolSyntax::of_template("<|im_start|>"), ToolSyntax::Hermes);
    }
}
