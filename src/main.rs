//! The `tern` binary: parse arguments, run one subcommand, report errors as one
//! line and a non-zero exit.

mod cli;

use clap::Parser;

fn main() {
    let args = match cli::args::Cli::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // Usage errors as one line, like every other error: the message and
            // its indented details (such as the missing arguments), up to the
            // usage block.
            let rendered = e.render().to_string();
            let line = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
            let line = if line.is_empty() {
                "error: invalid arguments".to_string()
            } else {
                line
            };
            eprintln!("{line} (see --help)");
            std::process::exit(2);
        }
    };
    cli::set_threads(args.threads);
    if let Err(e) = cli::run(args) {
        // One line: the chain of causes joined, no backtrace; a cause whose
        // text the line already ends with (an error that prints its source)
        // is said once.
        let mut msg = String::new();
        for cause in e.chain().map(|c| c.to_string()) {
            if msg.ends_with(&cause) {
                continue;
            }
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&cause);
        }
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
