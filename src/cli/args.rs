//! Command-line arguments: plain data parsed by clap, validated by each command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Tern: an embedded LLM runtime whose KV cache can be compressed to a budget.
///
/// Models are GGUF files. `--model` takes a registry name (see `tern pull --list`)
/// or a path to any GGUF file; the default model is fetched on first use.
#[derive(Debug, Parser)]
#[command(name = "tern", version, about, long_about = None)]
pub struct Cli {
    /// Worker threads for tensor kernels (default: all cores).
    #[arg(long, global = true, env = "TERN_THREADS")]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch a model from the registry into the model directory ($TERN_HOME or models/cache).
    Pull(PullArgs),
    /// Print a model's architecture, sizes, quantization and tokenizer facts.
    Info(ModelArgs),
    /// Tokenize text from stdin and print the token ids.
    Tokenize(TokenizeArgs),
    /// Generate a completion for one prompt, streaming text to stdout.
    Generate(GenerateArgs),
    /// Chat interactively with a model (empty line or Ctrl-D quits, /reset clears).
    Chat(ChatArgs),
    /// Compute perplexity over a text file the way llama.cpp's llama-perplexity does.
    Perplexity(PerplexityArgs),
    /// Measure what KV policies cost in quality and save in memory (perplexity,
    /// passkey retrieval, KV bytes), printing Markdown tables.
    KvEval(super::kv_eval::KvEvalArgs),
    /// Measure prefill and decode speed (pp/tg, as llama-bench), memory and KV bytes.
    Bench(BenchArgs),
    /// Best-of-N on one question: sample N answers (one shared prefill) and
    /// aggregate them by majority vote, a synthesizer, or unit tests.
    Bon(BonArgs),
    /// Accuracy, tokens and time of answer strategies on a JSONL task file
    /// (single, majority@N, synthesize@N, adaptive[@N]).
    Eval(EvalArgs),
    /// Training data for a synthesizer: N candidates per task, the synthesis
    /// prompt synthesize@N shows, K syntheses, the correct ones kept as
    /// targets; the file trains with `tern train --task FILE`.
    SynthData(super::synth_data::SynthDataArgs),
    /// Serve an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health, /metrics) with continuous batching.
    Serve(ServeArgs),
    /// Fine-tune on this machine under a memory cap: GRPO or SFT, LoRA or full,
    /// rollouts through the serving engine, resumable checkpoints.
    Train(Box<super::train::TrainArgs>),
    /// Draw training curves from a metrics JSONL file into a PNG: one panel
    /// per key against `step`.
    Plot(PlotArgs),
    /// Merge a training checkpoint into its base model and write a GGUF that
    /// `tern serve` and llama.cpp load, then check its logits.
    Export(super::export::ExportArgs),
    /// Quantize a GGUF to another type (q4_0 ... q8_0, q4_k_m, q6_k, f16, bf16)
    /// with the same tensor types and bytes as llama.cpp's llama-quantize.
    ///
    /// Types, smallest first within each family:
    ///   q4_0, q4_1, q5_0, q5_1, q8_0   32-value blocks (q8_0 is near-lossless)
    ///   q4_k_s, q4_k_m, q5_k_m, q6_k   K-quant mixes: 256-value super-blocks,
    ///                                  more bits where llama.cpp puts them
    ///   iq4_nl, iq4_xs                 4-bit non-linear values (blocks of 32;
    ///                                  super-blocks of 256 with 6-bit scales)
    ///   f16, bf16                      16-bit floats, no block quantization
    ///
    /// Every tensor gets the type and the bytes llama-quantize gives it
    /// (default settings, no importance matrix): the output projection keeps
    /// 6 or 8 bits, norms stay as they are, and a row length that is not whole
    /// super-blocks falls back to a 32-value format. q4_k_m is the usual
    /// choice for a small, good model; q8_0 when memory allows.
    ///
    /// An already-quantized input is dequantized and quantized again (as
    /// llama-quantize's --allow-requantize): allowed, with a warning, since
    /// the result is worse than quantizing the F32/F16/BF16 original.
    ///
    /// Example: tern quantize -m model-f16.gguf --out model-q4_k_m.gguf -t q4_k_m
    #[command(verbatim_doc_comment)]
    Quantize(super::quantize::QuantizeArgs),
}

/// Which model to use.
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// Registry name or path to a GGUF file.
    #[arg(long, short = 'm', default_value = tern_hub::DEFAULT_MODEL)]
    pub model: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `tern pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// Registry name of the model to fetch.
    #[arg(default_value = tern_hub::DEFAULT_MODEL)]
    pub name: String,
    /// List the registry instead of pulling.
    #[arg(long)]
    pub list: bool,
}

/// `tern tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Treat control-token text such as `<|im_start|>` as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
}

/// KV-cache compression, shared by every command that runs the model.
#[derive(Debug, Args, Clone)]
pub struct KvArgs {
    /// KV cache policy as a spec string: full, streaming:budget=256,sink=4,
    /// h2o:budget=256,recent=32, snapkv:budget=256,window=8,kernel=7,pool=max,
    /// pyramidkv:budget=256,window=8, rkv:budget=256,window=8,kernel=7,alpha=0.1,every=128,
    /// expected:budget=256,n_future=512,cov=pair, keydiff:budget=256,window=8,
    /// adakv:inner=snapkv,budget=256,floor=0.2 (head-wise budgets; takes its
    /// inner policy's keys). Missing keys take defaults. Any budgeted policy
    /// takes a relative budget, a share of the sequence's current length with
    /// a floor in tokens: rkv:budget=50%,min_budget=64 keeps
    /// max(64, ceil(50% of the tokens read)) as the sequence grows.
    #[arg(long, default_value = "full", value_parser = parse_policy)]
    pub kv_policy: tern_runtime::kv::policy::KvPolicy,
    /// How the KV cache stores keys and values: f16 (llama.cpp's default;
    /// 23,040 bytes a token for SmolLM2), q8_0 (about half of f16), q4_0
    /// (about a quarter), or f32 (twice f16, the same numbers). Stacks with
    /// any --kv-policy. The llama-cpp backend takes it when it loads.
    #[arg(long, default_value = "f16", value_parser = parse_dtype)]
    pub kv_dtype: tern_runtime::kv::KvDtype,
}

pub(super) fn parse_dtype(s: &str) -> Result<tern_runtime::kv::KvDtype, String> {
    s.parse()
        .map_err(|e: tern_models::kv_dtype::UnknownKvDtype| e.to_string())
}

fn parse_speculative(s: &str) -> Result<tern_runtime::engine::Speculative, String> {
    s.parse()
        .map_err(|e: tern_runtime::engine::UnknownSpeculative| e.to_string())
}

fn parse_policy(s: &str) -> Result<tern_runtime::kv::policy::KvPolicy, String> {
    s.parse()
        .map_err(|e: tern_runtime::kv::policy::PolicyError| e.to_string())
}

/// Sampling options shared by `generate` and `chat`.
#[derive(Debug, Args, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.7, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set with this much probability (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Divide the logits of recently seen tokens by this (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logits of tokens already present (OpenAI style).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times the count of each token already present.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Recent tokens the penalties look at (0 = all).
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (same seed, same output).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// Stop when this string appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
}

/// Where a prompt comes from: `-p TEXT`, or `-f FILE` for long or multi-line
/// prompts (`-f -` reads standard input), as with llama.cpp's `-f`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct PromptArgs {
    /// The prompt text.
    #[arg(long, short = 'p')]
    pub prompt: Option<String>,
    /// Read the prompt from this file (`-` for standard input); one trailing
    /// newline is dropped.
    #[arg(long, short = 'f', value_name = "FILE")]
    pub file: Option<PathBuf>,
}

impl PromptArgs {
    /// The prompt, read from the file or standard input when one was given.
    pub fn text(&self) -> anyhow::Result<String> {
        use anyhow::Context;
        use std::io::Read;
        let Some(path) = &self.file else {
            return Ok(self.prompt.clone().unwrap_or_default());
        };
        let mut text = String::new();
        if path.as_os_str() == "-" {
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the prompt from standard input")?;
        } else {
            text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the prompt from {}", path.display()))?;
        }
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        let from = if path.as_os_str() == "-" {
            "standard input".to_string()
        } else {
            path.display().to_string()
        };
        anyhow::ensure!(!text.trim().is_empty(), "the prompt from {from} is empty");
        Ok(text)
    }
}

/// `tern generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Wrap the prompt in the model's chat template as a user turn.
    #[arg(long)]
    pub chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Let control-token text such as `<|im_start|>` in the prompt become
    /// control tokens inside the chat template (default: it stays text).
    #[arg(long)]
    pub allow_special_tokens_in_content: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Keep generating past end-of-sequence up to --max-tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Return this many most likely alternatives per token in --json (0-20).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: usize,
    /// Prompt tokens per prefill forward pass.
    #[arg(long, default_value_t = tern_runtime::engine::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// What runs the forward pass: Tern's own kernels or llama.cpp.
    #[arg(long, value_enum, default_value = "tern")]
    pub backend: super::backend::BackendKind,
    /// Speculative decoding: `off` (the default without --draft-model),
    /// `ngram` (prompt lookup; the output is the same, faster where it
    /// repeats the prompt), `draft` (the --draft-model proposes; the default
    /// with one), or `ngram:max_draft=N` / `draft:max_draft=N`.
    #[arg(long, value_parser = parse_speculative)]
    pub speculative: Option<tern_runtime::engine::Speculative>,
    /// A smaller model of the same vocabulary (path or registry name) that
    /// drafts tokens for --model to verify (`--speculative draft`); the
    /// output is --model's own. Refused if its vocabulary differs.
    #[arg(long)]
    pub draft_model: Option<String>,
}

/// `tern bon`.
#[derive(Debug, Args)]
pub struct BonArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// The question: `-p TEXT` or `-f FILE`.
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// System prompt for the candidates.
    #[arg(long)]
    pub system: Option<String>,
    /// Most candidates to sample (1-16).
    #[arg(short = 'n', long = "candidates", default_value_t = 8)]
    pub n: usize,
    /// majority (vote on extracted answers), synthesize (a CoT synthesizer reads
    /// the candidates and answers), or reward (unit tests from --tests, or
    /// written by a model with --generate-tests K).
    #[arg(long, default_value = "majority")]
    pub aggregate: tern_solve::reasoning::Aggregate,
    /// Sample in waves and stop once the leading answer is the majority with
    /// probability >= --confidence (Beta posterior).
    #[arg(long)]
    pub adaptive: bool,
    /// Candidates per wave with --adaptive.
    #[arg(long, default_value_t = 2)]
    pub wave: usize,
    /// With --adaptive: the posterior probability that the leading answer is
    /// the majority at which sampling stops (0.5-1; higher samples more).
    #[arg(long, default_value_t = tern_solve::reasoning::DEFAULT_CONFIDENCE, value_parser = parse_confidence)]
    pub confidence: f64,
    /// Unit tests for --aggregate reward: one Python statement (or JSON string) per line.
    #[arg(long, conflicts_with = "generate_tests")]
    pub tests: Option<PathBuf>,
    /// For --aggregate reward without --tests: a model (--test-model, default
    /// --model) writes K unit tests for the question, sampled in parallel with
    /// the candidates; each candidate runs against each (1-64). The candidate
    /// passing most wins; ties go to the pass pattern most candidates share,
    /// then to the earliest.
    #[arg(long, value_name = "K")]
    pub generate_tests: Option<usize>,
    /// A second model (path or registry name) that writes the tests of
    /// --generate-tests, run as its own engine (default: --model).
    #[arg(long, requires = "generate_tests")]
    pub test_model: Option<String>,
    /// Candidates' temperature (the synthesizer decodes greedily).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Candidates' nucleus sampling (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Seed of candidate 1; candidate i uses seed + i - 1.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Add BIAS to token ID's logit before sampling, as llama.cpp's
    /// --logit-bias (repeatable): `--logit-bias 15043=+1.5`, `-100` bans it.
    #[arg(long = "logit-bias", value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Most tokens per candidate and for the synthesis (reasoning plus answer
    /// with --reasoning-effort / --thinking-budget).
    #[arg(long, default_value_t = 384)]
    pub max_tokens: usize,
    /// Adaptive length per candidate: low, medium, high (caps of 128, 512,
    /// 2048 reasoning tokens, then the answer is forced) or auto (answer
    /// probes every --probe-every tokens; stop once 3 agree; cap 2048).
    #[arg(long)]
    pub reasoning_effort: Option<tern_solve::reasoning::Effort>,
    /// The reasoning cap in tokens (replaces the effort's cap).
    #[arg(long)]
    pub thinking_budget: Option<usize>,
    /// Reasoning tokens between answer probes with --reasoning-effort auto.
    #[arg(long, default_value_t = tern_solve::reasoning::DEFAULT_PROBE_EVERY)]
    pub probe_every: usize,
    /// A second model (path or registry name) that writes the synthesis for
    /// --aggregate synthesize, run as its own engine (default: --model).
    #[arg(long)]
    pub synthesizer_model: Option<String>,
    /// Best-of-N on a spreadsheet task instead of a question: SOURCE is a
    /// spreadsheet spec (`spreadsheet:count=40,seed=1001`) or a
    /// `.spreadsheet.jsonl` file; the prompt is the task's, every candidate
    /// program is judged on its test-case workbooks, and --select chooses.
    /// It stands in for -p/-f (it joins their group).
    #[arg(long, value_name = "SOURCE", group = "PromptArgs", conflicts_with_all = ["tests", "generate_tests", "adaptive", "system"])]
    pub spreadsheet: Option<String>,
    /// With --spreadsheet: which task of SOURCE, counting from 0 (default 0).
    #[arg(long, value_name = "K")]
    pub sheet_task: Option<usize>,
    /// With --spreadsheet: agree (the program whose outputs on the test-case
    /// workbooks most candidates share; no hidden answers) or oracle (the
    /// program passing the most test cases by the reference comparison);
    /// default agree.
    #[arg(long, value_enum)]
    pub select: Option<SheetSelect>,
    /// With --spreadsheet: rounds per candidate (default 1). A candidate
    /// whose program crashed, ran out of time or left no answer on a test
    /// case is shown that (no hidden answer) and writes it again, up to R
    /// rounds; the choice is made over the last programs.
    #[arg(long, value_name = "R")]
    pub rounds: Option<usize>,
}

/// How `tern bon --spreadsheet` chooses among its candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SheetSelect {
    /// By agreement of outputs on the test-case workbooks.
    Agree,
    /// By the reference comparison (the oracle).
    Oracle,
}

/// A stopping confidence strictly between 0.5 and 1.
fn parse_confidence(s: &str) -> Result<f64, String> {
    let c: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if c > 0.5 && c < 1.0 {
        Ok(c)
    } else {
        Err(format!("must be above 0.5 and below 1, got {c}"))
    }
}

/// `tern eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Tasks: a JSONL file, gzipped or not (`{"question" or "prompt", "answer"}`
    /// per line, GSM8K as is; code tasks `{"prompt", "tests": [...]}` or
    /// HumanEval's records, graded by running their tests), or a built-in
    /// generator, e.g. `arithmetic:count=200,seed=1,difficulty=1,ops=add+sub+word`
    /// or `story:count=200,seed=1,steps=2+3` (multi-step word problems whose
    /// answers take a few sentences of reasoning).
    #[arg(long)]
    pub task: String,
    /// Strategies to compare, comma-separated: single, majority@N, synthesize@N,
    /// adaptive[@N] (adaptive width in waves of 2; `adaptive@8:wave=1` samples
    /// one candidate at a time, `:confidence=0.9` stops at a lower posterior
    /// than the default 0.95), synthesize@N:with=NAME (a --synthesizer),
    /// single:with=NAME (the --synthesizer NAME answers alone, greedily, no
    /// candidates shown: the SFT-only control), reward@N (code tasks: the candidate passing most of the task's tests),
    /// reward@N:tests=K (code tasks: the candidate passing most of K tests a
    /// model writes, --test-model or --model; graded by the task's tests),
    /// reward@N:tests=K:dynamic (the same K x tasks tests in all, spread over
    /// the tasks by how much their candidates disagree),
    /// length@EFFORT (one greedy sample under adaptive length: EFFORT is low,
    /// medium, high, auto, or a token cap). Spreadsheet tasks take single,
    /// rounds@R (retries after a failed test case), agree@N and/or oracle@N
    /// (best-of-N chosen by the agreement of outputs on the test-case
    /// workbooks, or by the reference comparison; with rounds@R beside them,
    /// each candidate retries after a crash or a missing answer, shown no
    /// hidden answer), or reference (each task's own reference program, no
    /// model).
    #[arg(long, value_delimiter = ',', default_value = "single,majority@8")]
    pub strategy: Vec<String>,
    /// Evaluate only the first N tasks (after --offset).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Skip the first N tasks (task numbers and seeds stay those of the whole file).
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// Append one JSON line per strategy and task to FILE, and skip the pairs
    /// FILE already holds (their results count in the table): a long run can
    /// stop and resume.
    #[arg(long, value_name = "FILE")]
    pub records: Option<std::path::PathBuf>,
    /// With --records: print the table over the tasks that already have a record
    /// for every strategy, without loading the model or running anything (to
    /// follow a long run). Like every run's table, it ends with each strategy
    /// against the first listed: tasks it wins and loses, one by one.
    #[arg(long, requires = "records")]
    pub report: bool,
    /// With --records: also print the table per task difficulty (generated
    /// tasks: digits per operand, a story's events), from every record on
    /// file, to see where adaptive width or length saves and where it costs.
    #[arg(long, requires = "records")]
    pub by_difficulty: bool,
    /// Tasks in flight at once. They share the engine's batches (more rows per
    /// step, higher throughput); each task keeps its own seeds, so answers are
    /// the same as with 1, but a task's seconds then overlap other tasks'.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub parallel: u64,
    /// Sampling temperature for multi-sample strategies (single is greedy).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Base seed; task i uses seed + 1000 i (+ candidate index).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Most tokens per sample.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Reasoning tokens between answer probes for length@auto.
    #[arg(long, default_value_t = tern_solve::reasoning::DEFAULT_PROBE_EVERY)]
    pub probe_every: usize,
    /// A second model (path or registry name) that writes the synthesis for
    /// synthesize@N, run as its own engine (default: --model).
    #[arg(long)]
    pub synthesizer_model: Option<String>,
    /// A named synthesizer, NAME=MODEL (repeatable), for strategies
    /// `synthesize@N:with=NAME`: several synthesizers over the very same
    /// candidates in one run, e.g. `--strategy
    /// majority@8,synthesize@8,synthesize@8:with=trained --synthesizer
    /// trained=runs/synth/export.gguf`. `single:with=NAME` has the named model
    /// answer alone: the SFT-only control (`tern synth-data --control-of`)
    /// beside the synthesizer trained on the same targets.
    #[arg(long, value_name = "NAME=MODEL")]
    pub synthesizer: Vec<String>,
    /// A second model (path or registry name) that writes the unit tests of
    /// reward@N:tests=K, run as its own engine (default: --model).
    #[arg(long)]
    pub test_model: Option<String>,
}

/// `tern chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// System prompt (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Let control-token text such as `<|im_start|>` in your messages become
    /// control tokens inside the chat template (default: it stays text).
    #[arg(long)]
    pub allow_special_tokens_in_content: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// `tern perplexity`.
#[derive(Debug, Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Text file to score.
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Window size in tokens; each window's second half is scored.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// What runs the forward pass: Tern's own kernels or llama.cpp.
    #[arg(long, value_enum, default_value = "tern")]
    pub backend: super::backend::BackendKind,
}

/// `tern bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Context depths to measure at (tokens already in the cache), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub depths: Vec<usize>,
    /// Prompt tokens for the prefill measurement (pp); 0 skips it.
    #[arg(long, default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to decode for the generation measurement (tg).
    #[arg(long, default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions per configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Backends to measure side by side, comma-separated: tern, llama-cpp
    /// (in process: the exactness reference, not a speed anchor), llama-native
    /// (llama.cpp's own llama-bench from scripts/native_llama.sh: the speed
    /// anchor). Runs interleave backend by backend, each in its own process.
    #[arg(long, value_delimiter = ',', default_value = "tern")]
    pub backends: Vec<super::bench::BenchBackend>,
    /// Also measure Tern's own backend under this KV policy, in the same run
    /// and interleaved with the others (repeatable), e.g. `--also-policy
    /// snapkv:budget=256` beside a full-cache llama.cpp at depth 4096.
    #[arg(long, value_name = "SPEC")]
    pub also_policy: Vec<tern_runtime::kv::policy::KvPolicy>,
    /// Also measure Tern's own backend with its cache stored as this type
    /// (f32, f16, q8_0, q4_0), under --kv-policy, in the same interleaved run
    /// (repeatable), e.g. `--also-kv-dtype f32` beside the f16 default.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub also_kv_dtype: Vec<tern_runtime::kv::KvDtype>,
    /// Skip the memory-bandwidth measurement (and the floor it gives).
    #[arg(long)]
    pub no_bandwidth: bool,
    /// Internal: measure one repetition of the first backend in this process.
    #[arg(long, hide = true)]
    pub child_rep: Option<u64>,
}

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
    pub backend: super::backend::BackendKind,
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

/// `tern plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Metrics files: one JSON object per line with a numeric `step` (the
    /// trainer's metrics.jsonl). Several files are drawn as one line each in
    /// every panel, to compare runs.
    #[arg(required = true, num_args = 1..)]
    pub file: Vec<PathBuf>,
    /// Legend labels, one per file, comma-separated (default: each file's
    /// directory name).
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Draw the trailing mean of this many steps instead of raw values
    /// (reward curves of small batches are noisy).
    #[arg(long, default_value_t = 1)]
    pub smooth: usize,
    /// PNG file to write.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// Keys to plot, one panel each, comma-separated; `*_bytes` and `kv_bytes_*` keys are
    /// shown in MiB; a dotted key reaches into an object (`rho.mean_rho`) or, by a number,
    /// an array (`epochs.0.kl_ref`: the first PPO epoch's KL to the reference model).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "reward_mean,loss,peak_rss_bytes"
    )]
    pub keys: Vec<String>,
    /// TrueType/OpenType font for the labels.
    #[arg(long, default_value = super::plot::DEFAULT_FONT)]
    pub font: PathBuf,
}

/// Parses `ID=BIAS` (also `ID+BIAS` / `ID-BIAS`, llama.cpp's forms).
fn parse_logit_bias(spec: &str) -> Result<(u32, f32), String> {
    let at = spec
        .find(['=', '+', '-'])
        .ok_or_else(|| format!("`{spec}` is not ID=BIAS (e.g. 15043=1.5)"))?;
    let id = spec[..at]
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("`{}` in `{spec}` is not a token id", &spec[..at]))?;
    let value = if &spec[at..at + 1] == "=" {
        &spec[at + 1..]
    } else {
        &spec[at..]
    };
    let bias = value
        .trim()
        .parse::<f32>()
        .ok()
        .filter(|b| b.is_finite())
        .ok_or_else(|| format!("`{value}` in `{spec}` is not a finite number"))?;
    Ok((id, bias))
}
