//! What every handler shares: the served model's identity, the server's
//! settings, and the engine once the model has loaded.
//!
//! The engine slot starts empty: `serve` binds and answers (503 while
//! loading) before the weights are read, then fills it exactly once. A
//! server of several models has a [`ModelRegistry`] instead, and a request
//! gets its model's engine from [`AppState::serve_model`] either way.

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
use crate::registry::{Lease, ModelRegistry};
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
    /// Several models loaded on demand (`None`: the one model of `engine`).
    registry: Option<Arc<ModelRegistry>>,
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
        Self::build(config, responses, None)
    }

    /// State for a server of several models, each loaded on first use by
    /// `registry`.
    pub fn with_models(
        config: &ServerConfig,
        responses: ResponseStore,
        registry: Arc<ModelRegistry>,
    ) -> Self {
        Self::build(config, responses, Some(registry))
    }

    fn build(
        config: &ServerConfig,
        responses: ResponseStore,
        registry: Option<Arc<ModelRegistry>>,
    ) -> Self {
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
            context_overflow: config.context_overflow.clone(),
            body_timeout: config.connections.body_timeout,
            embedding_pooling: config.embedding_pooling,
            responses: Arc::new(responses),
            adapters: AdapterRegistry::new(config.lora_dir.as_deref(), config.max_loras),
            engine: OnceLock::new(),
            synthesizer: OnceLock::new(),
            registry,
        }))
    }

    /// The models of a several-model server.
    pub fn registry(&self) -> Option<&Arc<ModelRegistry>> {
        self.0.registry.as_ref()
    }

    /// Whether requests can be served now: always on a several-model server
    /// (models load on first use), once the model has loaded otherwise
    /// (a 503 before).
    pub fn ready(&self) -> Result<(), ApiError> {
        match &self.0.registry {
            Some(_) => Ok(()),
            None => self.engine().map(|_| ()),
        }
    }

    /// The model a request's `model` names and the engine it runs on: the
    /// served model or a loaded adapter ([`AppState::resolve_model`]), or on
    /// a several-model server the named model, loaded first if it is not.
    pub async fn serve_model(&self, requested: Option<&str>) -> Result<Served, ApiError> {
        let Some(registry) = &self.0.registry else {
            let engine = self.engine()?.clone();
            let (name, adapters) = self.resolve_model(requested)?;
            return Ok(Served {
                name,
                adapters,
                engine,
                _lease: None,
            });
        };
        let name = match requested {
            None | Some("") => {
                return Err(ApiError::invalid_param(
                    "model",
                    "Missing required parameter: `model`",
                ))
            }
            Some(m) => m,
        };
        let lease = registry.acquire(name).await?;
        Ok(Served {
            name: name.to_string(),
            adapters: None,
            engine: lease.engine().clone(),
            _lease: Some(lease),
        })
    }

    /// The model whose tokenizer `/tokenize` and `/detokenize` use: the one
    /// served model whatever `model` says (llama-server's routes take none),
    /// or on a several-model server the one `model` names.
    pub async fn tokenizer_model(&self, requested: Option<&str>) -> Result<Served, ApiError> {
        match &self.0.registry {
            Some(_) => self.serve_model(requested).await,
            None => Ok(Served {
                name: self.0.model_id.clone(),
                adapters: None,
                engine: self.engine()?.clone(),
                _lease: None,
            }),
        }
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

    /// The engine that writes syntheses for a request served by `own`
    /// naming `synthesizer_model` (or not). On a several-model server: the
    /// request's own model, or any served model it names. Otherwise
    /// [`AppState::one_model_synthesizer`].
    pub async fn synthesizer(
        &self,
        requested: Option<&str>,
        own: &Served,
    ) -> Result<Served, ApiError> {
        let Some(registry) = &self.0.registry else {
            let (name, engine) = self.one_model_synthesizer(requested)?;
            return Ok(Served {
                name,
                adapters: None,
                engine,
                _lease: None,
            });
        };
        match requested {
            None => Ok(own.share()),
            Some(m) if m == own.name => Ok(own.share()),
            Some(m) if registry.contains(m) => self.serve_model(Some(m)).await,
            Some(m) => Err(ApiError::invalid_param(
                "synthesizer_model",
                format!(
                    "synthesizer model `{m}` is not served here (served: {})",
                    registry.names().join(", ")
                ),
            )
            .with_code("model_not_found")),
        }
    }

    /// The synthesizer of a one-model server: the loaded synthesizer
    /// (`--synthesizer-model`), or the served model itself, with its id; a
    /// name that is neither is a 400.
    fn one_model_synthesizer(
        &self,
        requested: Option<&str>,
    ) -> Result<(String, EngineHandle), ApiError> {
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

    /// Whether the model has loaded (always, with several models: they
    /// load on first use).
    pub fn is_ready(&self) -> bool {
        self.0.registry.is_some() || self.0.engine.get().is_some()
    }

    /// The one served model's engine, or a 503 while it is loading; a 400
    /// on a several-model server, which has no one engine (adapters).
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        if self.0.registry.is_some() {
            return Err(ApiError::needs_one_model("LoRA adapters"));
        }
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
        self.0.context_overflow.clone()
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

    /// What `model` names on a one-model server: the served model, or a
    /// loaded adapter (whose weights the request runs under, held even if it
    /// is unloaded meanwhile), as the name to report and the adapter. It
    /// must be given and be one of them.
    pub fn resolve_model(
        &self,
        requested: Option<&str>,
    ) -> Result<(String, Option<Arc<LoraSet>>), ApiError> {
        match requested {
            None | Some("") => Err(ApiError::invalid_param(
                "model",
                "Missing required parameter: `model`",
            )),
            Some(m) if m == self.0.model_id => Ok((m.to_string(), None)),
            Some(m) => match self.0.adapters.get(m) {
                Some(set) => Ok((m.to_string(), Some(set))),
                None => Err(ApiError::model_not_found(m, &self.0.model_id)),
            },
        }
    }
}

/// The model a request named, as [`AppState::serve_model`] found it, with
/// the engine it runs on.
pub struct Served {
    /// The `model` its answer reports: the served id or the adapter's name.
    pub name: String,
    /// The adapter's weights, when it named one.
    pub adapters: Option<Arc<LoraSet>>,
    /// The engine that runs it.
    pub engine: EngineHandle,
    /// On a several-model server, what keeps the model loaded while the
    /// request holds this.
    _lease: Option<Lease>,
}

impl Served {
    /// The same model for a second use within the request (no lease of its
    /// own: the request's keeps the model loaded).
    fn share(&self) -> Self {
        Self {
            name: self.name.clone(),
            adapters: self.adapters.clone(),
            engine: self.engine.clone(),
            _lease: None,
        }
    }
}

/// The limits request validation checks against.
pub fn limits(model: &LoadedModel) -> ModelLimits {
    ModelLimits {
        context_length: model.config().context_length,
        vocab_size: model.config().vocab_size,
    }
}
