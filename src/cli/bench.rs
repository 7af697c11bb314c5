//! `tern bench`: prefill and decode speed, peak memory and KV bytes, in the
//! shape llama-bench reports them (pp512, tg128 at context depths), for one or
//! more backends side by side.
//!
//! Every backend runs the same code path (the engine's [`Backend`] trait: rows
//! in, logits out, greedy argmax) on the same fixed pseudo-random token ids, as
//! llama-bench uses. With several backends or repetitions, each (repetition,
//! backend) runs in its own child process, interleaved backend by backend, so
//! peak RSS is per backend and machine drift hits every backend alike; the
//! medians are reported.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tern_models::GgufFile;
use tern_runtime::backend::{Backend, LogitsWanted, Row as StepRow};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::kv::KvDtype;
use tern_runtime::{memory, LoadedModel};

use super::args::{parse_dtype, KvArgs, ModelArgs};
use super::backend::{self, BackendKind, Sizing};
use super::resolve;
use clap::Args;

/// `tern bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Context depths to measure at (tokens already in the cache), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub depths: Vec<usize>,
    /// Prompt tokens for the prefill measurement (pp); 0 skips it.
    #[arg(long, default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to decode for the generation measurement (tg).
    #[arg(long, default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions per configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Backends to measure side by side, comma-separated: tern, llama-cpp
    /// (in process: the exactness reference, not a speed anchor), llama-native
    /// (llama.cpp's own llama-bench from scripts/native_llama.sh: the speed
    /// anchor). Runs interleave backend by backend, each in its own process.
    #[arg(long, value_delimiter = ',', default_value = "tern")]
    pub backends: Vec<crate::cli::bench::BenchBackend>,
    /// Also measure Tern's own backend under this KV policy, in the same run
    /// and interleaved with the others (repeatable), e.g. `--also-policy
    /// snapkv:budget=256` beside a full-cache llama.cpp at depth 4096.
    #[arg(long, value_name = "SPEC")]
    pub also_policy: Vec<tern_runtime::kv::policy::KvPolicy>,
    /// Also measure Tern's own backend with its cache stored as this type
    /// (f32, f16, q8_0, q4_0), under --kv-policy, in the same interleaved run
    /// (repeatable), e.g. `--also-kv-dtype f32` beside the f16 default.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub also_kv_dtype: Vec<tern_runtime::kv::KvDtype>,
    /// Skip the memory-bandwidth measurement (and the floor it gives).
    #[arg(long)]
    pub no_bandwidth: bool,
    /// Internal: measure one repetition of the first backend in this process.
    #[arg(long, hide = true)]
    pub child_rep: Option<u64>,
}

/// A backend `tern bench` measures: the two that run in process, or a native
/// llama.cpp (its own CMake build, `GGML_NATIVE=ON`, from
/// `scripts/native_llama.sh`) through its own llama-bench, the build speed
/// figures are quoted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    /// Tern's own kernels.
    #[value(alias = "candle")]
    Tern,
    /// llama.cpp in process (llama-cpp-2; the exactness reference, built -O2
    /// for x86-64-v3: not a speed anchor).
    LlamaCpp,
    /// llama.cpp's own llama-bench, built natively: `target/llama-native/bin`
    /// next to the tern binary, or `$TERN_LLAMA_BENCH`.
    LlamaNative,
}

impl BenchBackend {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            BenchBackend::Tern => "tern",
            BenchBackend::LlamaCpp => "llama-cpp",
            BenchBackend::LlamaNative => "llama-native",
        }
    }

    /// The in-process backend it is, if it is one.
    fn in_process(self) -> Option<BackendKind> {
        match self {
            BenchBackend::Tern => Some(BackendKind::Tern),
            BenchBackend::LlamaCpp => Some(BackendKind::LlamaCpp),
            BenchBackend::LlamaNative => None,
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    backend: String,
    kv_policy: String,
    #[serde(default)]
    kv_dtype: KvDtype,
    depth: usize,
    pp_tokens_per_s: Option<f64>,
    tg_tokens_per_s: f64,
    peak_rss_bytes: Option<u64>,
    kv_bytes: usize,
}

/// `n` deterministic token ids spread over the vocabulary (skipping the
/// lowest twentieth, where control tokens usually live).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let low = vocab as u64 / 20;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (low + x % (vocab as u64 - low)) as u32
        })
        .collect()
}

const CHUNK: usize = 512;

/// Feeds `tokens` to `seq` from position `start` in chunks; the last chunk's
/// logits come back.
fn feed(b: &mut dyn Backend, seq: u64, tokens: &[u32], start: usize) -> Result<Option<Vec<f32>>> {
    let mut logits = None;
    for (i, piece) in tokens.chunks(CHUNK).enumerate() {
        let rows = [StepRow {
            seq,
            tokens: piece,
            start_pos: start + i * CHUNK,
            logits: if (i + 1) * CHUNK >= tokens.len() {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        }];
        logits = b.forward(&rows)?.pop().flatten();
    }
    Ok(logits)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Measures one backend in this process: for each depth, pp over a fresh
/// prompt after `depth` tokens, and tg decoding `n_gen` tokens after `depth`.
fn measure(b: &mut dyn Backend, a: &BenchArgs, vocab: usize, rep: u64) -> Result<Vec<Row>> {
    let policy = &a.kv.kv_policy;
    let dtype = a.kv.kv_dtype;
    let mut rows = Vec::new();
    for &depth in &a.depths {
        let pp = if a.n_prompt > 0 {
            // A fresh `n_prompt`-token prompt after `depth` untimed tokens.
            let prompt = tokens(depth + a.n_prompt, vocab, rep + 1);
            let seq = b.new_seq(policy, dtype, prompt.len())?;
            feed(b, seq, &prompt[..depth], 0)?;
            let t = Instant::now();
            feed(b, seq, &prompt[depth..], depth)?;
            let secs = t.elapsed().as_secs_f64();
            b.free(seq);
            Some(a.n_prompt as f64 / secs.max(1e-9))
        } else {
            None
        };
        // `n_gen` greedy tokens decoded on top of `depth` tokens of context.
        let prompt = tokens(depth.max(1), vocab, 100 + rep);
        let seq = b.new_seq(policy, dtype, prompt.len() + a.n_gen + 1)?;
        let mut logits = feed(b, seq, &prompt, 0)?.context("no logits after prefill")?;
        b.finish_prefill(seq)?;
        let t = Instant::now();
        for pos in prompt.len()..prompt.len() + a.n_gen {
            let tok = [argmax(&logits)];
            let rows = [StepRow {
                seq,
                tokens: &tok,
                start_pos: pos,
                logits: LogitsWanted::Last,
            }];
            logits = b.forward(&rows)?.pop().flatten().context("no logits")?;
        }
        let tg = a.n_gen as f64 / t.elapsed().as_secs_f64().max(1e-9);
        let kv = b.kv(seq).peak;
        b.free(seq);
        rows.push(Row {
            backend: b.name().to_string(),
            kv_policy: policy.to_string(),
            kv_dtype: dtype,
            depth,
            pp_tokens_per_s: pp,
            tg_tokens_per_s: tg,
            peak_rss_bytes: None,
            kv_bytes: kv,
        });
    }
    Ok(rows)
}

/// Runs every depth for one backend in this process.
fn run_here(a: &BenchArgs, kind: BackendKind, path: &Path, rep: u64) -> Result<Vec<Row>> {
    let model = Arc::new(LoadedModel::load(path)?);
    let vocab = model.config().vocab_size;
    let max_depth = a.depths.iter().copied().max().unwrap_or(0);
    let sizing = Sizing {
        n_ctx: max_depth + a.n_prompt.max(a.n_gen) + 64,
        n_seq: 2,
        kv_dtype: a.kv.kv_dtype,
    };
    let mut b = backend::open(kind, path, &model, &sizing)?;
    if kind != BackendKind::Tern {
        // Only the tokenizer-free shape facts were needed from Tern's load.
        drop(model);
    }
    let mut rows = measure(b.as_mut(), a, vocab, rep)?;
    let rss = memory::peak_rss_bytes();
    for r in &mut rows {
        r.peak_rss_bytes = rss;
    }
    Ok(rows)
}

/// Runs one (repetition, backend, policy, storage) in a child process and
/// reads its rows.
fn run_child(
    a: &BenchArgs,
    (kind, policy, dtype): &(BenchBackend, KvPolicy, KvDtype),
    path: &Path,
    rep: u64,
) -> Result<Vec<Row>> {
    if *kind == BenchBackend::LlamaNative {
        return run_native(a, policy, *dtype, path);
    }
    let exe = std::env::current_exe()?;
    let depths: Vec<String> = a.depths.iter().map(|d| d.to_string()).collect();
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "--json", "--child-rep", &rep.to_string()])
        .args(["--model", &path.to_string_lossy()])
        .args(["--backends", kind.name()])
        .args(["--kv-policy", &policy.to_string()])
        .args(["--kv-dtype", dtype.name()])
        .args(["--depths", &depths.join(",")])
        .args(["--n-prompt", &a.n_prompt.to_string()])
        .args(["--n-gen", &a.n_gen.to_string()]);
    let out = cmd.output().context("starting a bench child process")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "{} run failed: {}",
            kind.name(),
            err.lines().last().unwrap_or("no output")
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(line).context("reading a child's report")?;
    Ok(serde_json::from_value(v["rows"].clone())?)
}

/// The native llama-bench: `$TERN_LLAMA_BENCH`, or where
/// `scripts/native_llama.sh` puts it (target/llama-native/bin, beside the
/// directory of this binary).
fn native_bench_path() -> Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("TERN_LLAMA_BENCH") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("llama-native/bin/llama-bench"))
        .context("no directory above the tern binary")?;
    if !p.exists() {
        bail!(
            "llama-native needs a native llama-bench: run scripts/native_llama.sh (builds {}) or set TERN_LLAMA_BENCH",
            p.display()
        );
    }
    Ok(p)
}

/// One repetition of the native llama.cpp: its own llama-bench, one
/// repetition (`-r 1`), the same prompt and generation sizes, depths,
/// threads and KV storage, llama.cpp's defaults otherwise (batch, flash
/// attention, repacking). Peak RSS is the child's own (`wait4`).
fn run_native(a: &BenchArgs, policy: &KvPolicy, dtype: KvDtype, path: &Path) -> Result<Vec<Row>> {
    if !matches!(policy, KvPolicy::Full) {
        bail!("llama-native measures llama.cpp's full cache only (--kv-policy full)");
    }
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let depths: Vec<String> = a.depths.iter().map(|d| d.to_string()).collect();
    let bench = native_bench_path()?;
    let child = Command::new(&bench)
        .args(["-m", &path.to_string_lossy()])
        .args(["-p", &a.n_prompt.to_string()])
        .args(["-n", &a.n_gen.to_string()])
        .args(["-d", &depths.join(",")])
        .args(["-t", &threads.to_string()])
        .args(["-ctk", dtype.name(), "-ctv", dtype.name()])
        .args(["-r", "1", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bench.display()))?;
    let (status, stdout, stderr, peak) = wait_with_peak(child)?;
    if !status.success() {
        bail!(
            "llama-native run failed: {}",
            stderr.lines().last().unwrap_or("no output")
        );
    }
    let tests: Vec<serde_json::Value> =
        serde_json::from_str(&stdout).context("reading llama-bench's JSON")?;
    let speed = |prompt: usize, gen: usize, depth: usize| {
        tests.iter().find_map(|t| {
            let field = |k: &str| t[k].as_u64().map(|v| v as usize);
            (field("n_prompt") == Some(prompt)
                && field("n_gen") == Some(gen)
                && field("n_depth") == Some(depth))
            .then(|| t["avg_ts"].as_f64())
            .flatten()
        })
    };
    a.depths
        .iter()
        .map(|&d| {
            Ok(Row {
                backend: BenchBackend::LlamaNative.name().into(),
                kv_policy: policy.to_string(),
                kv_dtype: dtype,
                depth: d,
                pp_tokens_per_s: if a.n_prompt > 0 {
                    Some(speed(a.n_prompt, 0, d).context("llama-bench reported no pp test")?)
                } else {
                    None
                },
                tg_tokens_per_s: speed(0, a.n_gen, d).context("llama-bench reported no tg test")?,
                peak_rss_bytes: Some(peak),
                kv_bytes: 0,
            })
        })
        .collect()
}

/// Waits for `child`, reading its output, and returns its exit status,
/// stdout, stderr and peak resident bytes (from its own rusage).
fn wait_with_peak(
    mut child: std::process::Child,
) -> Result<(std::process::ExitStatus, String, String, u64)> {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut out = child.stdout.take().context("no stdout")?;
    let mut err = child.stderr.take().context("no stderr")?;
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    out.read_to_string(&mut stdout)?;
    let stderr = err_reader.join().unwrap_or_default();
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child, which
    // std has not reaped (we never call child.wait()).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: pid is our unreaped child; both pointers are valid.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if r != pid {
        bail!(
            "waiting for llama-bench: {}",
            std::io::Error::last_os_error()
        );
    }
    let status = std::process::ExitStatus::from_raw(status);
    Ok((status, stdout, stderr, usage.ru_maxrss as u64 * 1024))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &BenchArgs) -> Result<()> {
    let path = resolve::model_path(&a.model.model)?;
    if a.backends.is_empty() {
        bail!("--backends needs at least one backend");
    }
    if let Some(rep) = a.child_rep {
        let kind = a.backends[0]
            .in_process()
            .context("a bench child runs an in-process backend")?;
        let rows = run_here(a, kind, &path, rep)?;
        println!("{}", serde_json::json!({ "rows": rows }));
        return Ok(());
    }
    let reps = a.reps.max(1);
    // Every backend under the main policy and storage, then Tern's under
    // each extra policy and each extra storage type.
    let main_dtype = a.kv.kv_dtype;
    let mut configs: Vec<(BenchBackend, KvPolicy, KvDtype)> = a
        .backends
        .iter()
        .map(|&k| (k, a.kv.kv_policy.clone(), main_dtype))
        .collect();
    configs.extend(
        a.also_policy
            .iter()
            .map(|p| (BenchBackend::Tern, p.clone(), main_dtype)),
    );
    configs.extend(
        a.also_kv_dtype
            .iter()
            .map(|&d| (BenchBackend::Tern, a.kv.kv_policy.clone(), d)),
    );
    let floor = if a.no_bandwidth {
        None
    } else {
        Some(Floor::measure(&path)?)
    };
    // runs[config][rep] = rows over depths
    let mut runs: Vec<Vec<Vec<Row>>> = vec![Vec::new(); configs.len()];
    for rep in 0..reps as u64 {
        for (ci, config) in configs.iter().enumerate() {
            if !a.model.json {
                let (kind, policy, dtype) = config;
                eprintln!(
                    "run {}/{}: {} {} ({dtype})",
                    rep + 1,
                    reps,
                    kind.name(),
                    policy
                );
            }
            runs[ci].push(run_child(a, config, &path, rep)?);
        }
    }
    let mut rows = Vec::new();
    for per_backend in &runs {
        for (di, _) in a.depths.iter().enumerate() {
            let reps: Vec<&Row> = per_backend.iter().map(|r| &r[di]).collect();
            let pps: Vec<f64> = reps.iter().filter_map(|r| r.pp_tokens_per_s).collect();
            rows.push(Row {
                pp_tokens_per_s: (!pps.is_empty()).then(|| median(pps)),
                tg_tokens_per_s: median(reps.iter().map(|r| r.tg_tokens_per_s).collect()),
                peak_rss_bytes: reps.iter().filter_map(|r| r.peak_rss_bytes).max(),
                kv_bytes: reps.iter().map(|r| r.kv_bytes).max().unwrap_or(0),
                ..reps[0].clone()
            });
        }
    }
    if a.model.json {
        println!(
            "{}",
            serde_json::json!({
                "threads": std::env::var("RAYON_NUM_THREADS").ok(),
                "reps": reps,
                "n_prompt": a.n_prompt,
                "n_gen": a.n_gen,
                "bandwidth_bytes_per_s": floor.as_ref().map(|f| f.bandwidth),
                "weight_bytes": floor.as_ref().map(|f| f.weight_bytes),
                "floor_tokens_per_s": floor.as_ref().map(Floor::tokens_per_s),
                "rows": rows,
            })
        );
        return Ok(());
    }
    print_table(&rows, a, floor.as_ref());
    Ok(())
}

/// The memory-bandwidth floor of decode: every weight is read once per token,
/// so no decoder beats bandwidth / weight bytes tokens per second.
struct Floor {
    bandwidth: f64,
    weight_bytes: u64,
}

impl Floor {
    fn measure(path: &Path) -> Result<Self> {
        let weight_bytes = GgufFile::open(path)?.tensor_summary().bytes;
        // The machine's bandwidth (every core reading), not one thread's.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self {
            bandwidth: memory::read_bandwidth(threads, 1 << 30),
            weight_bytes,
        })
    }

    fn tokens_per_s(&self) -> f64 {
        self.bandwidth / self.weight_bytes as f64
    }
}

fn print_table(rows: &[Row], a: &BenchArgs, floor: Option<&Floor>) {
    if let Some(f) = floor {
        println!(
            "memory read bandwidth {:.1} GB/s (every core summing its share of a 1 GiB buffer, best of 5 passes), {:.1} MB of weights per token: decode floor {:.0} tokens/s; `floor` is each decode's share of it",
            f.bandwidth / 1e9,
            f.weight_bytes as f64 / 1e6,
            f.tokens_per_s()
        );
    }
    println!(
        "{:<12} {:<18} {:>6} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>7}",
        "backend",
        "policy",
        "depth",
        format!("pp{}", a.n_prompt),
        format!("tg{}", a.n_gen),
        "rss MB",
        "kv MB",
        "pp ratio",
        "tg ratio",
        "floor"
    );
    let first = a.backends[0].name();
    let main_policy = a.kv.kv_policy.to_string();
    for r in rows {
        // Ratios against the first backend under the main policy, same depth.
        let base = rows.iter().find(|b| {
            b.backend == first
                && b.kv_policy == main_policy
                && b.kv_dtype == a.kv.kv_dtype
                && b.depth == r.depth
        });
        let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "-".into(),
        };
        let of_floor = floor.map_or("-".into(), |f| {
            format!("{:.0}%", 100.0 * r.tg_tokens_per_s / f.tokens_per_s())
        });
        println!(
            "{:<12} {:<18} {:>6} {:>10.1} {:>10.1} {:>8.1} {:>8.1} {:>9} {:>9} {:>7}",
            r.backend,
            format!(
                "{}/{}",
                r.kv_policy.split(',').next().unwrap_or(""),
                r.kv_dtype
            ),
            r.depth,
            r.pp_tokens_per_s.unwrap_or(0.0),
            r.tg_tokens_per_s,
            r.peak_rss_bytes.unwrap_or(0) as f64 / 1e6,
            r.kv_bytes as f64 / 1e6,
            ratio(r.pp_tokens_per_s, base.and_then(|b| b.pp_tokens_per_s)),
            ratio(Some(r.tg_tokens_per_s), base.map(|b| b.tg_tokens_per_s)),
            of_floor,
        );
    }
}
