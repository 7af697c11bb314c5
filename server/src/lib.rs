//! `tern-server`: an OpenAI-compatible HTTP API over the `tern-runtime` engine.
//!
//! Routes: `GET /v1/models` (and `/v1/models/{id}`), `POST /v1/chat/completions`,
//! `POST /v1/completions` (JSON or server-sent events), `POST /v1/embeddings`,
//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's shapes,
//! mapped onto the chat path: [`anthropic`]),
//! `POST /tokenize` and `/detokenize` (llama-server's shapes), `GET /health`,
//! `GET /metrics` (Prometheus) and `GET /` (a chat page). OpenAI's wire types live in [`openai`] and never
//! reach the runtime: handlers turn them into a `SubmitRequest`
//! ([`params`], [`prompt`]) and the engine's events back into responses
//! ([`collect`], [`stream`]); every failure is one [`openai::error::ApiError`].
//!
//! [`serve`] binds first and loads the model in the background, answering 503
//! until the engine is up; [`serve_models`] serves several models, each
//! loaded by the first request naming it ([`registry`]). Both then serve ([`listener`]) until Ctrl-C or SIGTERM,
//! letting in-flight requests finish within a grace period. [`router`] is the
//! seam tests drive in process. Every request passes the [`origin`] check
//! (Host and Origin) so web pages cannot drive a local server.

mod adapters;
mod affinity;
mod anthropic;
mod auth;
mod body;
mod collect;
pub mod duration;
mod echoed;
mod embedding;
mod events;
mod ids;
pub mod listener;
mod llama_api;
mod logprobs;
mod openai;
pub mod origin;
pub mod overflow;
mod params;
mod prometheus;
mod prompt;
pub mod registry;
mod routes;
pub use tern_runtime::size;
mod response_store;
mod state;
mod stream;
pub mod think;
mod tools;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method};
use axum::routing::{get, post};
use axum::Router;
use tern_runtime::chat_prompt::ContentTokens;
use tern_runtime::engine::{EngineConfig, EngineHandle, Pooling};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::LoadedModel;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

pub use listener::ConnectionLimits;
pub use state::AppState;

/// Default largest request body: 4 MiB.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// Default number of LoRA adapters one server holds at once.
pub const DEFAULT_MAX_LORAS: usize = 4;

/// Default bound of the in-memory Responses store.
pub const DEFAULT_RESPONSES_STORE: usize = 1024;

/// Default byte budget of the in-memory Responses store: 256 MiB.
pub const DEFAULT_RESPONSES_STORE_BYTES: usize = 256 << 20;

/// Everything `serve` needs besides the model itself.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Host name or address to bind (`127.0.0.1`, `0.0.0.0`, `localhost`).
    pub host: String,
    /// Port to bind; 0 picks a free one.
    pub port: u16,
    /// The id clients pass as `model` (registry name or file stem).
    pub model_id: String,
    /// KV policy of requests that do not name one.
    pub kv_policy: KvPolicy,
    /// KV storage type of requests that do not name one (`--kv-dtype`).
    pub kv_dtype: KvDtype,
    /// How the engine schedules (KV memory, queue, batch sizes).
    pub engine: EngineConfig,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Which browser origins may call the API.
    pub cors: Cors,
    /// Largest request body in bytes (413 above it).
    pub max_body: usize,
    /// `--allowed-hosts`: `Host` names accepted beside the bound address's
    /// own (see [`origin::HostPolicy`]); `*` accepts any.
    pub allowed_hosts: Vec<String>,
    /// Serve `/metrics` without the API key (`--metrics-public`).
    pub metrics_public: bool,
    /// How control-token text in chat message content is encoded.
    pub content_tokens: ContentTokens,
    /// Whether clients may have the server run their programs and tests in
    /// the sandbox (`--allow-code-execution`); off by default.
    pub allow_code_execution: bool,
    /// How a reasoning model's `<think>` block is returned when a request
    /// does not say (`--reasoning-format`; llama-server's default, `auto`).
    pub reasoning_format: think::ReasoningFormat,
    /// What a prompt too long for the context gets when a request does
    /// not say (`--context-overflow`; `error`, as OpenAI and llama-server).
    pub context_overflow: overflow::ContextOverflow,
    /// Connection cap and timeouts.
    pub connections: ConnectionLimits,
    /// How `/v1/embeddings` pools an input's token states (`--embedding-pooling`).
    pub embedding_pooling: Pooling,
    /// Most `/v1/responses` results kept for `previous_response_id` and
    /// `GET` (`--responses-store`; the oldest go first).
    pub responses_store: usize,
    /// Most bytes the stored responses may take in memory together, and
    /// the most one may take in Redis (`--responses-store-bytes`).
    pub responses_store_bytes: usize,
    /// `redis://host:port[/db]`: keep stored responses in that Redis server
    /// instead of this process's memory, shared by every replica naming it
    /// (`--state-store`); `None`: in memory.
    pub state_store: Option<String>,
    /// `--lora-dir`: LoRA adapters under this directory may be loaded at run
    /// time (`/v1/load_lora_adapter`); `None`: loading is off.
    pub lora_dir: Option<std::path::PathBuf>,
    /// Most adapters held at once (`--max-loras`).
    pub max_loras: usize,
}

impl ServerConfig {
    /// Settings for serving `model_id` on `host:port` with every other value
    /// at its default (loopback-safe: no CORS, no code execution).
    pub fn new(host: impl Into<String>, port: u16, model_id: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            port,
            model_id: model_id.into(),
            kv_policy: KvPolicy::Full,
            kv_dtype: KvDtype::default(),
            engine: EngineConfig::default(),
            api_key: None,
            cors: Cors::Off,
            max_body: DEFAULT_MAX_BODY,
            allowed_hosts: Vec::new(),
            metrics_public: false,
            content_tokens: ContentTokens::Text,
            allow_code_execution: false,
            reasoning_format: think::ReasoningFormat::default(),
            context_overflow: overflow::ContextOverflow::default(),
            connections: ConnectionLimits::default(),
            embedding_pooling: Pooling::Mean,
            responses_store: DEFAULT_RESPONSES_STORE,
            responses_store_bytes: DEFAULT_RESPONSES_STORE_BYTES,
            state_store: None,
            lora_dir: None,
            max_loras: DEFAULT_MAX_LORAS,
        }
    }
}

/// Cross-origin access for browsers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cors {
    /// No CORS headers: only same-origin pages may call the API.
    #[default]
    Off,
    /// Any origin (`--cors '*'`).
    Any,
    /// These origins exactly (`--cors https://a.example,https://b.example`).
    Origins(Vec<String>),
}

impl Cors {
    /// Parses `--cors`: `*` or comma-separated origins.
    pub fn parse(spec: &str) -> Result<Self, ServeError> {
        let spec = spec.trim();
        if spec == "*" {
            return Ok(Self::Any);
        }
        let origins: Vec<String> = spec
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if origins.is_empty() {
            return Err(ServeError::Cors(spec.to_string()));
        }
        if let Some(bad) = origins
            .iter()
            .find(|o| HeaderValue::from_str(o).is_err() || o.contains('*'))
        {
            return Err(ServeError::Cors(bad.clone()));
        }
        Ok(Self::Origins(origins))
    }

    fn layer(&self) -> Option<CorsLayer> {
        let origin = match self {
            Self::Off => return None,
            Self::Any => AllowOrigin::any(),
            Self::Origins(list) => {
                AllowOrigin::list(list.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
            }
        };
        Some(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
                .allow_headers(Any),
        )
    }
}

/// What `serve` reports as it goes, for the caller to print.
#[derive(Clone, Debug, PartialEq)]
pub enum ServeEvent {
    /// The socket is bound; requests are answered (503 until ready).
    Listening {
        /// The bound address (the real port when 0 was asked for).
        addr: SocketAddr,
    },
    /// The model has loaded and the engine is running.
    Ready {
        /// Seconds the load took.
        seconds: f64,
    },
    /// A shutdown signal arrived; in-flight requests are finishing.
    ShuttingDown,
    /// Several models: a request's model has loaded.
    ModelLoaded {
        /// The model's name.
        id: String,
        /// Seconds the load took.
        seconds: f64,
    },
    /// Several models: a model failed to load (the request got a 500).
    ModelLoadFailed {
        /// The model's name.
        id: String,
        /// The loader's error, whole.
        error: String,
    },
    /// Several models: a model was unloaded and its memory given back.
    ModelUnloaded {
        /// The model's name.
        id: String,
        /// Why: idle for its time, or to make room for another.
        reason: String,
    },
}

/// Why the server could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound (port in use, no permission ...).
    #[error("cannot listen on {addr}")]
    Bind {
        /// `host:port` as configured.
        addr: String,
        /// The OS error (printed after the message as its cause).
        source: std::io::Error,
    },
    /// Loading the model failed.
    #[error("loading the model failed: {0}")]
    Load(LoadError),
    /// A `--cors` origin is not a valid header value.
    #[error("invalid --cors origin `{0}` (use `*` or comma-separated origins such as https://example.com)")]
    Cors(String),
    /// `--state-store` could not be reached or parsed.
    #[error(transparent)]
    StateStore(#[from] response_store::StoreError),
    /// The several models to serve are not usable as given.
    #[error(transparent)]
    Models(#[from] registry::RegistryError),
    /// Serving failed after startup.
    #[error("serving HTTP failed")]
    Io(#[from] std::io::Error),
}

/// What a loader hands back: the model (tokenizer, template, shape), the
/// backend that will run it, and optionally a synthesizer model.
pub struct Loaded {
    /// The served model.
    pub model: Arc<LoadedModel>,
    /// What runs its forward pass.
    pub backend: Box<dyn tern_runtime::backend::Backend>,
    /// A second model and the id requests may name it by, run as its own
    /// engine (Tern's backend) to write best-of-N syntheses.
    pub synthesizer: Option<(String, Arc<LoadedModel>)>,
    /// A smaller model of the same vocabulary that drafts for requests
    /// speculating with `draft` (`--draft-model`), run on the engine thread
    /// beside the served model.
    pub draft: Option<tern_runtime::engine::DraftModel>,
}

/// The error a model loader returns.
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// The HTTP routes over `state`, with body limit, auth, Host/Origin and CORS
/// layers (CORS outermost, so preflights are answered first).
pub fn router(state: AppState) -> Router {
    use routes::{
        adapters, chat, completions, embeddings, health, messages, metrics, models, responses,
        tokenize, ui,
    };
    let require_key = || axum::middleware::from_fn_with_state(state.clone(), auth::require_api_key);
    let v1 = Router::new()
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::retrieve))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create))
        .route("/v1/load_lora_adapter", post(adapters::load))
        .route("/v1/unload_lora_adapter", post(adapters::unload))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        // llama-server's tokenizer routes: behind the key like /v1, since
        // they run on the served model too.
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(require_key());
    // Anthropic's Messages API: the key also as `x-api-key`, and every error
    // (the key check's too) in Anthropic's shape.
    let anthropic_api = Router::new()
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_api_key_or_x_api_key,
        ))
        .route_layer(axum::middleware::from_fn(anthropic::error::reshape));
    let metrics = Router::new().route("/metrics", get(metrics::metrics));
    let metrics = if state.metrics_public() {
        metrics
    } else {
        metrics.route_layer(require_key())
    };
    let app = Router::new()
        .route("/", get(ui::index))
        .route("/health", get(health::health))
        .merge(metrics)
        .merge(v1)
        .merge(anthropic_api)
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::check_origin,
        ));
    let app = match state.cors().layer() {
        Some(cors) => app.layer(cors),
        None => app,
    };
    app.with_state(state)
}

/// Binds, then loads the model with `load` on a blocking thread while already
/// answering (503 until ready), then serves until Ctrl-C or SIGTERM and lets
/// in-flight requests finish within `--shutdown-grace`. A second signal exits
/// at once. Returns an error
/// if binding or loading fails.
pub async fn serve<L>(
    config: ServerConfig,
    load: L,
    on_event: impl Fn(ServeEvent) + Send + Sync + 'static,
) -> Result<(), ServeError>
where
    L: FnOnce() -> Result<Loaded, LoadError> + Send + 'static,
{
    let (listener, config, store) = bind(config).await?;
    let state = AppState::with_store(&config, store);
    let on_event = Arc::new(on_event);
    on_event(ServeEvent::Listening {
        addr: listener.local_addr()?,
    });

    let failure: Arc<Mutex<Option<LoadError>>> = Arc::new(Mutex::new(None));
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let (state, failure, on_event) =
            (state.clone(), Arc::clone(&failure), Arc::clone(&on_event));
        let engine_config = config.engine.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let loaded = tokio::task::spawn_blocking(load)
                .await
                .unwrap_or_else(|e| Err(format!("the loader panicked: {e}").into()));
            match loaded {
                Ok(loaded) => {
                    if let Some((id, model)) = loaded.synthesizer {
                        let engine = EngineHandle::spawn(model, engine_config.clone());
                        state.set_synthesizer(id, engine);
                    }
                    state.set_engine(EngineHandle::spawn_with_draft(
                        loaded.model,
                        loaded.backend,
                        loaded.draft,
                        engine_config,
                    ));
                    on_event(ServeEvent::Ready {
                        seconds: started.elapsed().as_secs_f64(),
                    });
                }
                Err(e) => {
                    if let Ok(mut slot) = failure.lock() {
                        *slot = Some(e);
                    }
                    let _ = failed_tx.send(());
                }
            }
        });
    }
    run(listener, state, &config, on_event, failed_rx).await;
    let failed = failure.lock().ok().and_then(|mut slot| slot.take());
    match failed {
        Some(e) => Err(ServeError::Load(e)),
        None => Ok(()),
    }
}

/// Serves the several `models`, none loaded at start: each is loaded with
/// `load` (on a blocking thread) by the first request naming it, charged
/// against `models.memory` with its KV budget (`config.engine.kv_memory`),
/// and unloaded once idle for `models.idle_unload`. Ready as soon as bound;
/// serves until Ctrl-C or SIGTERM as [`serve`] does.
pub async fn serve_models<L>(
    config: ServerConfig,
    models: Vec<registry::ModelSpec>,
    limits: registry::RegistryConfig,
    load: L,
    on_event: impl Fn(ServeEvent) + Send + Sync + 'static,
) -> Result<(), ServeError>
where
    L: Fn(&registry::ModelSpec) -> Result<Loaded, LoadError> + Send + Sync + 'static,
{
    let on_event: registry::EventSink = Arc::new(on_event);
    let registry = Arc::new(registry::ModelRegistry::new(
        models,
        limits,
        config.engine.clone(),
        Arc::new(load),
        Arc::clone(&on_event),
    )?);
    let (listener, config, store) = bind(config).await?;
    let state = AppState::with_models(&config, store, Arc::clone(&registry));
    on_event(ServeEvent::Listening {
        addr: listener.local_addr()?,
    });
    registry.spawn_reaper();
    on_event(ServeEvent::Ready { seconds: 0.0 });
    // Nothing loads at startup, so nothing can fail before a request.
    let (_never_fails, failed_rx) = tokio::sync::oneshot::channel::<()>();
    run(listener, state, &config, on_event, failed_rx).await;
    Ok(())
}

/// Opens the Responses store and binds; returns the listener and the config
/// with the real port (the Host check needs it when 0 was asked for).
async fn bind(
    config: ServerConfig,
) -> Result<
    (
        tokio::net::TcpListener,
        ServerConfig,
        response_store::ResponseStore,
    ),
    ServeError,
> {
    let store = match &config.state_store {
        Some(url) => response_store::ResponseStore::redis(url, config.responses_store)?,
        None => response_store::ResponseStore::new(config.responses_store),
    };
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let bound = listener.local_addr()?;
    let config = ServerConfig {
        port: bound.port(),
        ..config
    };
    Ok((listener, config, store))
}

/// Serves `state` on `listener` until a shutdown signal (or `failed`, a
/// load failure at startup), letting in-flight requests finish.
async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    config: &ServerConfig,
    on_event: Arc<dyn Fn(ServeEvent) + Send + Sync>,
    failed: tokio::sync::oneshot::Receiver<()>,
) {
    let shutdown = async move {
        tokio::select! {
            () = shutdown_signal() => {
                on_event(ServeEvent::ShuttingDown);
                // A second signal means "now": do not wait for streams.
                tokio::spawn(async {
                    shutdown_signal().await;
                    std::process::exit(130);
                });
            }
            Ok(()) = failed => {}
        }
    };
    listener::run(
        listener,
        router(state),
        config.connections.clone(),
        shutdown,
    )
    .await;
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_specs() {
        assert_eq!(Cors::parse("*").unwrap(), Cors::Any);
        assert_eq!(
            Cors::parse("http://a.test, http://b.test").unwrap(),
            Cors::Origins(vec!["http://a.test".into(), "http://b.test".into()])
        );
        assert!(Cors::parse(",").is_err());
        assert!(Cors::parse("http://a\u{1}b").is_err());
    }
}
