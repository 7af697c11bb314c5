//! `tern chat`: an interactive conversation on the terminal.

use std::io::{BufRead, Write};

use anyhow::Result;
use tern_runtime::chat::ChatMessage;
use tern_runtime::engine::SubmitRequest;
use tern_runtime::engine::DEFAULT_PREFILL_CHUNK;

use super::args::{KvArgs, ModelArgs, SamplingArgs};
use super::generate::{cli_engine, content_tokens, run_request, sampling_params};
use super::resolve;
use clap::Args;

/// `tern chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// System prompt (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Let control-token text such as `<|im_start|>` in your messages become
    /// control tokens inside the chat template (default: it stays text).
    #[arg(long)]
    pub allow_special_tokens_in_content: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &ChatArgs) -> Result<()> {
    let model = resolve::load(&a.model.model)?;
    model.chat_template()?;
    let engine = cli_engine(model, DEFAULT_PREFILL_CHUNK);
    let model = engine.model();
    let content = content_tokens(a.allow_special_tokens_in_content);
    let mut history: Vec<ChatMessage> = Vec::new();
    let reset = |h: &mut Vec<ChatMessage>| {
        h.clear();
        if let Some(s) = &a.system {
            h.push(ChatMessage::new("system", s.as_str()));
        }
    };
    reset(&mut history);
    eprintln!(
        "chatting with {} (empty line or Ctrl-D quits, /reset clears the conversation)",
        model.path.display()
    );
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut turn = 0u64;
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        if line == "/reset" {
            reset(&mut history);
            continue;
        }
        history.push(ChatMessage::new("user", line));
        let mut sampling = sampling_params(&a.sampling, 0);
        sampling.seed = sampling.seed.wrapping_add(turn);
        turn += 1;
        let prompt = model.chat_prompt(&history, content)?;
        let max_tokens = model.fit_max_tokens(prompt.len(), a.sampling.max_tokens);
        let mut req = SubmitRequest::new(prompt, sampling, max_tokens);
        req.stop = a.sampling.stop.clone();
        req.kv_policy = a.kv.kv_policy.clone();
        req.kv_dtype = a.kv.kv_dtype;
        let out = match run_request(&engine, req, |piece| {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }) {
            Ok(out) => out,
            Err(e) => {
                // A too-long conversation ends this turn, not the session.
                eprintln!("\nerror: {e} (use /reset to start over)");
                history.pop();
                continue;
            }
        };
        println!();
        history.push(ChatMessage::new("assistant", out.completion.text));
    }
    Ok(())
}
