//! `tern quantize`: Tern's own `llama-quantize`. Reads a GGUF, gives every
//! tensor the type llama.cpp's quantizer would give it for the chosen file
//! type, encodes it with Tern's port of ggml's reference quantizers, and
//! writes a GGUF whose tensor bytes equal `llama-quantize`'s.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tern_models::{quantize_gguf, GgufFile, QuantType};

use super::resolve;

/// `tern quantize --model IN --out OUT --type TYPE` (its help text is on the
/// subcommand in `args.rs`).
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The GGUF to quantize (a path, or a registry name).
    #[arg(long, short = 'm')]
    pub model: String,
    /// The GGUF file to write (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// The file type: q4_0, q4_1, q5_0, q5_1, q8_0, f16, bf16, q4_k_m, q4_k_s,
    /// q5_k_m, q6_k, iq4_nl or iq4_xs.
    #[arg(long = "type", short = 't')]
    pub quant: String,
}

/// Whether a tensor type (by its ggml name) is a block quantization:
/// requantizing it loses more than converting a float.
fn is_block_quant(name: &str) -> bool {
    !matches!(name, "F32" | "F16" | "BF16")
}

/// Runs the subcommand.
pub fn run(a: &QuantizeArgs) -> Result<()> {
    let quant: QuantType = a.quant.parse()?;
    let src = resolve::model_path(&a.model)?;
    if a.out.exists() && std::fs::canonicalize(&a.out)? == std::fs::canonicalize(&src)? {
        bail!(
            "--out {} is the input file; write to another path",
            a.out.display()
        );
    }
    let file = GgufFile::open(&src)?;
    let quantized: Vec<String> = file
        .tensor_names()
        .into_iter()
        .filter_map(|n| file.tensor_dtype(n))
        .map(|t| format!("{t:?}").to_uppercase())
        .filter(|t| is_block_quant(t))
        .collect();
    if let Some(t) = quantized.first() {
        eprintln!(
            "warning: {} is already quantized ({} tensors, e.g. {t}); requantizing to {quant} \
             loses more quality than quantizing its F32/F16/BF16 original",
            src.display(),
            quantized.len()
        );
    }
    drop(file);
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("quantize {bar:30} {pos}/{len} tensors {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = quantize_gguf(&src, &a.out, quant, &mut |done, total, name| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(name.to_string());
    })
    .with_context(|| format!("quantizing {} to {}", src.display(), a.out.display()))?;
    bar.finish_and_clear();
    let src_bytes = std::fs::metadata(&src)?.len();
    println!(
        "wrote {} ({quant}, {} tensors, {:.1} MiB from {:.1} MiB{})",
        a.out.display(),
        report.tensors,
        report.bytes as f64 / (1 << 20) as f64,
        src_bytes as f64 / (1 << 20) as f64,
        if report.fallbacks > 0 {
            format!(
                "; {} tensors fell back to a 32-value type, their rows are not whole super-blocks",
                report.fallbacks
            )
        } else {
            String::new()
        }
    );
    Ok(())
}
