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

use super::args::BenchArgs;
use super::backend::{self, BackendKind, Sizing};
use super::resolve;

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
    (kind, policy, dtype): &(BackendKind, KvPolicy, KvDtype),
    path: &Path,
    rep: u64,
) -> Result<Vec<Row>> {
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
        let rows = run_here(a, a.backends[0], &path, rep)?;
        println!("{}", serde_json::json!({ "rows": rows }));
        return Ok(());
    }
    let reps = a.reps.max(1);
    // Every backend under the main policy and storage, then Tern's under
    // each extra policy and each extra storage type.
    let main_dtype = a.kv.kv_dtype;
    let mut configs: Vec<(BackendKind, KvPolicy, KvDtype)> = a
        .backends
        .iter()
        .map(|&k| (k, a.kv.kv_policy.clone(), main_dtype))
        .collect();
    configs.extend(
        a.also_policy
            .iter()
            .map(|p| (BackendKind::Tern, p.clone(), main_dtype)),
    );
    configs.extend(
        a.also_kv_dtype
            .iter()
            .map(|&d| (BackendKind::Tern, a.kv.kv_policy.clone(), d)),
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
            "memory read bandwidth {:.1} GB/s, {:.1} MB of weights per token: decode floor {:.0} tokens/s",
            f.bandwidth / 1e9,
            f.weight_bytes as f64 / 1e6,
            f.tokens_per_s()
        );
    }
    println!(
        "{:<10} {:<18} {:>6} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>7}",
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
            "{:<10} {:<18} {:>6} {:>10.1} {:>10.1} {:>8.1} {:>8.1} {:>9} {:>9} {:>7}",
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
