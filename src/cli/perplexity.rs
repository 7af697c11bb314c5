//! `tern perplexity`: llama.cpp-compatible perplexity over a text file.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::sync::Arc;
use tern_kveval::perplexity::perplexity_on;
use tern_kveval::KvEvalError;
use tern_runtime::memory;

use super::args::{KvArgs, ModelArgs};
use super::backend::{self, Sizing};
use super::resolve;
use clap::Args;
use std::path::PathBuf;

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
    pub backend: crate::cli::backend::BackendKind,
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {} as UTF-8 text", a.file.display()))?;
    let path = resolve::model_path(&a.model.model)?;
    let model = Arc::new(tern_runtime::LoadedModel::load(&path)?);
    let sizing = Sizing {
        n_ctx: a.ctx + 8,
        n_seq: 1,
        kv_dtype: a.kv.kv_dtype,
    };
    let mut backend = backend::open(a.backend, &path, &model, &sizing)?;
    let tokens = model.tokenizer.encode(&text, true, false)?;
    let bar = ProgressBar::new((tokens.len() / a.ctx.max(1)) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "perplexity {bar:30} {pos}/{len} windows, ppl {msg} [{elapsed}<{eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let policy = &a.kv.kv_policy;
    let report = perplexity_on(
        backend.as_mut(),
        &model,
        &tokens,
        a.ctx,
        policy,
        a.kv.kv_dtype,
        |_, _, ppl| {
            bar.set_message(format!("{ppl:.4}"));
            bar.inc(1);
        },
    )
    .map_err(|e| {
        // The evaluation names values; the flags that set them are ours.
        let flag = match e {
            KvEvalError::Window { .. } => Some("--ctx"),
            KvEvalError::TooFewTokens { .. } => Some("--file"),
            _ => None,
        };
        match flag {
            Some(flag) => anyhow::Error::new(e).context(flag),
            None => anyhow::Error::new(e),
        }
    })?;
    bar.finish_and_clear();
    if a.model.json {
        let mut v = serde_json::to_value(&report)?;
        v["peak_rss_bytes"] = json!(memory::peak_rss_bytes());
        println!("{v}");
    } else {
        println!(
            "perplexity {:.4} over {} scored tokens ({} windows of {}, {} tokens in file) in {:.1} s on {}; kv {} ({}) held {:.1} of {:.1} MB",
            report.perplexity,
            report.scored_tokens,
            report.chunks,
            report.ctx,
            report.tokens,
            report.seconds,
            report.backend,
            report.kv_policy,
            report.kv_dtype,
            report.kv_bytes as f64 / 1e6,
            report.kv_bytes_full as f64 / 1e6
        );
    }
    Ok(())
}
