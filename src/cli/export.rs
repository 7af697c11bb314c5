//! `tern export`: a training checkpoint merged into its base model and written
//! as a GGUF that `tern serve` and llama.cpp load, then checked: the exported
//! model's logits against the base model served with the adapters.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tern_models::export::{export_gguf, ExportQuant};
use tern_models::{KvStore, LogitsWanted, Precision, SeqBatch};
use tern_runtime::kv::SeqCache;
use tern_runtime::LoadedModel;
use tern_trainer::checkpoint;
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
    // The trained model before export (base weights + adapters) against the
    // export, both dequantized to f32 so the check sees the merge and the
    // export's rounding, not the serving kernels' activation quantization.
    let served = LoadedModel::load_as(&base, Precision::DenseF32)?;
    if let Some(scale) = ck.state.lora_scale {
        let set = tern_models::LoraSet::from_named(ck.params.clone(), scale)?;
        served.arch.set_adapters(Some(Arc::new(set)));
    }
    let exported = LoadedModel::load_as(&a.out, Precision::DenseF32)?;
    let text = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n7 + 5 = 12";
    let ids = served.tokenizer.encode(text, true, true)?;
    let logits = |m: &LoadedModel| -> Result<Vec<f32>> {
        let mut cache = SeqCache::new(m.config());
        let mut batch = [SeqBatch {
            tokens: &ids,
            start_pos: 0,
            cache: &mut cache as &mut dyn KvStore,
            logits: LogitsWanted::All,
        }];
        let out = m.arch.forward(&mut batch)?;
        Ok(out[0]
            .as_ref()
            .context("no logits")?
            .flatten_all()?
            .to_vec1::<f32>()?)
    };
    let (x, y) = (logits(&served)?, logits(&exported)?);
    let max_diff = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let scale = x.iter().map(|a| a.abs()).fold(0f32, f32::max);
    println!(
        "check (f32): max |logit difference| {max_diff:.4} over {} tokens x {} vocab (largest logit {scale:.2}) between the base model with the adapters and the export",
        ids.len(),
        served.config().vocab_size
    );
    Ok(())
}
