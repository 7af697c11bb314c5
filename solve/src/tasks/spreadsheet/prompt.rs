//! The prompt for a spreadsheet task, shown the way SpreadsheetBench shows
//! a workbook: the instruction, the answer position, then the first rows of
//! each sheet cell by cell with their addresses, within a budget of
//! characters so a large workbook does not overrun the model's context.

use super::workbook::{address, Workbook};
use super::SpreadsheetTask;

/// How much of the workbook a prompt shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PromptBudget {
    /// Most rows shown per sheet (counted from the sheet's first used row).
    pub rows: u32,
    /// Most characters of workbook text in all; rows past it are summarized.
    pub chars: usize,
}

impl Default for PromptBudget {
    /// 20 rows a sheet, 6000 characters (about 2000 tokens).
    fn default() -> Self {
        PromptBudget {
            rows: 20,
            chars: 6000,
        }
    }
}

/// The user turn for `task`.
pub fn prompt(task: &SpreadsheetTask, budget: PromptBudget) -> String {
    let shown = task
        .shown()
        .map(|b| workbook_text(b, budget))
        .unwrap_or_else(|| "(the workbook is given as a file)\n".into());
    format!(
        "You are given a spreadsheet file named input.xlsx.\n\nInstruction: {}\nAnswer \
         position: {}\n\nThe workbook, first rows of each sheet (empty cells left out):\n{shown}\n\
         Write a Python program that opens input.xlsx with openpyxl, makes the change, and saves \
         the workbook as output.xlsx. It will also be run on other workbooks with the same layout \
         and different values, so compute the answer from the cells instead of copying numbers. \
         Answer with the whole program in one ```python block.",
        task.instruction, task.answer_position
    )
}

/// The workbook's first rows, sheet by sheet, within `budget`.
fn workbook_text(book: &Workbook, budget: PromptBudget) -> String {
    let mut out = String::new();
    for sheet in &book.sheets {
        out.push_str(&format!("Sheet '{}':\n", sheet.name));
        if !sheet.merges.is_empty() {
            let merged: Vec<String> = sheet
                .merges
                .iter()
                .map(|&(r1, c1, r2, c2)| format!("{}:{}", address(r1, c1), address(r2, c2)))
                .collect();
            out.push_str(&format!("  merged cells: {}\n", merged.join(", ")));
        }
        let Some((first, _, last, _)) = sheet.extent() else {
            out.push_str("  (empty)\n");
            continue;
        };
        let mut rows_shown = 0;
        for r in first..=last {
            let cells: Vec<String> = sheet
                .cells
                .range((r, 0)..=(r, u32::MAX))
                .map(|(&(r, c), v)| format!("{}={}", address(r, c), v.shown()))
                .collect();
            if cells.is_empty() {
                continue;
            }
            let line = format!("  {}\n", cells.join(" | "));
            if rows_shown >= budget.rows || out.len() + line.len() > budget.chars {
                out.push_str(&format!("  ... (more rows, up to row {last})\n"));
                break;
            }
            out.push_str(&line);
            rows_shown += 1;
        }
    }
    out
}
