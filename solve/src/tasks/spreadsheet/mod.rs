//! Spreadsheet manipulation tasks, judged online-judge style (the
//! SpreadsheetBench setting): an instruction, an input workbook, and
//! several test-case workbooks that share its layout but not its values;
//! the candidate writes a Python (openpyxl) program that turns
//! `input.xlsx` into `output.xlsx`, and it is run on every test case
//! (`verify::spreadsheet`), so hard-coding the shown workbook's answer
//! fails the others.
//!
//! Tasks come from a seeded generator (`generator.rs`, the spec
//! `spreadsheet:count=N,seed=S`), since the real benchmark's files cannot be
//! fetched here, or from a JSONL file of tasks as [`SpreadsheetTask`]
//! serializes them (a test case's workbook given by `path` is read at
//! judging time). Nine operation kinds ([`Kind`]) over irregular layouts
//! (`layout.rs`): cell-level (`cells.rs`) and sheet-level (`reshape.rs`).
//! Workbooks are written by `xlsx.rs` on demand, never stored.

mod cells;
mod generator;
mod layout;
mod prompt;
mod reshape;
mod workbook;
mod xlsx;

pub use generator::SpreadsheetSpec;
pub use prompt::{prompt, prompt_for, PromptBudget, PromptParts};
pub use workbook::{address, iso_date, parse_address, Sheet, Value, Workbook};
pub use xlsx::to_xlsx;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TaskError;

/// Test-case workbooks per generated task; the first is the one the prompt
/// shows.
pub const CASES: usize = 4;

/// What a task asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A value looked up on another sheet by a key (VLOOKUP), times a quantity.
    Lookup,
    /// Totals over the rows that meet two conditions (SUMIFS).
    ConditionalSum,
    /// A date plus days, or the days between two dates.
    Dates,
    /// Names with stray spaces and mixed case, cleaned.
    TextCleanup,
    /// Rows copied to a new sheet without repeated IDs.
    Deduplicate,
    /// A region-by-quarter summary on a new sheet.
    Pivot,
    /// Blank cells under a group's label filled down.
    FillGaps,
    /// Formulas written as formulas (evaluated by the judge).
    Formulas,
    /// Rows over a threshold, sorted, on a new sheet.
    FilterSort,
}

impl Kind {
    /// Every kind, in the generator's order.
    pub const ALL: [Kind; 9] = [
        Kind::Lookup,
        Kind::ConditionalSum,
        Kind::Dates,
        Kind::TextCleanup,
        Kind::Deduplicate,
        Kind::Pivot,
        Kind::FillGaps,
        Kind::Formulas,
        Kind::FilterSort,
    ];

    /// The kind's name in specs and records (`conditional_sum`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Lookup => "lookup",
            Kind::ConditionalSum => "conditional_sum",
            Kind::Dates => "dates",
            Kind::TextCleanup => "text_cleanup",
            Kind::Deduplicate => "deduplicate",
            Kind::Pivot => "pivot",
            Kind::FillGaps => "fill_gaps",
            Kind::Formulas => "formulas",
            Kind::FilterSort => "filter_sort",
        }
    }

    /// Whether the answer is a whole table on a sheet (SpreadsheetBench's
    /// Sheet-Level Manipulation) rather than named cells (Cell-Level); the
    /// prompt says which, as the benchmark's does, since it changes what the
    /// answer position means.
    pub fn sheet_level(self) -> bool {
        matches!(self, Kind::Deduplicate | Kind::Pivot | Kind::FilterSort)
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One cell of the answer range and what it must hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Expected {
    /// The sheet's name.
    pub sheet: String,
    /// 1-based row.
    pub row: u32,
    /// 1-based column.
    pub col: u32,
    /// The value; `None` means the cell must be empty.
    pub value: Option<Value>,
    /// The cell must hold a formula whose value (as the judge evaluates it
    /// on the output workbook) is `value`.
    #[serde(default)]
    pub as_formula: bool,
}

/// Where a test case's input workbook comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Cells the generator drew, written as `.xlsx` when judged.
    Cells(Workbook),
    /// An `.xlsx` file, read when judged (a missing one fails its case).
    Path(PathBuf),
    /// `.xlsx` bytes a client sent (the endpoint's workbooks); never
    /// written to a task file.
    #[serde(skip)]
    Bytes(Vec<u8>),
}

impl Source {
    /// The `.xlsx` bytes of this input.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Source::Cells(book) => to_xlsx(book).map_err(|e| format!("writing the workbook: {e}")),
            Source::Bytes(b) => Ok(b.clone()),
            Source::Path(p) => std::fs::read(p).map_err(|e| {
                format!(
                    "the test case's workbook {} cannot be read: {e}",
                    p.display()
                )
            }),
        }
    }
}

/// One test case: an input workbook and the answer range's expected cells.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// The workbook the program gets as `input.xlsx`.
    pub input: Source,
    /// The answer range, cell by cell.
    pub expected: Vec<Expected>,
}

/// One spreadsheet task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpreadsheetTask {
    /// The operation kind (for per-kind scores).
    pub kind: Kind,
    /// What the user asks, naming the cells involved.
    pub instruction: String,
    /// The answer range, as SpreadsheetBench states it (`'Orders'!F6:F15`).
    pub answer_position: String,
    /// A program that solves every test case (checked through the judge).
    pub reference: String,
    /// The test cases; the first is the workbook the prompt shows.
    pub cases: Vec<Case>,
}

impl SpreadsheetTask {
    /// The workbook the prompt shows (the first case's, when it is cells).
    pub fn shown(&self) -> Option<&Workbook> {
        match &self.cases.first()?.input {
            Source::Cells(book) => Some(book),
            Source::Path(_) | Source::Bytes(_) => None,
        }
    }
}

/// Spreadsheet tasks from `source`: the generator spec
/// `spreadsheet[:k=v,...]` ([`SpreadsheetSpec`]) or a JSONL file with one
/// [`SpreadsheetTask`] per line.
pub fn load(source: &str) -> Result<Vec<SpreadsheetTask>, TaskError> {
    let tasks = if let Some(rest) = spec_rest(source) {
        SpreadsheetSpec::parse(rest)
            .and_then(|s| s.generate())
            .map_err(|reason| TaskError::Spec {
                spec: source.to_string(),
                reason,
            })?
    } else {
        read_file(Path::new(source))?
    };
    if tasks.is_empty() {
        return Err(TaskError::Empty(source.to_string()));
    }
    Ok(tasks)
}

/// Whether `source` names the spreadsheet family (the generator, or a
/// `.spreadsheet.jsonl` file).
pub fn is_spreadsheet(source: &str) -> bool {
    spec_rest(source).is_some() || source.ends_with(".spreadsheet.jsonl")
}

fn spec_rest(source: &str) -> Option<&str> {
    super::builtin_rest(source, "spreadsheet")
}

fn read_file(path: &Path) -> Result<Vec<SpreadsheetTask>, TaskError> {
    let text = std::fs::read_to_string(path).map_err(|source| TaskError::Io {
        path: path.display().to_string(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| TaskError::Line {
                path: path.display().to_string(),
                line: i + 1,
                reason: format!("not a spreadsheet task: {e}"),
            })
        })
        .collect()
}

/// What an operation draws for one task: the text, the reference program,
/// and each test case's workbook with its expected answer cells.
struct Draft {
    kind: Kind,
    instruction: String,
    answer_position: String,
    reference: String,
    cases: Vec<(Workbook, Vec<Expected>)>,
}
