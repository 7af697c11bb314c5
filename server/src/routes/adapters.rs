//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (vLLM's
//! endpoints and fields): add or drop a LoRA adapter by name while the server
//! runs; requests then name it as `model`. Off unless `--lora-dir` is set.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::adapters::AdapterRegistry;
use crate::body::{fields, JsonBody};
use crate::openai::error::ApiError;
use crate::prompt;
use crate::state::AppState;

/// `{"lora_name", "lora_path", "load_inplace"}`.
#[derive(Deserialize)]
struct LoadFields {
    lora_name: Option<String>,
    lora_path: Option<String>,
    /// Replace an adapter already loaded under this name (vLLM's field).
    load_inplace: Option<bool>,
}

/// `{"lora_name"}`.
#[derive(Deserialize)]
struct UnloadFields {
    lora_name: Option<String>,
}

fn required(v: Option<String>, name: &str) -> Result<String, ApiError> {
    v.filter(|s| !s.is_empty()).ok_or_else(|| {
        ApiError::invalid_param(name, format!("Missing required parameter: `{name}`"))
    })
}

/// Loads the adapter file at `lora_path` (under `--lora-dir`) as `lora_name`.
pub async fn load(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let engine = state.engine()?.clone();
    let f: LoadFields = fields(&body)?;
    let name = required(f.lora_name, "lora_name")?;
    let path = required(f.lora_path, "lora_path")?;
    let registry = state.adapters();
    let file = registry.admit(&name, &path, state.model_id())?;
    if engine.backend_name() != "tern" {
        return Err(ApiError::invalid_param(
            "lora_name",
            format!(
                "the {} backend cannot apply LoRA adapters; serve with --backend tern",
                engine.backend_name()
            ),
        ));
    }
    if registry.get(&name).is_some() && f.load_inplace != Some(true) {
        return Err(ApiError::invalid_param(
            "lora_name",
            format!("an adapter named `{name}` is already loaded (set load_inplace to replace it)"),
        ));
    }
    let config = engine.model().config().clone();
    let set = prompt::off_thread(move || AdapterRegistry::read_file(&file, &config)).await?;
    registry.insert(name.clone(), set);
    Ok(Json(json!({
        "object": "lora_adapter",
        "id": name,
        "message": format!("Success: LoRA adapter '{name}' added successfully."),
    })))
}

/// Drops the adapter `lora_name`; requests already running under it finish.
pub async fn unload(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    state.engine()?;
    let f: UnloadFields = fields(&body)?;
    let name = required(f.lora_name, "lora_name")?;
    let registry = state.adapters();
    registry.require_enabled()?;
    if !registry.remove(&name) {
        return Err(ApiError::not_found(
            "lora_name",
            format!("no LoRA adapter named `{name}` is loaded"),
        ));
    }
    Ok(Json(json!({
        "object": "lora_adapter",
        "id": name,
        "message": format!("Success: LoRA adapter '{name}' removed successfully."),
    })))
}
