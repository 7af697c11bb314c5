//! `POST /v1/chat/completions`: messages through the chat template into the
//! engine, answered as one `chat.completion` or as a stream of
//! `chat.completion.chunk`s.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use tern_runtime::chat::ChatMessage;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineHandle, FinishReason, TokenLogprob};
use tern_runtime::LoadedModel;
use tern_solve::reasoning::{BonRequest, TestSpec};

use crate::affinity;
use crate::body::{fields, JsonBody};
use crate::collect::{collect, finish_name, Collected};
use crate::events::Tally;
use crate::ids::{response_id, unix_now};
use crate::logprobs::{chat_entry, Vocab};
use crate::openai::chat::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatFields, ChatLogprobs,
    ChatTokenLogprob, ChunkChoice, Delta, WireMessage,
};
use crate::openai::error::ApiError;
use crate::openai::request::GenerationFields;
use crate::openai::usage::{TernInfo, Usage};
use crate::openai::{system_fingerprint, ResponseMeta};
use crate::overflow::{self, ContextOverflow, Overflowed, Shifted};
use crate::params::{self, EndpointInput, Plan};
use crate::prompt;
use crate::routes::spreadsheet::{self, SheetRequest};
use crate::routes::{best_of, reasoning};
use crate::state::{limits, AppState, Served};
use crate::stream::{sse_response, ChunkFormat, StreamState};
use crate::think::{self, ThinkSplit};
use crate::tools::{self, ToolCallDelta, ToolPlan};
use tern_runtime::chat::think_reader::{ThinkPiece, ThinkReader};
use tern_runtime::chat::tool_reader::{CallReader, Piece};
use tern_runtime::chat::tools::ToolSyntax;

/// The chat completions handler: reads and checks the request, templates
/// the conversation, plans the generation, then answers the way the
/// request asks (the spreadsheet setting, best-of-N, or one submission).
pub async fn chat_completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    state.ready()?;
    let shared: GenerationFields = fields(&body)?;
    let mut own: ChatFields = fields(&body)?;
    let served = state.serve_model(shared.model.as_deref()).await?;
    let engine = served.engine.clone();
    refuse_unsupported(&shared, &own)?;
    let tool_plan = tools::plan(
        own.tools.as_ref(),
        own.tool_choice.as_ref(),
        own.parallel_tool_calls,
    )?;
    let logprobs = params::chat_logprobs(own.logprobs, own.top_logprobs)?;
    let model = Arc::clone(engine.model());
    let max_tokens = params::merge_max_tokens(shared.max_tokens, own.max_completion_tokens);
    let content = state.content_tokens();
    let tools_used = tool_plan.is_some() || prompt::has_tool_turns(&body["messages"]);
    let (ids, messages) = if tools_used {
        (
            tool_prompt(&model, &body["messages"], tool_plan.as_ref(), content).await?,
            Vec::new(),
        )
    } else {
        plain_prompt(&model, own.messages.take(), content).await?
    };
    let rule = overflow_rule(own.context_overflow.as_deref(), &state)?;
    let (ids, shifted) = overflow::fit(&rule, ids, max_tokens.0, model.config().context_length)?;
    let past_context = match rule {
        ContextOverflow::Policy(p) => Some(p),
        _ => None,
    };
    let syntax = model
        .template
        .as_ref()
        .map_or(ToolSyntax::Hermes, |t| t.tool_syntax());
    let input = EndpointInput {
        prompt: ids,
        prompt_param: "messages",
        max_tokens,
        logprobs,
        past_context: past_context.is_some(),
    };
    let mut plan = params::plan(&shared, input, limits(&model), state.kv_defaults())?;
    plan.submit.adapters = served.adapters.clone();
    let overflow_spec = past_context.as_ref().map(ToString::to_string);
    plan.submit.overflow = past_context;
    force_tool_call(&mut plan, tool_plan.as_ref(), syntax)?;
    let tally = Tally::new(
        plan.submit.n,
        plan.submit.prompt.len(),
        plan.submit.kv_policy.to_string(),
    )
    .with_overflow(overflow_spec);
    let reasoning_fields = reasoning::ReasoningFields {
        effort: own.reasoning_effort.take(),
        budget: own.thinking_budget_tokens,
        max_tokens_given: max_tokens.0.is_some(),
    };
    let (tally, length) = reasoning::apply(reasoning_fields, &model, &mut plan, tally)?;
    let split = think::plan(
        own.reasoning_format.as_deref(),
        state.reasoning_format(),
        &model,
        &plan.submit.prompt,
    )?;
    constrain_free_text(&mut plan, tool_plan.as_ref(), syntax)?;
    let meta = ResponseMeta {
        id: response_id("chatcmpl"),
        object: "chat.completion",
        created: unix_now(),
        model: served.name.clone(),
        system_fingerprint: system_fingerprint(),
    };
    if let Some(raw) = own.spreadsheet.as_ref() {
        check_spreadsheet(&own, tools_used, &plan)?;
        let req = spreadsheet::request(
            raw,
            own.best_of,
            &messages,
            &plan,
            state.allow_code_execution(),
        )?;
        return answer_spreadsheet(engine, req, meta, content).await;
    }
    if let Some(best_of) = own.best_of.filter(|&b| b != 1) {
        check_best_of(tools_used, &plan)?;
        let synthesizer = state
            .synthesizer(own.synthesizer_model.as_deref(), &served)
            .await?;
        let mut req = best_of::request(
            best_of::Extension {
                best_of,
                aggregate: own.aggregate,
                tests: own.tests,
                generate_tests: own.generate_tests,
            },
            messages,
            &plan,
            state.allow_code_execution(),
        )?;
        // Every candidate reasons under the request's effort or budget.
        req.0.length = length;
        return answer_best_of(engine, &synthesizer, req, &plan, meta).await;
    }
    params::compile_constraint(&mut plan, &model).await?;
    let format = ChatFormat {
        meta,
        include_usage: plan.include_usage,
        vocab: model,
        logprobs: logprobs.is_some(),
        readers: Vec::new(),
        tools: tool_plan.map(|t| (t, syntax)),
        split,
        thinkers: Vec::new(),
        shifted,
    };
    answer(&engine, plan, format, tally).await
}

/// A 400 for the fields chat completions does not take.
fn refuse_unsupported(shared: &GenerationFields, own: &ChatFields) -> Result<(), ApiError> {
    if shared.return_tokens_as_token_ids == Some(true) {
        return Err(ApiError::unsupported(
            "return_tokens_as_token_ids",
            "return_tokens_as_token_ids on chat completions (use /v1/completions)",
        ));
    }
    if own.functions.as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(ApiError::unsupported(
            "functions",
            "the legacy `functions` field (send `tools`)",
        ));
    }
    Ok(())
}

/// The prompt of a conversation with tools: definitions, calls and results
/// go through the template (or Tern's default tool prompt where it has no
/// tools section).
async fn tool_prompt(
    model: &Arc<LoadedModel>,
    raw: &Value,
    tools: Option<&ToolPlan>,
    content: ContentTokens,
) -> Result<Vec<u32>, ApiError> {
    prompt::check_tool_conversation(raw)?;
    let model = Arc::clone(model);
    let raw = raw.clone();
    let list = tools.map(|t| t.tools.clone());
    prompt::off_thread(move || {
        model
            .conversation_prompt(&raw, list.as_ref(), content)
            .map_err(|e| ApiError::from_runtime(e, "messages"))
    })
    .await
}

/// The prompt of a conversation without tools, with its checked messages
/// (best-of-N and the spreadsheet setting send them on).
async fn plain_prompt(
    model: &Arc<LoadedModel>,
    messages: Option<Vec<WireMessage>>,
    content: ContentTokens,
) -> Result<(Vec<u32>, Vec<ChatMessage>), ApiError> {
    let messages = prompt::chat_messages(messages)?;
    let model = Arc::clone(model);
    prompt::off_thread(move || Ok((prompt::chat_prompt(&model, &messages, content)?, messages)))
        .await
}

/// The request's `context_overflow`, or the server's when it sends none.
fn overflow_rule(field: Option<&str>, state: &AppState) -> Result<ContextOverflow, ApiError> {
    match field {
        Some(s) => {
            ContextOverflow::parse(s).map_err(|e| ApiError::invalid_param("context_overflow", e))
        }
        None => Ok(state.context_overflow()),
    }
}

/// A forced tool call (`required` or a named function) holds the answer to
/// the call's grammar; it cannot also follow a response format or grammar.
fn force_tool_call(
    plan: &mut Plan,
    tool_plan: Option<&ToolPlan>,
    syntax: ToolSyntax,
) -> Result<(), ApiError> {
    if let Some(forced) = tool_plan
        .filter(|t| t.is_forced())
        .map(|t| t.constraint(syntax))
    {
        if plan.constraint.is_some() {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "a forced tool call (`required` or a named function) cannot be combined with a JSON `response_format` or `grammar`",
            ));
        }
        plan.constraint = Some(forced);
    }
    Ok(())
}

/// Refuses a constraint under reasoning, and gives `auto` tools their
/// constraint where the answer is otherwise free text.
fn constrain_free_text(
    plan: &mut Plan,
    tool_plan: Option<&ToolPlan>,
    syntax: ToolSyntax,
) -> Result<(), ApiError> {
    if plan.submit.think.is_some() {
        if let Some((_, param)) = &plan.constraint {
            // Reasoning writes free text and then a forced answer line; a
            // grammar over the whole output would constrain both.
            return Err(ApiError::invalid_param(
                *param,
                "structured outputs and forced tool calls cannot be combined with reasoning_effort or thinking_budget_tokens",
            ));
        }
    }
    if let Some(auto) = tool_plan.filter(|t| !t.is_forced()) {
        // `auto`: free prose, a call held to its schema once it begins;
        // not over a response format or grammar the request set, nor
        // through reasoning (whose answer is forced separately).
        if plan.constraint.is_none() && plan.submit.think.is_none() {
            plan.constraint = Some(auto.constraint(syntax));
        }
    }
    Ok(())
}

/// A 400 for what the spreadsheet setting cannot be combined with.
fn check_spreadsheet(own: &ChatFields, tools_used: bool, plan: &Plan) -> Result<(), ApiError> {
    if tools_used {
        return Err(ApiError::invalid_param(
            "spreadsheet",
            "spreadsheet cannot be combined with tools (the answer is a program)",
        ));
    }
    if let Some((_, param)) = &plan.constraint {
        return Err(ApiError::invalid_param(
            *param,
            "structured outputs cannot be combined with spreadsheet (the answer is a program)",
        ));
    }
    if own.aggregate.is_some() || own.tests.is_some() || own.generate_tests.is_some() {
        return Err(ApiError::invalid_param(
            "spreadsheet",
            "spreadsheet chooses among best_of programs by their outputs' agreement: \
             leave out aggregate, tests and generate_tests",
        ));
    }
    Ok(())
}

/// The spreadsheet setting's answer; its usage counts the opening turn's
/// prompt.
async fn answer_spreadsheet(
    engine: EngineHandle,
    req: SheetRequest,
    meta: ResponseMeta,
    content: ContentTokens,
) -> Result<Response, ApiError> {
    let opening = req.opening().to_vec();
    let counted = Arc::clone(engine.model());
    let prompt_tokens =
        prompt::off_thread(move || Ok(prompt::chat_prompt(&counted, &opening, content)?.len()))
            .await?;
    spreadsheet::respond(engine, req, meta, prompt_tokens).await
}

/// A 400 for what best-of-N cannot be combined with.
fn check_best_of(tools_used: bool, plan: &Plan) -> Result<(), ApiError> {
    if tools_used {
        return Err(ApiError::invalid_param(
            "best_of",
            "best_of cannot be combined with tools (candidates are aggregated as free text)",
        ));
    }
    if let Some((_, param)) = &plan.constraint {
        return Err(ApiError::invalid_param(
            *param,
            "structured outputs cannot be combined with best_of (candidates are aggregated as free text)",
        ));
    }
    Ok(())
}

/// Best-of-N's answer, written by `synthesizer` where it aggregates by
/// synthesis, with the prompt's affinity key.
async fn answer_best_of(
    engine: EngineHandle,
    synthesizer: &Served,
    req: (BonRequest, Option<TestSpec>),
    plan: &Plan,
    meta: ResponseMeta,
) -> Result<Response, ApiError> {
    let prompt_tokens = plan.submit.prompt.len();
    let key = affinity::prefix_key(&plan.submit.prompt);
    let writer = (synthesizer.name.clone(), synthesizer.engine.clone());
    best_of::respond(engine, writer, req, meta, prompt_tokens)
        .await
        .map(|r| affinity::with_key(r, key.as_deref()))
}

/// Submits `plan` and answers as `format` says: a stream of chunks, or one
/// `chat.completion` once every choice is done.
async fn answer(
    engine: &EngineHandle,
    plan: Plan,
    mut format: ChatFormat,
    tally: Tally,
) -> Result<Response, ApiError> {
    let key = affinity::prefix_key(&plan.submit.prompt);
    let events = engine
        .submit(plan.submit)
        .map_err(|e| ApiError::from_submit(e, "messages"))?;
    if plan.stream {
        format.meta = format.meta.with_object("chat.completion.chunk");
        return Ok(affinity::with_key(
            sse_response(events, StreamState::new(format, tally, plan.include_usage)),
            key.as_deref(),
        ));
    }
    let collected = collect(events, tally).await?;
    let body = Json(completion(
        format.meta,
        collected,
        format.logprobs,
        format.vocab.as_ref(),
        format.tools.as_ref().map(|(t, syntax)| (t, *syntax)),
        format.split,
        format.shifted,
    ));
    Ok(affinity::with_key(body.into_response(), key.as_deref()))
}

/// The non-streamed answer.
fn completion(
    meta: ResponseMeta,
    c: Collected,
    logprobs: bool,
    vocab: &dyn Vocab,
    tools: Option<(&ToolPlan, ToolSyntax)>,
    split: Option<ThinkSplit>,
    shifted: Option<Shifted>,
) -> ChatCompletion {
    let choices = c
        .choices
        .into_iter()
        .enumerate()
        .map(|(index, choice)| {
            let mut finish_reason = finish_name(choice.finish_reason);
            // The think block first; tool calls are read from the answer.
            let (reasoning_content, text) = match split {
                Some(s) => s.split(&choice.text),
                None => (None, choice.text),
            };
            let message = match tools.map(|(t, syntax)| t.answer(syntax, &text)) {
                Some(a) if !a.calls.is_empty() => {
                    finish_reason = a.finish_reason(finish_reason);
                    AssistantMessage {
                        role: "assistant",
                        content: a.content,
                        reasoning_content,
                        tool_calls: Some(a.calls),
                    }
                }
                _ => AssistantMessage {
                    role: "assistant",
                    content: Some(text),
                    reasoning_content,
                    tool_calls: None,
                },
            };
            ChatChoice {
                index,
                message,
                logprobs: logprobs.then(|| ChatLogprobs {
                    content: choice
                        .logprobs
                        .iter()
                        .filter_map(|lp| chat_entry(vocab, lp))
                        .collect(),
                }),
                finish_reason,
            }
        })
        .collect();
    let mut tern = c.tally.tern();
    if let Some(s) = shifted {
        tern.context_overflow = Some(Overflowed::Shift(s));
    }
    ChatCompletion {
        meta,
        choices,
        usage: c.tally.usage(),
        tern,
    }
}

/// Writes `chat.completion.chunk`s.
pub struct ChatFormat {
    /// id, object, created, model and fingerprint of every chunk.
    pub meta: ResponseMeta,
    /// Whether chunks carry `"usage": null` (and a usage chunk ends the stream).
    pub include_usage: bool,
    /// Token text for logprobs.
    pub vocab: Arc<dyn Vocab>,
    /// Whether content chunks carry logprobs.
    pub logprobs: bool,
    /// The request's tools: each choice's text is then read for calls as
    /// it comes, prose sent as content and calls as `tool_calls` deltas.
    pub tools: Option<(ToolPlan, ToolSyntax)>,
    /// Each choice's call reader and whether it sent a call (with tools).
    pub readers: Vec<(CallReader, bool)>,
    /// The reasoning split, when the model's think block is returned apart.
    pub split: Option<ThinkSplit>,
    /// Each choice's think reader (with a split): reasoning goes out as
    /// `reasoning_content` deltas, the answer on to the content path.
    pub thinkers: Vec<ThinkReader>,
    /// What `context_overflow: shift` dropped, reported in each `tern` object.
    pub shifted: Option<Shifted>,
}

impl ChatFormat {
    fn chunk(
        &self,
        choice: Option<ChunkChoice>,
        usage: Option<Usage>,
        mut tern: Option<TernInfo>,
    ) -> String {
        if let (Some(t), Some(s)) = (tern.as_mut(), &self.shifted) {
            t.context_overflow = Some(Overflowed::Shift(s.clone()));
        }
        let chunk = ChatChunk {
            meta: self.meta.clone(),
            choices: choice.into_iter().collect(),
            usage: self.include_usage.then_some(usage),
            tern,
        };
        serde_json::to_string(&chunk).unwrap_or_default()
    }
}

impl ChatFormat {
    /// A chunk carrying `delta` for choice `index` (no logprobs, not its last).
    fn delta_chunk(&self, index: usize, delta: Delta) -> String {
        let choice = ChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
        };
        self.chunk(Some(choice), None, None)
    }
}

impl ChatFormat {
    /// Chunks for what a choice's call reader said: prose as content, a
    /// call's name and its arguments' fragments as `tool_calls` deltas.
    fn tool_chunks(&mut self, index: usize, pieces: Vec<Piece>) -> Vec<String> {
        let mut out = Vec::new();
        for p in pieces {
            let (content, call) = match p {
                Piece::Content(text) => (Some(text), None),
                Piece::Begin { index: i, name } => {
                    if let Some(r) = self.readers.get_mut(index) {
                        r.1 = true;
                    }
                    (None, Some(ToolCallDelta::begin(i, name)))
                }
                Piece::Args { index: i, text } => (None, Some(ToolCallDelta::args(i, text))),
            };
            let delta = Delta {
                role: None,
                content,
                reasoning_content: None,
                tool_calls: call.map(|c| vec![c]),
            };
            out.push(self.delta_chunk(index, delta));
        }
        out
    }
}

impl ChunkFormat for ChatFormat {
    fn opening(&mut self, index: usize) -> Vec<String> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            reasoning_content: None,
            tool_calls: None,
        };
        vec![self.delta_chunk(index, delta)]
    }

    fn content(
        &mut self,
        index: usize,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Vec<String> {
        let entry = if self.logprobs {
            logprob
                .as_ref()
                .and_then(|lp| chat_entry(self.vocab.as_ref(), lp))
        } else {
            None
        };
        if let Some(split) = self.split {
            while self.thinkers.len() <= index {
                self.thinkers.push(split.reader());
            }
            let pieces = self.thinkers[index].push(&text);
            return self.think_chunks(index, pieces, entry);
        }
        self.answer_chunks(index, text, entry)
    }

    fn finish(
        &mut self,
        index: usize,
        reason: FinishReason,
        tern: Option<TernInfo>,
    ) -> Vec<String> {
        let mut finish_reason = finish_name(Some(reason));
        let mut chunks = Vec::new();
        if let Some(thinker) = self.thinkers.get_mut(index) {
            let pieces = thinker.finish();
            chunks = self.think_chunks(index, pieces, None);
        }
        if let Some((reader, _)) = self.readers.get_mut(index) {
            let pieces = reader.finish();
            chunks.extend(self.tool_chunks(index, pieces));
            // Calls that were sent make `tool_calls` the reason, unless the
            // token limit cut the answer (more calls may have been coming).
            if self.readers[index].1 && finish_reason != "length" {
                finish_reason = "tool_calls";
            }
        }
        let choice = ChunkChoice {
            index,
            delta: Delta::default(),
            logprobs: None,
            finish_reason: Some(finish_reason),
        };
        chunks.push(self.chunk(Some(choice), None, tern));
        chunks
    }

    fn usage(&mut self, usage: Usage, tern: TernInfo) -> String {
        self.chunk(None, Some(usage), Some(tern))
    }
}

impl ChatFormat {
    /// Chunks for what a choice's think reader said: reasoning as
    /// `reasoning_content` deltas, the answer down the content path. The
    /// token's logprob goes with its first chunk (or an empty content
    /// chunk when the reader held all of its text back).
    fn think_chunks(
        &mut self,
        index: usize,
        pieces: Vec<ThinkPiece>,
        mut entry: Option<ChatTokenLogprob>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                ThinkPiece::Reasoning(text) => {
                    let choice = ChunkChoice {
                        index,
                        delta: Delta {
                            reasoning_content: Some(text),
                            ..Delta::default()
                        },
                        logprobs: entry.take().map(|e| ChatLogprobs { content: vec![e] }),
                        finish_reason: None,
                    };
                    out.push(self.chunk(Some(choice), None, None));
                }
                ThinkPiece::Content(text) => {
                    out.extend(self.answer_chunks(index, text, entry.take()))
                }
            }
        }
        if entry.is_some() {
            out.extend(self.answer_chunks(index, String::new(), entry));
        }
        out
    }

    /// Chunks for answer text: read for tool calls when the request has
    /// tools, else one content delta.
    fn answer_chunks(
        &mut self,
        index: usize,
        text: String,
        entry: Option<ChatTokenLogprob>,
    ) -> Vec<String> {
        if let Some((plan, syntax)) = &self.tools {
            while self.readers.len() <= index {
                self.readers.push((plan.reader(*syntax), false));
            }
            let pieces = self.readers[index].0.push(&text);
            return self.tool_chunks(index, pieces);
        }
        if text.is_empty() && entry.is_none() {
            return Vec::new();
        }
        let choice = ChunkChoice {
            index,
            delta: Delta {
                content: Some(text),
                ..Delta::default()
            },
            logprobs: entry.map(|e| ChatLogprobs { content: vec![e] }),
            finish_reason: None,
        };
        vec![self.chunk(Some(choice), None, None)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::kv;
    use crate::logprobs::tests::Letters;
    use serde_json::Value;
    use tern_runtime::engine::Event;

    fn format(include_usage: bool) -> ChatFormat {
        ChatFormat {
            meta: ResponseMeta {
                id: "chatcmpl-1".into(),
                object: "chat.completion.chunk",
                created: 1,
                model: "m".into(),
                system_fingerprint: "tern-test".into(),
            },
            include_usage,
            vocab: Arc::new(Letters),
            logprobs: true,
            tools: None,
            readers: Vec::new(),
            split: None,
            thinkers: Vec::new(),
            shifted: None,
        }
    }

    fn stream(include_usage: bool, n: usize) -> Vec<Value> {
        let mut s = StreamState::new(
            format(include_usage),
            Tally::new(n, 4, "full".into()),
            include_usage,
        );
        let mut events = vec![Event::Prefilled { prompt_tokens: 4 }];
        for i in 0..n {
            events.push(Event::Token {
                index: i,
                token: 7,
                text: "h".into(),
                logprob: Some(TokenLogprob {
                    token: 7,
                    logprob: -0.25,
                    top: vec![(7, -0.25)],
                }),
            });
        }
        for i in 0..n {
            events.push(Event::Done {
                index: i,
                finish_reason: FinishReason::Length,
                completion_tokens: 1,
                kv: kv(10, 40),
            });
        }
        events
            .into_iter()
            .flat_map(|e| s.on_event(e))
            .map(|p| serde_json::from_str(&p).unwrap_or(Value::String(p)))
            .collect()
    }

    #[test]
    fn a_streamed_tool_call_arrives_as_deltas_while_generated() {
        let tools = vec![serde_json::json!({"type": "function", "function": {"name": "add"}})];
        let plan = crate::tools::plan(Some(&tools), None, None)
            .unwrap()
            .unwrap();
        let mut f = format(false);
        f.tools = Some((plan, ToolSyntax::Hermes));
        let mut s = StreamState::new(f, Tally::new(1, 4, "full".into()), false);
        let text =
            "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
        let mut events = vec![Event::Prefilled { prompt_tokens: 4 }];
        for piece in text.split_inclusive(' ') {
            events.push(Event::Token {
                index: 0,
                token: 7,
                text: piece.into(),
                logprob: None,
            });
        }
        let tokens = events.len() - 1;
        events.push(Event::Done {
            index: 0,
            finish_reason: FinishReason::Stop,
            completion_tokens: 5,
            kv: kv(10, 40),
        });
        // (event number, chunk) pairs.
        let v: Vec<(usize, Value)> = events
            .into_iter()
            .enumerate()
            .flat_map(|(i, e)| s.on_event(e).into_iter().map(move |p| (i, p)))
            .map(|(i, p)| (i, serde_json::from_str(&p).unwrap_or(Value::String(p))))
            .collect();
        let delta = |c: &Value| c["choices"][0]["delta"].clone();
        let content: String = v
            .iter()
            .filter_map(|(_, c)| delta(c)["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(content.trim(), "Sure.");
        let calls: Vec<(usize, Value)> = v
            .iter()
            .filter(|(_, c)| delta(c)["tool_calls"].is_array())
            .map(|(i, c)| (*i, delta(c)["tool_calls"][0].clone()))
            .collect();
        let (at, first) = &calls[0];
        assert_eq!(first["index"], 0);
        assert_eq!(first["type"], "function");
        assert_eq!(first["function"]["name"], "add");
        assert!(first["id"].as_str().unwrap().starts_with("call_"));
        // The name goes out before the last token arrives, and the
        // arguments in several fragments that join to the JSON.
        assert!(*at < tokens, "name sent at event {at} of {tokens}");
        assert!(calls.len() >= 3, "{calls:?}");
        let args: String = calls
            .iter()
            .map(|(_, c)| c["function"]["arguments"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(args, r#"{"a": 1, "b": 2}"#);
        assert!(calls[1..].iter().all(|(_, c)| c.get("id").is_none()));
        let last = &v[v.len() - 2].1;
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_think_block_streams_as_reasoning_deltas_apart_from_content() {
        let mut f = format(false);
        f.split = Some(ThinkSplit::new(false));
        let mut s = StreamState::new(f, Tally::new(1, 4, "full".into()), false);
        let mut events = vec![Event::Prefilled { prompt_tokens: 4 }];
        // The tags cut across tokens, as a vocabulary without them writes them.
        for piece in ["<thi", "nk>\nTwo", " and two.\n</", "think>\n\n", "Four."] {
            events.push(Event::Token {
                index: 0,
                token: 7,
                text: piece.into(),
                logprob: None,
            });
        }
        events.push(Event::Done {
            index: 0,
            finish_reason: FinishReason::Stop,
            completion_tokens: 5,
            kv: kv(10, 40),
        });
        let deltas: Vec<Value> = events
            .into_iter()
            .flat_map(|e| s.on_event(e))
            .filter_map(|p| serde_json::from_str::<Value>(&p).ok())
            .map(|c| c["choices"][0]["delta"].clone())
            .collect();
        let joined =
            |key: &str| -> String { deltas.iter().filter_map(|d| d[key].as_str()).collect() };
        assert_eq!(joined("reasoning_content"), "Two and two.");
        assert_eq!(joined("content"), "Four.");
        // Every reasoning delta comes before the answer's first text.
        let first_content = deltas
            .iter()
            .position(|d| d["content"].as_str().is_some_and(|c| !c.is_empty()))
            .unwrap();
        assert!(deltas[first_content..]
            .iter()
            .all(|d| d.get("reasoning_content").is_none()));
        // Without a split the text is left as generated.
        let v = stream(false, 1);
        assert!(v
            .iter()
            .all(|c| c["choices"][0]["delta"].get("reasoning_content").is_none()));
    }

    #[test]
    fn chunks_follow_openai_order_and_shape() {
        let v = stream(false, 2);
        assert_eq!(v.len(), 7);
        for chunk in &v[..6] {
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["id"], "chatcmpl-1");
            assert_eq!(chunk["system_fingerprint"], "tern-test");
            assert!(chunk.get("usage").is_none());
        }
        assert_eq!(v[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v[0]["choices"][0]["delta"]["content"], "");
        assert!(v[0]["choices"][0]["finish_reason"].is_null());
        assert!(v[2]["choices"][0]["delta"].get("role").is_none());
        assert_eq!(v[2]["choices"][0]["delta"]["content"], "h");
        assert_eq!(
            v[2]["choices"][0]["logprobs"]["content"][0]["logprob"],
            -0.25
        );
        let finishes: Vec<_> = v
            .iter()
            .filter(|c| c["choices"][0]["finish_reason"].is_string())
            .collect();
        assert_eq!(finishes.len(), 2);
        assert_eq!(finishes[0]["choices"][0]["finish_reason"], "length");
        assert!(finishes[0].get("tern").is_none());
        assert_eq!(finishes[1]["tern"]["kv_bytes"], 10);
        assert_eq!(finishes[1]["tern"]["kv_bytes_full"], 40);
        assert_eq!(v[6], Value::String("[DONE]".into()));
    }

    #[test]
    fn include_usage_adds_null_usage_and_a_final_usage_chunk() {
        let v = stream(true, 1);
        assert_eq!(v.len(), 5);
        for chunk in &v[..3] {
            assert!(chunk["usage"].is_null() && chunk.get("usage").is_some());
        }
        let last = &v[3];
        assert_eq!(last["choices"], Value::Array(vec![]));
        assert_eq!(last["usage"]["prompt_tokens"], 4);
        assert_eq!(last["usage"]["completion_tokens"], 1);
        assert_eq!(last["usage"]["total_tokens"], 5);
        assert_eq!(last["tern"]["prompt_tokens"], 4);
        assert_eq!(v[4], Value::String("[DONE]".into()));
    }
}
