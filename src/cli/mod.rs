//! Subcommands of the `tern` binary. Each takes its parsed arguments, builds
//! what it needs from the libraries, and prints text (or one JSON object).

mod args;
mod backend;
mod bench;
mod bon;
mod chat;
mod eval;
mod export;
mod generate;
pub mod hint;
mod info;
mod kv_eval;
mod perplexity;
mod plot;
mod pull;
mod quantize;
mod resolve;
mod serve;
mod synth_data;
mod tokenize;
mod train;

use anyhow::Result;

use clap::{Parser, Subcommand};

/// Tern: an embedded LLM runtime whose KV cache can be compressed to a budget.
///
/// Models are GGUF files. `--model` takes a registry name (see `tern pull --list`)
/// or a path to any GGUF file; the default model is fetched on first use.
#[derive(Debug, Parser)]
#[command(name = "tern", version, about, long_about = None)]
pub struct Cli {
    /// Worker threads for tensor kernels (default: all cores).
    #[arg(long, global = true, env = "TERN_THREADS")]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch a model from the registry into the model directory ($TERN_HOME or models/cache).
    Pull(pull::PullArgs),
    /// Print a model's architecture, sizes, quantization and tokenizer facts.
    Info(args::ModelArgs),
    /// Tokenize text from stdin and print the token ids.
    Tokenize(tokenize::TokenizeArgs),
    /// Generate a completion for one prompt, streaming text to stdout.
    Generate(generate::GenerateArgs),
    /// Chat interactively with a model (empty line or Ctrl-D quits, /reset clears).
    Chat(chat::ChatArgs),
    /// Compute perplexity over a text file the way llama.cpp's llama-perplexity does.
    Perplexity(perplexity::PerplexityArgs),
    /// Measure what KV policies cost in quality and save in memory (perplexity,
    /// passkey retrieval, KV bytes), printing Markdown tables.
    KvEval(kv_eval::KvEvalArgs),
    /// Measure prefill and decode speed (pp/tg, as llama-bench), memory and KV bytes.
    Bench(bench::BenchArgs),
    /// Best-of-N on one question: sample N answers (one shared prefill) and
    /// aggregate them by majority vote, a synthesizer, or unit tests.
    Bon(bon::BonArgs),
    /// Accuracy, tokens and time of answer strategies on a JSONL task file
    /// (single, majority@N, synthesize@N, adaptive[@N]).
    Eval(eval::EvalArgs),
    /// Training data for a synthesizer: N candidates per task, the synthesis
    /// prompt synthesize@N shows, K syntheses, the correct ones kept as
    /// targets; the file trains with `tern train --task FILE`.
    SynthData(synth_data::SynthDataArgs),
    /// Serve an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health, /metrics) with continuous batching.
    Serve(serve::ServeArgs),
    /// Fine-tune on this machine under a memory cap: GRPO or SFT, LoRA or full,
    /// rollouts through the serving engine, resumable checkpoints.
    Train(Box<train::TrainArgs>),
    /// Draw training curves from a metrics JSONL file into a PNG: one panel
    /// per key against `step`.
    Plot(plot::PlotArgs),
    /// Merge a training checkpoint into its base model and write a GGUF that
    /// `tern serve` and llama.cpp load, then check its logits.
    Export(export::ExportArgs),
    /// Quantize a GGUF to another type (q4_0 ... q8_0, q4_k_m, q6_k, f16, bf16)
    /// with the same tensor types and bytes as llama.cpp's llama-quantize.
    ///
    /// Types, smallest first within each family:
    ///   q4_0, q4_1, q5_0, q5_1, q8_0   32-value blocks (q8_0 is near-lossless)
    ///   q4_k_s, q4_k_m, q5_k_m, q6_k   K-quant mixes: 256-value super-blocks,
    ///                                  more bits where llama.cpp puts them
    ///   iq4_nl, iq4_xs                 4-bit non-linear values (blocks of 32;
    ///                                  super-blocks of 256 with 6-bit scales)
    ///   f16, bf16                      16-bit floats, no block quantization
    ///
    /// Every tensor gets the type and the bytes llama-quantize gives it
    /// (default settings, no importance matrix): the output projection keeps
    /// 6 or 8 bits, norms stay as they are, and a row length that is not whole
    /// super-blocks falls back to a 32-value format. q4_k_m is the usual
    /// choice for a small, good model; q8_0 when memory allows.
    ///
    /// An already-quantized input is dequantized and quantized again (as
    /// llama-quantize's --allow-requantize): allowed, with a warning, since
    /// the result is worse than quantizing the F32/F16/BF16 original.
    ///
    /// Example: tern quantize -m model-f16.gguf --out model-q4_k_m.gguf -t q4_k_m
    #[command(verbatim_doc_comment)]
    Quantize(quantize::QuantizeArgs),
}

/// Sets the kernel thread count before any tensor code starts its pools.
pub fn set_threads(threads: Option<usize>) {
    let n = threads
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // Both candle's pool and rayon read these once, at first use.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    // Child processes (`tern bench` runs each measurement in one) inherit it.
    std::env::set_var("TERN_THREADS", n.to_string());
}

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Pull(a) => pull::run(&a),
        Command::Info(a) => info::run(&a),
        Command::Tokenize(a) => tokenize::run(&a),
        Command::Generate(a) => generate::run(&a),
        Command::Chat(a) => chat::run(&a),
        Command::Perplexity(a) => perplexity::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Bon(a) => bon::run(&a),
        Command::Eval(a) => eval::run(&a),
        Command::SynthData(a) => synth_data::run(&a),
        Command::KvEval(a) => kv_eval::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::Train(a) => train::run(&a),
        Command::Plot(a) => plot::run(&a),
        Command::Export(a) => export::run(&a),
        Command::Quantize(a) => quantize::run(&a),
    }
}
