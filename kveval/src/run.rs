//! One `kv-eval` run: each evaluation asked for, in order, into one JSON
//! report keyed by evaluation.

use tern_runtime::LoadedModel;

use crate::config::KvEvalConfig;
use crate::error::{KvEvalError, Result};
use crate::memory::eval_memory;
use crate::passkey_table::eval_passkey;
use crate::ppl::eval_ppl;
use crate::printer::Printer;
use crate::ruler::sweep::eval_ruler;
use crate::texts::{eval_texts, wanted as texts_wanted};

/// Runs every evaluation of `cfg.tasks` on `model`, tables going to `out` as
/// they are measured; returns the report (`{task: report}`). An unknown task
/// fails when its turn comes.
pub fn run(
    model: &LoadedModel,
    cfg: &KvEvalConfig,
    out: &mut dyn Printer,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut report = serde_json::Map::new();
    for task in &cfg.tasks {
        let v = match task.as_str() {
            "ppl" if texts_wanted(cfg) => eval_texts(model, cfg, out)?,
            "ppl" => eval_ppl(model, cfg, out)?,
            "passkey" => eval_passkey(model, cfg, out)?,
            "memory" => eval_memory(model, cfg, out)?,
            "ruler" => eval_ruler(model, cfg, out)?,
            other => return Err(KvEvalError::UnknownTask(other.to_string())),
        };
        report.insert(task.clone(), v);
    }
    Ok(report)
}
