//! `tern kv-eval`: what each KV policy costs in quality and saves in memory, in
//! one run: perplexity under eviction, passkey retrieval, KV bytes at long
//! contexts, and the RULER-style suite. The evaluations live in
//! `tern-kveval`; this file parses the flags into its config, prints its
//! Markdown tables (docs/KV.md is made from them) or JSON, and names the
//! flag behind an error.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use tern_kveval::{KvEvalConfig, KvEvalError, Printer};

use super::resolve;

/// `tern kv-eval`.
#[derive(Debug, Args)]
pub struct KvEvalArgs {
    #[command(flatten)]
    pub model: super::args::ModelArgs,
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
    pub ruler_tasks: Vec<tern_kveval::ruler::RulerTask>,
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
    #[arg(long, default_value = "f16", value_parser = super::args::parse_dtype)]
    pub kv_dtype: tern_runtime::kv::KvDtype,
}

fn parse_ruler_task(s: &str) -> Result<tern_kveval::ruler::RulerTask, String> {
    s.parse()
        .map_err(|e: tern_kveval::ruler::UnknownRulerTask| e.to_string())
}

fn parse_kept(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(k) if (1..=99).contains(&k) => Ok(k),
        _ => Err(format!("must be a percentage from 1 to 99, got `{s}`")),
    }
}

impl KvEvalArgs {
    /// The evaluations' config: the flags as plain data.
    fn config(&self) -> KvEvalConfig {
        KvEvalConfig {
            model: self.model.model.clone(),
            tasks: self.tasks.clone(),
            policies: self.policies.clone(),
            kv_dtype: self.kv_dtype,
            seed: self.seed,
            out: self.out.clone(),
            ppl: tern_kveval::PplConfig {
                file: self.file.clone(),
                files: self.files.clone(),
                ctx: self.ctx,
                windows: self.windows,
                budgets: self.budgets.clone(),
                kept: self.kept.clone(),
            },
            passkey: tern_kveval::PasskeyConfig {
                budgets: self.passkey_budgets.clone(),
                contexts: self.contexts.clone(),
                depths: self.depths.clone(),
                trials: self.trials,
            },
            memory: tern_kveval::MemoryConfig {
                contexts: self.memory_contexts.clone(),
                budget: self.memory_budget,
            },
            ruler: tern_kveval::RulerConfig {
                lengths: self.ruler_lengths.clone(),
                tasks: self.ruler_tasks.clone(),
                samples: self.ruler_samples,
                removed: self.removed.clone(),
                query: if self.query_agnostic {
                    tern_kveval::Query::Agnostic
                } else {
                    tern_kveval::Query::Aware
                },
            },
        }
    }

    /// The flag that set the value an error is about, as the user wrote it,
    /// where one did.
    fn flag(&self, e: &KvEvalError) -> Option<String> {
        let text_flag = if self.files.is_empty() {
            "--file"
        } else {
            "--files"
        };
        Some(match e {
            KvEvalError::UnknownTask(_) => "--tasks".into(),
            KvEvalError::UnknownPolicy(_) => "--policies".into(),
            KvEvalError::ReadText { .. } | KvEvalError::TooFewTokens { .. } => text_flag.into(),
            KvEvalError::ShortText { .. } => format!("{text_flag} (--ctx {})", self.ctx),
            KvEvalError::Window { .. } => "--ctx".into(),
            KvEvalError::NothingKept { .. } => format!("--kept (--ctx {})", self.ctx),
            KvEvalError::CreateRecords { .. } | KvEvalError::WriteRecords(_) => "--out".into(),
            KvEvalError::RulerSample { .. } => "--ruler-lengths".into(),
            _ => return None,
        })
    }
}

/// Tables to stdout, progress to stderr.
struct Console;

impl Printer for Console {
    fn table(&mut self, text: &str) {
        println!("{text}");
    }

    fn progress(&mut self, text: &str) {
        eprintln!("{text}");
    }
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &KvEvalArgs) -> Result<()> {
    let model = resolve::load(&a.model.model)?;
    let report =
        tern_kveval::run(&model, &a.config(), &mut Console).map_err(|e| match a.flag(&e) {
            Some(flag) => anyhow::Error::new(e).context(flag),
            None => anyhow::Error::new(e),
        })?;
    if a.model.json {
        println!("{}", serde_json::Value::Object(report));
    }
    Ok(())
}
