//! Where a task's table sits on its sheet, drawn once per task so every
//! test-case workbook shares it: not at A1, a title above (merged across
//! the table), sometimes a second header row of merged group labels, a
//! note of free text below. SpreadsheetBench's workbooks are laid out like
//! this by people; a program that assumes a table at A1 with one header row
//! fails here.
//!
//! Owns the positions and the decorations; the data values are the
//! operations' (`operations.rs`), written per test case.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::workbook::{address, column_letters, Sheet};

/// Words for titles, group labels and notes.
const TITLES: [&str; 6] = [
    "Quarterly report",
    "Export from the ledger",
    "Working copy - do not share",
    "Figures as of last close",
    "Team sheet",
    "Summary prepared by finance",
];
const NOTES: [&str; 5] = [
    "Source: ERP export, unaudited.",
    "Ask Dana before changing the layout.",
    "Totals are checked monthly.",
    "Rows added by hand are marked in the log.",
    "Numbers in the local currency.",
];
const GROUPS: [(&str, &str); 4] = [
    ("Record", "Figures"),
    ("Who", "How much"),
    ("Item", "Values"),
    ("Details", "Amounts"),
];

/// One table's place on its sheet.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The sheet it is on.
    pub sheet: String,
    /// The row of the column headers (the lower one when there are two).
    pub header_row: u32,
    /// The table's first column.
    pub first_col: u32,
    /// How many data rows.
    pub rows: u32,
    /// The column headers, left to right.
    pub headers: Vec<String>,
    /// The title above the table, merged across its width, if any.
    title: Option<(u32, String)>,
    /// Group labels over the headers: `(label, first column offset, span)`.
    groups: Vec<(String, u32, u32)>,
    /// A line of free text below the table (after `reserve_below` rows).
    note: Option<(u32, String)>,
}

impl Table {
    /// Draws a layout for `headers` over `rows` data rows on `sheet`,
    /// leaving `reserve_below` rows under the data free for answers.
    pub fn draw(
        rng: &mut ChaCha8Rng,
        sheet: &str,
        headers: &[&str],
        rows: u32,
        reserve_below: u32,
    ) -> Table {
        let mut row = rng.gen_range(1..=4);
        let first_col = rng.gen_range(1..=4);
        let title = if rng.gen_bool(0.7) {
            let t = (row, TITLES[rng.gen_range(0..TITLES.len())].to_string());
            row += rng.gen_range(2..=3);
            Some(t)
        } else {
            None
        };
        let width = headers.len() as u32;
        let groups = if width >= 3 && rng.gen_bool(0.5) {
            let (a, b) = GROUPS[rng.gen_range(0..GROUPS.len())];
            let split = rng.gen_range(1..width);
            row += 1;
            vec![
                (a.to_string(), 0, split),
                (b.to_string(), split, width - split),
            ]
        } else {
            Vec::new()
        };
        let header_row = row;
        let note = rng.gen_bool(0.6).then(|| {
            (
                header_row + rows + reserve_below + 2,
                NOTES[rng.gen_range(0..NOTES.len())].to_string(),
            )
        });
        Table {
            sheet: sheet.to_string(),
            header_row,
            first_col,
            rows,
            headers: headers.iter().map(|h| h.to_string()).collect(),
            title,
            groups,
            note,
        }
    }

    /// The sheet column of the table's column `i` (0-based).
    pub fn col(&self, i: usize) -> u32 {
        self.first_col + i as u32
    }

    /// The column letters of the table's column `i`.
    pub fn letter(&self, i: usize) -> String {
        column_letters(self.col(i))
    }

    /// The sheet row of data row `k` (0-based).
    pub fn row(&self, k: u32) -> u32 {
        self.header_row + 1 + k
    }

    /// The first data row.
    pub fn first_row(&self) -> u32 {
        self.row(0)
    }

    /// The last data row.
    pub fn last_row(&self) -> u32 {
        self.row(self.rows - 1)
    }

    /// The column after the table's last one.
    pub fn next_col(&self) -> u32 {
        self.first_col + self.headers.len() as u32
    }

    /// `B6:B15`: the data cells of column `i`.
    pub fn column_range(&self, i: usize) -> String {
        format!(
            "{}:{}",
            address(self.first_row(), self.col(i)),
            address(self.last_row(), self.col(i))
        )
    }

    /// Writes the title, group labels, headers and note onto `sheet`.
    pub fn write_frame(&self, sheet: &mut Sheet) {
        let last_col = self.next_col() - 1;
        if let Some((r, t)) = &self.title {
            sheet.text(*r, self.first_col, t);
            if last_col > self.first_col {
                sheet.merges.push((*r, self.first_col, *r, last_col));
            }
        }
        for (label, offset, span) in &self.groups {
            let c = self.first_col + offset;
            sheet.text(self.header_row - 1, c, label);
            if *span > 1 {
                sheet
                    .merges
                    .push((self.header_row - 1, c, self.header_row - 1, c + span - 1));
            }
        }
        for (i, h) in self.headers.iter().enumerate() {
            sheet.text(self.header_row, self.col(i), h);
        }
        if let Some((r, t)) = &self.note {
            sheet.text(*r, self.first_col, t);
        }
    }

    /// How the instruction names the table: its sheet, header row and data rows.
    pub fn described(&self) -> String {
        let names: Vec<String> = self
            .headers
            .iter()
            .enumerate()
            .map(|(i, h)| format!("{h} in column {}", self.letter(i)))
            .collect();
        format!(
            "the table on sheet '{}' has its headers in row {} and data in rows {} to {} ({})",
            self.sheet,
            self.header_row,
            self.first_row(),
            self.last_row(),
            names.join(", ")
        )
    }
}
