//! The continuous-batching engine: one thread owns the model and every running
//! sequence; callers submit requests through an [`EngineHandle`] and read each
//! request's events from its own channel.
//!
//! Each step the scheduler admits waiting requests while the KV memory they
//! would need under their policy fits (`kv_memory`), then runs ONE ragged
//! forward holding one decode token for every running sequence plus prefill
//! chunks of newly admitted prompts, samples, applies stop conditions and sends
//! events. A request whose receiver is dropped is cancelled at the next step and
//! its cache freed. The server, the CLI, best-of-N and the trainer all come in
//! through [`EngineHandle::submit`], and read whole completions through
//! [`Collector`] (`collect`). Embedding requests ([`EngineHandle::embed`])
//! share the thread: one bounded embedding forward runs between generation
//! steps (see `embed`).

mod admission;
mod apply;
mod collect;
mod draft;
mod embed;
mod metrics;
mod output;
mod plan;
mod prefix;
mod running;
mod scheduler;
mod sequence;
mod speculate;
mod stop;
mod think;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

pub use collect::{Collected, Collector, Completion, Conclusion, ProbeOutput};
pub use draft::{DraftError, DraftModel};
pub use embed::{
    l2_normalize, EmbedReceiver, EmbedRequest, Embeddings, Pooling, MAX_EMBED_INPUTS,
    MAX_EMBED_TOKENS,
};
pub use metrics::{EngineMetrics, Histogram, HistogramSnapshot, KvKey, MetricsSnapshot, PolicyKv};
pub use output::{FinishReason, TokenLogprob};
pub use speculate::{
    lookup as ngram_lookup, walk as verify_draft, SpecStats, Speculative, UnknownSpeculative,
    DEFAULT_MAX_DRAFT, MAX_DRAFT,
};
pub use stop::{Emit, StopMatcher};
pub use think::{ConvergenceRule, ProbeSpec, ThinkSpec};

use crate::backend::{Backend, TernBackend};
use crate::constraint::Grammar;
use crate::error::{RuntimeError, Setting};
use crate::kv::policy::KvPolicy;
use crate::kv::SeqCache;
use crate::model::LoadedModel;
use crate::sampler::SamplingParams;
use tern_models::{EvictionLog, KvDtype};

/// Default number of prompt tokens run in one prefill forward.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Most parallel completions one request may ask for (`n`).
pub const MAX_N: usize = 16;

/// Longest stop string, in bytes. Matching holds back text that could start
/// a stop and compares every prefix of every stop after each token, so its
/// cost on the engine thread (shared by every request) grows with the
/// square of a stop's length: 1 KiB keeps it to microseconds per token.
pub const MAX_STOP_BYTES: usize = 1024;

/// A request whose reservation reaches this many bytes hands freed heap
/// memory back to the OS when it retires (see [`crate::memory`]): its
/// scoring rows are many small allocations that glibc would otherwise keep
/// resident in the engine thread's arena after the request is gone.
const TRIM_AFTER_BYTES: usize = 64 << 20;

/// How the engine schedules; every field has a default sized for a small machine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Bytes of KV cache all running sequences together may reserve.
    pub kv_memory: usize,
    /// Requests that may wait for room (KV memory, decode rows) before
    /// `submit` answers [`SubmitError::QueueFull`]; requests that room is
    /// free for are about to run and do not count, even before the engine
    /// has taken them in.
    pub max_queue: usize,
    /// Sequences decoded together at most (rows of one decode batch).
    pub max_running: usize,
    /// Prompt tokens one sequence prefills per step (never more than
    /// `step_tokens`: see [`EngineConfig::prompt_chunk`]).
    pub prefill_chunk: usize,
    /// Tokens (decode rows plus prefill chunks) one step aims at, so a long
    /// prompt never stalls running streams for more than one chunk. Prompt
    /// chunks are never cut to fit: a step with a prompt waiting carries at
    /// least one whole chunk, and further chunks only where they fit.
    pub step_tokens: usize,
    /// Recent prompts whose KV the engine keeps (full-cache requests only) so
    /// that a later prompt sharing a prefix with one (a system prompt, an
    /// earlier turn) prefills only the rest. 0 turns it off, the default: a
    /// reused prefix may have been computed in chunks of another size, whose
    /// attention kernel rounds differently (see `tern_models::flash`).
    pub prefix_cache: usize,
    /// How requests that do not say speculate (`tern serve --speculative`);
    /// off by default.
    pub speculative: Speculative,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_memory: default_kv_memory(),
            max_queue: 256,
            max_running: 64,
            prefill_chunk: 256,
            step_tokens: DEFAULT_PREFILL_CHUNK,
            prefix_cache: 0,
            speculative: Speculative::Off,
        }
    }
}

impl EngineConfig {
    /// Prompt tokens per prefill chunk as the engine reads them: the chunk,
    /// never more than a step. Fixed by the configuration alone, so a prompt
    /// is cut the same way under any load.
    pub fn prompt_chunk(&self) -> usize {
        self.prefill_chunk.min(self.step_tokens).max(1)
    }
}

/// Half of the memory the machine has available now (at least 256 MiB): the KV
/// budget when the user does not set one.
pub fn default_kv_memory() -> usize {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kb: usize = line["MemAvailable:".len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(4 << 30);
    (available / 2).max(256 << 20)
}

/// One generation request, already tokenized.
#[derive(Clone, Debug)]
pub struct SubmitRequest {
    /// Prompt token ids (templated and tokenized by the caller).
    pub prompt: Vec<u32>,
    /// Sampling parameters; child `i` of an `n > 1` request uses `seed + i`.
    pub sampling: SamplingParams,
    /// Most tokens each completion generates.
    pub max_tokens: usize,
    /// Strings that end a completion; the text is cut before them.
    pub stop: Vec<String>,
    /// Stop strings armed only once the completion has written some
    /// non-whitespace text, so an answer that opens with a line break is not
    /// cut to nothing (a forced answer's sentence end).
    pub stop_after_content: Vec<String>,
    /// Keep going past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// KV compression for this request's sequences.
    pub kv_policy: KvPolicy,
    /// How this request's sequences store keys and values (f16 unless asked).
    pub kv_dtype: KvDtype,
    /// Completions sharing the prompt: prefilled once, the cache forked `n` ways.
    pub n: usize,
    /// A compiled constraint on the output (JSON, a schema, a grammar),
    /// enforced while sampling; each completion advances its own copy.
    pub constraint: Option<Grammar>,
    /// Record each sampled token's log-probability in [`Event::Token`].
    pub logprobs: bool,
    /// A thinking budget (and answer probes) for each completion; `max_tokens`
    /// still bounds reasoning and answer together.
    pub think: Option<ThinkSpec>,
    /// Record which cached entries each token saw (its KV policy's evictions)
    /// and return the record in [`KvUsage::evictions`]; the trainer's
    /// `sparse-replay` learner masks attention with it.
    pub record_evictions: bool,
    /// LoRA adapters this request runs under instead of the engine's own
    /// (a server's per-request adapter, addressed by name as `model`); its
    /// rows run in a forward of their own when others run other adapters.
    pub adapters: Option<Arc<tern_models::LoraSet>>,
    /// Speculative decoding for this request; `None` takes the engine's
    /// default ([`EngineConfig::speculative`]). Output is the same either way.
    pub speculative: Option<Speculative>,
    /// A KV policy under which the request goes on past the model's context
    /// (a conversation longer than the window, an answer that outgrows it):
    /// when the next tokens would pass the last position, it evicts down to
    /// its budget and what is kept is re-numbered to make room (see
    /// [`crate::kv::SeqCache::make_room`]). Over a full `kv_policy` it
    /// evicts only there; otherwise it must be `kv_policy` itself. `None`:
    /// the prompt and `max_tokens` must fit the context, and a completion
    /// ends where the context does.
    pub overflow: Option<KvPolicy>,
}

impl SubmitRequest {
    /// A request with defaults (one completion, full cache, no stops).
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        Self {
            prompt,
            sampling,
            max_tokens,
            stop: Vec::new(),
            stop_after_content: Vec::new(),
            ignore_eos: false,
            kv_policy: KvPolicy::Full,
            kv_dtype: KvDtype::default(),
            n: 1,
            constraint: None,
            logprobs: false,
            think: None,
            record_evictions: false,
            adapters: None,
            speculative: None,
            overflow: None,
        }
    }

    /// Tokens each sequence may hold beyond the prompt: generated tokens plus
    /// the forced answer suffix.
    fn extra_tokens(&self) -> usize {
        self.max_tokens + self.think.as_ref().map_or(0, |t| t.answer_suffix.len())
    }
}

/// KV figures for one finished completion.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KvUsage {
    /// The policy's canonical spec string.
    pub policy: String,
    /// How the cache stored keys and values.
    pub dtype: KvDtype,
    /// Peak bytes of keys and values the sequence held.
    pub bytes_peak: usize,
    /// Bytes the sequence held at the end.
    pub bytes_final: usize,
    /// Bytes a full cache would have held for the same tokens.
    pub bytes_full: usize,
    /// The completion's eviction record, when the request asked for one.
    #[serde(skip)]
    pub evictions: Option<Arc<EvictionLog>>,
    /// Times the cache was re-numbered to go on past the model's context
    /// (a request's `overflow` policy).
    #[serde(skip)]
    pub shifts: usize,
    /// Entries the fullest layer held at the end: what the cache kept of
    /// the tokens it read.
    #[serde(skip)]
    pub entries_final: usize,
}

/// What a request's channel carries, in order; per completion `index`, tokens
/// then exactly one `Done`. An `Error` ends the whole request.
#[derive(Clone, Debug)]
pub enum Event {
    /// The prompt has been read (sent once, before any token).
    Prefilled {
        /// Prompt length in tokens.
        prompt_tokens: usize,
    },
    /// One sampled token of completion `index`.
    Token {
        /// Which of the request's `n` completions.
        index: usize,
        /// The token id.
        token: u32,
        /// Text that became final with this token (complete UTF-8, stop strings
        /// withheld); may be empty.
        text: String,
        /// The token's log-probability and alternatives, if asked for.
        logprob: Option<TokenLogprob>,
    },
    /// Completion `index` ended.
    Done {
        /// Which of the request's `n` completions.
        index: usize,
        /// Why it ended.
        finish_reason: FinishReason,
        /// Tokens it generated (a final stop token included).
        completion_tokens: usize,
        /// Its KV cache figures.
        kv: KvUsage,
    },
    /// An answer probe of completion `index` finished (think requests with probes).
    Probe {
        /// Which of the request's `n` completions was probed.
        index: usize,
        /// Tokens the completion had generated when it was probed.
        at: usize,
        /// What the probe wrote after the forced answer suffix.
        text: String,
        /// Tokens the probe generated.
        tokens: usize,
    },
    /// Completion `index` stopped reasoning; the answer suffix follows in its
    /// next token's text, then the answer.
    Concluded {
        /// Which of the request's `n` completions.
        index: usize,
        /// Reasoning tokens it generated.
        at: usize,
        /// True when the probes settled it, false when it hit the budget.
        early: bool,
    },
    /// What speculative decoding did for completion `index` (sent just
    /// before its `Done`, only when the request speculated or asked to).
    Speculated {
        /// Which of the request's `n` completions.
        index: usize,
        /// Draft tokens proposed and accepted, or why speculation was off.
        stats: SpecStats,
    },
    /// The request failed inside the engine; no more events follow.
    Error(String),
}

/// Why a request was not accepted; each maps to a client error or a 429/503.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The request is invalid (empty prompt, too long, bad sampling values ...).
    #[error(transparent)]
    Invalid(#[from] RuntimeError),
    /// The wait queue is full; try again later.
    #[error(
        "the server is busy: {waiting} requests are already waiting (limit {limit}); retry later"
    )]
    QueueFull {
        /// Requests waiting now.
        waiting: usize,
        /// The configured limit.
        limit: usize,
    },
    /// Even alone the request needs more KV memory than the engine has.
    #[error("this request needs {needed} bytes of KV cache but the engine has {kv_memory}; use a budgeted kv_policy, fewer tokens or a smaller n")]
    TooLarge {
        /// Bytes the request would reserve.
        needed: usize,
        /// The engine's KV memory.
        kv_memory: usize,
    },
    /// The engine has shut down.
    #[error("the engine has stopped")]
    Stopped,
}

/// The receiving end of one request: its events in order. Dropping it cancels
/// the request.
pub struct RequestStream {
    /// Engine-wide id of the request (for logs).
    pub id: u64,
    /// Bytes of KV memory reserved for it.
    pub kv_reserved: usize,
    /// Completions it will produce (its `n`).
    pub n: usize,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
}

impl RequestStream {
    /// The next event, or `None` once the request is over (async callers).
    pub async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// The next event, blocking the thread (CLI, trainer; not inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }
}

/// Commands from handles to the engine thread.
enum Command {
    Submit(Box<Pending>),
    /// Several requests the engine takes in together (see `submit_all`).
    SubmitAll(Vec<Pending>),
    /// An embedding request (see `embed`).
    Embed(embed::EmbedJob),
    /// New adapters for every later step, tagged with a version; the result goes
    /// back on `ack` once the engine has switched.
    SetAdapters {
        version: u64,
        adapters: Option<Arc<tern_models::LoraSet>>,
        ack: std::sync::mpsc::SyncSender<Result<(), String>>,
    },
}

/// A submitted request waiting to be admitted.
struct Pending {
    req: SubmitRequest,
    reserve: usize,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    submitted: Instant,
}

/// State shared between the handles and the engine thread.
struct Shared {
    model: Arc<LoadedModel>,
    backend_name: &'static str,
    policies: Option<&'static [&'static str]>,
    /// The KV storage types the backend honours (`None`: all).
    kv_dtypes: Option<Vec<KvDtype>>,
    /// Whether the backend exposes hidden states (embeddings).
    embeds: bool,
    /// The draft model's shape, when the engine has one (`--draft-model`).
    draft: Option<tern_models::ModelConfig>,
    /// Embedding requests submitted and not answered yet: bounded by
    /// `max_queue` like waiting generation requests.
    embeds_pending: AtomicUsize,
    config: EngineConfig,
    metrics: EngineMetrics,
    admission: admission::Admission,
    next_id: AtomicU64,
    stopped: AtomicBool,
    /// Version of the weights every step since the last switch used.
    weights_version: AtomicU64,
}

/// The way into the engine; cheap to clone and share across threads. The
/// engine thread ends when every handle is dropped and its work is done.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Command>,
}

impl EngineHandle {
    /// Starts the engine thread for `model` on Tern's own backend.
    pub fn spawn(model: Arc<LoadedModel>, config: EngineConfig) -> Self {
        let backend = Box::new(TernBackend::new(Arc::clone(&model)));
        Self::spawn_with(model, backend, config)
    }

    /// Starts the engine thread running `backend`; `model` supplies the
    /// tokenizer, template and shape facts the scheduler needs.
    pub fn spawn_with(
        model: Arc<LoadedModel>,
        backend: Box<dyn Backend>,
        config: EngineConfig,
    ) -> Self {
        Self::spawn_with_draft(model, backend, None, config)
    }

    /// As [`EngineHandle::spawn_with`], with a draft model for requests that
    /// speculate with `draft` ([`Speculative::Draft`]); built beside
    /// `model` by [`DraftModel::new`], which checks their vocabularies.
    pub fn spawn_with_draft(
        model: Arc<LoadedModel>,
        backend: Box<dyn Backend>,
        draft: Option<DraftModel>,
        config: EngineConfig,
    ) -> Self {
        let metrics = EngineMetrics::new(config.kv_memory);
        let shared = Arc::new(Shared {
            backend_name: backend.name(),
            policies: backend.supported_policies(),
            kv_dtypes: backend.supported_kv_dtypes(),
            embeds: backend.embeds(),
            draft: draft.as_ref().map(|d| d.config().clone()),
            embeds_pending: AtomicUsize::new(0),
            model,
            config,
            metrics,
            admission: admission::Admission::default(),
            next_id: AtomicU64::new(1),
            stopped: AtomicBool::new(false),
            weights_version: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let engine_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("tern-engine".into())
            .spawn(move || scheduler::run(engine_shared, backend, draft, rx))
            .expect("spawning the engine thread");
        Self { shared, tx }
    }

    /// The model this engine runs.
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.shared.model
    }

    /// Whether `other` is a handle on this very engine (a clone of it), so
    /// a caller can put work for both into one [`EngineHandle::submit_all`]
    /// unit and keep the engine's batching the same from run to run.
    pub fn same_engine(&self, other: &EngineHandle) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Switches the engine to `adapters` (the trainer's policy after an update)
    /// between two steps, so no step mixes weights, and tags later work with
    /// `version`. Blocks until the engine has switched; a backend that cannot
    /// apply adapters is an error.
    pub fn set_adapters(
        &self,
        version: u64,
        adapters: Option<Arc<tern_models::LoraSet>>,
    ) -> Result<(), RuntimeError> {
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        let cmd = Command::SetAdapters {
            version,
            adapters,
            ack,
        };
        if self.tx.send(cmd).is_err() {
            return Err(RuntimeError::Backend("the engine has stopped".into()));
        }
        match done.recv() {
            Ok(res) => res.map_err(RuntimeError::Backend),
            Err(_) => Err(RuntimeError::Backend("the engine has stopped".into())),
        }
    }

    /// The weights version the engine runs (0 until [`EngineHandle::set_adapters`]).
    pub fn weights_version(&self) -> u64 {
        self.shared.weights_version.load(Ordering::Acquire)
    }

    /// Whether the engine has a draft model (requests may ask for `draft`).
    pub fn has_draft_model(&self) -> bool {
        self.shared.draft.is_some()
    }

    /// The backend running the forward pass (`candle`, `llama-cpp`).
    pub fn backend_name(&self) -> &'static str {
        self.shared.backend_name
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Live counters and histograms.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.shared.metrics
    }

    /// Requests submitted and not admitted yet.
    pub fn waiting(&self) -> usize {
        self.shared.admission.pending()
    }

    /// Embedding requests submitted and not answered yet.
    pub fn embeds_pending(&self) -> usize {
        self.shared.embeds_pending.load(Ordering::Acquire)
    }

    /// Whether the engine has work: a generation request submitted and not
    /// finished, or an embedding request not answered. A server that holds
    /// several models unloads one only while this is false.
    pub fn busy(&self) -> bool {
        self.shared.admission.in_flight() || self.embeds_pending() > 0
    }

    /// Bytes of KV memory `req` would reserve: its `n` sequences' worst case
    /// under its policy (see [`SeqCache::reservation_bytes`]).
    pub fn reservation(&self, req: &SubmitRequest) -> usize {
        let cfg = self.shared.model.config();
        let chunk = self.shared.config.prefill_chunk;
        let per_seq = match &req.overflow {
            // Past the context the cache holds at most a context's entries:
            // all of them while the overflow policy waits for the context to
            // fill, and the policy's scoring of them.
            Some(overflow) if req.kv_policy.budget().is_none() => {
                let ctx = cfg.context_length;
                SeqCache::reservation_bytes(cfg, &KvPolicy::Full, req.kv_dtype, ctx, 0, chunk)
                    + SeqCache::scoring_bytes(cfg, overflow, &vec![ctx; cfg.n_layer], ctx, chunk)
            }
            Some(_) => {
                let ctx = cfg.context_length;
                let prompt = req.prompt.len().min(ctx);
                SeqCache::reservation_bytes(
                    cfg,
                    &req.kv_policy,
                    req.kv_dtype,
                    prompt,
                    ctx - prompt,
                    chunk,
                )
            }
            None => SeqCache::reservation_bytes(
                cfg,
                &req.kv_policy,
                req.kv_dtype,
                req.prompt.len(),
                req.extra_tokens(),
                chunk,
            ),
        };
        // A probe is a fork living beside its completion.
        let probes = if req.think.as_ref().is_some_and(|t| t.probe.is_some()) {
            2
        } else {
            1
        };
        // A completion that drafts with the draft model holds a cache there
        // too (never one that may overflow: it does not speculate).
        let draft = match (&self.shared.draft, req.speculative) {
            (Some(dc), Some(Speculative::Draft { .. })) if req.overflow.is_none() => {
                DraftModel::reservation(
                    dc,
                    req.prompt.len(),
                    req.extra_tokens(),
                    self.shared.config.prefill_chunk,
                )
            }
            _ => 0,
        };
        (per_seq * probes + draft) * req.n.max(1)
    }

    /// Validates `req` and queues it; events arrive on the returned stream.
    pub fn submit(&self, req: SubmitRequest) -> Result<RequestStream, SubmitError> {
        let (pending, stream) = self.prepare(req)?;
        let room = (pending.req.n.max(1), pending.reserve);
        if self.tx.send(Command::Submit(Box::new(pending))).is_err() {
            self.shared.admission.leave(room.0, room.1);
            return Err(SubmitError::Stopped);
        }
        Ok(stream)
    }

    /// Validates `req` and queues it for the engine thread, which runs its
    /// inputs between generation steps (batched with other embedding
    /// requests' inputs); the vectors arrive on the returned receiver, one
    /// per input, L2-normalised.
    pub fn embed(&self, req: EmbedRequest) -> Result<EmbedReceiver, SubmitError> {
        if self.shared.stopped.load(Ordering::Relaxed) {
            return Err(SubmitError::Stopped);
        }
        if !self.shared.embeds {
            return Err(SubmitError::Invalid(RuntimeError::InvalidParam {
                param: "model".into(),
                reason: format!(
                    "the {} backend cannot compute embeddings (serve with the tern backend)",
                    self.shared.backend_name
                ),
            }));
        }
        embed::validate(&self.shared.model, &req)?;
        let limit = self.shared.config.max_queue;
        let pending = &self.shared.embeds_pending;
        let waiting = pending.fetch_add(1, Ordering::AcqRel);
        if waiting >= limit {
            pending.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull { waiting, limit });
        }
        let (job, rx) = embed::EmbedJob::new(req);
        if self.tx.send(Command::Embed(job)).is_err() {
            pending.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Stopped);
        }
        Ok(rx)
    }

    /// Validates every request and queues them as one unit: the engine takes
    /// them all in before its next step, so their batches (and therefore their
    /// outputs, to the bit) do not depend on how fast the caller submitted.
    /// The trainer's rollouts rely on this for exact resume. All or none are
    /// queued.
    pub fn submit_all(&self, reqs: Vec<SubmitRequest>) -> Result<Vec<RequestStream>, SubmitError> {
        let mut pendings = Vec::with_capacity(reqs.len());
        let mut streams = Vec::with_capacity(reqs.len());
        for req in reqs {
            match self.prepare(req) {
                Ok((p, s)) => {
                    pendings.push(p);
                    streams.push(s);
                }
                Err(e) => {
                    self.leave_all(&pendings);
                    return Err(e);
                }
            }
        }
        let rooms: Vec<(usize, usize)> = pendings
            .iter()
            .map(|p| (p.req.n.max(1), p.reserve))
            .collect();
        if self.tx.send(Command::SubmitAll(pendings)).is_err() {
            for (rows, bytes) in rooms {
                self.shared.admission.leave(rows, bytes);
            }
            return Err(SubmitError::Stopped);
        }
        Ok(streams)
    }

    /// Gives back the queue places of requests that will not be sent.
    fn leave_all(&self, pendings: &[Pending]) {
        for p in pendings {
            self.shared.admission.leave(p.req.n.max(1), p.reserve);
        }
    }

    /// Checks a request and takes a queue slot for it.
    fn prepare(&self, mut req: SubmitRequest) -> Result<(Pending, RequestStream), SubmitError> {
        if self.shared.stopped.load(Ordering::Relaxed) {
            return Err(SubmitError::Stopped);
        }
        req.speculative
            .get_or_insert(self.shared.config.speculative);
        validate(&self.shared.model, &req)?;
        if req.overflow.is_some() && self.shared.backend_name != "tern" {
            return Err(SubmitError::Invalid(RuntimeError::InvalidParam {
                param: "context_overflow".into(),
                reason: format!(
                    "the {} backend cannot go on past the context under a KV policy \
                     (use the tern backend)",
                    self.shared.backend_name
                ),
            }));
        }
        if matches!(req.speculative, Some(Speculative::Draft { .. })) && self.shared.draft.is_none()
        {
            return Err(SubmitError::Invalid(RuntimeError::setup(
                Setting::DraftModel,
                RuntimeError::InvalidParam {
                    param: "speculative".into(),
                    reason: "`draft` needs a draft model (a smaller model of the same \
                             vocabulary), and none is loaded; use `ngram`, or load one"
                        .into(),
                },
            )));
        }
        if let Some(names) = self.shared.policies {
            if !names.contains(&req.kv_policy.name()) {
                return Err(SubmitError::Invalid(RuntimeError::InvalidParam {
                    param: "kv_policy".into(),
                    reason: format!(
                        "the {} backend supports only {}, not `{}`",
                        self.shared.backend_name,
                        names.join(" and "),
                        req.kv_policy.name()
                    ),
                }));
            }
        }
        if let Some(dtypes) = &self.shared.kv_dtypes {
            if !dtypes.contains(&req.kv_dtype) {
                let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
                return Err(SubmitError::Invalid(RuntimeError::setup(
                    Setting::KvDtype,
                    RuntimeError::InvalidParam {
                        param: "kv_dtype".into(),
                        reason: format!(
                            "the {} backend's cache holds {} (chosen when it loads), not `{}`",
                            self.shared.backend_name,
                            names.join(" and "),
                            req.kv_dtype
                        ),
                    },
                )));
            }
        }
        let reserve = self.reservation(&req);
        let kv_memory = self.shared.config.kv_memory;
        if reserve > kv_memory {
            return Err(SubmitError::TooLarge {
                needed: reserve,
                kv_memory,
            });
        }
        let config = &self.shared.config;
        self.shared
            .admission
            .enter(req.n.max(1), reserve, config)
            .map_err(|full| SubmitError::QueueFull {
                waiting: full.queued,
                limit: config.max_queue,
            })?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let n = req.n.max(1);
        let pending = Pending {
            req,
            reserve,
            events: events_tx,
            submitted: Instant::now(),
        };
        Ok((
            pending,
            RequestStream {
                id,
                kv_reserved: reserve,
                n,
                events: events_rx,
            },
        ))
    }
}

/// The most positions an overflowing request's row may take: what the
/// context leaves beside the most entries `policy` keeps in a layer (its
/// budget, or a sliding layer's window). Zero when it leaves none.
pub(super) fn overflow_room(model: &LoadedModel, policy: &KvPolicy) -> usize {
    let c = model.config();
    let kept = (0..c.n_layer)
        .map(|l| match c.sliding_window(l) {
            Some(w) => w.saturating_sub(1),
            None => policy
                .head_capacity(l, c.n_layer, c.n_kv_head)
                .unwrap_or(c.context_length),
        })
        .max()
        .unwrap_or(0);
    c.context_length.saturating_sub(kept)
}

/// The checks of a request that goes on past the context under `overflow`
/// (its prompt and answer need not fit; the policy must leave room).
fn check_overflow(
    model: &LoadedModel,
    req: &SubmitRequest,
    overflow: &KvPolicy,
) -> Result<(), RuntimeError> {
    let invalid = |reason: String| RuntimeError::InvalidParam {
        param: "context_overflow".into(),
        reason,
    };
    overflow.validate().map_err(|e| invalid(e.to_string()))?;
    if overflow.budget().is_none() {
        return Err(invalid(
            "the full policy evicts nothing, so it cannot go on past the context: \
             name a policy with a budget (streaming, snapkv, h2o, ...)"
                .into(),
        ));
    }
    if overflow.is_relative() {
        return Err(invalid(
            "a relative budget grows with the conversation, so it cannot bound one \
             longer than the context: give the budget in tokens"
                .into(),
        ));
    }
    if req.kv_policy.budget().is_some() && req.kv_policy != *overflow {
        return Err(invalid(format!(
            "the request's kv_policy `{}` and its overflow policy `{overflow}` differ: \
             send one of them, or the same policy in both",
            req.kv_policy
        )));
    }
    if req.record_evictions {
        return Err(invalid(
            "a recorded eviction history cannot be re-numbered past the context".into(),
        ));
    }
    let ctx = model.config().context_length;
    if overflow_room(model, overflow) == 0 {
        return Err(invalid(format!(
            "`{overflow}` keeps as many entries as the context holds ({ctx}): \
             give it a smaller budget"
        )));
    }
    if req.prompt.is_empty() {
        return Err(RuntimeError::EmptyPrompt);
    }
    Ok(())
}

/// Everything about a request that can be checked before it is queued.
fn validate(model: &LoadedModel, req: &SubmitRequest) -> Result<(), RuntimeError> {
    let invalid = |param: &str, reason: String| RuntimeError::InvalidParam {
        param: param.into(),
        reason,
    };
    req.sampling.validate()?;
    match req.speculative {
        Some(Speculative::Ngram { max_draft }) => {
            Speculative::ngram(max_draft).map_err(|e| invalid("speculative", e.to_string()))?;
        }
        Some(Speculative::Draft { max_draft }) => {
            Speculative::draft(max_draft).map_err(|e| invalid("speculative", e.to_string()))?;
        }
        _ => {}
    }
    req.kv_policy
        .validate()
        .and_then(|()| req.kv_policy.check_context(model.config().context_length))
        .map_err(|e| invalid("kv_policy", e.to_string()))?;
    if let Some(long) = req.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(invalid(
            "stop",
            format!(
                "stop strings may be at most {MAX_STOP_BYTES} bytes, got one of {}",
                long.len()
            ),
        ));
    }
    req.kv_dtype
        .check(model.config().head_dim)
        .map_err(|e| invalid("kv_dtype", e.to_string()))?;
    if req.n == 0 || req.n > MAX_N {
        return Err(invalid(
            "n",
            format!("must be between 1 and {MAX_N}, got {}", req.n),
        ));
    }
    if req.max_tokens == 0 {
        return Err(invalid("max_tokens", "must be at least 1".into()));
    }
    if let Some(overflow) = &req.overflow {
        check_overflow(model, req, overflow)?;
    } else {
        model.check_prompt(req.prompt.len())?;
        let ctx = model.config().context_length;
        if req.prompt.len() + req.extra_tokens() > ctx {
            return Err(RuntimeError::ContextRequest {
                prompt_tokens: req.prompt.len(),
                max_tokens: req.extra_tokens(),
                context_length: ctx,
            });
        }
    }
    if let Some(think) = &req.think {
        if think.budget == 0 {
            return Err(invalid(
                "thinking_budget_tokens",
                "must be at least 1".into(),
            ));
        }
        if think.answer_suffix.is_empty() {
            return Err(invalid(
                "answer_suffix",
                "a thinking budget needs a suffix that forces the answer".into(),
            ));
        }
        if let Some(p) = &think.probe {
            if p.every == 0 || p.max_tokens == 0 {
                return Err(invalid(
                    "probe",
                    "probes need an interval and a token budget of at least 1".into(),
                ));
            }
        }
    }
    let vocab = model.config().vocab_size as u32;
    if let Some(&(token, _)) = req.sampling.logit_bias.iter().find(|(t, _)| *t >= vocab) {
        return Err(invalid(
            "logit_bias",
            format!("token id {token} is outside the vocabulary (0..{vocab})"),
        ));
    }
    Ok(())
}
