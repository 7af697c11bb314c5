//! Argument groups that several subcommands share (the model, the KV cache,
//! sampling, the prompt) and their value parsers. Each subcommand's own
//! arguments live in its file.

use std::path::PathBuf;

use clap::Args;

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

pub(super) fn parse_speculative(s: &str) -> Result<tern_runtime::engine::Speculative, String> {
    s.parse()
        .map_err(|e: tern_runtime::engine::UnknownSpeculative| e.to_string())
}

fn parse_policy(s: &str) -> Result<tern_runtime::kv::policy::KvPolicy, String> {
    s.parse()
        .map_err(|e: tern_runtime::kv::policy::PolicyError| e.to_string())
}

fn parse_kept(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(k) if (1..=99).contains(&k) => Ok(k),
        _ => Err(format!("must be a percentage from 1 to 99, got `{s}`")),
    }
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

/// `tern kv-eval`.
#[derive(Debug, Args)]
pub struct KvEvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Which evaluations to run: ppl, passkey, memory, ruler (the synthetic
    /// long-context suite; not in the default set, it takes long).
    #[arg(long, value_delimiter = ',', default_value = "ppl,passkey,memory")]
    pub tasks: Vec<String>,
    /// Policies to compare against full: names (with the eval's settings) or
    /// specs without `budget` (as written, e.g. `snapkv:window=32,pool=avg`);
    /// budgets come from --budgets (--kept for --files, --removed for ruler).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "streaming,h2o,snapkv,pyramidkv,rkv"
    )]
    pub policies: Vec<String>,
    /// Text for the perplexity evaluation.
    #[arg(
        long,
        short = 'f',
        default_value = "../shared/reference/smollm2/gpl-3.txt"
    )]
    pub file: PathBuf,
    /// Perplexity window (context) size.
    #[arg(long, default_value_t = 2048)]
    pub ctx: usize,
    /// Perplexity windows to score (each from an empty cache).
    #[arg(long, default_value_t = 1)]
    pub windows: usize,
    /// KV budgets for the perplexity table.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512")]
    pub budgets: Vec<usize>,
    /// Texts to compare (comma-separated or repeated): one perplexity table
    /// per policy with a column per text, mean and spread, since a policy
    /// ranked on one text may not hold its rank on another. Replaces --file.
    #[arg(long, value_delimiter = ',')]
    pub files: Vec<PathBuf>,
    /// Budgets as the percentage of --ctx kept (1-99; budget = ctx * kept /
    /// 100), so tables at different contexts compare. Replaces --budgets.
    #[arg(long, value_delimiter = ',', value_parser = parse_kept)]
    pub kept: Vec<usize>,
    /// Write records as JSON lines to FILE: with --files, one per text,
    /// policy and budget (with the full-cache perplexity and the ratio); for
    /// ruler, one per (task, length, policy, removed, sample) as each finishes.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// KV budgets for the passkey table.
    #[arg(long, value_delimiter = ',', default_value = "128,256")]
    pub passkey_budgets: Vec<usize>,
    /// Passkey prompt lengths in tokens.
    #[arg(long, value_delimiter = ',', default_value = "1024,2048")]
    pub contexts: Vec<usize>,
    /// Passkey depths in percent of the filler.
    #[arg(long, value_delimiter = ',', default_value = "10,50,90")]
    pub depths: Vec<usize>,
    /// Passkey trials per (context, depth).
    #[arg(long, default_value_t = 1)]
    pub trials: usize,
    /// Seed for passkeys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Contexts for the memory table.
    #[arg(long, value_delimiter = ',', default_value = "2048,4096,8192")]
    pub memory_contexts: Vec<usize>,
    /// Budget for the memory table (snapkv).
    #[arg(long, default_value_t = 256)]
    pub memory_budget: usize,
    /// Ruler: sequence lengths in tokens (prompt plus answer, as RULER sizes them).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192")]
    pub ruler_lengths: Vec<usize>,
    /// Ruler: tasks to run (niah_single, niah_multikey, niah_multivalue, vt, cwe).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "niah_single,niah_multikey,niah_multivalue,vt,cwe",
        value_parser = parse_ruler_task
    )]
    pub ruler_tasks: Vec<tern_runtime::kv::ruler::RulerTask>,
    /// Ruler: samples per task and length.
    #[arg(long, default_value_t = 10)]
    pub ruler_samples: usize,
    /// Ruler: percent of the prompt's KV entries each policy removes (1-99);
    /// the budget per layer is ceil(prompt tokens * (100 - removed) / 100).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "25,50,75,90",
        value_parser = clap::value_parser!(u32).range(1..=99)
    )]
    pub removed: Vec<u32>,
    /// Ruler: compress the context before the question is read (kvpress's
    /// query-agnostic setting: the cache is pruned once, no policy sees the
    /// question's queries, and the question and answer are kept whole).
    /// Budgets then count context tokens. Default: the whole prompt,
    /// question included, is read and compressed at once (query-aware).
    #[arg(long)]
    pub query_agnostic: bool,
    /// How the KV cache stores keys and values in every run (f16, q8_0, q4_0,
    /// f32); records carry it.
    #[arg(long, default_value = "f16", value_parser = parse_dtype)]
    pub kv_dtype: tern_runtime::kv::KvDtype,
}

fn parse_ruler_task(s: &str) -> Result<tern_runtime::kv::ruler::RulerTask, String> {
    s.parse()
        .map_err(|e: tern_runtime::kv::ruler::UnknownRulerTask| e.to_string())
}
