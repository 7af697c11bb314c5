//! `tern export`: a training checkpoint merged into its base model and written
//! as a GGUF that `tern serve` and llama.cpp load, then checked: the exported
//! model's logits against the base model served with the adapters. The work is
//! `tern_trainer::export`'s; this file reads flags and prints.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tern_models::export::{export_gguf, ExportQuant};
use tern_trainer::checkpoint;
use tern_trainer::export::check_export;
use tern_trainer::merge::merged_tensors;

/// `tern export --checkpoint DIR --out model.gguf [--quant TYPE]`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint directory, or a run's output directory (its latest checkpoint).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The GGUF file to write (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// File type of the export, as `tern quantize --type` takes it: q8_0
    /// (near-lossless), q4_k_m (small, good), q4_0, q4_1, q5_0, q5_1, q4_k_s,
    /// q5_k_m, q6_k, iq4_nl, iq4_xs, f16 or bf16.
    #[arg(long, default_value = "q8_0")]
    pub quant: String,
    /// Base model to merge into (default: the one the run trained).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Skip the logits check after writing.
    #[arg(long)]
    pub no_check: bool,
}

/// Runs the subcommand.
pub fn run(a: &ExportArgs) -> Result<()> {
    let quant: ExportQuant = a.quant.parse()?;
    let ck = checkpoint::load(&a.checkpoint)?;
    let base = a
        .base
        .clone()
        .unwrap_or_else(|| ck.state.model_path.clone());
    let replacements = merged_tensors(&ck, &base)?;
    let report = export_gguf(&base, &a.out, &replacements, quant)
        .with_context(|| format!("writing {}", a.out.display()))?;
    println!(
        "wrote {} ({} tensors, {} merged, {} bytes, {quant}) from step {} of {}",
        a.out.display(),
        report.tensors,
        report.replaced,
        report.bytes,
        ck.state.step,
        base.display()
    );
    if a.no_check {
        return Ok(());
    }
    let check = check_export(&ck, &base, &a.out)?;
    println!(
        "check (f32): max |logit difference| {:.4} over {} tokens x {} vocab (largest logit {:.2}) between the base model with the adapters and the export",
        check.max_diff, check.tokens, check.vocab, check.largest
    );
    Ok(())
}
