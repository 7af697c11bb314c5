//! `GET /v1/models` wire types: the list holds the model this server runs,
//! or on a server of several models every one of them with its state in a
//! `tern` object (whether it is loaded and what memory it is charged).

use serde::Serialize;

/// `{"object": "list", "data": [...]}`.
#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
    /// With several models: the memory budget they share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<ModelsMemory>,
}

/// The `tern` object of a several-model server's list.
#[derive(Clone, Debug, Serialize)]
pub struct ModelsMemory {
    /// `--models-memory`: what loaded models' weights and KV budgets may
    /// take together.
    pub memory_budget_bytes: usize,
    /// What loaded (and loading) models are charged now.
    pub memory_in_use_bytes: usize,
    /// `--model-idle-unload`, seconds (0: never).
    pub idle_unload_s: f64,
}

/// The `tern` object of one model on a several-model server.
#[derive(Clone, Debug, Serialize)]
pub struct ModelState {
    /// `loaded`, `loading` or `unloaded`.
    pub state: &'static str,
    /// Bytes charged against the budget now: weights plus KV budget while
    /// loaded, 0 unloaded.
    pub memory_bytes: usize,
    /// The weights' bytes (the GGUF file's size).
    pub weights_bytes: usize,
    /// The KV budget its engine has when loaded (`--kv-memory`).
    pub kv_memory_bytes: usize,
    /// Times it has been loaded since the server started.
    pub loads: u64,
}

/// One model, as `GET /v1/models/{id}` returns it.
#[derive(Clone, Debug, Serialize)]
pub struct ModelCard {
    /// The id clients pass as `model` (registry name or file stem).
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix time the server started.
    pub created: u64,
    /// Always `tern`.
    pub owned_by: &'static str,
    /// For a LoRA adapter loaded at run time, the model it adapts (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// With several models: its state and memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tern: Option<ModelState>,
}

impl ModelCard {
    /// The card for `id`, served since `created`.
    pub fn new(id: &str, created: u64) -> Self {
        Self {
            id: id.to_string(),
            object: "model",
            created,
            owned_by: "tern",
            parent: None,
            tern: None,
        }
    }

    /// The card of adapter `id` on the model `parent`.
    pub fn adapter(id: &str, parent: &str, created: u64) -> Self {
        Self {
            parent: Some(parent.to_string()),
            ..Self::new(id, created)
        }
    }
}
