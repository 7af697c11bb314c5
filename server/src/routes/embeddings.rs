//! `POST /v1/embeddings`: inputs into the engine's embedding queue, answered
//! as OpenAI's list of embeddings.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use tern_runtime::engine::EmbedRequest;

use crate::body::{fields, JsonBody};
use crate::embedding::{dimensions, encoding, inputs, vector};
use crate::openai::embedding::{EmbeddingData, EmbeddingFields, EmbeddingList, EmbeddingUsage};
use crate::openai::error::ApiError;
use crate::prompt;
use crate::state::AppState;

/// The embeddings handler.
pub async fn embeddings(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<EmbeddingList>, ApiError> {
    state.ready()?;
    let mut f: EmbeddingFields = fields(&body)?;
    let served = state.serve_model(f.model.as_deref()).await?;
    let engine = served.engine.clone();
    if served.adapters.is_some() {
        return Err(ApiError::invalid_param(
            "model",
            "embeddings come from the served model itself, not a LoRA adapter",
        ));
    }
    let model = Arc::clone(engine.model());
    let encoding = encoding(f.encoding_format.as_deref())?;
    let dims = dimensions(f.dimensions, model.config().n_embd)?;
    let input = std::mem::take(&mut f.input);
    let tokens = prompt::off_thread(move || inputs(&model, &input)).await?;
    let prompt_tokens = tokens.iter().map(Vec::len).sum();
    let rx = engine
        .embed(EmbedRequest {
            inputs: tokens,
            pooling: state.embedding_pooling(),
        })
        .map_err(|e| ApiError::from_submit(e, "input"))?;
    let vectors = rx
        .recv()
        .await
        .map_err(|e| ApiError::from_runtime(e, "input"))?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| EmbeddingData {
            object: "embedding",
            index,
            embedding: vector(v, dims, encoding),
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list",
        data,
        model: served.name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }))
}
