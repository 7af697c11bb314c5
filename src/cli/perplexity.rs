//! `tern perplexity`: llama.cpp-compatible perplexity over a text file.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tern_runtime::memory;
use tern_runtime::perplexity::perplexity;

use super::args::PerplexityArgs;
use super::resolve;

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {} as UTF-8 text", a.file.display()))?;
    let model = resolve::load(&a.model.model)?;
    let tokens = model.tokenizer.encode(&text, true, false)?;
    let bar = ProgressBar::new((tokens.len() / a.ctx.max(1)) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "perplexity {bar:30} {pos}/{len} windows, ppl {msg} [{elapsed}<{eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = perplexity(&model, &tokens, a.ctx, &a.kv.kv_policy, |_, _, ppl| {
        bar.set_message(format!("{ppl:.4}"));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    if a.model.json {
        let mut v = serde_json::to_value(&report)?;
        v["peak_rss_bytes"] = json!(memory::peak_rss_bytes());
        println!("{v}");
    } else {
        println!(
            "perplexity {:.4} over {} scored tokens ({} windows of {}, {} tokens in file) in {:.1} s; kv {} held {:.1} of {:.1} MB",
            report.perplexity,
            report.scored_tokens,
            report.chunks,
            report.ctx,
            report.tokens,
            report.seconds,
            report.kv_policy,
            report.kv_bytes as f64 / 1e6,
            report.kv_bytes_full as f64 / 1e6
        );
    }
    Ok(())
}
