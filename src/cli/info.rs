//! `tern info`: what a GGUF file holds, without running it.

use anyhow::Result;
use serde_json::json;
use tern_models::{GgufFile, ModelConfig, ModelError};
use tern_runtime::tokenizer::Tokenizer;

use super::args::ModelArgs;
use super::resolve;

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &ModelArgs) -> Result<()> {
    let path = resolve::model_path(&a.model)?;
    let file = GgufFile::open(&path)?;
    let config = match ModelConfig::from_gguf(&file) {
        Ok(config) => config,
        // Tern cannot run it, but it can still say what the file holds.
        Err(e @ ModelError::UnsupportedArchitecture { .. }) => {
            return raw(&path, &file, &e.to_string(), a.json)
        }
        Err(e) => return Err(e.into()),
    };
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
        "vocab           {} ({} tokenizer, pre-tokenizer {pre}, bos {:?}, eos {:?}, add bos {})",
        tokenizer.vocab_size(),
        tokenizer.model_name(),
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

/// What `tern info` prints for a GGUF Tern cannot run: why, the tensors, and
/// every metadata entry (arrays by their length, long strings cut).
fn raw(path: &std::path::Path, file: &GgufFile, why: &str, json_out: bool) -> Result<()> {
    let summary = file.tensor_summary();
    let metadata: Vec<(&str, String)> = file
        .metadata()
        .into_iter()
        .map(|(k, v)| (k, tern_models::gguf::value_summary(v)))
        .collect();
    // The tokenizer needs only metadata, so it may well load (`tern tokenize`).
    let tokenizer = match Tokenizer::from_gguf(file) {
        Ok(t) => format!("{}, {} tokens", t.model_name(), t.vocab_size()),
        Err(e) => format!("cannot be built: {e}"),
    };
    if json_out {
        let info = json!({
            "path": path,
            "runnable": false,
            "reason": why,
            "tensors": summary.tensors,
            "params": summary.params,
            "weight_bytes": summary.bytes,
            "file_bytes": file.file_bytes(),
            "tokenizer": tokenizer,
            "metadata": metadata.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        });
        println!("{info}");
        return Ok(());
    }
    println!(
        "file            {} ({:.1} MB)",
        path.display(),
        file.file_bytes() as f64 / 1e6
    );
    println!("runnable        no: {why}");
    println!("tokenizer       {tokenizer}");
    println!(
        "parameters      {:.1} M in {} tensors, {:.1} MB of weights",
        summary.params as f64 / 1e6,
        summary.tensors,
        summary.bytes as f64 / 1e6
    );
    println!("metadata        {} entries:", metadata.len());
    for (k, v) in metadata {
        println!("  {k} = {v}");
    }
    Ok(())
}
