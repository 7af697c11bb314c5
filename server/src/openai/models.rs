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
}

impl ModelCard {
    /// The card for `id`, served since `created`.
    pub fn new(id: &str, created: u64) -> Self {
        Self {
            id: id.to_string(),
            object: "model",
            created,
            owned_by: "tern",
        }
    }
}
