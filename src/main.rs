//! The `tern` binary: parse arguments, run one subcommand, report errors as one
//! line and a non-zero exit.

mod cli;

use clap::Parser;

fn main() {
    let args = cli::args::Cli::parse();
    cli::set_threads(args.threads);
    if let Err(e) = cli::run(args) {
        // One line: the chain of causes joined, no backtrace.
        let msg = e
            .chain()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(": ");
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
