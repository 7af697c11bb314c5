//! What every handler shares: the served model's identity, the server's
//! settings, and the engine once the model has loaded.
//!
//! The engine slot starts empty: `serve` binds and answers (503 while
//! loading) before the weights are read, then fills it exactly once.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tern_models::LoraSet;
use tern_runtime::engine::{EngineHandle, Pooling};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::LoadedModel;

use tern_runtime::chat_prompt::ContentTokens;

use crate::adapters::AdapterRegistry;
use crate::ids::unix_now;
use crate::openai::error::ApiError;
use crate::origin::HostPolicy;
use crate::overflow::ContextOverflow;
use crate::params::ModelLimits;
use crate::response_store::ResponseStore;
use crate::think::ReasoningFormat;
use crate::{Cors, ServerConfig};

/// Shared state, cheap to clone into every handler.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    model_id: String,
    created: u64,
    kv_policy: KvPolicy,
    kv_dtype: KvDtype,
    api_key: Option<String>,
    max_body: usize,
    cors: Cors,
    hosts: HostPolicy,
    metrics_public: bool,
    content_tokens: ContentTokens,
    allow_code_execution: bool,
    reasoning_format: ReasoningFormat,
    context_overflow: ContextOverflow,
    body_timeout: Duration,
    embedding_pooling: Pooling,
    responses: Arc<ResponseStore>,
    adapters: AdapterRegistry,
    engine: OnceLock<EngineHandle>,
    synthesizer: OnceLock<(String, EngineHandle)>,
}

impl AppState {
    /// State for `config`, with the model not loaded yet and responses
    /// stored in memory.
    pub fn new(config: &ServerConfig) -> Self {
        Self::with_store(config, ResponseStore::new(config.responses_store))
    }

    /// State for `config` with `responses` as the Responses store, bounded
    /// to the config's `responses_store_bytes`.
    pub fn with_store(config: &ServerConfig, responses: ResponseStore) -> Self {
        let responses = responses.with_max_bytes(config.responses_store_bytes);
        Self(Arc::new(Inner {
            model_id: config.model_id.clone(),
            created: unix_now(),
            kv_policy: config.kv_policy.clone(),
            kv_dtype: config.kv_dtype,
            api_key: config.api_key.clone(),
            max_body: config.max_body,
            cors: config.cors.clone(),
            hosts: HostPolicy::new(&config.host, config.port, &config.allowed_hosts),
            metrics_public: config.metrics_public,
            content_tokens: config.content_tokens,
            allow_code_execution: config.allow_code_execution,
            reasoning_format: config.reasoning_format,
            context_overflow: config.context_overflow,
            body_timeout: config.connections.body_timeout,
            embedding_pooling: config.embedding_pooling,
            responses: Arc::new(responses),
            adapters: AdapterRegistry::new(config.lora_dir.as_deref(), config.max_loras),
            engine: OnceLock::new(),
            synthesizer: OnceLock::new(),
        }))
    }

    /// Marks the model loaded; requests are served from now on. A second
    /// call is ignored (the first engine keeps serving).
    pub fn set_engine(&self, engine: EngineHandle) {
        let _ = self.0.engine.set(engine);
    }

    /// Adds the synthesizer model's engine (`--synthesizer-model`), named
    /// `id`; set before the main engine so a ready server always has it.
    pub fn set_synthesizer(&self, id: String, engine: EngineHandle) {
        let _ = self.0.synthesizer.set((id, engine));
    }

    /// The engine that writes syntheses for a request naming
    /// `synthesizer_model` (or not): the loaded synthesizer, or the served
    /// model itself, with its id; a name that is neither is a 400.
    pub fn synthesizer(&self, requested: Option<&str>) -> Result<(String, EngineHandle), ApiError> {
        let main = || Ok((self.0.model_id.clone(), self.engine()?.clone()));
        let loaded = self.0.synthesizer.get();
        match (requested, loaded) {
            (None, Some(s)) => Ok(s.clone()),
            (None, None) => main(),
            (Some(m), Some(s)) if m == s.0 => Ok(s.clone()),
            (Some(m), _) if m == self.0.model_id => main(),
            (Some(m), loaded) => {
                let mut known = vec![self.0.model_id.as_str()];
                known.extend(loaded.map(|(id, _)| id.as_str()));
                Err(ApiError::invalid_param(
                    "synthesizer_model",
                    format!(
                        "synthesizer model `{m}` is not loaded on this server (loaded: {}); start tern serve with --synthesizer-model",
                        known.join(", ")
                    ),
                )
                .with_code("model_not_found"))
            }
        }
    }

    /// Stored `/v1/responses` results.
    pub fn responses(&self) -> &ResponseStore {
        &self.0.responses
    }

    /// The same store, shared with a stream that stores at its end.
    pub fn responses_arc(&self) -> Arc<ResponseStore> {
        Arc::clone(&self.0.responses)
    }

    /// Whether the model has loaded.
    pub fn is_ready(&self) -> bool {
        self.0.engine.get().is_some()
    }

    /// The engine, or a 503 while the model is loading.
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        self.0.engine.get().ok_or_else(ApiError::loading)
    }

    /// The id clients pass as `model`.
    pub fn model_id(&self) -> &str {
        &self.0.model_id
    }

    /// Unix time the server started (the model card's `created`).
    pub fn created(&self) -> u64 {
        self.0.created
    }

    /// The KV policy of requests that do not name one.
    pub fn kv_policy(&self) -> &KvPolicy {
        &self.0.kv_policy
    }

    /// The KV policy and storage type of requests that name neither.
    pub fn kv_defaults(&self) -> (&KvPolicy, KvDtype) {
        (&self.0.kv_policy, self.0.kv_dtype)
    }

    /// The key `/v1/*` requests must present, if one is set.
    pub fn api_key(&self) -> Option<&str> {
        self.0.api_key.as_deref()
    }

    /// Largest request body accepted, in bytes.
    pub fn max_body(&self) -> usize {
        self.0.max_body
    }

    /// Which browser origins may call the API.
    pub fn cors(&self) -> &Cors {
        &self.0.cors
    }

    /// The `Host` values requests may carry.
    pub fn host_policy(&self) -> &HostPolicy {
        &self.0.hosts
    }

    /// Whether `/metrics` is served without the API key.
    pub fn metrics_public(&self) -> bool {
        self.0.metrics_public
    }

    /// How control-token text in chat message content is encoded.
    pub fn content_tokens(&self) -> ContentTokens {
        self.0.content_tokens
    }

    /// Whether clients may have programs and tests run in the sandbox
    /// (`--allow-code-execution`); endpoints that execute code refuse without it.
    pub fn allow_code_execution(&self) -> bool {
        self.0.allow_code_execution
    }

    /// The `reasoning_format` of requests that do not send one.
    pub fn reasoning_format(&self) -> ReasoningFormat {
        self.0.reasoning_format
    }

    /// The `context_overflow` of requests that do not send one.
    pub fn context_overflow(&self) -> ContextOverflow {
        self.0.context_overflow
    }

    /// Longest a request body may take to arrive.
    pub fn body_timeout(&self) -> Duration {
        self.0.body_timeout
    }

    /// How embeddings pool an input's token states.
    pub fn embedding_pooling(&self) -> Pooling {
        self.0.embedding_pooling
    }

    /// LoRA adapters loaded at run time.
    pub fn adapters(&self) -> &AdapterRegistry {
        &self.0.adapters
    }

    /// What `model` names: the served model, or a loaded adapter (whose
    /// weights the request runs under, held even if it is unloaded
    /// meanwhile). It must be given and be one of them.
    pub fn resolve_model(&self, requested: Option<&str>) -> Result<Served, ApiError> {
        match requested {
            None | Some("") => Err(ApiError::invalid_param(
                "model",
                "Missing required parameter: `model`",
            )),
            Some(m) if m == self.0.model_id => Ok(Served {
                name: m.to_string(),
                adapters: None,
            }),
            Some(m) => match self.0.adapters.get(m) {
                Some(set) => Ok(Served {
                    name: m.to_string(),
                    adapters: Some(set),
                }),
                None => Err(ApiError::model_not_found(m, &self.0.model_id)),
            },
        }
    }
}

/// The model a request named, as [`AppState::resolve_model`] found it.
pub struct Served {
    /// The `model` its answer reports: the served id or the adapter's name.
    pub name: String,
    /// The adapter's weights, when it named one.
    pub adapters: Option<Arc<LoraSet>>,
}

/// The limits request validation checks against.
pub fn limits(model: &LoadedModel) -> ModelLimits {
    ModelLimits {
        context_length: model.config().context_length,
        vocab_size: model.config().vocab_size,
    }
}
