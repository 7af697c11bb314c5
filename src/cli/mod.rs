//! Subcommands of the `tern` binary. Each takes its parsed arguments, builds
//! what it needs from the libraries, and prints text (or one JSON object).

pub mod args;
mod backend;
mod bench;
mod bon;
mod bon_spreadsheet;
mod chat;
mod eval;
mod eval_spreadsheet;
mod eval_spreadsheet_best;
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

use args::{Cli, Command};

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
