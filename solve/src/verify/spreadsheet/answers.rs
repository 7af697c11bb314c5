//! What a program wrote into a task's answer range, in a form two
//! programs' outputs can be compared by, without the expected values: the
//! ground best-of-N by agreement stands on ([`super::select`]). Only the
//! answer range's positions are used, and those are what the task states
//! (its answer position), never the hidden expected cells.
//!
//! Each cell becomes one short text: `f:` and the formula's value as the
//! judge's evaluator computes it (or `f=` and the formula's text where the
//! evaluator cannot), `n:` a number, `d:` a date (its day number), `t:`
//! text, `b:` a boolean, `e:` an error, and the empty text for an empty
//! cell. Numbers are written to 9 significant digits, so values that differ
//! only in float noise agree. A range with no cell filled is no answer, and
//! the judge also drops a range the output holds just as the input did
//! (`judge_case`): a program that saved its input unchanged did nothing the
//! others can agree with, even where the range starts partly filled (a
//! group label written once, to be filled down).

use calamine::Data;

use super::compare::{OutputBook, SheetView};
use super::formula::{self, Cells};
use crate::tasks::spreadsheet::Expected;

/// A program's answer range on one test case, one text per cell in the
/// answer range's order.
pub type AnswerRange = Vec<String>;

/// The answer range `cells` (their sheets and positions only) as `output`
/// holds it; `None` when the output is not a workbook, lacks a sheet of the
/// range, or leaves every cell of it empty.
pub fn answer_range(output: &[u8], cells: &[Expected]) -> Option<AnswerRange> {
    let mut book = OutputBook::open(output).ok()?;
    let mut range = Vec::with_capacity(cells.len());
    for c in cells {
        let view = book.sheet(&c.sheet)?;
        range.push(cell_text(view, c.row, c.col));
    }
    range.iter().any(|t| !t.is_empty()).then_some(range)
}

fn number(x: f64) -> String {
    format!("{x:.8e}")
}

fn cell_text(view: &SheetView, row: u32, col: u32) -> String {
    if let Some(f) = view.formula(row, col) {
        return match formula::evaluate(&f, view) {
            Ok(v) => format!("f:{}", number(v)),
            Err(_) => format!("f={}", f.trim()),
        };
    }
    match view.value(row, col) {
        Data::Empty => String::new(),
        Data::String(s) if s.is_empty() => String::new(),
        Data::String(s) => format!("t:{s}"),
        Data::Float(f) => format!("n:{}", number(*f)),
        Data::Int(i) => format!("n:{}", number(*i as f64)),
        Data::Bool(b) => format!("b:{b}"),
        Data::DateTime(d) => format!("d:{}", number(d.as_f64())),
        Data::DateTimeIso(s) => format!("d:{s}"),
        Data::DurationIso(s) => format!("t:{s}"),
        Data::Error(e) => format!("e:{e}"),
    }
}
