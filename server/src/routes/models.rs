//! `GET /v1/models` and `GET /v1/models/{id}`: the one model this server runs.

use axum::extract::{Path, State};
use axum::Json;

use crate::openai::error::ApiError;
use crate::openai::models::{ModelCard, ModelList};
use crate::state::AppState;

/// Lists the served model.
pub async fn list(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    state.engine()?;
    Ok(Json(ModelList {
        object: "list",
        data: vec![ModelCard::new(state.model_id(), state.created())],
    }))
}

/// The served model's card, or 404 `model_not_found` for any other id.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    state.engine()?;
    state.check_model(Some(&id))?;
    Ok(Json(ModelCard::new(state.model_id(), state.created())))
}
