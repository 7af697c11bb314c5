//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's
//! Messages API, so Anthropic-SDK clients and coding agents can use the
//! served model.
//!
//! A request is checked and converted into a chat completions body
//! (`anthropic::request`) and run by the chat handler itself, streamed, so
//! template, tool prompt, tool-call grammar and reading, sampling and engine
//! admission are chat's own. Its chunks come back through
//! `anthropic::reply` as Anthropic's events, or folded into one `message`.
//! `count_tokens` renders the same prompt without running it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderName;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use tern_runtime::LoadedModel;

use crate::affinity;
use crate::anthropic::reply::{Accumulator, Translator};
use crate::anthropic::request;
use crate::anthropic::upstream::ChatEvents;
use crate::anthropic::wire::{Event, Message};
use crate::body::{fields, JsonBody};
use crate::ids::random_u64;
use crate::openai::chat::ChatFields;
use crate::openai::error::ApiError;
use crate::prompt;
use crate::routes::chat;
use crate::state::AppState;
use crate::tools;

/// `POST /v1/messages`.
pub async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let req = request::convert(&body)?;
    let max_tokens = req.max_tokens.ok_or_else(|| {
        ApiError::invalid_param("max_tokens", "Missing required parameter: `max_tokens`")
    })?;
    let served = state.serve_model(Some(&req.model)).await?;
    let model = Arc::clone(served.engine.model());
    let context = model.config().context_length;
    let input_tokens = prompt_tokens(&state, model, &req.chat).await?;
    // Anthropic clients send a fixed `max_tokens` (coding agents: tens of
    // thousands) whatever the model; cap it at the room the context leaves
    // rather than refuse. A prompt that leaves none is chat's 400.
    let room = context.saturating_sub(input_tokens).max(1);
    let mut chat_body = req.chat;
    chat_body["max_tokens"] = json!(usize::try_from(max_tokens).map_or(room, |m| m.min(room)));
    chat_body["stream"] = json!(true);
    chat_body["stream_options"] = json!({"include_usage": true});
    let upstream = chat::chat_completions(State(state), JsonBody(chat_body)).await?;
    let key = upstream.headers().get(affinity::HEADER).cloned();
    let id = format!("msg_{:016x}{:016x}", random_u64(), random_u64());
    let translator = Translator::new(id, served.name, input_tokens, req.stop_sequences);
    let events = ChatEvents::new(upstream.into_body());
    let mut res = if req.stream {
        sse(events, translator)
    } else {
        Json(collect(events, translator).await?).into_response()
    };
    if let Some(k) = key {
        res.headers_mut()
            .insert(HeaderName::from_static(affinity::HEADER), k);
    }
    Ok(res)
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt
/// `/v1/messages` would run for the same fields (system, messages, tools).
pub async fn count_tokens(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let req = request::convert(&body)?;
    let served = state.serve_model(Some(&req.model)).await?;
    let n = prompt_tokens(&state, Arc::clone(served.engine.model()), &req.chat).await?;
    Ok(Json(json!({"input_tokens": n})))
}

/// Tokens of the prompt the chat handler renders for `chat` (a chat
/// completions body): the same path it takes (the tool-aware conversation
/// with tools or tool turns, the plain template otherwise), the same
/// template and content-token setting, on `model`.
async fn prompt_tokens(
    state: &AppState,
    model: Arc<LoadedModel>,
    chat: &Value,
) -> Result<usize, ApiError> {
    let own: ChatFields = fields(chat)?;
    let plan = tools::plan(
        own.tools.as_ref(),
        own.tool_choice.as_ref(),
        own.parallel_tool_calls,
    )?;
    let content = state.content_tokens();
    let raw = chat["messages"].clone();
    let ids = if plan.is_some() || prompt::has_tool_turns(&raw) {
        prompt::check_tool_conversation(&raw)?;
        let list = plan.map(|p| p.tools);
        prompt::off_thread(move || {
            model
                .conversation_prompt(&raw, list.as_ref(), content)
                .map_err(|e| ApiError::from_runtime(e, "messages"))
        })
        .await?
    } else {
        let messages = prompt::chat_messages(own.messages)?;
        prompt::off_thread(move || prompt::chat_prompt(&model, &messages, content)).await?
    };
    Ok(ids.len())
}

/// The whole answer as one `message`; a failure midway is a 500.
async fn collect(mut events: ChatEvents, mut t: Translator) -> Result<Message, ApiError> {
    let mut acc = Accumulator::default();
    let mut batch = t.start();
    loop {
        for e in batch {
            acc.apply(e).map_err(ApiError::internal)?;
        }
        if t.is_finished() {
            break;
        }
        batch = match events.next().await {
            Some(step) => t.on_upstream(step),
            None => t.on_closed(),
        };
    }
    // (The chat stream is dropped here: a stop sequence cancels the request.)
    acc.finish()
        .ok_or_else(|| ApiError::internal("the answer never started"))
}

/// The answer as Anthropic's server-sent events, with `ping` events while
/// the engine is busy elsewhere. The chat stream lives inside the body, so
/// a client that leaves cancels the request.
fn sse(events: ChatEvents, t: Translator) -> Response {
    let first = t.start();
    let rest = stream::unfold(Some((events, t)), |slot| async move {
        let (mut events, mut t) = slot?;
        loop {
            let out = match events.next().await {
                Some(step) => t.on_upstream(step),
                None => t.on_closed(),
            };
            if t.is_finished() {
                return Some((out, None));
            }
            if !out.is_empty() {
                return Some((out, Some((events, t))));
            }
        }
    });
    let all = stream::iter([first])
        .chain(rest)
        .flat_map(|batch| stream::iter(batch.into_iter().map(|e| Ok::<_, Infallible>(e.sse()))));
    Sse::new(all)
        .keep_alive(KeepAlive::new().event(Event::Ping.sse()))
        .into_response()
}
