//! `tern tokenize`: text on stdin, token ids out.

use std::io::Read;

use anyhow::{Context, Result};
use serde_json::json;
use tern_models::GgufFile;
use tern_runtime::tokenizer::Tokenizer;

use super::args::ModelArgs;
use super::resolve;
use clap::Args;

/// `tern tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Treat control-token text such as `<|im_start|>` as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &TokenizeArgs) -> Result<()> {
    let path = resolve::model_path(&a.model.model)?;
    // Only the tokenizer is needed: skip loading the weights.
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&path)?)?;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading stdin (is it UTF-8 text?)")?;
    let ids = tokenizer.encode(&text, true, !a.no_parse_special)?;
    if a.model.json {
        let pieces: Vec<String> = ids.iter().map(|&i| tokenizer.decode(&[i], true)).collect();
        println!(
            "{}",
            json!({"ids": ids, "count": ids.len(), "pieces": pieces})
        );
    } else {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", s.join(" "));
    }
    Ok(())
}
