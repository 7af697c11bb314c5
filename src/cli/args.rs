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
