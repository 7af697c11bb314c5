//! `GET /metrics`: the engine's counters for Prometheus (only
//! `tern_model_ready 0` while the model is loading).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::prometheus;
use crate::state::AppState;

/// The scrape endpoint.
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let body = match state.engine() {
        Ok(engine) => prometheus::render(&engine.metrics().snapshot()),
        Err(_) => prometheus::render_loading(),
    };
    ([(CONTENT_TYPE, prometheus::CONTENT_TYPE)], body)
}
