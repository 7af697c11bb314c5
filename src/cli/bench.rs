//! `tern bench`: prefill and decode speed, peak memory and KV bytes, in the
//! shape llama-bench reports them (pp512, tg128 at context depths), medians
//! over repetitions. Prompts are fixed pseudo-random token ids, as llama-bench
//! uses, so no text or tokenizer is involved.

use anyhow::Result;
use serde::Serialize;
use tern_runtime::generate::{generate, GenerateRequest, DEFAULT_PREFILL_CHUNK};
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::sampler::SamplingParams;
use tern_runtime::{memory, LoadedModel};

use super::args::BenchArgs;
use super::resolve;

/// One measured configuration.
#[derive(Debug, Serialize)]
struct Row {
    backend: &'static str,
    kv_policy: String,
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

fn run_once(
    model: &LoadedModel,
    policy: &KvPolicy,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> Result<(f64, f64, usize)> {
    let req = GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens,
        ignore_eos: true,
        stop: Vec::new(),
        prefill_chunk: DEFAULT_PREFILL_CHUNK,
        kv_policy: policy.clone(),
    };
    let out = generate(model, &req, |_| {})?;
    let pp = out.prompt_tokens as f64 / out.prefill_secs.max(1e-9);
    let tg = out.decode_steps as f64 / out.decode_secs.max(1e-9);
    Ok((pp, tg, out.kv_bytes))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the subcommand with its parsed arguments.
pub fn run(a: &BenchArgs) -> Result<()> {
    let model = resolve::load(&a.model.model)?;
    let vocab = model.config().vocab_size;
    let reps = a.reps.max(1);
    let mut rows = Vec::new();
    for &depth in &a.depths {
        let (mut pps, mut tgs, mut kv) = (Vec::new(), Vec::new(), 0);
        for r in 0..reps {
            // pp: a fresh `n_prompt`-token prompt after `depth` tokens of context
            // (skipped with --n-prompt 0).
            if a.n_prompt > 0 {
                let prompt = tokens(depth + a.n_prompt, vocab, r as u64 + 1);
                let (pp, _, _) = run_once(&model, &a.kv.kv_policy, prompt, 1)?;
                pps.push(pp);
            }
            // tg: `n_gen` tokens decoded on top of `depth` tokens of context.
            let prompt = tokens(depth.max(1), vocab, 100 + r as u64);
            let (_, tg, bytes) = run_once(&model, &a.kv.kv_policy, prompt, a.n_gen + 1)?;
            tgs.push(tg);
            kv = kv.max(bytes);
        }
        let row = Row {
            backend: "tern",
            kv_policy: a.kv.kv_policy.to_string(),
            depth,
            pp_tokens_per_s: (!pps.is_empty()).then(|| median(pps)),
            tg_tokens_per_s: median(tgs),
            peak_rss_bytes: memory::peak_rss_bytes(),
            kv_bytes: kv,
        };
        if !a.model.json {
            eprintln!(
                "depth {:>5}: pp{} {:>7.1} tok/s   tg{} {:>6.1} tok/s   kv {:>6.1} MB",
                depth,
                a.n_prompt,
                row.pp_tokens_per_s.unwrap_or(0.0),
                a.n_gen,
                row.tg_tokens_per_s,
                row.kv_bytes as f64 / 1e6
            );
        }
        rows.push(row);
    }
    if a.model.json {
        println!(
            "{}",
            serde_json::json!({ "threads": std::env::var("RAYON_NUM_THREADS").ok(), "rows": rows })
        );
    } else {
        println!(
            "{:<8} {:<6} {:>6} {:>12} {:>12} {:>10} {:>10}",
            "backend", "policy", "depth", "pp tok/s", "tg tok/s", "rss MB", "kv MB"
        );
        for r in &rows {
            println!(
                "{:<8} {:<6} {:>6} {:>12.1} {:>12.1} {:>10.1} {:>10.1}",
                r.backend,
                r.kv_policy,
                r.depth,
                r.pp_tokens_per_s.unwrap_or(0.0),
                r.tg_tokens_per_s,
                r.peak_rss_bytes.unwrap_or(0) as f64 / 1e6,
                r.kv_bytes as f64 / 1e6
            );
        }
    }
    Ok(())
}
