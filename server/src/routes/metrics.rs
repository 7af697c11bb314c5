//! `GET /metrics`: the engine's counters for Prometheus (only
//! `tern_model_ready 0` while the model is loading); on a several-model
//! server, the models' states and the memory they are charged.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::prometheus;
use crate::state::AppState;

/// The scrape endpoint.
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    if let Some(registry) = state.registry() {
        let mut body = String::new();
        prometheus::models(&mut body, &registry.status(), &registry.memory());
        let store = state.responses();
        if let Some((count, bytes)) = store.usage() {
            prometheus::responses_store(&mut body, count, bytes, store.max_bytes());
        }
        return ([(CONTENT_TYPE, prometheus::CONTENT_TYPE)], body);
    }
    let body = match state.engine() {
        Ok(engine) => {
            let mut body = prometheus::render(&engine.metrics().snapshot());
            let adapters = state.adapters();
            prometheus::adapters(
                &mut body,
                &adapters.names(),
                adapters.max(),
                crate::ids::unix_now(),
            );
            let store = state.responses();
            if let Some((count, bytes)) = store.usage() {
                prometheus::responses_store(&mut body, count, bytes, store.max_bytes());
            }
            body
        }
        Err(_) => prometheus::render_loading(),
    };
    ([(CONTENT_TYPE, prometheus::CONTENT_TYPE)], body)
}
