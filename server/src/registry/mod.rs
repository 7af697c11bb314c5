//! Several models in one server (`tern serve --model A --model B`, or
//! `--models-dir DIR`): requests are routed by their `model` field, a model
//! is loaded by the first request naming it, and unloaded once it has been
//! idle for `--model-idle-unload` (Ollama's and llama-server's router
//! behaviour).
//!
//! Memory: every loaded model is charged its weights plus its engine's KV
//! budget against `--models-memory` ([`budget`]). A load that does not fit
//! unloads idle models, least recently used first; when none is idle it is a
//! 503 `models_memory_full`, never an allocation past the budget. Each model
//! runs its own engine ([`slot`]); what a request runs under is a [`Lease`],
//! which keeps the model loaded while a handler holds it.
//!
//! This module knows nothing of OpenAI's wire types except the error it
//! answers with; `/v1/models` turns [`ModelStatus`] into cards.

pub mod budget;
pub mod slot;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tern_runtime::engine::{EngineConfig, EngineHandle};
use tern_runtime::size::format_size;
use tern_runtime::LoadedModel;

use crate::openai::error::ApiError;
use crate::{LoadError, Loaded, ServeEvent};
use budget::MemoryBudget;
use slot::{Engine, Slot, SlotState};

pub use slot::ModelSpec;

/// Loads one model's weights and backend (given by the binary, which knows
/// the backends); runs on a blocking thread.
pub type ModelLoader = Arc<dyn Fn(&ModelSpec) -> Result<Loaded, LoadError> + Send + Sync>;

/// What the server reports about models coming and going.
pub type EventSink = Arc<dyn Fn(ServeEvent) + Send + Sync>;

/// Default idle time before a model is unloaded: Ollama's keep-alive.
pub const DEFAULT_IDLE_UNLOAD: Duration = Duration::from_secs(300);

/// How the registry budgets and unloads models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Bytes the loaded models' weights and KV budgets may take together
    /// (`--models-memory`).
    pub memory: usize,
    /// Unload a model idle this long (`--model-idle-unload`); `None` keeps
    /// models loaded.
    pub idle_unload: Option<Duration>,
}

/// Why a registry could not be built at startup.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two models would answer to the same name.
    #[error("two models are named `{0}`; requests could not tell them apart")]
    DuplicateName(String),
    /// A model's file could not be read.
    #[error("model `{id}`: cannot read {path}")]
    File {
        /// The model's name.
        id: String,
        /// Its file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// No model to serve.
    #[error("no models to serve")]
    Empty,
}

/// The models a server may serve, loaded on demand.
pub struct ModelRegistry {
    slots: Vec<Arc<Slot>>,
    budget: MemoryBudget,
    config: RegistryConfig,
    /// Each model's engine settings; its `kv_memory` is charged per model.
    engine: EngineConfig,
    loader: ModelLoader,
    events: EventSink,
    created: u64,
}

/// A model a request runs under: its engine stays loaded while this lives,
/// and dropping it restarts the model's idle time.
pub struct Lease {
    engine: Arc<EngineHandle>,
    slot: Arc<Slot>,
}

impl Lease {
    /// The model's engine.
    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.touch();
    }
}

/// One model as `/v1/models` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStatus {
    /// The name requests use.
    pub id: String,
    /// Loaded, loading or unloaded.
    pub state: SlotState,
    /// Bytes charged against the budget now (weights + KV budget while
    /// loaded or loading, 0 otherwise).
    pub memory_bytes: usize,
    /// The weights' bytes (the file's size).
    pub weights_bytes: usize,
    /// The KV budget its engine gets when loaded.
    pub kv_memory_bytes: usize,
    /// Times it has been loaded since the server started.
    pub loads: u64,
}

/// The budget as a whole.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryStatus {
    /// `--models-memory`.
    pub budget_bytes: usize,
    /// Charged by loaded and loading models.
    pub in_use_bytes: usize,
    /// `--model-idle-unload` in seconds (0: never).
    pub idle_unload_s: f64,
}

impl ModelRegistry {
    /// A registry over `models` (none loaded yet), each weights' size read
    /// from its file now; each model runs an engine configured as `engine`.
    pub fn new(
        models: Vec<ModelSpec>,
        config: RegistryConfig,
        engine: EngineConfig,
        loader: ModelLoader,
        events: EventSink,
    ) -> Result<Self, RegistryError> {
        if models.is_empty() {
            return Err(RegistryError::Empty);
        }
        let mut slots: Vec<Arc<Slot>> = Vec::with_capacity(models.len());
        for spec in models {
            if slots.iter().any(|s| s.spec.id == spec.id) {
                return Err(RegistryError::DuplicateName(spec.id));
            }
            let bytes = std::fs::metadata(&spec.path)
                .map_err(|source| RegistryError::File {
                    id: spec.id.clone(),
                    path: spec.path.display().to_string(),
                    source,
                })?
                .len() as usize;
            slots.push(Arc::new(Slot::new(spec, bytes)));
        }
        Ok(Self {
            slots,
            budget: MemoryBudget::new(config.memory),
            config,
            engine,
            loader,
            events,
            created: crate::ids::unix_now(),
        })
    }

    /// Unix time the server started (the cards' `created`).
    pub fn created(&self) -> u64 {
        self.created
    }

    /// The names requests may use, in the order given.
    pub fn names(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.spec.id.as_str()).collect()
    }

    /// Whether `name` is one of the served models.
    pub fn contains(&self, name: &str) -> bool {
        self.slot(name).is_some()
    }

    fn slot(&self, name: &str) -> Option<&Arc<Slot>> {
        self.slots.iter().find(|s| s.spec.id == name)
    }

    /// The engine of `name`, loading it first if it is not loaded (the
    /// request waits; concurrent requests wait for the same load). An
    /// unknown name is a 404 `model_not_found`; no room in the budget, a
    /// 503; a failed load, a 500 (and the next request tries again).
    pub async fn acquire(&self, name: &str) -> Result<Lease, ApiError> {
        let slot = self
            .slot(name)
            .ok_or_else(|| ApiError::model_not_found(name, &self.names().join("`, `")))?;
        let mut guard = slot.engine.lock().await;
        let handle = match guard.as_ref() {
            Some(engine) => Arc::clone(&engine.handle),
            None => {
                let engine = self.load(slot).await?;
                let handle = Arc::clone(&engine.handle);
                *guard = Some(engine);
                handle
            }
        };
        slot.touch();
        Ok(Lease {
            engine: handle,
            slot: Arc::clone(slot),
        })
    }

    /// Charges the budget (unloading idle models if it must), loads the
    /// model on a blocking thread and starts its engine. The caller holds
    /// the slot's lock. If the request is dropped midway, the charge is
    /// given back.
    async fn load(&self, slot: &Arc<Slot>) -> Result<Engine, ApiError> {
        let charge = slot.weights_bytes + self.engine.kv_memory;
        slot.set_state(SlotState::Loading);
        let mut attempt = Attempt {
            budget: &self.budget,
            slot,
            charged: 0,
        };
        self.make_room(slot, charge)?;
        attempt.charged = charge;
        let loader = Arc::clone(&self.loader);
        let spec = slot.spec.clone();
        let started = Instant::now();
        let loaded = tokio::task::spawn_blocking(move || loader(&spec))
            .await
            .unwrap_or_else(|e| Err(format!("the loader panicked: {e}").into()));
        let loaded = loaded.map_err(|error| {
            (self.events)(ServeEvent::ModelLoadFailed {
                id: slot.spec.id.clone(),
                error: error.to_string(),
            });
            ApiError::model_load_failed(&slot.spec.id)
        })?;
        let handle = EngineHandle::spawn_with_draft(
            loaded.model,
            loaded.backend,
            loaded.draft,
            self.engine.clone(),
        );
        slot.loaded(charge);
        (self.events)(ServeEvent::ModelLoaded {
            id: slot.spec.id.clone(),
            seconds: started.elapsed().as_secs_f64(),
        });
        Ok(Engine {
            handle: Arc::new(handle),
            charged: charge,
        })
    }

    /// Charges `bytes` for `slot`, first unloading other models that are
    /// idle now (least recently used first) while the budget lacks room.
    fn make_room(&self, slot: &Slot, bytes: usize) -> Result<(), ApiError> {
        let id = &slot.spec.id;
        let weights = format_size(slot.weights_bytes);
        let kv = format_size(self.engine.kv_memory);
        if bytes > self.budget.total() {
            return Err(ApiError::models_memory_full(format!(
                "The model `{id}` needs {} (weights {weights} + KV {kv}), more than the whole \
                 --models-memory ({}); start the server with a larger --models-memory or a \
                 smaller --kv-memory",
                format_size(bytes),
                format_size(self.budget.total())
            )));
        }
        loop {
            let Err(no_room) = self.budget.try_charge(bytes) else {
                return Ok(());
            };
            let mut others: Vec<&Arc<Slot>> = self
                .slots
                .iter()
                .filter(|s| s.spec.id != *id && s.state() == SlotState::Loaded)
                .collect();
            others.sort_by_key(|s| std::cmp::Reverse(s.idle_for()));
            let freed = others
                .iter()
                .find_map(|s| s.unload_if_idle(Duration::ZERO).map(|u| (s, u)));
            match freed {
                Some((other, (b, model))) => {
                    self.budget.release(b);
                    give_back_when_freed(model);
                    (self.events)(ServeEvent::ModelUnloaded {
                        id: other.spec.id.clone(),
                        reason: format!("to make room for {id}"),
                    });
                }
                None => {
                    let busy: Vec<&str> = others.iter().map(|s| s.spec.id.as_str()).collect();
                    return Err(ApiError::models_memory_full(format!(
                        "The model `{id}` needs {} (weights {weights} + KV {kv}) but {} of \
                         --models-memory {} is free, and the loaded models ({}) are serving \
                         requests; retry later",
                        format_size(bytes),
                        format_size(no_room.free),
                        format_size(no_room.total),
                        if busy.is_empty() {
                            "none idle".to_string()
                        } else {
                            busy.join(", ")
                        }
                    )));
                }
            }
        }
    }

    /// Unloads every model idle for at least the configured time.
    pub fn reap(&self) {
        let Some(idle) = self.config.idle_unload else {
            return;
        };
        for slot in &self.slots {
            if slot.state() != SlotState::Loaded {
                continue;
            }
            if let Some((bytes, model)) = slot.unload_if_idle(idle) {
                self.budget.release(bytes);
                give_back_when_freed(model);
                (self.events)(ServeEvent::ModelUnloaded {
                    id: slot.spec.id.clone(),
                    reason: format!("idle for {} s", idle.as_secs_f64()),
                });
            }
        }
    }

    /// Starts the task that unloads idle models (none when models never
    /// unload); it ends when the registry is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let Some(idle) = self.config.idle_unload else {
            return;
        };
        // A quarter of the idle time between looks, so a model goes within
        // 25% of its idle time, and never busier than 20 looks a second.
        let period = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let registry = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(registry) = registry.upgrade() else {
                    break;
                };
                registry.reap();
            }
        });
    }

    /// Every model's state and charge, in the order given.
    pub fn status(&self) -> Vec<ModelStatus> {
        self.slots
            .iter()
            .map(|s| ModelStatus {
                id: s.spec.id.clone(),
                state: s.state(),
                memory_bytes: match s.state() {
                    SlotState::Loaded => s.charged(),
                    SlotState::Loading => s.weights_bytes + self.engine.kv_memory,
                    SlotState::Unloaded => 0,
                },
                weights_bytes: s.weights_bytes,
                kv_memory_bytes: self.engine.kv_memory,
                loads: s.loads(),
            })
            .collect()
    }

    /// The budget and what is charged against it.
    pub fn memory(&self) -> MemoryStatus {
        MemoryStatus {
            budget_bytes: self.budget.total(),
            in_use_bytes: self.budget.used(),
            idle_unload_s: self.config.idle_unload.map_or(0.0, |d| d.as_secs_f64()),
        }
    }
}

/// Once the engine thread has ended and dropped `model` (a few
/// milliseconds after its last handle goes), hands the freed heap back to
/// the system: the allocator would otherwise keep the weights' pages, and
/// the process's resident memory would not fall with the unload.
fn give_back_when_freed(model: Weak<LoadedModel>) {
    tokio::task::spawn_blocking(move || {
        // An engine finishing a step first: give it up to 30 s.
        for _ in 0..3000 {
            if model.strong_count() == 0 {
                tern_runtime::memory::release_free_memory();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// A load in progress: gives its charge back and marks the model unloaded
/// unless the load finished (a failed load, or a request dropped midway).
struct Attempt<'a> {
    budget: &'a MemoryBudget,
    slot: &'a Slot,
    charged: usize,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.slot.state() == SlotState::Loading {
            self.budget.release(self.charged);
            self.slot.set_state(SlotState::Unloaded);
        }
    }
}
