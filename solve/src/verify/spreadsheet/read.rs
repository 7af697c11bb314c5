//! A client's own `.xlsx` at the endpoint: read into a [`Workbook`] so the
//! prompt shows it as it shows a generated one, and its answer position
//! turned into the cells best-of-N by agreement compares. Positions only:
//! a client's workbook comes with no expected values, so nothing here (or
//! downstream) can judge an answer right or wrong, only whether programs
//! agree on it.

use std::io::Cursor;

use calamine::{Data, Reader, Xlsx};

use crate::tasks::spreadsheet::{parse_address, Expected, Sheet, Value, Workbook};

/// Most cells an answer position may name.
pub const MAX_ANSWER_CELLS: usize = 10_000;

/// The workbook in `bytes`: every worksheet's values (numbers, text, dates
/// as whole serial days, booleans and errors as their text), formulas as
/// formulas, and merged ranges where they read; or why it cannot be read.
pub fn read_workbook(bytes: &[u8]) -> Result<Workbook, String> {
    let mut book: Xlsx<_> = Xlsx::new(Cursor::new(bytes.to_vec()))
        .map_err(|e| format!("not a readable .xlsx workbook: {e}"))?;
    let merges = book.load_merged_regions().is_ok();
    let mut sheets = Vec::new();
    for name in book.sheet_names() {
        let mut sheet = Sheet::new(&name);
        let values = book
            .worksheet_range(&name)
            .map_err(|e| format!("sheet '{name}' cannot be read: {e}"))?;
        let (r0, c0) = values.start().unwrap_or((0, 0));
        for (r, c, v) in values.used_cells() {
            if let Some(value) = value_of(v) {
                sheet.set(r0 + r as u32 + 1, c0 + c as u32 + 1, value);
            }
        }
        if let Ok(formulas) = book.worksheet_formula(&name) {
            let (r0, c0) = formulas.start().unwrap_or((0, 0));
            for (r, c, f) in formulas.used_cells() {
                let f = f.trim().trim_start_matches('=');
                if !f.is_empty() {
                    let at = (r0 + r as u32 + 1, c0 + c as u32 + 1);
                    sheet.set(at.0, at.1, Value::Formula(f.to_string()));
                }
            }
        }
        if merges {
            for (_, _, d) in book.merged_regions_by_sheet(&name) {
                let (a, b) = (d.start, d.end);
                sheet.merges.push((a.0 + 1, a.1 + 1, b.0 + 1, b.1 + 1));
            }
        }
        sheets.push(sheet);
    }
    if sheets.is_empty() {
        return Err("the workbook has no worksheet".into());
    }
    Ok(Workbook { sheets })
}

fn value_of(d: &Data) -> Option<Value> {
    Some(match d {
        Data::Empty => return None,
        Data::String(s) if s.is_empty() => return None,
        Data::String(s) | Data::DateTimeIso(s) | Data::DurationIso(s) => Value::Text(s.clone()),
        Data::Float(f) => Value::Number(*f),
        Data::Int(i) => Value::Number(*i as f64),
        Data::Bool(b) => Value::Text(if *b { "TRUE" } else { "FALSE" }.into()),
        Data::DateTime(d) => Value::Date(d.as_f64().floor() as i64),
        Data::Error(e) => Value::Text(e.to_string()),
    })
}

/// The cells of `position` (`'Sheet name'!B2:D9`, `Sheet1!B2`, or `B2:D9`
/// on the first sheet; `$` signs allowed), row by row, on a sheet `book`
/// has; or what is wrong with it.
pub fn answer_cells(position: &str, book: &Workbook) -> Result<Vec<Expected>, String> {
    let position = position.trim();
    let (sheet, range) = match position.rsplit_once('!') {
        Some((sheet, range)) => {
            let sheet = sheet.trim();
            let sheet = match sheet.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
                Some(quoted) => quoted.replace("''", "'"),
                None => sheet.to_string(),
            };
            (sheet, range)
        }
        None => (
            book.sheets
                .first()
                .map(|s| s.name.clone())
                .unwrap_or_default(),
            position,
        ),
    };
    if !book.sheets.iter().any(|s| s.name == sheet) {
        let names: Vec<String> = book
            .sheets
            .iter()
            .map(|s| format!("'{}'", s.name))
            .collect();
        return Err(format!(
            "the workbook has no sheet '{sheet}' (it has {})",
            names.join(", ")
        ));
    }
    let cell = |a: &str| {
        parse_address(&a.trim().replace('$', ""))
            .ok_or_else(|| format!("`{a}` is not a cell address like B2"))
    };
    let (first, last) = match range.split_once(':') {
        Some((a, b)) => (cell(a)?, cell(b)?),
        None => (cell(range)?, cell(range)?),
    };
    let (r1, r2) = (first.0.min(last.0), first.0.max(last.0));
    let (c1, c2) = (first.1.min(last.1), first.1.max(last.1));
    let count = (r2 - r1 + 1) as usize * (c2 - c1 + 1) as usize;
    if count > MAX_ANSWER_CELLS {
        return Err(format!(
            "the answer position names {count} cells; at most {MAX_ANSWER_CELLS}"
        ));
    }
    Ok((r1..=r2)
        .flat_map(|row| {
            let sheet = sheet.clone();
            (c1..=c2).map(move |col| Expected {
                sheet: sheet.clone(),
                row,
                col,
                value: None,
                as_formula: false,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::spreadsheet::{load, to_xlsx};

    #[test]
    fn a_written_workbook_reads_back_as_it_was_and_positions_name_its_cells() {
        let task = &load("spreadsheet:count=1,seed=3,kinds=lookup").unwrap()[0];
        let book = task.shown().unwrap();
        let read = read_workbook(&to_xlsx(book).unwrap()).unwrap();
        assert_eq!(read.sheets.len(), book.sheets.len());
        for (a, b) in read.sheets.iter().zip(&book.sheets) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.cells, b.cells, "sheet {}", a.name);
            assert_eq!(a.merges, b.merges, "sheet {}", a.name);
        }
        // The task's own position names its expected cells, in order.
        let cells = answer_cells(&task.answer_position, &read).unwrap();
        let want: Vec<_> = task.cases[0]
            .expected
            .iter()
            .map(|e| (e.sheet.clone(), e.row, e.col))
            .collect();
        let got: Vec<_> = cells
            .iter()
            .map(|e| (e.sheet.clone(), e.row, e.col))
            .collect();
        assert_eq!(got, want);
        let first = &read.sheets[0].name;
        assert_eq!(answer_cells("$B$2", &read).unwrap()[0].sheet, *first);
        assert_eq!(answer_cells("C3:B2", &read).unwrap().len(), 4);
        for (bad, says) in [
            ("'Nope'!A1", "no sheet 'Nope'"),
            ("A0", "not a cell address"),
            ("A1:ZZ9999", "at most 10000"),
        ] {
            let e = answer_cells(bad, &read).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(read_workbook(b"not a zip")
            .unwrap_err()
            .contains("not a readable"));
    }
}
