//! `tern bon`'s flags.

use crate::cli::args::{KvArgs, ModelArgs, PromptArgs};
use clap::Args;
use std::path::PathBuf;

/// `tern bon`.
#[derive(Debug, Args)]
pub struct BonArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// The question: `-p TEXT` or `-f FILE`.
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// System prompt for the candidates.
    #[arg(long)]
    pub system: Option<String>,
    /// Most candidates to sample (1-16).
    #[arg(short = 'n', long = "candidates", default_value_t = 8)]
    pub n: usize,
    /// majority (vote on extracted answers), synthesize (a CoT synthesizer reads
    /// the candidates and answers), or reward (unit tests from --tests, or
    /// written by a model with --generate-tests K).
    #[arg(long, default_value = "majority")]
    pub aggregate: tern_solve::reasoning::Aggregate,
    /// Sample in waves and stop once the leading answer is the majority with
    /// probability >= --confidence (Beta posterior).
    #[arg(long)]
    pub adaptive: bool,
    /// Candidates per wave with --adaptive.
    #[arg(long, default_value_t = 2)]
    pub wave: usize,
    /// With --adaptive: the posterior probability that the leading answer is
    /// the majority at which sampling stops (0.5-1; higher samples more).
    #[arg(long, default_value_t = tern_solve::reasoning::DEFAULT_CONFIDENCE, value_parser = parse_confidence)]
    pub confidence: f64,
    /// Unit tests for --aggregate reward: one Python statement (or JSON string) per line.
    #[arg(long, conflicts_with = "generate_tests")]
    pub tests: Option<PathBuf>,
    /// For --aggregate reward without --tests: a model (--test-model, default
    /// --model) writes K unit tests for the question, sampled in parallel with
    /// the candidates; each candidate runs against each (1-64). The candidate
    /// passing most wins; ties go to the pass pattern most candidates share,
    /// then to the earliest.
    #[arg(long, value_name = "K")]
    pub generate_tests: Option<usize>,
    /// A second model (path or registry name) that writes the tests of
    /// --generate-tests, run as its own engine (default: --model).
    #[arg(long, requires = "generate_tests")]
    pub test_model: Option<String>,
    /// Candidates' temperature (the synthesizer decodes greedily).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Candidates' nucleus sampling (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Seed of candidate 1; candidate i uses seed + i - 1.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Add BIAS to token ID's logit before sampling, as llama.cpp's
    /// --logit-bias (repeatable): `--logit-bias 15043=+1.5`, `-100` bans it.
    #[arg(long = "logit-bias", value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Most tokens per candidate and for the synthesis (reasoning plus answer
    /// with --reasoning-effort / --thinking-budget).
    #[arg(long, default_value_t = 384)]
    pub max_tokens: usize,
    /// Adaptive length per candidate: low, medium, high (caps of 128, 512,
    /// 2048 reasoning tokens, then the answer is forced) or auto (answer
    /// probes every --probe-every tokens; stop once 3 agree; cap 2048).
    #[arg(long)]
    pub reasoning_effort: Option<tern_solve::reasoning::Effort>,
    /// The reasoning cap in tokens (replaces the effort's cap).
    #[arg(long)]
    pub thinking_budget: Option<usize>,
    /// Reasoning tokens between answer probes with --reasoning-effort auto.
    #[arg(long, default_value_t = tern_solve::reasoning::DEFAULT_PROBE_EVERY)]
    pub probe_every: usize,
    /// A second model (path or registry name) that writes the synthesis for
    /// --aggregate synthesize, run as its own engine (default: --model).
    #[arg(long)]
    pub synthesizer_model: Option<String>,
    /// Best-of-N on a spreadsheet task instead of a question: SOURCE is a
    /// spreadsheet spec (`spreadsheet:count=40,seed=1001`) or a
    /// `.spreadsheet.jsonl` file; the prompt is the task's, every candidate
    /// program is judged on its test-case workbooks, and --select chooses.
    /// It stands in for -p/-f (it joins their group).
    #[arg(long, value_name = "SOURCE", group = "PromptArgs", conflicts_with_all = ["tests", "generate_tests", "adaptive", "system"])]
    pub spreadsheet: Option<String>,
    /// With --spreadsheet: which task of SOURCE, counting from 0 (default 0).
    #[arg(long, value_name = "K")]
    pub sheet_task: Option<usize>,
    /// With --spreadsheet: agree (the program whose outputs on the test-case
    /// workbooks most candidates share; no hidden answers) or oracle (the
    /// program passing the most test cases by the reference comparison);
    /// default agree.
    #[arg(long, value_enum)]
    pub select: Option<SheetSelect>,
    /// With --spreadsheet: rounds per candidate (default 1). A candidate
    /// whose program crashed, ran out of time or left no answer on a test
    /// case is shown that (no hidden answer) and writes it again, up to R
    /// rounds; the choice is made over the last programs.
    #[arg(long, value_name = "R")]
    pub rounds: Option<usize>,
}

/// How `tern bon --spreadsheet` chooses among its candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SheetSelect {
    /// By agreement of outputs on the test-case workbooks.
    Agree,
    /// By the reference comparison (the oracle).
    Oracle,
}

/// A stopping confidence strictly between 0.5 and 1.
fn parse_confidence(s: &str) -> Result<f64, String> {
    let c: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if c > 0.5 && c < 1.0 {
        Ok(c)
    } else {
        Err(format!("must be above 0.5 and below 1, got {c}"))
    }
}

/// Parses `ID=BIAS` (also `ID+BIAS` / `ID-BIAS`, llama.cpp's forms).
fn parse_logit_bias(spec: &str) -> Result<(u32, f32), String> {
    let at = spec
        .find(['=', '+', '-'])
        .ok_or_else(|| format!("`{spec}` is not ID=BIAS (e.g. 15043=1.5)"))?;
    let id = spec[..at]
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("`{}` in `{spec}` is not a token id", &spec[..at]))?;
    let value = if &spec[at..at + 1] == "=" {
        &spec[at + 1..]
    } else {
        &spec[at..]
    };
    let bias = value
        .trim()
        .parse::<f32>()
        .ok()
        .filter(|b| b.is_finite())
        .ok_or_else(|| format!("`{value}` in `{spec}` is not a finite number"))?;
    Ok((id, bias))
}
