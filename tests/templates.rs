//! Chat templates rendered by Tern (minijinja) and by llama.cpp's own Jinja
//! path (`--jinja`, called in process), required equal byte for byte: the
//! real Qwen3 template with its tools and thinking sections, and the published
//! templates of Llama 3.2, Gemma 3 and Phi-3.5, over system, multi-turn,
//! tool-call and tool-result conversations.

use serde_json::{json, Value};
use tern_runtime::backend::{render_chat_llama_cpp, JinjaRequest};
use tern_runtime::chat::{ChatTemplate, RenderOptions};

use crate::support::{real_vocab, repo_root};

fn template(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/data/templates").join(name)).unwrap()
}

fn qwen3_template() -> String {
    let config = real_vocab("qwen").with_file_name("tokenizer_config.json");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    config["chat_template"].as_str().unwrap().to_string()
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city — «quoted», with \"escapes\" & <tags> 🌦",
            "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "description": "City name"},
                               "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"]}}},
        {"type": "function", "function": {"name": "now", "description": "The time"}},
    ])
}

/// The conversations every template renders.
fn plain_conversations() -> Vec<(&'static str, Value)> {
    vec![
        (
            "user only",
            json!([{"role": "user", "content": "Hi there"}]),
        ),
        (
            "system and user",
            json!([{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "  What is 2+2?  "}]),
        ),
        (
            "multi-turn",
            json!([{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3? Ünïcödé, 中文, emoji 😀"}]),
        ),
        (
            "developer turn",
            json!([{"role": "developer", "content": "Answer in French."},
                   {"role": "user", "content": "Hello"}]),
        ),
    ]
}

fn tool_conversation(arguments: Value) -> Value {
    json!([
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear."},
        {"role": "user", "content": "Thanks"},
    ])
}

/// Renders `messages` both ways and requires equal text; returns it.
fn same(source: &str, bos: &str, eos: &str, messages: &Value, opts: &RenderOptions) -> String {
    let tern = ChatTemplate::new(source, bos, eos).unwrap();
    let ours = tern.render_conversation(messages, opts).unwrap();
    let req = JinjaRequest {
        tools: opts.tools.as_ref(),
        add_generation_prompt: opts.add_generation_prompt,
        enable_thinking: opts.enable_thinking,
    };
    let theirs = render_chat_llama_cpp(source, bos, eos, messages, &req).unwrap();
    assert_eq!(
        ours, theirs,
        "Tern and llama.cpp render differently for {messages}"
    );
    ours
}

fn check_plain(source: &str, bos: &str, eos: &str) {
    for (what, msgs) in plain_conversations() {
        for add_generation_prompt in [true, false] {
            let opts = RenderOptions {
                add_generation_prompt,
                ..RenderOptions::default()
            };
            let out = same(source, bos, eos, &msgs, &opts);
            assert!(
                out.contains("Hi there") || out.contains("2+2") || out.contains("Hello"),
                "{what}: {out}"
            );
        }
    }
}

#[test]
fn qwen3_template_renders_as_llama_cpp_does_with_tools_and_thinking() {
    let source = qwen3_template();
    check_plain(&source, "", "<|im_end|>");
    let with_tools = RenderOptions {
        tools: Some(tools()),
        ..RenderOptions::default()
    };
    // Arguments sent as JSON text and as an object render the same way.
    let text = same(
        &source,
        "",
        "<|im_end|>",
        &tool_conversation(json!("{\"city\": \"Paris\"}")),
        &with_tools,
    );
    let object = same(
        &source,
        "",
        "<|im_end|>",
        &tool_conversation(json!({"city": "Paris"})),
        &with_tools,
    );
    assert_eq!(text, object);
    assert!(
        text.contains("<tools>") && text.contains("\"name\": \"get_weather\""),
        "{text}"
    );
    assert!(
        text.contains("<tool_call>") && text.contains("<tool_response>"),
        "{text}"
    );
    // Thinking: reasoning before the last user turn is dropped, after it is
    // kept; `enable_thinking=false` opens an empty think block.
    let thinking = json!([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "And 3+3?"},
    ]);
    for enable_thinking in [true, false] {
        let opts = RenderOptions {
            enable_thinking,
            ..RenderOptions::default()
        };
        let out = same(&source, "", "<|im_end|>", &thinking, &opts);
        assert_eq!(
            out.ends_with("<think>\n\n</think>\n\n"),
            !enable_thinking,
            "{out}"
        );
    }
    let no_gen = RenderOptions {
        add_generation_prompt: false,
        ..RenderOptions::default()
    };
    let answered = json!([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
    ]);
    let out = same(&source, "", "<|im_end|>", &answered, &no_gen);
    assert!(
        out.contains("<think>\nadd them\n</think>"),
        "the last turn keeps its thinking: {out}"
    );
}

#[test]
fn llama3_template_renders_as_llama_cpp_does_with_tools() {
    let source = template("llama3.2-instruct.jinja");
    let (bos, eos) = ("<|begin_of_text|>", "<|eot_id|>");
    check_plain(&source, bos, eos);
    let with_tools = RenderOptions {
        tools: Some(tools()),
        ..RenderOptions::default()
    };
    let out = same(
        &source,
        bos,
        eos,
        &tool_conversation(json!({"city": "Paris"})),
        &with_tools,
    );
    assert!(
        out.contains("Environment: ipython") && out.contains("<|start_header_id|>ipython"),
        "{out}"
    );
    // tojson(indent=4) as Python writes it.
    assert!(
        out.contains("{\n    \"type\": \"function\",\n    \"function\": {"),
        "{out}"
    );
}

#[test]
fn gemma3_and_phi3_templates_render_as_llama_cpp_does() {
    check_plain(&template("gemma3-it.jinja"), "<bos>", "<eos>");
    check_plain(
        &template("phi3.5-mini-instruct.jinja"),
        "<s>",
        "<|endoftext|>",
    );
    // Gemma folds the system turn into the first user turn itself.
    let out = same(
        &template("gemma3-it.jinja"),
        "<bos>",
        "<eos>",
        &plain_conversations()[1].1,
        &RenderOptions::default(),
    );
    assert!(
        out.starts_with("<bos><start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n"),
        "{out}"
    );
}

#[test]
fn a_template_error_is_reported_by_both() {
    // Gemma's template refuses turns that do not alternate.
    let source = template("gemma3-it.jinja");
    let msgs = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
    let tern = ChatTemplate::new(&source, "<bos>", "<eos>").unwrap();
    let err = tern
        .render_conversation(&msgs, &RenderOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("must alternate"), "{err}");
    let req = JinjaRequest {
        add_generation_prompt: true,
        enable_thinking: true,
        ..Default::default()
    };
    assert!(render_chat_llama_cpp(&source, "<bos>", "<eos>", &msgs, &req).is_err());
}

/// Each family's template: which tool syntax it writes, whether it lists
/// tools itself, and fixed model outputs in its syntax read back as calls
/// (malformed ones as text).
#[test]
fn tool_calls_are_read_in_each_familys_syntax() {
    use tern_runtime::chat::tools::ToolSyntax;
    let chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let cases = [
        ("qwen3", qwen3_template(), ToolSyntax::Hermes, true),
        (
            "llama3.2",
            template("llama3.2-instruct.jinja"),
            ToolSyntax::Llama3,
            true,
        ),
        (
            "chatml without tools (the default)",
            chatml.to_string(),
            ToolSyntax::Hermes,
            false,
        ),
    ];
    for (name, source, syntax, lists_tools) in cases {
        let t = ChatTemplate::new(&source, "<s>", "</s>").unwrap();
        assert_eq!(t.tool_syntax(), syntax, "{name}");
        assert_eq!(t.caps().tools, lists_tools, "{name}");
        if lists_tools {
            let opts = RenderOptions {
                tools: Some(tools()),
                ..RenderOptions::default()
            };
            let out = t
                .render_conversation(&json!([{"role": "user", "content": "Weather?"}]), &opts)
                .unwrap();
            assert!(out.contains("get_weather"), "{name}: {out}");
        }
    }
    let qwen_out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
    let p = ToolSyntax::Hermes.parse(qwen_out);
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.calls[0].arguments, json!({"city": "Paris", "unit": "c"}));
    let llama_out = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    let p = ToolSyntax::Llama3.parse(llama_out);
    assert_eq!(p.calls[0].name, "get_weather");
    assert_eq!(p.calls[0].arguments, json!({"city": "Paris"}));
    for (syntax, broken) in [
        (
            ToolSyntax::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        ),
        (
            ToolSyntax::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": ",
        ),
    ] {
        let p = syntax.parse(broken);
        assert!(p.calls.is_empty(), "{broken}");
        assert_eq!(p.content, broken.trim());
    }
}
