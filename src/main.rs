//! The `tern` binary: parse arguments, run one subcommand, report errors as one
//! line and a non-zero exit.

mod cli;

use clap::Parser;

/// Keeps buffers up to 32 MiB (a prefill's activations) on the heap and up
/// to 64 MiB of freed heap mapped: glibc would otherwise map every such
/// buffer afresh and unmap it when freed, so each layer's products paid for
/// zeroed pages from the kernel again (a third of a prefill's page faults,
/// about 5% of its time on the 1.5B).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

fn main() {
    tune_allocator();
    let args = match cli::Cli::try_parse() {
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
        // The runtime names no flags; the binary knows which of its own
        // sets what the error needs.
        if let Some(hint) = cli::hint::setup_hint(&e) {
            msg.push_str(&format!(" ({hint})"));
        }
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
