//! `GET /v1/models` and `GET /v1/models/{id}`: the model this server runs and
//! the LoRA adapters loaded on it, or every model of a several-model server
//! with its state (loaded or not) and memory.

use axum::extract::{Path, State};
use axum::Json;

use crate::openai::error::ApiError;
use crate::openai::models::{ModelCard, ModelList, ModelState, ModelsMemory};
use crate::registry::{ModelRegistry, ModelStatus};
use crate::state::AppState;

/// Lists the served model(s).
pub async fn list(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    if let Some(registry) = state.registry() {
        return Ok(Json(several(registry)));
    }
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
        tern: None,
    }))
}

/// The served model's card, or 404 `model_not_found` for any other id.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    if let Some(registry) = state.registry() {
        return several(registry)
            .data
            .into_iter()
            .find(|c| c.id == id)
            .map(Json)
            .ok_or_else(|| ApiError::model_not_found(&id, &registry.names().join("`, `")));
    }
    state.engine()?;
    match state.resolve_model(Some(&id))? {
        (_, None) => Ok(Json(ModelCard::new(state.model_id(), state.created()))),
        (_, Some(_)) => Ok(Json(ModelCard::adapter(
            &id,
            state.model_id(),
            state.created(),
        ))),
    }
}

/// Every model of a several-model server, with its state, and the budget.
fn several(registry: &ModelRegistry) -> ModelList {
    let created = registry.created();
    let memory = registry.memory();
    ModelList {
        object: "list",
        data: registry
            .status()
            .into_iter()
            .map(|s| card(s, created))
            .collect(),
        tern: Some(ModelsMemory {
            memory_budget_bytes: memory.budget_bytes,
            memory_in_use_bytes: memory.in_use_bytes,
            idle_unload_s: memory.idle_unload_s,
        }),
    }
}

fn card(s: ModelStatus, created: u64) -> ModelCard {
    ModelCard {
        tern: Some(ModelState {
            state: s.state.name(),
            memory_bytes: s.memory_bytes,
            weights_bytes: s.weights_bytes,
            kv_memory_bytes: s.kv_memory_bytes,
            loads: s.loads,
        }),
        ..ModelCard::new(&s.id, created)
    }
}
