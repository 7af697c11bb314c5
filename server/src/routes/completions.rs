//! `POST /v1/completions`: a raw prompt into the engine (no chat template),
//! answered as one `text_completion` or as a stream of them.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tern_runtime::engine::{FinishReason, TokenLogprob};

use crate::affinity;
use crate::body::{fields, JsonBody};
use crate::collect::{collect, finish_name, Collected};
use crate::events::Tally;
use crate::ids::{response_id, unix_now};
use crate::logprobs::{LegacyBuilder, Vocab};
use crate::openai::completion::{
    CompletionChoice, CompletionFields, LegacyLogprobs, TextCompletion,
};
use crate::openai::error::ApiError;
use crate::openai::request::GenerationFields;
use crate::openai::usage::{TernInfo, Usage};
use crate::openai::{system_fingerprint, ResponseMeta};
use crate::params::{self, EndpointInput};
use crate::prompt;
use crate::state::{limits, AppState};
use crate::stream::{sse_response, ChunkFormat, StreamState};

/// The text completions handler.
pub async fn completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    state.ready()?;
    let shared: GenerationFields = fields(&body)?;
    let mut own: CompletionFields = fields(&body)?;
    let served = state.serve_model(shared.model.as_deref()).await?;
    let engine = served.engine.clone();
    if own.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo"));
    }
    if own.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix"));
    }
    if own.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::unsupported("best_of", "best_of other than 1"));
    }
    let logprobs = params::completion_logprobs(own.logprobs)?;
    let ids_out = shared.return_tokens_as_token_ids.unwrap_or(false);
    let model = Arc::clone(engine.model());
    let text = std::mem::take(&mut own.prompt);
    let ids = {
        let model = Arc::clone(&model);
        prompt::off_thread(move || prompt::completion_prompt(&model, &text)).await?
    };
    let input = EndpointInput {
        prompt: ids,
        prompt_param: "prompt",
        max_tokens: (shared.max_tokens, "max_tokens"),
        logprobs,
        past_context: false,
    };
    let mut plan = params::plan(&shared, input, limits(&model), state.kv_defaults())?;
    plan.submit.adapters = served.adapters;
    params::compile_constraint(&mut plan, &model).await?;
    let tally = Tally::new(
        plan.submit.n,
        plan.submit.prompt.len(),
        plan.submit.kv_policy.to_string(),
    );
    let meta = ResponseMeta {
        id: response_id("cmpl"),
        object: "text_completion",
        created: unix_now(),
        model: served.name,
        system_fingerprint: system_fingerprint(),
    };
    let vocab: Arc<dyn Vocab> = model;
    let key = affinity::prefix_key(&plan.submit.prompt);
    let events = engine
        .submit(plan.submit)
        .map_err(|e| ApiError::from_submit(e, "prompt"))?;
    if plan.stream {
        let n = tally.n();
        let format = CompletionFormat {
            meta,
            include_usage: plan.include_usage,
            vocab,
            logprobs: logprobs.map(|_| (0..n).map(|_| LegacyBuilder::new(ids_out)).collect()),
        };
        return Ok(affinity::with_key(
            sse_response(events, StreamState::new(format, tally, plan.include_usage)),
            key.as_deref(),
        ));
    }
    let collected = collect(events, tally).await?;
    let body = Json(completion(
        meta,
        collected,
        logprobs.is_some().then_some(ids_out),
        vocab.as_ref(),
    ));
    Ok(affinity::with_key(body.into_response(), key.as_deref()))
}

/// The non-streamed answer; `logprobs` says whether they were asked for and
/// whether tokens are named by id.
fn completion(
    meta: ResponseMeta,
    c: Collected,
    logprobs: Option<bool>,
    vocab: &dyn Vocab,
) -> TextCompletion {
    let choices = c
        .choices
        .into_iter()
        .enumerate()
        .map(|(index, choice)| {
            let logprobs = logprobs.map(|ids| {
                let mut builder = LegacyBuilder::new(ids);
                let mut out = LegacyLogprobs::default();
                for lp in &choice.logprobs {
                    builder.push(vocab, lp, &mut out);
                }
                out
            });
            CompletionChoice {
                index,
                text: choice.text,
                logprobs,
                finish_reason: Some(finish_name(choice.finish_reason)),
            }
        })
        .collect();
    TextCompletion {
        meta,
        choices,
        usage: Some(Some(c.tally.usage())),
        tern: Some(c.tally.tern()),
    }
}

/// Writes streamed `text_completion` chunks.
pub struct CompletionFormat {
    /// id, object, created, model and fingerprint of every chunk.
    pub meta: ResponseMeta,
    /// Whether chunks carry `"usage": null` (and a usage chunk ends the stream).
    pub include_usage: bool,
    /// Token text for logprobs.
    pub vocab: Arc<dyn Vocab>,
    /// One legacy-logprobs builder per choice, when logprobs were asked for.
    pub logprobs: Option<Vec<LegacyBuilder>>,
}

impl CompletionFormat {
    fn chunk(
        &self,
        choice: Option<CompletionChoice>,
        usage: Option<Usage>,
        tern: Option<TernInfo>,
    ) -> String {
        let chunk = TextCompletion {
            meta: self.meta.clone(),
            choices: choice.into_iter().collect(),
            usage: self.include_usage.then_some(usage),
            tern,
        };
        serde_json::to_string(&chunk).unwrap_or_default()
    }
}

impl ChunkFormat for CompletionFormat {
    fn opening(&mut self, _index: usize) -> Vec<String> {
        // Text completions have no role to announce.
        Vec::new()
    }

    fn content(
        &mut self,
        index: usize,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Vec<String> {
        let mut lps = None;
        if let (Some(builders), Some(lp)) = (&mut self.logprobs, &logprob) {
            if let Some(b) = builders.get_mut(index) {
                let mut out = LegacyLogprobs::default();
                b.push(self.vocab.as_ref(), lp, &mut out);
                lps = (!out.tokens.is_empty()).then_some(out);
            }
        }
        if text.is_empty() && lps.is_none() {
            return Vec::new();
        }
        let choice = CompletionChoice {
            index,
            text,
            logprobs: lps,
            finish_reason: None,
        };
        vec![self.chunk(Some(choice), None, None)]
    }

    fn finish(
        &mut self,
        index: usize,
        reason: FinishReason,
        tern: Option<TernInfo>,
    ) -> Vec<String> {
        let choice = CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(finish_name(Some(reason))),
        };
        vec![self.chunk(Some(choice), None, tern)]
    }

    fn usage(&mut self, usage: Usage, tern: TernInfo) -> String {
        self.chunk(None, Some(usage), Some(tern))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::kv;
    use crate::logprobs::tests::Letters;
    use serde_json::Value;
    use tern_runtime::engine::Event;

    #[test]
    fn stream_chunks_are_text_completions_with_legacy_logprobs() {
        let format = CompletionFormat {
            meta: ResponseMeta {
                id: "cmpl-1".into(),
                object: "text_completion",
                created: 1,
                model: "m".into(),
                system_fingerprint: "tern-test".into(),
            },
            include_usage: false,
            vocab: Arc::new(Letters),
            logprobs: Some(vec![LegacyBuilder::default()]),
        };
        let mut s = StreamState::new(format, Tally::new(1, 2, "full".into()), false);
        let lp = |t| {
            Some(TokenLogprob {
                token: t,
                logprob: -1.0,
                top: vec![],
            })
        };
        let events = vec![
            Event::Prefilled { prompt_tokens: 2 },
            Event::Token {
                index: 0,
                token: 0,
                text: "a".into(),
                logprob: lp(0),
            },
            Event::Token {
                index: 0,
                token: 1,
                text: "b".into(),
                logprob: lp(1),
            },
            Event::Done {
                index: 0,
                finish_reason: FinishReason::Stop,
                completion_tokens: 2,
                kv: kv(1, 1),
            },
        ];
        let v: Vec<Value> = events
            .into_iter()
            .flat_map(|e| s.on_event(e))
            .map(|p| serde_json::from_str(&p).unwrap_or(Value::String(p)))
            .collect();
        assert_eq!(v.len(), 4);
        assert_eq!(v[0]["object"], "text_completion");
        assert_eq!(v[0]["choices"][0]["text"], "a");
        assert_eq!(v[1]["choices"][0]["logprobs"]["text_offset"][0], 1);
        assert_eq!(v[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(v[2]["tern"]["kv_policy"], "full");
        assert_eq!(v[3], Value::String("[DONE]".into()));
    }
}
