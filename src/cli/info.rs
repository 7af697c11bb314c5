//! `tern info`: what a GGUF file holds, without running it.

use anyhow::Result;
use serde_json::json;
use tern_models::{GgufFile, ModelConfig};
use tern_runtime::tokenizer::Tokenizer;

use super::args::ModelArgs;
use super::resolve;

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &ModelArgs) -> Result<()> {
    let path = resolve::model_path(&a.model)?;
    let file = GgufFile::open(&path)?;
    let config = ModelConfig::from_gguf(&file)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let summary = file.tensor_summary();
    let has_template = file.str("tokenizer.chat_template").is_ok();
    let pre = file
        .str("tokenizer.ggml.pre")
        .unwrap_or("default")
        .to_string();
    if a.json {
        let info = json!({
            "path": path,
            "config": config,
            "tensors": summary.tensors,
            "params": summary.params,
            "weight_bytes": summary.bytes,
            "file_bytes": file.file_bytes(),
            "quantization": summary.by_type.iter()
                .map(|(k, (n, b))| (k.clone(), json!({"tensors": n, "bytes": b})))
                .collect::<serde_json::Map<_, _>>(),
            "vocab_size": tokenizer.vocab_size(),
            "pre_tokenizer": pre,
            "bos": tokenizer.bos(),
            "eos": tokenizer.eos(),
            "add_bos": tokenizer.adds_bos(),
            "chat_template": has_template,
        });
        println!("{info}");
        return Ok(());
    }
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "file            {} ({:.1} MB)",
        path.display(),
        mb(file.file_bytes())
    );
    println!("name            {}", config.name.as_deref().unwrap_or("-"));
    println!("architecture    {}", config.architecture);
    println!(
        "parameters      {:.1} M in {} tensors, {:.1} MB of weights",
        summary.params as f64 / 1e6,
        summary.tensors,
        mb(summary.bytes)
    );
    let quant: Vec<String> = summary
        .by_type
        .iter()
        .map(|(k, (n, b))| format!("{k} x{n} ({:.1} MB)", mb(*b)))
        .collect();
    println!("quantization    {}", quant.join(", "));
    println!(
        "layers          {} (hidden {}, ffn {}, heads {} / kv heads {}, head dim {})",
        config.n_layer,
        config.n_embd,
        config.n_ff,
        config.n_head,
        config.n_kv_head,
        config.head_dim
    );
    println!("context length  {}", config.context_length);
    println!("rope base       {}", config.rope_base);
    println!(
        "vocab           {} (pre-tokenizer {pre}, bos {:?}, eos {:?}, add bos {})",
        tokenizer.vocab_size(),
        tokenizer.bos(),
        tokenizer.eos(),
        tokenizer.adds_bos()
    );
    println!(
        "chat template   {}",
        if has_template { "yes" } else { "no" }
    );
    println!(
        "kv per token    {} bytes (f32 cache, all layers)",
        config.kv_bytes_per_position()
    );
    Ok(())
}
