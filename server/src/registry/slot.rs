//! One model a multi-model server can serve: its name and file, and its
//! engine while it is loaded.
//!
//! The engine sits behind an async mutex so that concurrent first requests
//! load it once: the first holds the lock through the load, the others wait
//! on it and find the engine there. Handlers get the engine as an
//! `Arc<EngineHandle>` (inside a `Lease`), so "no handler holds it" is the
//! `Arc`'s count; an unload takes the lock without waiting and checks that
//! count and the engine's own work (`EngineHandle::busy`), so it never drops
//! an engine a request is using. Loading, charging memory and choosing what
//! to unload are the registry's (`registry/mod.rs`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tern_runtime::engine::EngineHandle;
use tern_runtime::LoadedModel;

/// Where a model stands, as `/v1/models` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Not in memory; the next request naming it loads it.
    Unloaded,
    /// A request is loading it; others naming it wait.
    Loading,
    /// Its engine is running.
    Loaded,
}

impl SlotState {
    /// The name `/v1/models` and `/metrics` use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unloaded => "unloaded",
            Self::Loading => "loading",
            Self::Loaded => "loaded",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Loading,
            2 => Self::Loaded,
            _ => Self::Unloaded,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Self::Unloaded => 0,
            Self::Loading => 1,
            Self::Loaded => 2,
        }
    }
}

/// A model a request may name, given at startup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The name requests send as `model` (registry name or file stem).
    pub id: String,
    /// The GGUF file.
    pub path: PathBuf,
}

/// A running engine and the bytes charged for it.
pub(super) struct Engine {
    pub handle: Arc<EngineHandle>,
    pub charged: usize,
}

/// One model's place in the registry.
pub(super) struct Slot {
    pub spec: ModelSpec,
    /// Bytes its weights take once loaded: the file's size.
    pub weights_bytes: usize,
    pub engine: tokio::sync::Mutex<Option<Engine>>,
    state: AtomicU8,
    /// Bytes charged while loaded (0 otherwise), readable without the lock.
    charged: AtomicU64,
    /// Times it has been loaded since the server started.
    loads: AtomicU64,
    last_used: Mutex<Instant>,
}

impl Slot {
    pub fn new(spec: ModelSpec, weights_bytes: usize) -> Self {
        Self {
            spec,
            weights_bytes,
            engine: tokio::sync::Mutex::new(None),
            state: AtomicU8::new(SlotState::Unloaded.as_u8()),
            charged: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            last_used: Mutex::new(Instant::now()),
        }
    }

    pub fn state(&self) -> SlotState {
        SlotState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn set_state(&self, s: SlotState) {
        self.state.store(s.as_u8(), Ordering::Release);
    }

    /// Records a finished load of `charged` bytes.
    pub fn loaded(&self, charged: usize) {
        self.charged.store(charged as u64, Ordering::Release);
        self.loads.fetch_add(1, Ordering::AcqRel);
        self.touch();
        self.set_state(SlotState::Loaded);
    }

    pub fn charged(&self) -> usize {
        self.charged.load(Ordering::Acquire) as usize
    }

    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::Acquire)
    }

    /// Marks the model used now: its idle time starts again.
    pub fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    pub fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    /// Takes the engine out if it is loaded, no handler holds it, its engine
    /// has no work and it has been idle at least `min_idle`; returns the
    /// bytes it was charged and a weak reference to the model, which dies
    /// once the engine thread has ended and freed it. Never waits: a slot
    /// being loaded or handed out right now is left alone. A busy engine
    /// counts as used now.
    pub fn unload_if_idle(&self, min_idle: Duration) -> Option<(usize, Weak<LoadedModel>)> {
        let mut guard = self.engine.try_lock().ok()?;
        let engine = guard.as_ref()?;
        if Arc::strong_count(&engine.handle) > 1 || engine.handle.busy() {
            self.touch();
            return None;
        }
        if self.idle_for() < min_idle {
            return None;
        }
        let engine = guard.take()?;
        self.charged.store(0, Ordering::Release);
        self.set_state(SlotState::Unloaded);
        let model = Arc::downgrade(engine.handle.model());
        // Dropping the last handle ends the engine thread, which frees the
        // model's weights and caches.
        drop(engine.handle);
        Some((engine.charged, model))
    }
}
