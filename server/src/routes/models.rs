//! `GET /v1/models` and `GET /v1/models/{id}`: the model this server runs and
//! the LoRA adapters loaded on it.

use axum::extract::{Path, State};
use axum::Json;

use crate::openai::error::ApiError;
use crate::openai::models::{ModelCard, ModelList};
use crate::state::AppState;

/// Lists the served model.
pub async fn list(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    state.engine()?;
    let mut data = vec![ModelCard::new(state.model_id(), state.created())];
    data.extend(
        state
            .adapters()
            .names()
            .iter()
            .map(|n| ModelCard::adapter(n, state.model_id(), state.created())),
    );
    Ok(Json(ModelList {
        object: "list",
        data,
    }))
}

/// The served model's card, or 404 `model_not_found` for any other id.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    state.engine()?;
    match state.resolve_model(Some(&id))?.adapters {
        None => Ok(Json(ModelCard::new(state.model_id(), state.created()))),
        Some(_) => Ok(Json(ModelCard::adapter(
            &id,
            state.model_id(),
            state.created(),
        ))),
    }
}
