//! The perplexity table: one text scored with a full cache, then under each
//! policy at each budget, as the ratio to full.

use serde_json::json;
use tern_runtime::kv::policy::KvPolicy;
use tern_runtime::LoadedModel;

use crate::config::KvEvalConfig;
use crate::error::{KvEvalError, Result};
use crate::perplexity::perplexity_stored;
use crate::policy::{policy, policy_names};
use crate::printer::Printer;

/// Runs the single-text table on `cfg.ppl.file`; returns its JSON report.
pub fn eval_ppl(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    out: &mut dyn Printer,
) -> Result<serde_json::Value> {
    let a = &cfg.ppl;
    let text = std::fs::read_to_string(&a.file).map_err(|source| KvEvalError::ReadText {
        path: a.file.clone(),
        source,
    })?;
    let mut tokens = model.tokenizer.encode(&text, true, false)?;
    tokens.truncate(a.ctx * a.windows);
    let run = |p: &KvPolicy| -> Result<(f64, usize)> {
        let r = perplexity_stored(model, &tokens, a.ctx, p, cfg.kv_dtype, |_, _, _| {})?;
        Ok((r.perplexity, r.kv_bytes))
    };
    let (full_ppl, full_bytes) = run(&KvPolicy::Full)?;
    out.progress(&format!("ppl full: {full_ppl:.4}"));
    let mut rows = Vec::new();
    out.table(&format!(
        "\n### Perplexity at context {} ({} window(s), {} scored tokens each)\n",
        a.ctx,
        a.windows,
        a.ctx - a.ctx / 2 - 1
    ));
    out.table(&format!(
        "full: **{full_ppl:.4}** (KV peak {:.1} MB)\n",
        full_bytes as f64 / 1e6
    ));
    let header: Vec<String> = a.budgets.iter().map(|b| format!("budget {b}")).collect();
    out.table(&format!("| policy | {} |", header.join(" | ")));
    out.table(&format!("|---|{}", "---|".repeat(a.budgets.len())));
    for name in &policy_names(&cfg.policies) {
        let mut cells = Vec::new();
        for &b in &a.budgets {
            let p = policy(name, b)?;
            let (ppl, bytes) = run(&p)?;
            out.progress(&format!("ppl {p}: {ppl:.4}"));
            cells.push(format!("{ppl:.3} ({:.3}x)", ppl / full_ppl));
            rows.push(
                json!({"policy": p.to_string(), "name": name, "budget": b, "perplexity": ppl,
                "ratio": ppl / full_ppl, "kv_bytes": bytes, "kv_bytes_full": full_bytes}),
            );
        }
        out.table(&format!("| {name} | {} |", cells.join(" | ")));
    }
    Ok(json!({"ctx": a.ctx, "windows": a.windows, "full": full_ppl, "rows": rows}))
}
