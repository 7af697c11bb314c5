//! `tern kv-eval --tasks ppl --files a,b,c --kept 25,50`: perplexity under
//! eviction on several texts at once. A policy that wins on one text can lose
//! on another (code and dialogue repeat differently from prose), so the
//! default policy is chosen from the mean and spread over texts, not from one.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::perplexity::perplexity_stored;
use tern_runtime::LoadedModel;

use super::args::KvEvalArgs;
use super::kv_eval::policy;

/// Whether `a` asks for the multi-text table rather than the single-file one.
pub fn wanted(a: &KvEvalArgs) -> bool {
    !a.files.is_empty() || !a.kept.is_empty() || a.out.is_some()
}

/// One evaluated text: its name in tables, its path and its tokens.
struct Text {
    name: String,
    path: PathBuf,
    tokens: Vec<u32>,
}

/// A budget column: the cache size, and the percentage of the context it is
/// when given with --kept.
#[derive(Clone, Copy)]
struct Budget {
    budget: usize,
    kept: Option<usize>,
}

impl Budget {
    fn label(&self) -> String {
        match self.kept {
            Some(k) => format!("kept {k}%"),
            None => format!("budget {}", self.budget),
        }
    }
}

/// Mean, population standard deviation, min and max of `xs` (not empty).
fn spread(xs: &[f64]) -> (f64, f64, f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, std, min, max)
}

/// The short name a text goes by in tables: its file stem, made unique.
fn names(paths: &[PathBuf]) -> Vec<String> {
    let stems: Vec<String> = paths
        .iter()
        .map(|p| {
            p.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string())
        })
        .collect();
    stems
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if stems.iter().filter(|t| *t == s).count() > 1 {
                paths[i].display().to_string()
            } else {
                s.clone()
            }
        })
        .collect()
}

/// Reads and tokenizes every text before any is evaluated, so a bad path or
/// a too-short text fails at once rather than after an hour of other texts.
fn load_texts(model: &LoadedModel, a: &KvEvalArgs) -> Result<Vec<Text>> {
    let (flag, paths) = if a.files.is_empty() {
        ("--file", vec![a.file.clone()])
    } else {
        ("--files", a.files.clone())
    };
    let mut texts = Vec::new();
    for (path, name) in paths.iter().zip(names(&paths)) {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{flag}: cannot read {} as UTF-8 text", path.display()))?;
        let mut tokens = model.tokenizer.encode(&text, true, false)?;
        if tokens.len() < a.ctx {
            bail!(
                "{flag}: {} has {} tokens; one window of --ctx {} needs at least that many",
                path.display(),
                tokens.len(),
                a.ctx
            );
        }
        tokens.truncate(a.ctx * a.windows);
        texts.push(Text {
            name,
            path: path.clone(),
            tokens,
        });
    }
    Ok(texts)
}

/// The budget columns: --kept percentages of --ctx when given, else --budgets.
fn budgets(a: &KvEvalArgs) -> Result<Vec<Budget>> {
    if a.kept.is_empty() {
        return Ok(a
            .budgets
            .iter()
            .map(|&budget| Budget { budget, kept: None })
            .collect());
    }
    a.kept
        .iter()
        .map(|&k| {
            let budget = a.ctx * k / 100;
            if budget == 0 {
                bail!("--kept: {k}% of --ctx {} leaves no cache entry", a.ctx);
            }
            Ok(Budget {
                budget,
                kept: Some(k),
            })
        })
        .collect()
}

/// Appends JSON records to --out as they are measured, so a long run that is
/// stopped keeps what it finished.
struct Records {
    file: Option<std::fs::File>,
}

impl Records {
    fn create(path: Option<&Path>) -> Result<Self> {
        let file = path
            .map(|p| {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("--out: cannot create {}", dir.display()))?;
                }
                std::fs::File::create(p)
                    .with_context(|| format!("--out: cannot create {}", p.display()))
            })
            .transpose()?;
        Ok(Self { file })
    }

    fn write(&mut self, record: &serde_json::Value) -> Result<()> {
        if let Some(f) = &mut self.file {
            writeln!(f, "{record}").context("--out: write failed")?;
            f.flush().context("--out: write failed")?;
        }
        Ok(())
    }
}

/// Runs the multi-text perplexity table: full cache once per text, then each
/// policy at each budget on each text. Prints one Markdown table per policy
/// (rows: budgets; columns: texts, then mean, standard deviation and range of
/// the ratio to full over texts) and a summary of means.
pub fn eval(model: &LoadedModel, a: &KvEvalArgs) -> Result<serde_json::Value> {
    let texts = load_texts(model, a)?;
    let cols = budgets(a)?;
    let policies = a
        .policies
        .iter()
        .map(|name| {
            cols.iter()
                .map(|b| policy(name, b.budget))
                .collect::<Result<Vec<KvPolicy>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let mut records = Records::create(a.out.as_deref())?;
    let scored = a.ctx - a.ctx / 2 - 1;

    let mut full = Vec::new();
    for t in &texts {
        let r = perplexity_stored(
            model,
            &t.tokens,
            a.ctx,
            &KvPolicy::Full,
            a.kv_dtype,
            |_, _, _| {},
        )?;
        eprintln!("ppl {} full: {:.4}", t.name, r.perplexity);
        full.push((r.perplexity, r.kv_bytes));
    }

    println!(
        "\n### Perplexity over {} texts at context {} ({} window(s), {} scored tokens each)\n",
        texts.len(),
        a.ctx,
        a.windows,
        scored
    );
    let names: Vec<&str> = texts.iter().map(|t| t.name.as_str()).collect();
    let header = format!("{} | mean | std | min-max |", names.join(" | "));
    let rule = "---|".repeat(texts.len() + 3);
    let full_ppl: Vec<f64> = full.iter().map(|f| f.0).collect();
    println!("| full | {header}\n|---|{rule}");
    let cells: Vec<String> = full_ppl.iter().map(|p| format!("{p:.3}")).collect();
    let (mean, std, min, max) = spread(&full_ppl);
    println!(
        "| perplexity | {} | {mean:.3} | {std:.3} | {min:.3}-{max:.3} |",
        cells.join(" | ")
    );

    let mut rows = Vec::new();
    let mut summary = Vec::new();
    for (name, specs) in a.policies.iter().zip(&policies) {
        println!("\n{name}: ratio to full (perplexity)\n");
        println!("| {name} | {header}\n|---|{rule}");
        for (b, p) in cols.iter().zip(specs) {
            let mut ratios = Vec::new();
            let mut cells = Vec::new();
            for (t, &(full_ppl, full_bytes)) in texts.iter().zip(&full) {
                let r = perplexity_stored(model, &t.tokens, a.ctx, p, a.kv_dtype, |_, _, _| {})?;
                let ratio = r.perplexity / full_ppl;
                eprintln!(
                    "ppl {} {p}: {:.4} ({ratio:.3}x, {:.0} s)",
                    t.name, r.perplexity, r.seconds
                );
                cells.push(format!("{ratio:.3}x ({:.2})", r.perplexity));
                ratios.push(ratio);
                let record = json!({
                    "text": t.name, "file": t.path.display().to_string(),
                    "policy": p.to_string(), "name": name,
                    "kept": b.kept, "ctx": a.ctx, "budget": b.budget, "windows": a.windows,
                    "scored_tokens": r.scored_tokens, "ppl": r.perplexity, "full_ppl": full_ppl,
                    "ratio": ratio, "kv_bytes": r.kv_bytes, "kv_bytes_full": full_bytes,
                    "kv_dtype": a.kv_dtype, "model": a.model.model,
                });
                records.write(&record)?;
                rows.push(record);
            }
            let (mean, std, min, max) = spread(&ratios);
            println!(
                "| {} | {} | {mean:.3}x | {std:.3} | {min:.3}-{max:.3} |",
                b.label(),
                cells.join(" | ")
            );
            summary.push(json!({"name": name, "budget": b.budget, "kept": b.kept,
                "mean_ratio": mean, "std_ratio": std, "min_ratio": min, "max_ratio": max}));
        }
    }

    println!("\nMean ratio to full over the texts (population std):\n");
    let labels: Vec<String> = cols.iter().map(Budget::label).collect();
    println!(
        "| policy | {} |\n|---|{}",
        labels.join(" | "),
        "---|".repeat(cols.len())
    );
    for (name, s) in a.policies.iter().zip(summary.chunks(cols.len())) {
        let cells: Vec<String> = s
            .iter()
            .map(|v| {
                format!(
                    "{:.3}x ± {:.3}",
                    v["mean_ratio"].as_f64().unwrap_or(f64::NAN),
                    v["std_ratio"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }

    let texts_json: Vec<serde_json::Value> = texts
        .iter()
        .zip(&full)
        .map(|(t, f)| json!({"text": t.name, "file": t.path.display().to_string(), "full": f.0}))
        .collect();
    Ok(
        json!({"ctx": a.ctx, "windows": a.windows, "kv_dtype": a.kv_dtype, "texts": texts_json,
        "rows": rows, "summary": summary}),
    )
}
