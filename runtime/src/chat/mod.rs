//! Chat prompts: the model's own Jinja chat template, rendered with minijinja.
//!
//! Templates come from the GGUF (`tokenizer.chat_template`) and are written for
//! Hugging Face's Jinja environment, so this one is set up the same way: blocks
//! trimmed, Python string methods (`.strip()`, `.startswith()` ...) through
//! minijinja-contrib's pycompat, and the helpers templates call
//! (`raise_exception`, `strftime_now`), and `tojson` written as Python's
//! `json.dumps` ([`pyjson`]). Conversations are normalized as llama.cpp's
//! Jinja path normalizes them ([`conversation`]), so a request renders to the
//! same prompt in Tern and in llama.cpp (tested against it, template by
//! template). Output is a string with control-token text in it; the tokenizer
//! parses those into single tokens.
//!
//! A template is a program from the model file, so every render runs under
//! minijinja's fuel ([`TEMPLATE_FUEL`] instructions): a template that loops
//! without end is refused when it is compiled (the capability probes render
//! sample conversations under the same fuel), and a render that runs out at
//! request time is that request's error, never a hung thread.

pub mod conversation;
pub mod pyjson;
pub mod think_reader;
pub mod tool_reader;
pub mod tools;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value as JinjaValue};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use conversation::Caps;

use crate::error::{Result, RuntimeError};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may accept others, e.g. `tool`).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A conversation of one user turn, after a system message when there
    /// is one: what a single prompt becomes in the CLI and the trainer.
    pub fn turn(system: Option<&str>, user: &str) -> Vec<Self> {
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(Self::new("system", s));
        }
        messages.push(Self::new("user", user));
        messages
    }
}

/// What a render asks of the template besides the messages.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, ready for the model.
    pub add_generation_prompt: bool,
    /// OpenAI-style tool definitions the template may list for the model.
    pub tools: Option<Value>,
    /// Whether a thinking model may think (`enable_thinking`; llama.cpp's
    /// default is true, and templates without the switch ignore it).
    pub enable_thinking: bool,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            tools: None,
            enable_thinking: true,
        }
    }
}

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    caps: Caps,
    tool_syntax: tools::ToolSyntax,
    marks_reasoning: bool,
}

const TEMPLATE_NAME: &str = "chat";

/// Instructions one render of a chat template may run (minijinja's fuel).
/// Real templates need far less: Qwen2.5's, Llama 3.2's, Gemma 3's and
/// Phi-3.5's, with tools, spend 30 to 50 per message (measured), so this
/// admits some 400,000 messages, more than a request body can hold, while a
/// template that loops without end stops after about half a second instead
/// of holding its thread forever.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are exposed to the template as
    /// variables of those names. A template that runs out of fuel on the
    /// sample conversations of the capability probes is an error here, so a
    /// model whose template never ends is refused at load.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| RuntimeError::Template(format!("does not compile: {e}")))?;
        let mut template = Self {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            caps: Caps::default(),
            tool_syntax: tools::ToolSyntax::of_template(source),
            marks_reasoning: source.contains(think_reader::THINK_OPEN)
                && source.contains(think_reader::THINK_CLOSE),
        };
        template.caps = template.probe_caps()?;
        Ok(template)
    }

    /// What this template does with system turns and tool calls, as probed
    /// when it was compiled.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// How this model family writes tool calls (Hermes blocks unless the
    /// template writes Llama 3's JSON call).
    pub fn tool_syntax(&self) -> tools::ToolSyntax {
        self.tool_syntax
    }

    /// Whether the template marks reasoning with `<think>` ... `</think>`
    /// (Qwen3, DeepSeek-R1): its model's replies then open with a think
    /// block that a server splits out ([`think_reader`]) and a thinking
    /// budget closes.
    pub fn marks_reasoning(&self) -> bool {
        self.marks_reasoning
    }

    /// Renders `messages`; with `add_generation_prompt` the output ends with the
    /// header of an assistant turn, ready for the model to continue.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let messages = serde_json::to_value(messages)
            .map_err(|e| RuntimeError::Template(format!("messages: {e}")))?;
        let opts = RenderOptions {
            add_generation_prompt,
            ..RenderOptions::default()
        };
        self.render_conversation(&messages, &opts)
    }

    /// Renders OpenAI-style `messages` (a JSON array, tool calls and results
    /// included) with `opts`, after the normalization llama.cpp applies.
    pub fn render_conversation(&self, messages: &Value, opts: &RenderOptions) -> Result<String> {
        if messages.as_array().is_some_and(Vec::is_empty) {
            return Err(RuntimeError::Template("no messages to render".into()));
        }
        let messages = conversation::normalize_messages(messages, &self.caps)
            .map_err(RuntimeError::Template)?;
        let tools = match &opts.tools {
            Some(t) if t.as_array().is_some_and(|a| !a.is_empty()) => {
                Some(conversation::normalize_tools(t).map_err(RuntimeError::Template)?)
            }
            _ => None,
        };
        self.render_raw(&messages, tools.as_ref(), opts)
            .map_err(|e| match e.kind() {
                ErrorKind::OutOfFuel => RuntimeError::Template(format!(
                    "render stopped: the template ran more than {TEMPLATE_FUEL} instructions \
                     (its fuel) on this conversation"
                )),
                _ => RuntimeError::Template(format!("render failed: {e:#}")),
            })
    }

    /// Renders already-normalized input; the context holds what llama.cpp's
    /// holds (`tools` only when there are some, `add_generation_prompt` only
    /// when set).
    fn render_raw(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        opts: &RenderOptions,
    ) -> std::result::Result<String, Error> {
        let tmpl = self.env.get_template(TEMPLATE_NAME)?;
        let mut ctx = json!({
            "messages": messages,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "enable_thinking": opts.enable_thinking,
        });
        if let Some(tools) = tools {
            ctx["tools"] = tools.clone();
        }
        if opts.add_generation_prompt {
            ctx["add_generation_prompt"] = Value::Bool(true);
        }
        tmpl.render(JinjaValue::from_serialize(&ctx))
    }

    /// Finds [`Caps`] by rendering small conversations with marker strings
    /// and looking for the markers in the output (a template that fails on a
    /// probe keeps the default for what that probe asks). A probe that runs
    /// out of fuel is an error: the template would hang every request.
    fn probe_caps(&self) -> Result<Caps> {
        const SYSTEM: &str = "tern-probe-system-text";
        const TOOL: &str = "tern_probe_tool";
        const ARG: &str = "tern-probe-argument";
        let mut caps = Caps::default();
        let system = json!([
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "User message"},
        ]);
        caps.system_role = self
            .probe(&system, None)?
            .is_some_and(|out| out.contains(SYSTEM));
        let calls = json!([
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call00001", "type": "function",
                 "function": {"name": TOOL, "arguments": {"arg": ARG}}}
            ]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"},
        ]);
        // Without a tool list, so the name can only come from the call.
        if let Some(out) = self.probe(&calls, None)? {
            caps.tool_calls = out.contains(TOOL);
            caps.object_arguments = out.contains(ARG);
        }
        let user = json!([{"role": "user", "content": "User message"}]);
        let tools = json!([{"type": "function", "function": {
            "name": TOOL, "description": "", "parameters": {"type": "object", "properties": {}}}}]);
        caps.tools = self
            .probe(&user, Some(&tools))?
            .is_some_and(|out| out.contains(TOOL));
        Ok(caps)
    }

    /// One probe's output; `None` when the template refused the
    /// conversation, an error when it ran out of fuel.
    fn probe(&self, messages: &Value, tools: Option<&Value>) -> Result<Option<String>> {
        match self.render_raw(messages, tools, &RenderOptions::default()) {
            Ok(out) => Ok(Some(out)),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(RuntimeError::Template(format!(
                "refused: rendering a {}-message sample conversation ran more than \
                 {TEMPLATE_FUEL} instructions (the template's fuel); the template \
                 loops without end or does far too much work",
                messages.as_array().map_or(0, Vec::len)
            ))),
            Err(_) => Ok(None),
        }
    }
}

/// `tojson` as Python's `json.dumps` writes it (see [`pyjson`]): `indent`,
/// `separators` and `ensure_ascii` as keyword arguments; `sort_keys` refused.
fn tojson(value: JinjaValue, kwargs: Kwargs) -> std::result::Result<JinjaValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    if sort_keys == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson(sort_keys=true) is not supported",
        ));
    }
    let mut style = pyjson::Style::python(indent);
    style.ensure_ascii = ensure_ascii.unwrap_or(false);
    if let Some(seps) = separators {
        if let [item, key] = seps.as_slice() {
            style.item_sep = item.clone();
            style.key_sep = key.clone();
        }
    }
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(JinjaValue::from_safe_string(pyjson::dumps(&json, &style)))
}

/// `strftime_now(fmt)` as HF templates use it for "today's date"; supports the
/// common `%Y %m %d %B %b` fields from the system clock (UTC).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nDefault<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_default_system_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "<s>", "</s>").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn explicit_system_replaces_default_and_no_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "<s>", "</s>").unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello"),
        ];
        let out = t.render(&msgs, false).unwrap();
        assert!(out.starts_with("<|im_start|>system\nBe brief.<|im_end|>"));
        assert!(out.ends_with("<|im_start|>assistant\nHello<|im_end|>\n"));
        assert!(!out.contains("Default"));
    }

    #[test]
    fn python_methods_and_raise_exception() {
        let src = "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}{{ messages[0]['content'].strip().upper() }}{{ bos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  hey ")], false)
                .unwrap(),
            "HEY<s>"
        );
        let err = t
            .render(&[ChatMessage::new("bad", "x")], false)
            .unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn broken_template_is_a_clear_error() {
        let err = ChatTemplate::new("{% for x in %}", "", "").err().unwrap();
        assert!(err.to_string().contains("does not compile"), "{err}");
    }

    #[test]
    fn a_template_that_never_ends_is_refused_at_load() {
        // 10^10 iterations: a hang without fuel.
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let err = ChatTemplate::new(src, "", "").err().expect("refused");
        let msg = err.to_string();
        assert!(msg.starts_with("chat template: refused"), "{msg}");
        assert!(
            msg.contains(&format!("{TEMPLATE_FUEL} instructions")),
            "{msg}"
        );
    }

    #[test]
    fn a_render_that_runs_out_of_fuel_is_an_error() {
        // Cheap on the probes' short conversations, endless on a long one.
        let src = "{% if messages|length > 5 %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}{{ messages[0]['content'] }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let long: Vec<ChatMessage> = (0..6)
            .map(|i| ChatMessage::new("user", format!("{i}")))
            .collect();
        let err = t.render(&long, false).unwrap_err().to_string();
        assert!(err.contains("fuel"), "{err}");
        assert_eq!(t.render(&long[..1], false).unwrap(), "0");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
    }
}
