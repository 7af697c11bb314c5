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

/// The user turn for `task`. It carries what SpreadsheetBench's prompt
/// carries (instruction, instruction type, answer position and what it
/// means for that type, where the input is and where the output goes, the
/// first rows) and the facts of the judge's sandbox a program cannot guess:
/// the file names are relative to the working directory, every sheet shown
/// is inside input.xlsx, and openpyxl is the library to use (named alone:
/// a sentence saying pandas is absent made the 0.5B import pandas in 14 of
/// 16 programs).
pub fn prompt(task: &SpreadsheetTask, budget: PromptBudget) -> String {
    prompt_for(
        &PromptParts {
            instruction: &task.instruction,
            answer_position: &task.answer_position,
            sheet_level: task.kind.sheet_level(),
            shown: task.shown(),
        },
        budget,
    )
}

/// What a prompt states, wherever the task came from: the generator's
/// tasks ([`prompt`]) and a client's own workbook at the endpoint.
#[derive(Clone, Copy, Debug)]
pub struct PromptParts<'a> {
    /// What the user asks.
    pub instruction: &'a str,
    /// The answer range, as SpreadsheetBench states it.
    pub answer_position: &'a str,
    /// Whether the answer is a whole table (else the cells named).
    pub sheet_level: bool,
    /// The workbook shown, if it can be.
    pub shown: Option<&'a Workbook>,
}

/// The prompt for `parts`, showing the workbook within `budget`.
pub fn prompt_for(parts: &PromptParts<'_>, budget: PromptBudget) -> String {
    let shown = parts
        .shown
        .map(|b| workbook_text(b, budget))
        .unwrap_or_else(|| "(the workbook is given as a file)\n".into());
    let (kind, position) = if parts.sheet_level {
        (
            "Sheet-Level Manipulation (the answer is a whole table)",
            "the largest range the table may cover; its cells past the table stay \
             empty",
        )
    } else {
        (
            "Cell-Level Manipulation (the answer is the cells named)",
            "the cells to fill",
        )
    };
    format!(
        "You are a spreadsheet expert who changes spreadsheets with Python code.\n\n\
         Instruction: {}\nInstruction type: {kind}\nAnswer position: {} ({position}; change \
         nothing outside it)\nInput: input.xlsx in the working directory; every sheet below \
         is a worksheet of that one file (wb['Name']), there is no other file.\nOutput: save \
         the changed workbook as output.xlsx in the working directory.\n\n\
         The workbook, first rows of each sheet (empty cells left out):\n{shown}\n\
         Write a Python program that opens input.xlsx with openpyxl, makes the change, and \
         saves the workbook as output.xlsx. It will also be run on other workbooks with the \
         same layout and different values, so compute the answer from the cells instead of \
         copying numbers. Answer with the whole program in \
         one ```python block.",
        parts.instruction, parts.answer_position
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

#[cfg(test)]
mod tests {
    use super::super::load;
    use super::*;

    #[test]
    fn the_prompt_says_the_instruction_type_and_that_every_sheet_is_in_the_input() {
        for kinds in ["lookup", "pivot"] {
            let task = &load(&format!("spreadsheet:count=1,seed=3,kinds={kinds}")).unwrap()[0];
            let p = prompt(task, PromptBudget::default());
            let level = if kinds == "pivot" {
                "Sheet-Level"
            } else {
                "Cell-Level"
            };
            assert!(
                p.contains(&format!("Instruction type: {level} Manipulation")),
                "{p}"
            );
            assert!(p.contains(&task.answer_position) && p.contains(&task.instruction));
            for sheet in &task.shown().unwrap().sheets {
                assert!(p.contains(&format!("Sheet '{}':", sheet.name)), "{p}");
            }
            assert!(p.contains("every sheet below is a worksheet of that one file"));
        }
    }
}
