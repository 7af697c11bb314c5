//! `tern serve`: the OpenAI-compatible HTTP server.
//!
//! Turns the flags into a `tern_server::ServerConfig`, starts a tokio runtime
//! and hands `tern_server::serve` a loader that resolves `--model` (pulling a
//! registry model on first use) and loads it, so the port is bound and
//! answering 503 while the weights load. Prints one line when listening and
//! one when the model is ready; startup failures are one-line errors.
//!
//! With several models (`--model` repeated, `--models-dir`) it resolves
//! every file at startup (pulling registry models that are missing) and
//! hands `tern_server::serve_models` a loader that each model's first
//! request runs; it prints a line as models load and unload.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tern_hub as registry;
use tern_runtime::engine::{default_kv_memory, EngineConfig};
use tern_runtime::LoadedModel;
use tern_server::registry::{ModelSpec, RegistryConfig};
use tern_server::size::format_size;
use tern_server::{ConnectionLimits, Cors, LoadError, Loaded, ServeEvent, ServerConfig};

use super::args::{parse_speculative, KvArgs};
use super::backend::{self, BackendKind, Sizing};
use super::resolve;
use clap::Args;

/// `tern serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Registry name or path to a GGUF file (pulled on first use). Its id in
    /// the API is the registry name or the file stem. Repeat it (or add
    /// --models-dir) to serve several models: each is loaded by the first
    /// request naming it and unloaded after --model-idle-unload. Default:
    /// the registry's default model.
    #[arg(long, short = 'm')]
    pub model: Vec<String>,
    /// Serve every `.gguf` file in DIR (not its subdirectories) beside any
    /// --model, each named by its file stem, loaded on first use.
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// With several models: unload a model nobody has used for this long
    /// (`300`, `1.5`, `500ms`, `10m`; 0 keeps models loaded). A request for
    /// an unloaded model loads it again and waits for the load.
    #[arg(long, default_value = "300", value_parser = tern_server::duration::parse_duration)]
    pub model_idle_unload: std::time::Duration,
    /// With several models: memory the loaded models' weights (their files'
    /// sizes) and KV budgets (--kv-memory each) may take together; a model
    /// that does not fit unloads idle ones, or its request gets a 503.
    /// Default: three quarters of the memory available at start.
    #[arg(long, value_parser = tern_server::size::parse_size)]
    pub models_memory: Option<usize>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Default KV policy of requests that do not send `kv_policy`.
    #[command(flatten)]
    pub kv: KvArgs,
    /// KV cache memory all running requests share: 2GiB, 512MiB, 1G or bytes
    /// (default: half the memory available at start). With several models,
    /// each loaded model's (default: --models-memory over twice the number
    /// of models).
    #[arg(long, value_parser = tern_server::size::parse_size)]
    pub kv_memory: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1/* requests.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (first line; keeps it out of `ps`).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Serve without an API key on a non-loopback --host. Without this flag
    /// such a server refuses to start: anyone who can reach the port could
    /// use the model, swap or unload its adapters and, with
    /// --allow-code-execution, run programs.
    #[arg(long)]
    pub insecure_no_key: bool,
    /// Requests that may wait for admission before new ones get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Allow browser calls from these origins: comma-separated, or `*`.
    #[arg(long)]
    pub cors: Option<String>,
    /// Largest request body (413 above it): 4MiB, 64KiB or bytes.
    #[arg(long, default_value = "4MiB", value_parser = tern_server::size::parse_size)]
    pub max_body: usize,
    /// Run client-written Python: best-of-N requests with `aggregate:
    /// "reward"` send `tests` that the server executes against each
    /// candidate. Off by default (such requests get 403). With it, any client
    /// that can reach the API (and holds the key, if one is set) can run
    /// programs of its choosing on this machine, each inside the bubblewrap
    /// sandbox (no network, no files but the Python runtime, 2 s, 256 MiB;
    /// docs/SECURITY.md). Needs `bwrap`: the server refuses to start without it.
    #[arg(long)]
    pub allow_code_execution: bool,
    /// Most code sandboxes alive at once across all requests (each judged
    /// test is two: the candidate's program and the test, in sandboxes of
    /// their own). More tests wait their turn; none is refused. Default: two
    /// per core.
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=4096))]
    pub max_sandboxes: Option<u64>,
    /// Sequences decoded together at most.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// Prompt tokens one sequence prefills per engine step.
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Recent prompts whose KV the server keeps (full-cache requests), so a
    /// prompt sharing its beginning with one (the system prompt, earlier turns
    /// of a chat) prefills only the rest; 0 turns it off. The kept KV counts
    /// against --kv-memory and gives way to requests.
    #[arg(long, default_value_t = 8)]
    pub prefix_cache: usize,
    /// Speculative decoding for requests that do not send `speculative`:
    /// `off` (the default without --draft-model), `ngram` (prompt lookup:
    /// drafts copied from where the text's latest words occurred before,
    /// verified in one forward; output unchanged), `draft` (the
    /// --draft-model proposes; the default with one), or
    /// `ngram:max_draft=N` / `draft:max_draft=N`.
    #[arg(long, value_parser = parse_speculative)]
    pub speculative: Option<tern_runtime::engine::Speculative>,
    /// A smaller model of the same vocabulary (path or registry name),
    /// loaded beside --model, that drafts tokens for requests speculating
    /// with `draft`; its KV per request counts against --kv-memory. One
    /// --model only. Refused at startup if its vocabulary differs.
    #[arg(long)]
    pub draft_model: Option<String>,
    /// What runs the forward pass: Tern's own kernels or llama.cpp (full and
    /// streaming KV policies only).
    #[arg(long, value_enum, default_value = "tern")]
    pub backend: crate::cli::backend::BackendKind,
    /// A second model (path or registry name) loaded beside --model as its
    /// own engine; `aggregate: synthesize` uses it to write the synthesis.
    /// A model that fails to load stops the server at startup.
    #[arg(long)]
    pub synthesizer_model: Option<String>,
    /// Host names (HOST or HOST:PORT, comma-separated) accepted in the Host
    /// header beside the bound address's own; `*` accepts any Host and must
    /// be given explicitly. By default (this stops DNS-rebinding pages):
    /// bound to loopback, localhost, 127.0.0.1 and [::1] at the bound port;
    /// bound to one address, that address at the bound port; bound to every
    /// interface (0.0.0.0, ::), any IP address and localhost at the bound
    /// port. Clients that reach the server by a name need it listed here.
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Serve /metrics without the API key (it needs the key by default when
    /// one is set).
    #[arg(long)]
    pub metrics_public: bool,
    /// Let control-token text such as `<|im_start|>` written inside chat
    /// messages become control tokens. Off by default, so a user cannot
    /// forge a system turn; only the chat template's own tokens are special.
    #[arg(long)]
    pub allow_special_tokens_in_content: bool,
    /// Where a reasoning model's `<think>` block goes when a request does
    /// not send `reasoning_format` (llama-server's flag and values): `none`
    /// leaves it in `content`; `deepseek` and `auto` (the default, as in
    /// llama-server, so its clients see the same answer) return it as
    /// `reasoning_content`. Only models whose chat template marks reasoning
    /// (Qwen3, DeepSeek-R1) are split
    #[arg(long, default_value = "auto", value_parser = ["none", "deepseek", "auto"])]
    pub reasoning_format: String,
    /// What a request whose prompt leaves its answer no room in the context
    /// gets when it does not send `context_overflow`: `error` (the default:
    /// a 400 with the numbers, as OpenAI and llama-server answer, so no
    /// client is answered about a conversation the model did not read
    /// whole), `shift` / `shift:keep=N` (keep the first N tokens, default
    /// 4, and the newest; drop the oldest between them), or a KV policy
    /// with a budget such as `snapkv:budget=1024` or
    /// `streaming:budget=1024,sink=4` (read the whole conversation; each time
    /// the context fills, the policy evicts down to its budget and the kept
    /// tokens are re-numbered, so prompt and answer may both run past it)
    #[arg(long, default_value = "error")]
    pub context_overflow: String,
    /// Tokens of context a sequence may span (llama.cpp's `-c`): prompts,
    /// answers and each request's KV reservation are held to it. Default:
    /// the length the model was trained for; at most that
    #[arg(long, short = 'c', value_name = "TOKENS")]
    pub ctx: Option<usize>,
    /// Connections served at once; further ones wait to be accepted.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Time a request's headers may take to arrive, counted from when the
    /// connection is ready for a request, so also the longest a keep-alive
    /// connection may sit idle: 10s, 500ms, 2m.
    #[arg(long, default_value = "10s", value_parser = tern_server::duration::parse_duration)]
    pub header_timeout: std::time::Duration,
    /// Time a request's whole body may take to arrive (408 after).
    #[arg(long, default_value = "30s", value_parser = tern_server::duration::parse_duration)]
    pub body_timeout: std::time::Duration,
    /// After Ctrl-C or SIGTERM, how long in-flight requests may take to
    /// finish before the server exits anyway.
    #[arg(long, default_value = "30s", value_parser = tern_server::duration::parse_duration)]
    pub shutdown_grace: std::time::Duration,
    /// How POST /v1/embeddings turns an input's tokens into one vector. The
    /// model reads the input once; each token then has a final hidden state
    /// (after the output norm), and pooling picks how those become one
    /// vector, which is then scaled to unit length. `mean` suits most
    /// models and inputs; `last` suits models trained to sum up a text in
    /// its final position (their cards say so, often with an end token the
    /// client appends).
    #[arg(long, value_enum, default_value = "mean")]
    pub embedding_pooling: EmbeddingPooling,
    /// How many POST /v1/responses results the server keeps in memory, so
    /// a client can continue a conversation with `previous_response_id` or
    /// read one back with GET /v1/responses/{id}. The oldest are forgotten
    /// first; a request naming a forgotten one gets a 404 (never a silently
    /// shorter conversation). Requests with `store: false` are not kept; 0
    /// keeps none.
    #[arg(long, default_value_t = tern_server::DEFAULT_RESPONSES_STORE)]
    pub responses_store: usize,
    /// Most memory the stored POST /v1/responses results may take
    /// together (each is kept as its JSON text): 256MiB, 1GiB or bytes.
    /// The oldest are forgotten first once it is full; a response larger
    /// than all of it is not stored, and a request whose input alone would
    /// be is refused (400) unless it sends `store: false`. With
    /// --state-store it bounds each response, and Redis's own maxmemory the
    /// total.
    #[arg(long, default_value = "256MiB", value_parser = tern_server::size::parse_size)]
    pub responses_store_bytes: usize,
    /// Keep stored responses in a Redis server (`redis://host:port[/db]`)
    /// instead of this process's memory: replicas behind a load balancer
    /// that name the same store continue each other's conversations
    /// (docs/SCALING.md). Checked at startup; later failures are 503s.
    /// Every Redis call has a 2 s connect, read and write timeout, so a
    /// Redis that stops answering costs a request a 503, never a hang.
    #[arg(long, value_name = "URL")]
    pub state_store: Option<String>,
    /// Allow LoRA adapters under DIR to be loaded while the server runs
    /// (POST /v1/load_lora_adapter {"lora_name", "lora_path"}, vLLM's
    /// endpoint; /v1/unload_lora_adapter drops one); a request then names an
    /// adapter as its `model`. Off by default: a client names a path, so the
    /// server reads only files under DIR. `tern train --rollout-endpoints`
    /// publishes each update this way.
    #[arg(long, value_name = "DIR")]
    pub lora_dir: Option<std::path::PathBuf>,
    /// Most LoRA adapters held at once.
    #[arg(long, default_value_t = tern_server::DEFAULT_MAX_LORAS, value_name = "N")]
    pub max_loras: usize,
}

/// `--embedding-pooling`: how token states become one embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EmbeddingPooling {
    /// The average over every token of the input.
    Mean,
    /// The last token's state alone.
    Last,
}

impl From<EmbeddingPooling> for tern_runtime::engine::Pooling {
    fn from(p: EmbeddingPooling) -> Self {
        match p {
            EmbeddingPooling::Mean => Self::Mean,
            EmbeddingPooling::Last => Self::Last,
        }
    }
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &ServeArgs) -> Result<()> {
    if a.models_dir.is_some() || a.model.len() > 1 {
        return run_several(a);
    }
    let spec = a
        .model
        .first()
        .cloned()
        .unwrap_or_else(|| registry::DEFAULT_MODEL.to_string());
    let config = server_config(a, &spec, None)?;
    if let Some(warning) = exposure_check(&config, a.insecure_no_key)? {
        eprintln!("{warning}");
    }
    if let Some(note) = host_note(&config) {
        eprintln!("{note}");
    }
    let synth_spec = a
        .synthesizer_model
        .as_ref()
        .map(|s| (model_id(s), s.clone()));
    let draft_spec = a.draft_model.clone();
    let model_id = config.model_id.clone();
    let policy = config.kv_policy.to_string();
    let kv_dtype = config.kv_dtype;
    let kv_memory = format_size(config.engine.kv_memory);
    let opener = Opener::new(a, &config);
    let load = move || -> Result<Loaded, LoadError> {
        let load = || -> Result<Loaded> {
            let path = resolve::model_path(&spec)?;
            let (model, backend) = opener.open(&path)?;
            let draft = resolve::draft_model(draft_spec.as_deref(), &model)?;
            let synthesizer = match &synth_spec {
                Some((id, s)) => {
                    let m = resolve::load(s)
                        .with_context(|| format!("loading --synthesizer-model {s}"))?;
                    Some((id.clone(), Arc::new(m)))
                }
                None => None,
            };
            Ok(Loaded {
                model,
                backend,
                synthesizer,
                draft,
            })
        };
        // Keep the whole chain of causes in the one message.
        load().map_err(|e| format!("{e:#}").into())
    };
    let policy = format!("{policy}, kv dtype {kv_dtype}");
    let on_event = move |event: ServeEvent| announce(&event, &model_id, &policy, &kv_memory);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tern-http")
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(tern_server::serve(config, load, on_event));
    // Do not wait for a model load (or pull) still running on a blocking thread.
    runtime.shutdown_background();
    Ok(served?)
}

/// How a model file becomes a model and the backend that runs it, with the
/// server's backend, KV storage type and budgets.
#[derive(Clone)]
struct Opener {
    kind: BackendKind,
    kv_dtype: tern_runtime::kv::KvDtype,
    kv_memory: usize,
    max_running: usize,
    ctx: Option<usize>,
}

impl Opener {
    fn new(a: &ServeArgs, config: &ServerConfig) -> Self {
        Self {
            kind: a.backend,
            kv_dtype: config.kv_dtype,
            kv_memory: config.engine.kv_memory,
            max_running: config.engine.max_running,
            ctx: a.ctx,
        }
    }

    fn open(
        &self,
        path: &Path,
    ) -> Result<(Arc<LoadedModel>, Box<dyn tern_runtime::backend::Backend>)> {
        let mut model = LoadedModel::load(path)?;
        if let Some(n) = self.ctx {
            model
                .limit_context(n)
                .with_context(|| format!("--ctx for {}", path.display()))?;
        }
        let model = Arc::new(model);
        let c = model.config();
        // llama.cpp's shared cache holds what the engine's KV budget admits,
        // counted as the engine counts (its storage type's bytes per token).
        let per_token = 2 * c.n_layer * c.n_kv_head * self.kv_dtype.row_bytes(c.head_dim);
        let sizing = Sizing {
            n_ctx: (self.kv_memory / per_token.max(1)).max(c.context_length),
            n_seq: self.max_running * 2,
            kv_dtype: self.kv_dtype,
        };
        let backend = backend::open(self.kind, path, &model, &sizing)?;
        Ok((model, backend))
    }
}

/// `tern serve` with several models: every file resolved now, each loaded
/// by the first request naming it.
fn run_several(a: &ServeArgs) -> Result<()> {
    if a.synthesizer_model.is_some() {
        bail!(
            "--synthesizer-model works with one --model; with several, a request names any \
             served model as its synthesizer_model"
        );
    }
    if a.lora_dir.is_some() {
        bail!("--lora-dir works with one --model (adapters run on the one served model)");
    }
    if a.draft_model.is_some() {
        bail!("--draft-model works with one --model (it drafts for that model's vocabulary)");
    }
    let models = model_specs(&a.model, a.models_dir.as_deref())?;
    let memory = a
        .models_memory
        .unwrap_or_else(|| default_kv_memory() / 2 * 3);
    // Half the budget for KV, shared evenly, unless --kv-memory says.
    let kv_memory = a
        .kv_memory
        .unwrap_or(memory / (2 * models.len()))
        .max(1 << 20);
    let config = server_config(a, &models[0].id, Some(kv_memory))?;
    if let Some(warning) = exposure_check(&config, a.insecure_no_key)? {
        eprintln!("{warning}");
    }
    if let Some(note) = host_note(&config) {
        eprintln!("{note}");
    }
    let limits = RegistryConfig {
        memory,
        idle_unload: Some(a.model_idle_unload).filter(|d| !d.is_zero()),
    };
    let names: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
    let summary = format!(
        "models {}; loaded on first use, {}; memory {} for weights and KV, kv memory {} each, \
         kv policy {}, kv dtype {}",
        names.join(", "),
        match limits.idle_unload {
            Some(d) => format!("unloaded after {} s idle", d.as_secs_f64()),
            None => "never unloaded".to_string(),
        },
        format_size(memory),
        format_size(kv_memory),
        config.kv_policy,
        config.kv_dtype
    );
    let opener = Opener::new(a, &config);
    let load = move |spec: &ModelSpec| -> Result<Loaded, LoadError> {
        let (model, backend) = opener.open(&spec.path).map_err(|e| format!("{e:#}"))?;
        Ok(Loaded {
            model,
            backend,
            synthesizer: None,
            draft: None,
        })
    };
    let on_event = move |event: ServeEvent| announce_several(&event, &summary);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tern-http")
        .build()
        .context("starting the async runtime")?;
    let served = runtime.block_on(tern_server::serve_models(
        config, models, limits, load, on_event,
    ));
    runtime.shutdown_background();
    Ok(served?)
}

/// Every model to serve: each `--model` (a file, or a registry name pulled
/// now if missing) and each `.gguf` in `dir`, in that order.
fn model_specs(models: &[String], dir: Option<&Path>) -> Result<Vec<ModelSpec>> {
    let mut specs = Vec::new();
    for spec in models {
        let path = resolve::model_path(spec).with_context(|| format!("--model {spec}"))?;
        specs.push(ModelSpec {
            id: model_id(spec),
            path,
        });
    }
    if let Some(dir) = dir {
        let entries =
            std::fs::read_dir(dir).with_context(|| format!("--models-dir {}", dir.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        if files.is_empty() {
            bail!("--models-dir {}: no .gguf files in it", dir.display());
        }
        files.sort();
        for path in files {
            specs.push(ModelSpec {
                id: model_id(&path.to_string_lossy()),
                path,
            });
        }
    }
    Ok(specs)
}

/// The several-model server's progress: listening, then each load and unload.
fn announce_several(event: &ServeEvent, summary: &str) {
    match event {
        ServeEvent::Listening { addr } => {
            println!("tern serve: listening on http://{addr} ({summary})")
        }
        ServeEvent::Ready { .. } => {}
        ServeEvent::ModelLoaded { id, seconds } => {
            println!("tern serve: model {id} loaded in {seconds:.1} s")
        }
        ServeEvent::ModelLoadFailed { id, error } => {
            eprintln!("tern serve: model {id} failed to load: {error}")
        }
        ServeEvent::ModelUnloaded { id, reason } => {
            println!("tern serve: model {id} unloaded ({reason})")
        }
        ServeEvent::ShuttingDown => eprintln!(
            "tern serve: shutting down, finishing in-flight requests \
             (Ctrl-C again to quit now)"
        ),
    }
}

/// Prints the server's progress: one line when listening, one when ready.
fn announce(event: &ServeEvent, model_id: &str, policy: &str, kv_memory: &str) {
    match event {
        ServeEvent::Listening { addr } => println!(
            "tern serve: listening on http://{addr} \
             (model {model_id}, kv policy {policy}, kv memory {kv_memory})"
        ),
        ServeEvent::Ready { seconds } => {
            println!("tern serve: model {model_id} ready in {seconds:.1} s")
        }
        ServeEvent::ShuttingDown => eprintln!(
            "tern serve: shutting down, finishing in-flight requests \
             (Ctrl-C again to quit now)"
        ),
        // One model never loads or unloads after it is ready.
        ServeEvent::ModelLoaded { .. }
        | ServeEvent::ModelLoadFailed { .. }
        | ServeEvent::ModelUnloaded { .. } => {}
    }
}

/// Validated server settings from the flags, serving `model` (its id
/// taken from it), with `kv_memory` as each engine's KV budget when given.
fn server_config(a: &ServeArgs, model: &str, kv_memory: Option<usize>) -> Result<ServerConfig> {
    for (flag, value) in [
        ("--max-queue", a.max_queue),
        ("--max-running", a.max_running),
        ("--prefill-chunk", a.prefill_chunk),
        ("--max-connections", a.max_connections),
    ] {
        if value == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    let api_key = match (&a.api_key, &a.api_key_file) {
        (Some(key), _) => Some(non_empty_key(key.clone(), "--api-key")?),
        (None, Some(file)) => Some(read_key_file(file)?),
        (None, None) => None,
    };
    let cors = match &a.cors {
        Some(spec) => Cors::parse(spec)?,
        None => Cors::Off,
    };
    if let Some(dir) = &a.lora_dir {
        anyhow::ensure!(
            dir.is_dir(),
            "--lora-dir {}: not a directory",
            dir.display()
        );
    }
    if a.allow_code_execution {
        // Refuse now rather than on the first request: never run code unsandboxed.
        tern_solve::verify::check().context("--allow-code-execution")?;
        if let Some(max) = a.max_sandboxes {
            tern_solve::verify::gate::set_max_sandboxes(max as usize);
        }
        eprintln!(
            "code execution: {}; at most {} sandboxes at once",
            tern_solve::verify::isolation().context("--allow-code-execution")?,
            tern_solve::verify::gate::max_sandboxes()
        );
    }
    let engine = EngineConfig {
        // llama.cpp allocates its whole cache up front: default it to 1 GiB
        // there instead of half the machine.
        kv_memory: kv_memory
            .or(a.kv_memory)
            .unwrap_or_else(|| match a.backend {
                BackendKind::Tern => default_kv_memory(),
                BackendKind::LlamaCpp => 1 << 30,
            }),
        max_queue: a.max_queue,
        max_running: a.max_running,
        prefill_chunk: a.prefill_chunk,
        prefix_cache: a.prefix_cache,
        speculative: resolve::speculative(a.speculative, a.draft_model.is_some())?,
        ..EngineConfig::default()
    };
    Ok(ServerConfig {
        host: a.host.clone(),
        port: a.port,
        model_id: model_id(model),
        kv_policy: a.kv.kv_policy.clone(),
        kv_dtype: a.kv.kv_dtype,
        engine,
        api_key,
        cors,
        max_body: a.max_body,
        allowed_hosts: a.allowed_hosts.clone(),
        metrics_public: a.metrics_public,
        content_tokens: super::generate::content_tokens(a.allow_special_tokens_in_content),
        allow_code_execution: a.allow_code_execution,
        reasoning_format: a
            .reasoning_format
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?,
        context_overflow: tern_server::overflow::ContextOverflow::parse(&a.context_overflow)
            .map_err(|e| anyhow::anyhow!("--context-overflow: {e}"))?,
        connections: ConnectionLimits {
            max_connections: a.max_connections,
            header_timeout: a.header_timeout,
            body_timeout: a.body_timeout,
            shutdown_grace: a.shutdown_grace,
        },
        embedding_pooling: a.embedding_pooling.into(),
        responses_store: a.responses_store,
        responses_store_bytes: a.responses_store_bytes,
        state_store: a.state_store.clone(),
        lora_dir: a.lora_dir.clone(),
        max_loras: a.max_loras,
    })
}

/// A server reachable beyond this machine with no API key: an error (anyone
/// on the network could use it), or with `--insecure-no-key` the warning to
/// print. `None` when there is a key or the bind is loopback.
fn exposure_check(config: &ServerConfig, insecure_no_key: bool) -> Result<Option<String>> {
    if config.api_key.is_some() || tern_server::origin::is_loopback(&config.host) {
        return Ok(None);
    }
    let mut risk = "anyone who can reach this port could use the model and load or unload \
                    its adapters"
        .to_string();
    if config.allow_code_execution {
        risk.push_str(" and run programs in its sandbox (--allow-code-execution)");
    }
    if !insecure_no_key {
        bail!(
            "refusing to listen on {} without an API key: {risk}; set --api-key-file FILE, \
             bind to 127.0.0.1, or pass --insecure-no-key to serve without one",
            config.host
        );
    }
    Ok(Some(format!(
        "tern serve: WARNING: listening on {} without an API key (--insecure-no-key): {risk}",
        config.host
    )))
}

/// What a non-loopback server answers, when no `--allowed-hosts` widens it:
/// clients that use a name are refused until it is listed.
fn host_note(config: &ServerConfig) -> Option<String> {
    let host = &config.host;
    if tern_server::origin::is_loopback(host) || !config.allowed_hosts.is_empty() {
        return None;
    }
    let answered = if tern_server::origin::is_unspecified(host) {
        "IP addresses and localhost".to_string()
    } else {
        host.clone()
    };
    Some(format!(
        "tern serve: requests are answered only for Host {answered} at this port; clients \
         that use a name need --allowed-hosts NAME (e.g. --allowed-hosts $(hostname)), \
         or '*' for any"
    ))
}

/// The id clients send as `model`: the registry name, or the file's stem.
fn model_id(spec: &str) -> String {
    if let Some(entry) = registry::lookup(spec) {
        return entry.name.to_string();
    }
    Path::new(spec)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| spec.to_string())
}

/// The first line of `path`, trimmed.
fn read_key_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --api-key-file {}", path.display()))?;
    let key = text.lines().next().unwrap_or("").trim().to_string();
    non_empty_key(key, &format!("--api-key-file {}", path.display()))
}

fn non_empty_key(key: String, source: &str) -> Result<String> {
    if key.trim().is_empty() {
        bail!("{source}: the API key is empty");
    }
    Ok(key.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_binds_without_a_key_are_refused_unless_insecure() {
        let open = ServerConfig::new("0.0.0.0", 8080, "m");
        let e = exposure_check(&open, false).unwrap_err().to_string();
        assert!(
            e.contains("without an API key") && e.contains("--insecure-no-key"),
            "{e}"
        );
        let w = exposure_check(&open, true).unwrap().unwrap();
        assert!(
            w.contains("WARNING") && w.contains("--insecure-no-key"),
            "{w}"
        );
        let keyed = ServerConfig {
            api_key: Some("k".into()),
            ..open.clone()
        };
        assert_eq!(exposure_check(&keyed, false).unwrap(), None);
        for local in ["127.0.0.1", "localhost", "::1"] {
            let c = ServerConfig::new(local, 8080, "m");
            assert_eq!(exposure_check(&c, false).unwrap(), None, "{local}");
            assert_eq!(host_note(&c), None, "{local}");
        }
        assert!(host_note(&open).is_some_and(|n| n.contains("--allowed-hosts")));
        let lan = ServerConfig::new("192.168.1.4", 8080, "m");
        assert!(host_note(&lan).is_some_and(|n| n.contains("192.168.1.4")));
        let listed = ServerConfig {
            allowed_hosts: vec!["tern.lan".into()],
            ..lan
        };
        assert_eq!(host_note(&listed), None);
    }

    #[test]
    fn model_ids() {
        assert_eq!(model_id("smollm2-135m-instruct"), "smollm2-135m-instruct");
        assert_eq!(model_id("models/cache/Foo.Q4_1.gguf"), "Foo.Q4_1");
    }
}
