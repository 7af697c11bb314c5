//! `GET /v1/models` wire types: the list holds the one model this server runs.

use serde::Serialize;

/// `{"object": "list", "data": [...]}`.
#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
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
