//! Perplexity under eviction on several texts at once. A policy that wins on
//! one text can lose on another (code and dialogue repeat differently from
//! prose), so the default policy is chosen from the mean and spread over
//! texts, not from one.

use std::path::PathBuf;

use serde_json::json;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::LoadedModel;

use crate::config::{KvEvalConfig, PplConfig};
use crate::error::{KvEvalError, Result};
use crate::perplexity::perplexity_stored;
use crate::policy::policy;
use crate::printer::Printer;
use crate::record_file::Records;

/// Whether `cfg` asks for the multi-text table rather than the single-file
/// one (texts, kept percentages or a records file).
pub fn wanted(cfg: &KvEvalConfig) -> bool {
    !cfg.ppl.files.is_empty() || !cfg.ppl.kept.is_empty() || cfg.out.is_some()
}

/// One evaluated text: its name in tables, its path and its tokens.
struct Text {
    name: String,
    path: PathBuf,
    tokens: Vec<u32>,
}

/// A budget column: the cache size, and the percentage of the context it is
/// when given as kept.
#[derive(Clone, Copy, Debug)]
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
fn load_texts(model: &LoadedModel, a: &PplConfig) -> Result<Vec<Text>> {
    let paths = if a.files.is_empty() {
        vec![a.file.clone()]
    } else {
        a.files.clone()
    };
    let mut texts = Vec::new();
    for (path, name) in paths.iter().zip(names(&paths)) {
        let text = std::fs::read_to_string(path).map_err(|source| KvEvalError::ReadText {
            path: path.clone(),
            source,
        })?;
        let mut tokens = model.tokenizer.encode(&text, true, false)?;
        if tokens.len() < a.ctx {
            return Err(KvEvalError::ShortText {
                path: path.clone(),
                tokens: tokens.len(),
                window: a.ctx,
            });
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

/// The budget columns: kept percentages of the window when given, else the
/// budgets.
fn budgets(a: &PplConfig) -> Result<Vec<Budget>> {
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
                return Err(KvEvalError::NothingKept {
                    kept: k,
                    window: a.ctx,
                });
            }
            Ok(Budget {
                budget,
                kept: Some(k),
            })
        })
        .collect()
}

/// Everything one run of the tables works from, checked before the first
/// perplexity is computed.
struct Plan<'a> {
    model: &'a LoadedModel,
    cfg: &'a KvEvalConfig,
    texts: Vec<Text>,
    cols: Vec<Budget>,
    /// Per policy name, its policy at each column's budget.
    policies: Vec<Vec<KvPolicy>>,
    /// Per text, its full-cache perplexity and KV bytes.
    full: Vec<(f64, usize)>,
}

/// Runs the multi-text perplexity table: full cache once per text, then each
/// policy at each budget on each text. Prints one Markdown table per policy
/// (rows: budgets; columns: texts, then mean, standard deviation and range of
/// the ratio to full over texts) and a summary of means; returns the JSON
/// report. Records go to `cfg.out` as they are measured.
pub fn eval_texts(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    out: &mut dyn Printer,
) -> Result<serde_json::Value> {
    let texts = load_texts(model, &cfg.ppl)?;
    let cols = budgets(&cfg.ppl)?;
    let policies = cfg
        .policies
        .iter()
        .map(|name| {
            cols.iter()
                .map(|b| policy(name, b.budget))
                .collect::<Result<Vec<KvPolicy>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let mut records = Records::create(cfg.out.as_deref())?;
    let mut plan = Plan {
        model,
        cfg,
        texts,
        cols,
        policies,
        full: Vec::new(),
    };
    plan.full_table(out)?;
    let mut rows = Vec::new();
    let mut summary = Vec::new();
    for (name, specs) in cfg.policies.iter().zip(&plan.policies) {
        plan.policy_table(name, specs, out, &mut records, &mut rows, &mut summary)?;
    }
    plan.summary_table(&summary, out);
    let texts_json: Vec<serde_json::Value> = plan
        .texts
        .iter()
        .zip(&plan.full)
        .map(|(t, f)| json!({"text": t.name, "file": t.path.display().to_string(), "full": f.0}))
        .collect();
    let a = &cfg.ppl;
    Ok(
        json!({"ctx": a.ctx, "windows": a.windows, "kv_dtype": cfg.kv_dtype, "texts": texts_json,
        "rows": rows, "summary": summary}),
    )
}

impl Plan<'_> {
    /// The header shared by every table: the texts, then mean, std and range.
    fn header(&self) -> (String, String) {
        let names: Vec<&str> = self.texts.iter().map(|t| t.name.as_str()).collect();
        let header = format!("{} | mean | std | min-max |", names.join(" | "));
        (header, "---|".repeat(self.texts.len() + 3))
    }

    /// Scores every text with a full cache and prints their table.
    fn full_table(&mut self, out: &mut dyn Printer) -> Result<()> {
        let a = &self.cfg.ppl;
        for t in &self.texts {
            let r = perplexity_stored(
                self.model,
                &t.tokens,
                a.ctx,
                &KvPolicy::Full,
                self.cfg.kv_dtype,
                |_, _, _| {},
            )?;
            out.progress(&format!("ppl {} full: {:.4}", t.name, r.perplexity));
            self.full.push((r.perplexity, r.kv_bytes));
        }
        out.table(&format!(
            "\n### Perplexity over {} texts at context {} ({} window(s), {} scored tokens each)\n",
            self.texts.len(),
            a.ctx,
            a.windows,
            a.ctx - a.ctx / 2 - 1
        ));
        let (header, rule) = self.header();
        let full_ppl: Vec<f64> = self.full.iter().map(|f| f.0).collect();
        out.table(&format!("| full | {header}\n|---|{rule}"));
        let cells: Vec<String> = full_ppl.iter().map(|p| format!("{p:.3}")).collect();
        let (mean, std, min, max) = spread(&full_ppl);
        out.table(&format!(
            "| perplexity | {} | {mean:.3} | {std:.3} | {min:.3}-{max:.3} |",
            cells.join(" | ")
        ));
        Ok(())
    }

    /// One policy's table: a row per budget column, a cell per text; each
    /// measurement is recorded and appended to `rows`, each row's spread to
    /// `summary`.
    fn policy_table(
        &self,
        name: &str,
        specs: &[KvPolicy],
        out: &mut dyn Printer,
        records: &mut Records,
        rows: &mut Vec<serde_json::Value>,
        summary: &mut Vec<serde_json::Value>,
    ) -> Result<()> {
        let (header, rule) = self.header();
        out.table(&format!("\n{name}: ratio to full (perplexity)\n"));
        out.table(&format!("| {name} | {header}\n|---|{rule}"));
        for (b, p) in self.cols.iter().zip(specs) {
            let mut ratios = Vec::new();
            let mut cells = Vec::new();
            for (t, &full) in self.texts.iter().zip(&self.full) {
                let (record, ppl, ratio) = self.measure(name, *b, p, t, full, out)?;
                cells.push(format!("{ratio:.3}x ({ppl:.2})"));
                ratios.push(ratio);
                records.write(&record)?;
                rows.push(record);
            }
            let (mean, std, min, max) = spread(&ratios);
            out.table(&format!(
                "| {} | {} | {mean:.3}x | {std:.3} | {min:.3}-{max:.3} |",
                b.label(),
                cells.join(" | ")
            ));
            summary.push(json!({"name": name, "budget": b.budget, "kept": b.kept,
                "mean_ratio": mean, "std_ratio": std, "min_ratio": min, "max_ratio": max}));
        }
        Ok(())
    }

    /// Scores text `t` under `p` (policy `name` at column `b`); returns its
    /// record (against the text's `(full perplexity, full KV bytes)`), its
    /// perplexity and the ratio to full.
    fn measure(
        &self,
        name: &str,
        b: Budget,
        p: &KvPolicy,
        t: &Text,
        (full_ppl, full_bytes): (f64, usize),
        out: &mut dyn Printer,
    ) -> Result<(serde_json::Value, f64, f64)> {
        let a = &self.cfg.ppl;
        let r = perplexity_stored(
            self.model,
            &t.tokens,
            a.ctx,
            p,
            self.cfg.kv_dtype,
            |_, _, _| {},
        )?;
        let ratio = r.perplexity / full_ppl;
        out.progress(&format!(
            "ppl {} {p}: {:.4} ({ratio:.3}x, {:.0} s)",
            t.name, r.perplexity, r.seconds
        ));
        let record = json!({
            "text": t.name, "file": t.path.display().to_string(),
            "policy": p.to_string(), "name": name,
            "kept": b.kept, "ctx": a.ctx, "budget": b.budget, "windows": a.windows,
            "scored_tokens": r.scored_tokens, "ppl": r.perplexity, "full_ppl": full_ppl,
            "ratio": ratio, "kv_bytes": r.kv_bytes, "kv_bytes_full": full_bytes,
            "kv_dtype": self.cfg.kv_dtype, "model": self.cfg.model,
        });
        Ok((record, r.perplexity, ratio))
    }

    /// The closing table: each policy's mean ratio (and std) per column.
    fn summary_table(&self, summary: &[serde_json::Value], out: &mut dyn Printer) {
        out.table("\nMean ratio to full over the texts (population std):\n");
        let labels: Vec<String> = self.cols.iter().map(Budget::label).collect();
        out.table(&format!(
            "| policy | {} |\n|---|{}",
            labels.join(" | "),
            "---|".repeat(self.cols.len())
        ));
        for (name, s) in self
            .cfg
            .policies
            .iter()
            .zip(summary.chunks(self.cols.len()))
        {
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
            out.table(&format!("| {name} | {} |", cells.join(" | ")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ppl(kept: &[usize]) -> PplConfig {
        PplConfig {
            file: PathBuf::from("a.txt"),
            files: Vec::new(),
            ctx: 64,
            windows: 1,
            budgets: vec![16, 32],
            kept: kept.to_vec(),
        }
    }

    #[test]
    fn names_are_stems_unless_two_share_one() {
        let paths: Vec<PathBuf> = ["x/fox.txt", "y/fox.txt", "z/dog.md"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(names(&paths), ["x/fox.txt", "y/fox.txt", "dog"]);
    }

    #[test]
    fn kept_percentages_replace_budgets_and_must_keep_an_entry() {
        let cols = budgets(&ppl(&[])).unwrap();
        assert_eq!(
            cols.iter().map(Budget::label).collect::<Vec<_>>(),
            ["budget 16", "budget 32"]
        );
        let cols = budgets(&ppl(&[25, 50])).unwrap();
        assert_eq!(cols.iter().map(|b| b.budget).collect::<Vec<_>>(), [16, 32]);
        assert_eq!(cols[0].label(), "kept 25%");
        let e = budgets(&ppl(&[1])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "1% of a 64-token window leaves no cache entry"
        );
    }

    #[test]
    fn spread_is_mean_population_std_and_range() {
        let (mean, std, min, max) = spread(&[1.0, 3.0]);
        assert_eq!((mean, std, min, max), (2.0, 1.0, 1.0, 3.0));
    }
}
