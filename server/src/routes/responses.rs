//! `POST /v1/responses` (OpenAI's Responses API, which Codex and the Agents
//! SDK speak), `GET` and `DELETE /v1/responses/{id}`.
//!
//! A request becomes a chat conversation (the stored conversation of
//! `previous_response_id`, then `input`'s messages, function calls and
//! function outputs, with `instructions` as the system turn), runs through
//! the same prompt, constraint, tool and engine path as chat completions,
//! and is answered as a `response` object whose `output` holds one message
//! and/or function calls; streamed as Responses events. A reasoning model's
//! think block (see `crate::think`) comes first as a `reasoning` item; such
//! a stream, like one with tools, sends its items whole when the reply ends.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tern_runtime::chat::tools::ToolSyntax;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineHandle, FinishReason, TokenLogprob};
use tern_runtime::LoadedModel;

use crate::affinity;
use crate::body::{fields, JsonBody};
use crate::collect::collect;
use crate::echoed::{self, MAX_RESPONSE_ID_CHARS, MAX_USER_CHARS};
use crate::events::Tally;
use crate::ids::{random_u64, unix_now};
use crate::openai::error::ApiError;
use crate::openai::request::GenerationFields;
use crate::openai::usage::{TernInfo, Usage};
use crate::params::{self, EndpointInput, Plan};
use crate::prompt;
use crate::response_store::{ResponseStore, Stored};
use crate::state::{limits, AppState};
use crate::stream::{sse_response, ChunkFormat, StreamState};
use crate::think::{self, ThinkSplit};
use crate::tools::{self, ToolPlan};

/// The Responses-only fields (sampling ones are read as chat's).
#[derive(Debug, Default, Deserialize)]
struct ResponseFields {
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    text: Option<Value>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    max_output_tokens: Option<i64>,
    stream: Option<bool>,
    metadata: Option<Value>,
    user: Option<String>,
    safety_identifier: Option<String>,
}

/// Everything a finished response is built from.
struct Context {
    id: String,
    created: u64,
    model: String,
    echo: Value,
    conversation: Value,
    tools: Option<(ToolPlan, ToolSyntax)>,
    /// The reasoning split, for a model whose template marks reasoning.
    split: Option<ThinkSplit>,
    store: Option<Arc<ResponseStore>>,
    prompt_tokens: usize,
}

/// `POST /v1/responses`: checks the echoed fields, builds the conversation
/// and its prompt, plans the generation as chat does, then answers.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    state.ready()?;
    let own: ResponseFields = fields(&body)?;
    let (metadata, text) = check_echoed(&own)?;
    let model_field = body.get("model").and_then(Value::as_str);
    let served = state.serve_model(model_field).await?;
    let engine = served.engine.clone();
    let chat_tools = own.tools.as_ref().map(|t| chat_tools(t)).transpose()?;
    let tool_plan = tools::plan(
        chat_tools.as_ref(),
        own.tool_choice.as_ref().map(chat_tool_choice).as_ref(),
        own.parallel_tool_calls,
    )?;
    let conversation = conversation(&state, &own)?;
    let model = Arc::clone(engine.model());
    let ids = template(
        &model,
        &conversation,
        own.instructions.as_deref(),
        tool_plan.as_ref(),
        state.content_tokens(),
    )
    .await?;
    let shared = generation_fields(&body, &text)?;
    let input = EndpointInput {
        prompt: ids,
        prompt_param: "input",
        max_tokens: (own.max_output_tokens, "max_output_tokens"),
        logprobs: None,
        past_context: false,
    };
    let mut plan = params::plan(&shared, input, limits(&model), state.kv_defaults())?;
    plan.submit.adapters = served.adapters;
    let syntax = model
        .template
        .as_ref()
        .map_or(ToolSyntax::Hermes, |t| t.tool_syntax());
    constrain_tools(&mut plan, tool_plan.as_ref(), syntax)?;
    params::compile_constraint(&mut plan, &model).await?;
    let split = think::plan(
        body.get("reasoning_format").and_then(Value::as_str),
        state.reasoning_format(),
        &model,
        &plan.submit.prompt,
    )?;
    let prompt_tokens = plan.submit.prompt.len();
    let tally = Tally::new(1, prompt_tokens, plan.submit.kv_policy.to_string());
    let echo = echo(&own, &body, &text, &metadata);
    let store = own.store.unwrap_or(true);
    if store {
        check_storable(state.responses(), &echo, &conversation)?;
    }
    let ctx = Context {
        id: format!("resp_{:016x}{:016x}", random_u64(), random_u64()),
        created: unix_now(),
        model: served.name,
        echo,
        conversation: Value::Array(conversation),
        tools: tool_plan.map(|t| (t, syntax)),
        split,
        store: store.then(|| state.responses_arc()),
        prompt_tokens,
    };
    answer(&engine, plan, ctx, tally, own.stream.unwrap_or(false)).await
}

/// Checks the fields a response echoes (each is bounded, and only what is
/// checked is echoed); returns `metadata` and `text` as echoed.
fn check_echoed(own: &ResponseFields) -> Result<(Value, Value), ApiError> {
    let metadata = echoed::metadata(own.metadata.as_ref())?;
    let text = echoed::text_options(own.text.as_ref())?;
    echoed::short_string("user", own.user.as_deref(), MAX_USER_CHARS)?;
    echoed::short_string(
        "safety_identifier",
        own.safety_identifier.as_deref(),
        MAX_USER_CHARS,
    )?;
    echoed::short_string(
        "previous_response_id",
        own.previous_response_id.as_deref(),
        MAX_RESPONSE_ID_CHARS,
    )?;
    Ok((metadata, text))
}

/// The conversation: what the previous response held, then the input.
fn conversation(state: &AppState, own: &ResponseFields) -> Result<Vec<Value>, ApiError> {
    let mut conversation: Vec<Value> = match &own.previous_response_id {
        Some(prev) => match state.responses().get(prev).map_err(store_down)? {
            Some(s) => s.conversation.as_array().cloned().unwrap_or_default(),
            None => {
                return Err(ApiError::not_found(
                    "previous_response_id",
                    format!("no stored response `{prev}` (never stored, deleted, or evicted from the --responses-store)"),
                ))
            }
        },
        None => Vec::new(),
    };
    let new_turns = input_messages(own.input.as_ref())?;
    // (The stored part was checked when it was sent.)
    prompt::check_tool_conversation(&Value::Array(new_turns.clone()))
        .map_err(|e| rename_param(e, "input"))?;
    conversation.extend(new_turns);
    Ok(conversation)
}

/// The prompt: `instructions` as the system turn, then the conversation,
/// with the tools' definitions.
async fn template(
    model: &Arc<LoadedModel>,
    conversation: &[Value],
    instructions: Option<&str>,
    tool_plan: Option<&ToolPlan>,
    content: ContentTokens,
) -> Result<Vec<u32>, ApiError> {
    let mut messages = conversation.to_vec();
    if let Some(i) = instructions.filter(|i| !i.is_empty()) {
        messages.insert(0, json!({"role": "system", "content": i}));
    }
    let messages = Value::Array(messages);
    let model = Arc::clone(model);
    let list = tool_plan.map(|t| t.tools.clone());
    prompt::off_thread(move || {
        model
            .conversation_prompt(&messages, list.as_ref(), content)
            .map_err(|e| ApiError::from_runtime(e, "input"))
    })
    .await
}

/// The sampling fields as chat reads them, with `text.format` as
/// `response_format`.
fn generation_fields(body: &Value, text: &Value) -> Result<GenerationFields, ApiError> {
    let mut gen = json!({});
    for k in [
        "temperature",
        "top_p",
        "seed",
        "top_k",
        "min_p",
        "kv_policy",
    ]
    .into_iter()
    .chain(params::samplers::FIELDS)
    {
        if let Some(v) = body.get(k) {
            gen[k] = v.clone();
        }
    }
    if let Some(f) = text.get("format") {
        gen["response_format"] = response_format(f)?;
    }
    fields(&gen)
}

/// The tools' constraint: a forced call cannot be combined with a JSON
/// `text.format`; `auto` leaves a `text.format` the request set in charge.
fn constrain_tools(
    plan: &mut Plan,
    tool_plan: Option<&ToolPlan>,
    syntax: ToolSyntax,
) -> Result<(), ApiError> {
    if let Some(t) = tool_plan {
        if t.is_forced() && plan.constraint.is_some() {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "a forced tool call cannot be combined with a JSON `text.format`",
            ));
        }
        if plan.constraint.is_none() {
            plan.constraint = Some(t.constraint(syntax));
        }
    }
    Ok(())
}

/// The request fields the response object repeats.
fn echo(own: &ResponseFields, body: &Value, text: &Value, metadata: &Value) -> Value {
    json!({
        "instructions": own.instructions,
        "tools": own.tools.as_deref().map(echo_tools).unwrap_or_default(),
        "tool_choice": own.tool_choice.as_ref().map_or(json!("auto"), echo_tool_choice),
        "parallel_tool_calls": own.parallel_tool_calls.unwrap_or(true),
        "text": text,
        "previous_response_id": own.previous_response_id,
        "temperature": body.get("temperature").cloned().unwrap_or(json!(1.0)),
        "top_p": body.get("top_p").cloned().unwrap_or(json!(1.0)),
        "max_output_tokens": own.max_output_tokens,
        "metadata": metadata,
        "store": own.store.unwrap_or(true),
    })
}

/// Submits `plan` and answers: a stream of Responses events, or the
/// response object once the reply is done.
async fn answer(
    engine: &EngineHandle,
    plan: Plan,
    ctx: Context,
    tally: Tally,
    stream: bool,
) -> Result<Response, ApiError> {
    let key = affinity::prefix_key(&plan.submit.prompt);
    let events = engine
        .submit(plan.submit)
        .map_err(|e| ApiError::from_submit(e, "input"))?;
    if stream {
        let format = ResponsesFormat {
            ctx,
            text: String::new(),
            tokens: 0,
            seq: 0,
            started_message: false,
        };
        return Ok(affinity::with_key(
            sse_response(events, StreamState::new(format, tally, false)),
            key.as_deref(),
        ));
    }
    let collected = collect(events, tally).await?;
    let choice = collected.choices.into_iter().next().unwrap_or_default();
    let usage = collected.tally.usage();
    let response = finish(
        &ctx,
        &choice.text,
        choice.finish_reason,
        usage.completion_tokens,
    );
    Ok(affinity::with_key(
        Json(response).into_response(),
        key.as_deref(),
    ))
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match state.responses().get(&id).map_err(store_down)? {
        Some(s) => Ok(Json(s.response).into_response()),
        None => Err(missing(&id)),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if state.responses().remove(&id).map_err(store_down)? {
        Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
    } else {
        Err(missing(&id))
    }
}

/// A 503: the shared store did not answer (not a 404: the response may be
/// there).
fn store_down(e: crate::response_store::StoreError) -> ApiError {
    ApiError::state_store_unavailable(e.to_string())
}

/// Keeps a finished response; a store that fails costs only the later
/// `previous_response_id` (a clear 404 then), not this answer.
fn keep(store: &ResponseStore, id: String, stored: Stored) {
    if let Err(e) = store.insert(id, stored) {
        eprintln!("warning: {e}");
    }
}

fn missing(id: &str) -> ApiError {
    ApiError::not_found(
        "response_id",
        format!("no stored response `{id}` (never stored, deleted, or evicted)"),
    )
}

fn rename_param(mut e: ApiError, to: &str) -> ApiError {
    if let Some(p) = &e.param {
        e.param = Some(p.replacen("messages", to, 1));
        e.message = e.message.replacen("messages", to, 1);
    }
    e
}

/// Responses tools (`{"type": "function", "name", "parameters", ...}`) in
/// chat's shape; other tool types are refused by name.
fn chat_tools(list: &[Value]) -> Result<Vec<Value>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
            if kind != "function" {
                return Err(ApiError::invalid_param(
                    format!("tools[{i}].type"),
                    format!("tools[{i}]: only `function` tools are supported, not `{kind}`"),
                ));
            }
            let mut f = serde_json::Map::new();
            for k in ["name", "description", "parameters"] {
                if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                    f.insert(k.into(), v.clone());
                }
            }
            Ok(json!({"type": "function", "function": f}))
        })
        .collect::<Result<_, _>>()
        .map_err(|e: ApiError| {
            let param = e.param.clone().unwrap_or_default().replace(".function", "");
            e.with_param(param)
        })
}

/// A 400 naming `store` when what this response would keep before its
/// output (its echoed fields and the conversation) already exceeds the
/// store's byte budget: it could never be stored, and a client continuing
/// it would get a 404 instead of a clear reason now.
fn check_storable(
    store: &ResponseStore,
    echo: &Value,
    conversation: &[Value],
) -> Result<(), ApiError> {
    let turns: usize = conversation.iter().map(echoed::json_len).sum();
    let bytes = echoed::json_len(echo) + turns;
    if store.fits(bytes) {
        return Ok(());
    }
    Err(ApiError::invalid_param(
        "store",
        format!(
            "this response would take at least {bytes} bytes to store, more than the server's \
             --responses-store-bytes ({}) holds; send `store: false` or a shorter input",
            store.max_bytes()
        ),
    ))
}

/// The tools as the response echoes them: each function's own fields
/// (`type`, `name`, `description`, `parameters`, `strict`), nothing else a
/// client attached (the prompt never saw it, so the context never bounded it).
fn echo_tools(list: &[Value]) -> Vec<Value> {
    list.iter()
        .map(|t| {
            let mut f = serde_json::Map::new();
            for k in ["type", "name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                    f.insert(k.into(), v.clone());
                }
            }
            Value::Object(f)
        })
        .collect()
}

/// `tool_choice` as echoed: a mode string as sent, a function as its type
/// and name only.
fn echo_tool_choice(c: &Value) -> Value {
    match c {
        Value::String(_) => c.clone(),
        _ => json!({"type": c.get("type"), "name": c.get("name")}),
    }
}

/// `{"type": "function", "name": ...}` as chat's tool_choice.
fn chat_tool_choice(c: &Value) -> Value {
    match c.get("name") {
        Some(name) => json!({"type": "function", "function": {"name": name}}),
        None => c.clone(),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(f: &Value) -> Result<Value, ApiError> {
    match f.get("type").and_then(Value::as_str) {
        Some("text") | None => Ok(json!({"type": "text"})),
        Some("json_object") => Ok(json!({"type": "json_object"})),
        Some("json_schema") => Ok(json!({"type": "json_schema", "json_schema": {
            "name": f.get("name"), "schema": f.get("schema"), "strict": f.get("strict")}})),
        Some(other) => Err(ApiError::invalid_param(
            "text.format.type",
            format!(
                "text.format.type must be `text`, `json_object` or `json_schema`, got `{other}`"
            ),
        )),
    }
}

/// `input` (a string, or a list of messages and function-call items) as
/// chat messages.
fn input_messages(input: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let bad = |i: usize, what: &str| {
        ApiError::invalid_param(format!("input[{i}]"), format!("input[{i}]: {what}"))
    };
    match input {
        None | Some(Value::Null) => Err(ApiError::invalid_param(
            "input",
            "Missing required parameter: `input`",
        )),
        Some(Value::String(s)) => Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) if items.is_empty() => Err(ApiError::invalid_param(
            "input",
            "`input` must not be empty",
        )),
        Some(Value::Array(items)) => {
            let mut out: Vec<Value> = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => {
                        let role = item
                            .get("role")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad(i, "a message needs a `role`"))?;
                        let text = match item.get("content") {
                            Some(Value::String(s)) => s.clone(),
                            Some(Value::Array(parts)) => {
                                let mut t = Vec::new();
                                for p in parts {
                                    match p.get("type").and_then(Value::as_str) {
                                        Some("input_text" | "output_text" | "text") => t.push(
                                            p.get("text")
                                                .and_then(Value::as_str)
                                                .unwrap_or_default()
                                                .to_string(),
                                        ),
                                        other => {
                                            return Err(bad(
                                                i,
                                                &format!(
                                                    "content part type `{}` is not supported",
                                                    other.unwrap_or("?")
                                                ),
                                            ))
                                        }
                                    }
                                }
                                t.join("\n")
                            }
                            _ => {
                                return Err(bad(
                                    i,
                                    "a message needs `content` (text or text parts)",
                                ))
                            }
                        };
                        out.push(json!({"role": role, "content": text}));
                    }
                    "function_call" => {
                        let call = json!({"id": item.get("call_id"), "type": "function", "function": {
                            "name": item.get("name"), "arguments": item.get("arguments")}});
                        match out.last_mut() {
                            Some(last)
                                if last["role"] == "assistant"
                                    && last.get("tool_calls").is_some() =>
                            {
                                if let Some(a) = last["tool_calls"].as_array_mut() {
                                    a.push(call);
                                }
                            }
                            _ => out.push(
                                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                            ),
                        }
                    }
                    "function_call_output" => {
                        let output = match item.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v) => v.to_string(),
                            None => return Err(bad(i, "a function_call_output needs `output`")),
                        };
                        out.push(json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": output}));
                    }
                    other => {
                        return Err(bad(
                            i,
                            &format!("input items of type `{other}` are not supported"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::invalid_param(
            "input",
            "`input` must be a string or a list of items",
        )),
    }
}

/// The output items for `text` and what the conversation gains.
fn output_items(ctx: &Context, text: &str) -> (Vec<Value>, Vec<Value>) {
    let (reasoning, text) = match ctx.split {
        Some(s) => s.split(text),
        None => (None, text.to_string()),
    };
    let (content, calls) = match &ctx.tools {
        Some((plan, syntax)) => {
            let a = plan.answer(*syntax, &text);
            (a.content, a.calls)
        }
        None => (Some(text), Vec::new()),
    };
    let mut items = Vec::new();
    let mut turns = Vec::new();
    if let Some(r) = reasoning {
        items.push(json!({
            "type": "reasoning", "id": format!("rs_{:016x}", random_u64()), "status": "completed",
            "summary": [], "content": [{"type": "reasoning_text", "text": r}],
        }));
    }
    if let Some(text) = content
        .as_ref()
        .filter(|c| !c.is_empty() || calls.is_empty())
    {
        items.push(json!({
            "type": "message", "id": format!("msg_{:016x}", random_u64()), "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }));
    }
    for c in &calls {
        items.push(json!({
            "type": "function_call", "id": format!("fc_{:016x}", random_u64()), "call_id": c.id,
            "name": c.function.name, "arguments": c.function.arguments, "status": "completed",
        }));
    }
    let mut turn = json!({"role": "assistant", "content": content.clone().unwrap_or_default()});
    if !calls.is_empty() {
        turn["tool_calls"] = serde_json::to_value(&calls).unwrap_or_default();
    }
    turns.push(turn);
    (items, turns)
}

/// The finished response object (stored when `store` is on).
fn finish(ctx: &Context, text: &str, reason: Option<FinishReason>, output_tokens: usize) -> Value {
    let (items, turns) = output_items(ctx, text);
    let incomplete = reason == Some(FinishReason::Length);
    let mut r = json!({
        "id": ctx.id, "object": "response", "created_at": ctx.created,
        "status": if incomplete { "incomplete" } else { "completed" },
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "error": null, "model": ctx.model, "output": items,
        "usage": {
            "input_tokens": ctx.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": ctx.prompt_tokens + output_tokens,
        },
    });
    if let (Some(o), Some(e)) = (r.as_object_mut(), ctx.echo.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    if let Some(store) = &ctx.store {
        let mut conversation = ctx.conversation.as_array().cloned().unwrap_or_default();
        conversation.extend(turns);
        keep(
            store,
            ctx.id.clone(),
            Stored {
                response: r.clone(),
                conversation: Value::Array(conversation),
            },
        );
    }
    r
}

/// Writes Responses stream events (`response.created`, text deltas, the
/// items, `response.completed`).
struct ResponsesFormat {
    ctx: Context,
    text: String,
    tokens: usize,
    seq: u64,
    started_message: bool,
}

impl ResponsesFormat {
    fn event(&mut self, kind: &str, mut body: Value) -> String {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        body.to_string()
    }

    /// Whether the message's text is streamed as it is generated (not with
    /// tools or a reasoning split, whose text is read whole at the end).
    fn streams_text(&self) -> bool {
        self.ctx.tools.is_none() && self.ctx.split.is_none()
    }

    fn skeleton(&self, status: &str) -> Value {
        let mut r = json!({"id": self.ctx.id, "object": "response", "created_at": self.ctx.created,
            "status": status, "model": self.ctx.model, "output": [], "error": null,
            "incomplete_details": null, "usage": null});
        if let (Some(o), Some(e)) = (r.as_object_mut(), self.ctx.echo.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        r
    }
}

const MSG: &str = "msg_stream";

impl ChunkFormat for ResponsesFormat {
    fn opening(&mut self, _index: usize) -> Vec<String> {
        let r = self.skeleton("in_progress");
        vec![
            self.event("response.created", json!({"response": r.clone()})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    fn content(&mut self, _index: usize, text: String, _: Option<TokenLogprob>) -> Vec<String> {
        self.tokens += 1;
        self.text.push_str(&text);
        // With tools or a reasoning split the text is read whole at the end
        // (it may be a call, or reasoning).
        if !self.streams_text() || text.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if !self.started_message {
            self.started_message = true;
            out.push(self.event("response.output_item.added", json!({"output_index": 0,
                "item": {"type": "message", "id": MSG, "status": "in_progress", "role": "assistant", "content": []}})));
            out.push(self.event("response.content_part.added", json!({"item_id": MSG, "output_index": 0,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})));
        }
        out.push(self.event(
            "response.output_text.delta",
            json!({"item_id": MSG, "output_index": 0,
            "content_index": 0, "delta": text, "logprobs": []}),
        ));
        out
    }

    fn finish(&mut self, _index: usize, reason: FinishReason, _: Option<TernInfo>) -> Vec<String> {
        let text = std::mem::take(&mut self.text);
        let mut response = finish(&self.ctx, &text, Some(reason), self.tokens);
        let mut out = Vec::new();
        let streamed = self.streams_text();
        if streamed && !self.started_message {
            // An empty answer still announces its message.
            self.started_message = true;
            out.push(self.event("response.output_item.added", json!({"output_index": 0,
                "item": {"type": "message", "id": MSG, "status": "in_progress", "role": "assistant", "content": []}})));
        }
        let items = response["output"]
            .as_array_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let mut final_items = Vec::new();
        for (i, mut item) in items.into_iter().enumerate() {
            if item["type"] == "message" && streamed {
                item["id"] = json!(MSG);
                let t = item["content"][0]["text"].clone();
                out.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": MSG, "output_index": i,
                    "content_index": 0, "text": t, "logprobs": []}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": MSG, "output_index": i,
                    "content_index": 0, "part": item["content"][0].clone()}),
                ));
            } else {
                let mut added = item.clone();
                added["status"] = json!("in_progress");
                if item["type"] == "function_call" {
                    added["arguments"] = json!("");
                }
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": i, "item": added}),
                ));
                if item["type"] == "reasoning" {
                    let id = item["id"].clone();
                    let t = item["content"][0]["text"].clone();
                    out.push(self.event(
                        "response.reasoning_text.delta",
                        json!({"item_id": id, "output_index": i, "content_index": 0, "delta": t}),
                    ));
                    out.push(self.event(
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0, "text": t}),
                    ));
                } else if item["type"] == "function_call" {
                    let id = item["id"].clone();
                    out.push(self.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id,
                        "output_index": i, "delta": item["arguments"].clone()}),
                    ));
                    out.push(self.event("response.function_call_arguments.done", json!({"item_id": id,
                        "output_index": i, "arguments": item["arguments"].clone(), "name": item["name"].clone()})));
                } else {
                    let part = item["content"][0].clone();
                    let id = item["id"].clone();
                    out.push(self.event("response.content_part.added", json!({"item_id": id, "output_index": i,
                        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})));
                    out.push(self.event(
                        "response.output_text.delta",
                        json!({"item_id": id, "output_index": i,
                        "content_index": 0, "delta": part["text"].clone(), "logprobs": []}),
                    ));
                    out.push(self.event(
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": i,
                        "content_index": 0, "text": part["text"].clone(), "logprobs": []}),
                    ));
                    out.push(self.event(
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": i,
                        "content_index": 0, "part": part}),
                    ));
                }
            }
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": i, "item": item.clone()}),
            ));
            final_items.push(item);
        }
        response["output"] = Value::Array(final_items);
        if let Some(store) = &self.ctx.store {
            // Store what the client saw (the message's stream id).
            if let Ok(Some(mut s)) = store.get(&self.ctx.id) {
                s.response = response.clone();
                keep(store, self.ctx.id.clone(), s);
            }
        }
        let kind = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(kind, json!({"response": response})));
        out
    }

    /// Never called: Responses streams carry usage in `response.completed`
    /// and are built without `include_usage`.
    fn usage(&mut self, _: Usage, _: TernInfo) -> String {
        String::new()
    }
}
