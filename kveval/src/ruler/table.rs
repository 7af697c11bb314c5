//! The suite's tables for one length, in kvpress's leaderboard shape
//! (policies by fraction removed, cells the average score over tasks), then
//! per task.

use std::collections::HashMap;

use super::RulerTask;
use crate::config::KvEvalConfig;
use crate::printer::Printer;

/// One setting of the table: a policy at a removed percentage (0 for full).
pub(super) struct Setting {
    /// The policy's name as given.
    pub name: String,
    /// Percent of the compressed entries removed.
    pub removed: u32,
}

/// Scores per (setting, task) for one length, in sample order.
pub(super) type Cells = HashMap<(usize, RulerTask), Vec<f64>>;

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        f64::NAN
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Average over tasks of each task's mean score, for one setting.
fn task_average(cells: &Cells, setting: usize, tasks: &[RulerTask]) -> f64 {
    let means: Vec<f64> = tasks
        .iter()
        .filter_map(|t| cells.get(&(setting, *t)).map(|v| mean(v)))
        .collect();
    mean(&means)
}

/// Writes both tables for `length`.
pub(super) fn print_tables(
    length: usize,
    cfg: &KvEvalConfig,
    settings: &[Setting],
    cells: &Cells,
    out: &mut dyn Printer,
) {
    let a = &cfg.ruler;
    out.table(&format!(
        "\n### RULER at {length} tokens, query-{} ({} sample(s) per task; score 0-100, average over {})\n",
        a.query.name(),
        a.samples,
        a.tasks
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let header: Vec<String> = a.removed.iter().map(|r| format!("{r}%")).collect();
    out.table(&format!("| policy | 0% | {} |", header.join(" | ")));
    out.table(&format!("|---|---|{}", "---|".repeat(a.removed.len())));
    out.table(&format!(
        "| full | {:.1} |{}",
        task_average(cells, 0, &a.tasks),
        " - |".repeat(a.removed.len())
    ));
    for name in cfg.policies.iter().filter(|n| *n != "full") {
        let row: Vec<String> = a
            .removed
            .iter()
            .map(|r| {
                let i = settings
                    .iter()
                    .position(|s| &s.name == name && s.removed == *r)
                    .unwrap_or(usize::MAX);
                format!("{:.1}", task_average(cells, i, &a.tasks))
            })
            .collect();
        out.table(&format!("| {name} | - | {} |", row.join(" | ")));
    }
    out.table("\nPer task:\n");
    let names: Vec<&str> = a.tasks.iter().map(|t| t.name()).collect();
    out.table(&format!("| policy | removed | {} |", names.join(" | ")));
    out.table(&format!("|---|---|{}", "---|".repeat(names.len())));
    for (i, s) in settings.iter().enumerate() {
        let row: Vec<String> = a
            .tasks
            .iter()
            .map(|t| format!("{:.1}", mean(cells.get(&(i, *t)).map_or(&[][..], |v| v))))
            .collect();
        out.table(&format!(
            "| {} | {}% | {} |",
            s.name,
            s.removed,
            row.join(" | ")
        ));
    }
}
