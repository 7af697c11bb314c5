//! `tern eval`'s flags.

use crate::cli::args::{KvArgs, ModelArgs};
use clap::Args;

/// `tern eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Tasks: a JSONL file, gzipped or not (`{"question" or "prompt", "answer"}`
    /// per line, GSM8K as is; code tasks `{"prompt", "tests": [...]}` or
    /// HumanEval's records, graded by running their tests), or a built-in
    /// generator, e.g. `arithmetic:count=200,seed=1,difficulty=1,ops=add+sub+word`
    /// or `story:count=200,seed=1,steps=2+3` (multi-step word problems whose
    /// answers take a few sentences of reasoning).
    #[arg(long)]
    pub task: String,
    /// Strategies to compare, comma-separated: single, majority@N, synthesize@N,
    /// adaptive[@N] (adaptive width in waves of 2; `adaptive@8:wave=1` samples
    /// one candidate at a time, `:confidence=0.9` stops at a lower posterior
    /// than the default 0.95), synthesize@N:with=NAME (a --synthesizer),
    /// single:with=NAME (the --synthesizer NAME answers alone, greedily, no
    /// candidates shown: the SFT-only control), reward@N (code tasks: the candidate passing most of the task's tests),
    /// reward@N:tests=K (code tasks: the candidate passing most of K tests a
    /// model writes, --test-model or --model; graded by the task's tests),
    /// reward@N:tests=K:dynamic (the same K x tasks tests in all, spread over
    /// the tasks by how much their candidates disagree),
    /// length@EFFORT (one greedy sample under adaptive length: EFFORT is low,
    /// medium, high, auto, or a token cap). Spreadsheet tasks take single,
    /// rounds@R (retries after a failed test case), agree@N and/or oracle@N
    /// (best-of-N chosen by the agreement of outputs on the test-case
    /// workbooks, or by the reference comparison; with rounds@R beside them,
    /// each candidate retries after a crash or a missing answer, shown no
    /// hidden answer), or reference (each task's own reference program, no
    /// model).
    #[arg(long, value_delimiter = ',', default_value = "single,majority@8")]
    pub strategy: Vec<String>,
    /// Evaluate only the first N tasks (after --offset).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Skip the first N tasks (task numbers and seeds stay those of the whole file).
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// Append one JSON line per strategy and task to FILE, and skip the pairs
    /// FILE already holds (their results count in the table): a long run can
    /// stop and resume.
    #[arg(long, value_name = "FILE")]
    pub records: Option<std::path::PathBuf>,
    /// With --records: print the table over the tasks that already have a record
    /// for every strategy, without loading the model or running anything (to
    /// follow a long run). Like every run's table, it ends with each strategy
    /// against the first listed: tasks it wins and loses, one by one.
    #[arg(long, requires = "records")]
    pub report: bool,
    /// With --records: also print the table per task difficulty (generated
    /// tasks: digits per operand, a story's events), from every record on
    /// file, to see where adaptive width or length saves and where it costs.
    #[arg(long, requires = "records")]
    pub by_difficulty: bool,
    /// Tasks in flight at once. They share the engine's batches (more rows per
    /// step, higher throughput); each task keeps its own seeds, so answers are
    /// the same as with 1, but a task's seconds then overlap other tasks'.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub parallel: u64,
    /// Sampling temperature for multi-sample strategies (single is greedy).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Base seed; task i uses seed + 1000 i (+ candidate index).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Most tokens per sample.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Reasoning tokens between answer probes for length@auto.
    #[arg(long, default_value_t = tern_solve::reasoning::DEFAULT_PROBE_EVERY)]
    pub probe_every: usize,
    /// A second model (path or registry name) that writes the synthesis for
    /// synthesize@N, run as its own engine (default: --model).
    #[arg(long)]
    pub synthesizer_model: Option<String>,
    /// A named synthesizer, NAME=MODEL (repeatable), for strategies
    /// `synthesize@N:with=NAME`: several synthesizers over the very same
    /// candidates in one run, e.g. `--strategy
    /// majority@8,synthesize@8,synthesize@8:with=trained --synthesizer
    /// trained=runs/synth/export.gguf`. `single:with=NAME` has the named model
    /// answer alone: the SFT-only control (`tern synth-data --control-of`)
    /// beside the synthesizer trained on the same targets.
    #[arg(long, value_name = "NAME=MODEL")]
    pub synthesizer: Vec<String>,
    /// A second model (path or registry name) that writes the unit tests of
    /// reward@N:tests=K, run as its own engine (default: --model).
    #[arg(long)]
    pub test_model: Option<String>,
}
