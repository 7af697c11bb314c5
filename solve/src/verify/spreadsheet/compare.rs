//! The output workbook against the expected cells, cell by cell.
//!
//! The output is read with calamine (a pure-Rust reader of `.xlsx`; the
//! comparison runs outside the sandbox, so it must not be Python the
//! candidate's process could influence, and calamine reads cell values and
//! formulas separately, which formula answers need). Rules:
//! - numbers match within [`TOLERANCE`] relative (at least absolute 1e-6);
//! - text matches exactly (a stray space is a wrong answer: text cleanup is
//!   a task kind);
//! - dates match by day: the cell must be a date (a number formatted as
//!   one), at midnight of the expected day;
//! - an expected empty cell must hold nothing (no value, no formula);
//! - where the task asks for a formula, the cell must hold one, and its
//!   value as [`super::formula`] evaluates it on the output's own cells must
//!   match the expected number; a value where a formula was asked fails.

use std::collections::HashMap;
use std::io::Cursor;

use calamine::{Data, Range, Reader, Xlsx};

use super::formula::{self, Cells};
use crate::tasks::spreadsheet::{address, iso_date, Expected, Value};

/// Relative tolerance on numbers (absolute below 1).
pub const TOLERANCE: f64 = 1e-6;
/// Mismatches a verdict names before it counts the rest.
const NAMED: usize = 3;

/// One sheet of the output: its values and formulas.
pub(super) struct SheetView {
    values: Range<Data>,
    formulas: Range<String>,
}

/// The output's sheets, each read once when first asked for.
pub(super) struct OutputBook {
    book: Xlsx<Cursor<Vec<u8>>>,
    names: Vec<String>,
    sheets: HashMap<String, Option<SheetView>>,
}

impl OutputBook {
    /// Opens `output`, or says why it is not a workbook.
    pub(super) fn open(output: &[u8]) -> Result<OutputBook, String> {
        let book: Xlsx<_> = Xlsx::new(Cursor::new(output.to_vec()))
            .map_err(|e| format!("output.xlsx is not a readable workbook: {e}"))?;
        let names = book.sheet_names();
        Ok(OutputBook {
            book,
            names,
            sheets: HashMap::new(),
        })
    }

    /// The sheet named `name`, if the output has it and it reads.
    pub(super) fn sheet(&mut self, name: &str) -> Option<&SheetView> {
        let OutputBook {
            book,
            names,
            sheets,
        } = self;
        sheets
            .entry(name.to_string())
            .or_insert_with(|| {
                if !names.iter().any(|n| n == name) {
                    return None;
                }
                let values = book.worksheet_range(name).ok()?;
                let formulas = book.worksheet_formula(name).ok()?;
                Some(SheetView { values, formulas })
            })
            .as_ref()
    }
}

impl SheetView {
    /// The cell's value (empty outside the used range).
    pub(super) fn value(&self, row: u32, col: u32) -> &Data {
        self.values
            .get_value((row - 1, col - 1))
            .unwrap_or(&Data::Empty)
    }
}

impl Cells for SheetView {
    fn formula(&self, row: u32, col: u32) -> Option<String> {
        self.formulas
            .get_value((row.checked_sub(1)?, col.checked_sub(1)?))
            .filter(|f| !f.trim().is_empty())
            .cloned()
    }

    fn number(&self, row: u32, col: u32) -> Result<Option<f64>, String> {
        if row == 0 || col == 0 {
            return Err("a cell outside the sheet".into());
        }
        match self.value(row, col) {
            Data::Empty => Ok(None),
            Data::Float(f) => Ok(Some(*f)),
            Data::Int(i) => Ok(Some(*i as f64)),
            Data::DateTime(d) => Ok(Some(d.as_f64())),
            Data::String(s) if s.is_empty() => Ok(None),
            other => Err(format!("{} holds {other}, not a number", address(row, col))),
        }
    }
}

/// `Ok` when `output` holds every expected cell; otherwise what differs
/// (the first few cells, then how many in all).
pub fn compare(output: &[u8], expected: &[Expected]) -> Result<(), String> {
    let mut book = OutputBook::open(output)?;
    let mut wrong = Vec::new();
    for e in expected {
        let at = format!("'{}'!{}", e.sheet, address(e.row, e.col));
        let Some(view) = book.sheet(&e.sheet) else {
            return Err(format!("output.xlsx has no readable sheet '{}'", e.sheet));
        };
        if let Err(why) = cell_matches(view, e) {
            wrong.push(format!("{at}: {why}"));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    let more = wrong.len().saturating_sub(NAMED);
    let mut text = wrong[..wrong.len().min(NAMED)].join("; ");
    if more > 0 {
        text.push_str(&format!("; and {more} more of {} cells", expected.len()));
    }
    Err(text)
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= TOLERANCE * want.abs().max(1.0)
}

fn shown(d: &Data) -> String {
    match d {
        Data::Empty => "an empty cell".into(),
        Data::String(s) => format!("{s:?}"),
        Data::DateTime(dt) => format!("the date-time {}", dt.as_f64()),
        other => other.to_string(),
    }
}

fn cell_matches(view: &SheetView, e: &Expected) -> Result<(), String> {
    let got = view.value(e.row, e.col);
    let formula = view.formula(e.row, e.col);
    let want = match &e.value {
        None => {
            let empty =
                matches!(got, Data::Empty) || matches!(got, Data::String(s) if s.is_empty());
            return match (empty, formula) {
                (true, None) => Ok(()),
                (_, Some(f)) => Err(format!("expected an empty cell, got the formula ={f}")),
                _ => Err(format!("expected an empty cell, got {}", shown(got))),
            };
        }
        Some(v) => v,
    };
    if e.as_formula {
        let Value::Number(n) = want else {
            return Err("the task's expected formula value is not a number".into());
        };
        let Some(f) = formula else {
            return Err(format!(
                "expected a formula (worth {n}), got {}",
                shown(got)
            ));
        };
        let v = formula::evaluate(&f, view)?;
        return if close(v, *n) {
            Ok(())
        } else {
            Err(format!("the formula ={f} gives {v}, expected {n}"))
        };
    }
    let ok = match (want, got) {
        (Value::Number(n), Data::Float(f)) => close(*f, *n),
        (Value::Number(n), Data::Int(i)) => close(*i as f64, *n),
        (Value::Text(t), Data::String(s)) => s == t,
        (Value::Date(d), Data::DateTime(dt)) => close(dt.as_f64(), *d as f64),
        (Value::Date(d), Data::DateTimeIso(s)) => s.starts_with(&iso_date(*d)),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let expected = match want {
        Value::Date(d) => format!("the date {}", iso_date(*d)),
        other => other.shown(),
    };
    let got = match formula {
        Some(f) => format!("the formula ={f} (values were asked)"),
        None => shown(got),
    };
    Err(format!("expected {expected}, got {got}"))
}
