//! A workbook as the generator builds it: named sheets of cells addressed
//! by row and column, with merged ranges.
//!
//! Owns cell values (numbers, text, dates as Excel serial days, formulas),
//! A1 addresses and dates' calendar form. Writing the `.xlsx` file is
//! `xlsx.rs`; reading a candidate's output back is the judge's
//! (`verify::spreadsheet`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One cell's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Value {
    /// A number.
    Number(f64),
    /// A string.
    Text(String),
    /// A date as Excel's serial day (1 = 1900-01-01, 1900 date system),
    /// shown with a date format so openpyxl reads a `datetime`.
    Date(i64),
    /// A formula, without its leading `=` (`SUM(B2:B9)`).
    Formula(String),
}

impl Value {
    /// The cell as a prompt shows it: text quoted, dates as ISO days,
    /// formulas with their `=`.
    pub fn shown(&self) -> String {
        match self {
            Value::Number(n) => number_text(*n),
            Value::Text(s) => format!("{s:?}"),
            Value::Date(d) => iso_date(*d),
            Value::Formula(f) => format!("={f}"),
        }
    }
}

/// A number as the workbook stores it: whole numbers without a fraction.
pub fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// One sheet: cells by `(row, column)`, both from 1, and merged ranges.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sheet {
    /// The sheet's tab name.
    pub name: String,
    /// Non-empty cells by `(row, column)`, 1-based (in JSON a list of
    /// `[row, column, value]`: JSON object keys are strings).
    #[serde(with = "cell_list")]
    pub cells: BTreeMap<(u32, u32), Value>,
    /// Merged ranges as `(first row, first column, last row, last column)`.
    pub merges: Vec<(u32, u32, u32, u32)>,
}

impl Sheet {
    /// An empty sheet named `name`.
    pub fn new(name: &str) -> Self {
        Sheet {
            name: name.to_string(),
            ..Sheet::default()
        }
    }

    /// Puts `value` at `(row, col)`.
    pub fn set(&mut self, row: u32, col: u32, value: Value) {
        self.cells.insert((row, col), value);
    }

    /// Puts text at `(row, col)`.
    pub fn text(&mut self, row: u32, col: u32, s: &str) {
        self.set(row, col, Value::Text(s.to_string()));
    }

    /// The occupied rectangle `(first row, first col, last row, last col)`,
    /// `None` for an empty sheet.
    pub fn extent(&self) -> Option<(u32, u32, u32, u32)> {
        let rows = self.cells.keys().map(|k| k.0);
        let cols = self.cells.keys().map(|k| k.1);
        Some((
            rows.clone().min()?,
            cols.clone().min()?,
            rows.max()?,
            cols.max()?,
        ))
    }
}

/// Cells as a JSON list of `[row, column, value]`.
mod cell_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::Value;

    pub fn serialize<S: Serializer>(
        cells: &BTreeMap<(u32, u32), Value>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(cells.iter().map(|(&(r, c), v)| (r, c, v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<(u32, u32), Value>, D::Error> {
        let list: Vec<(u32, u32, Value)> = Vec::deserialize(d)?;
        Ok(list.into_iter().map(|(r, c, v)| ((r, c), v)).collect())
    }
}

/// A whole workbook, sheets in tab order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Workbook {
    /// The sheets, first is the active one.
    pub sheets: Vec<Sheet>,
}

impl Workbook {
    /// The sheet named `name`.
    pub fn sheet_mut(&mut self, name: &str) -> Option<&mut Sheet> {
        self.sheets.iter_mut().find(|s| s.name == name)
    }
}

/// Column letters of 1-based `col` (1 -> A, 27 -> AA).
pub fn column_letters(col: u32) -> String {
    let mut n = col;
    let mut out = Vec::new();
    while n > 0 {
        let r = (n - 1) % 26;
        out.push(b'A' + r as u8);
        n = (n - 1) / 26;
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII letters")
}

/// The A1 address of `(row, col)`.
pub fn address(row: u32, col: u32) -> String {
    format!("{}{row}", column_letters(col))
}

/// `(row, col)` of an A1 address (`$` allowed), `None` if it is not one.
pub fn parse_address(a1: &str) -> Option<(u32, u32)> {
    let s: String = a1.chars().filter(|&c| c != '$').collect();
    let split = s.find(|c: char| c.is_ascii_digit())?;
    let (letters, digits) = s.split_at(split);
    if letters.is_empty() || letters.len() > 3 || !letters.chars().all(|c| c.is_ascii_alphabetic())
    {
        return None;
    }
    let col = letters.chars().fold(0u32, |n, c| {
        n * 26 + (c.to_ascii_uppercase() as u32 - 'A' as u32 + 1)
    });
    let row: u32 = digits.parse().ok()?;
    (row > 0).then_some((row, col))
}

/// Excel's serial day of 1970-01-01.
const UNIX_EPOCH_SERIAL: i64 = 25569;

/// `(year, month, day)` of an Excel serial day (after 1900-02-28).
pub fn civil(serial: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days-to-civil, from days since 1970-01-01.
    let z = serial - UNIX_EPOCH_SERIAL + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `YYYY-MM-DD` of an Excel serial day.
pub fn iso_date(serial: i64) -> String {
    let (y, m, d) = civil(serial);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_dates_read_as_a_spreadsheet_shows_them() {
        assert_eq!(column_letters(1), "A");
        assert_eq!(column_letters(26), "Z");
        assert_eq!(column_letters(28), "AB");
        assert_eq!(address(5, 3), "C5");
        assert_eq!(parse_address("$AB$12"), Some((12, 28)));
        assert_eq!(parse_address("12"), None);
        assert_eq!(iso_date(45292), "2024-01-01");
        assert_eq!(iso_date(44986), "2023-03-01");
    }
}
