//! `GET /health`: 200 `{"status":"ok"}` once the model has loaded, a 503
//! (OpenAI error JSON) before, so load balancers wait for the weights.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::openai::error::ApiError;
use crate::state::AppState;

/// The health probe.
pub async fn health(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state.ready()?;
    Ok(Json(json!({"status": "ok"})))
}
