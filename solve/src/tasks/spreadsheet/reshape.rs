//! Sheet-level operations: the answer is a whole table on a new sheet
//! (rows deduplicated, a pivot-style summary, rows filtered and sorted).
//! The answer range is the largest the table can take, so cells past the
//! table's end must stay empty: a program that copies every row fails.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::layout::Table;
use super::workbook::{address, Sheet, Value, Workbook};
use super::{Draft, Expected, Kind, CASES};

const NAMES: [&str; 10] = [
    "Ada", "Bo", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ines", "Jon",
];
const REGIONS: [&str; 6] = ["North", "South", "East", "West", "Central", "Coast"];
const DEPTS: [&str; 4] = ["Sales", "Ops", "Legal", "IT"];
const SAVE: &str = "wb.save('output.xlsx')\n";

fn prologue(sheet: &str) -> String {
    format!("import openpyxl\nwb = openpyxl.load_workbook('input.xlsx')\nws = wb['{sheet}']\n")
}

/// The expected block `rows` x `width` at A1 of `sheet`: `cells` first,
/// row by row, every cell after them empty.
fn block(sheet: &str, width: u32, rows: u32, cells: &[Vec<Value>]) -> Vec<Expected> {
    let mut out = Vec::new();
    for r in 0..rows {
        for c in 0..width {
            let value = cells
                .get(r as usize)
                .and_then(|row| row.get(c as usize))
                .cloned();
            out.push(Expected {
                sheet: sheet.to_string(),
                row: r + 1,
                col: c + 1,
                value,
                as_formula: false,
            });
        }
    }
    out
}

fn one_sheet(name: &str) -> Workbook {
    Workbook {
        sheets: vec![Sheet::new(name)],
    }
}

/// Text of the header cells, as the reference program copies them.
fn header_copy(table: &Table) -> String {
    format!(
        "out.append([ws.cell({}, c).value for c in range({}, {})])\n",
        table.header_row,
        table.first_col,
        table.next_col()
    )
}

fn rows_of(table: &Table) -> String {
    format!(
        "rows = [[ws.cell(r, c).value for c in range({}, {})] for r in range({}, {})]\n",
        table.first_col,
        table.next_col(),
        table.first_row(),
        table.last_row() + 1
    )
}

/// Rows copied to a new sheet, keeping each ID's first row.
pub(super) fn deduplicate(rng: &mut ChaCha8Rng) -> Draft {
    let on = ["Signups", "Log", "Requests"][rng.gen_range(0..3)];
    let to = ["Unique", "Clean", "Deduped"][rng.gen_range(0..3)];
    let n = rng.gen_range(8..=12);
    let headers = ["ID", "Name", "Plan"];
    let table = Table::draw(rng, on, &headers, n, 0);
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = one_sheet(on);
        let ws = &mut wb.sheets[0];
        table.write_frame(ws);
        let pool = n as usize * 2 / 3;
        let people: Vec<(f64, &str, &str)> = (0..pool)
            .map(|i| {
                (
                    (1000 + 17 * i + rng.gen_range(0..17)) as f64,
                    NAMES[rng.gen_range(0..NAMES.len())],
                    ["Free", "Pro", "Team"][rng.gen_range(0..3)],
                )
            })
            .collect();
        let mut seen = Vec::new();
        let mut unique: Vec<Vec<Value>> =
            vec![headers.iter().map(|h| Value::Text(h.to_string())).collect()];
        for j in 0..n {
            let (id, name, plan) = people[rng.gen_range(0..pool)];
            let r = table.row(j);
            ws.set(r, table.col(0), Value::Number(id));
            ws.text(r, table.col(1), name);
            ws.text(r, table.col(2), plan);
            if !seen.contains(&(id as i64)) {
                seen.push(id as i64);
                unique.push(vec![
                    Value::Number(id),
                    Value::Text(name.into()),
                    Value::Text(plan.into()),
                ]);
            }
        }
        cases.push((wb, block(to, 3, n + 1, &unique)));
    }
    let instruction = format!(
        "In this workbook, {}. Some IDs appear on several rows. Add a sheet named '{to}' with \
         the three headers in A1:C1 and below them the table's rows with each ID's first row \
         only, in their original order, starting at A2 and leaving nothing else on the sheet.",
        table.described()
    );
    let reference = format!(
        "{}out = wb.create_sheet('{to}')\n{}{}seen = set()\nfor row in rows:\n    if row[0] in seen:\n        continue\n    seen.add(row[0])\n    out.append(row)\n{SAVE}",
        prologue(on),
        header_copy(&table),
        rows_of(&table)
    );
    Draft {
        kind: Kind::Deduplicate,
        instruction,
        answer_position: format!("'{to}'!A1:{}", address(n + 1, 3)),
        reference,
        cases,
    }
}

/// Sales summed by region (rows) and quarter (columns) on a new sheet.
pub(super) fn pivot(rng: &mut ChaCha8Rng) -> Draft {
    let on = ["Data", "Sales", "Raw"][rng.gen_range(0..3)];
    let to = ["Pivot", "Summary", "By quarter"][rng.gen_range(0..3)];
    let n = rng.gen_range(10..=16);
    let mut regions: Vec<&str> = REGIONS.to_vec();
    regions.shuffle(rng);
    regions.truncate(rng.gen_range(3..=4));
    let table = Table::draw(rng, on, &["Region", "Quarter", "Sales"], n, 0);
    let quarters = ["Q1", "Q2", "Q3", "Q4"];
    let mut sorted = regions.clone();
    sorted.sort();
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = one_sheet(on);
        let ws = &mut wb.sheets[0];
        table.write_frame(ws);
        // Every region appears at least once, in a shuffled order.
        let mut which: Vec<usize> = (0..n as usize)
            .map(|j| {
                if j < regions.len() {
                    j
                } else {
                    rng.gen_range(0..regions.len())
                }
            })
            .collect();
        which.shuffle(rng);
        let mut sums = vec![[0.0f64; 4]; regions.len()];
        for (j, &g) in which.iter().enumerate() {
            let r = table.row(j as u32);
            let q = rng.gen_range(0..4);
            let sales = rng.gen_range(5..=300) as f64;
            ws.text(r, table.col(0), regions[g]);
            ws.text(r, table.col(1), quarters[q]);
            ws.set(r, table.col(2), Value::Number(sales));
            sums[g][q] += sales;
        }
        let mut cells = vec![std::iter::once("Region")
            .chain(quarters)
            .map(|s| Value::Text(s.to_string()))
            .collect::<Vec<_>>()];
        for region in &sorted {
            let g = regions
                .iter()
                .position(|r| r == region)
                .expect("a drawn region");
            let mut row = vec![Value::Text(region.to_string())];
            row.extend(sums[g].iter().map(|&s| Value::Number(s)));
            cells.push(row);
        }
        cases.push((wb, block(to, 5, regions.len() as u32 + 1, &cells)));
    }
    let last = address(regions.len() as u32 + 1, 5);
    let instruction = format!(
        "In this workbook, {}. Add a sheet named '{to}' summarizing Sales by region and \
         quarter: A1 = 'Region', B1:E1 = Q1, Q2, Q3, Q4, the regions in alphabetical order from \
         A2 down, and in each cell the total Sales of that region in that quarter (0 where \
         there are none). The summary fills A1:{last}.",
        table.described()
    );
    let reference = format!(
        "{}{}tot = {{}}\nfor reg, q, s in rows:\n    tot[(reg, q)] = tot.get((reg, q), 0) + s\nregions = sorted({{row[0] for row in rows}})\n\
         out = wb.create_sheet('{to}')\nqs = ['Q1', 'Q2', 'Q3', 'Q4']\nout.append(['Region'] + qs)\nfor reg in regions:\n    out.append([reg] + [tot.get((reg, q), 0) for q in qs])\n{SAVE}",
        prologue(on),
        rows_of(&table)
    );
    Draft {
        kind: Kind::Pivot,
        instruction,
        answer_position: format!("'{to}'!A1:{last}"),
        reference,
        cases,
    }
}

/// Rows above a threshold, highest first, on a new sheet.
pub(super) fn filter_sort(rng: &mut ChaCha8Rng) -> Draft {
    let on = ["Staff", "Payroll", "People"][rng.gen_range(0..3)];
    let to = ["High earners", "Top pay", "Above line"][rng.gen_range(0..3)];
    let n = rng.gen_range(8..=12);
    let threshold = [50_000, 60_000, 70_000][rng.gen_range(0..3)];
    let table = Table::draw(rng, on, &["Name", "Dept", "Salary"], n, 0);
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = one_sheet(on);
        let ws = &mut wb.sheets[0];
        table.write_frame(ws);
        // Distinct salaries, so the order is one.
        let mut pay: Vec<u32> = (60..240).collect();
        pay.shuffle(rng);
        let mut kept: Vec<(f64, Vec<Value>)> = Vec::new();
        for j in 0..n {
            let r = table.row(j);
            let salary = f64::from(pay[j as usize] * 500);
            let name = format!("{} {}", NAMES[rng.gen_range(0..NAMES.len())], j + 1);
            let dept = DEPTS[rng.gen_range(0..DEPTS.len())];
            ws.text(r, table.col(0), &name);
            ws.text(r, table.col(1), dept);
            ws.set(r, table.col(2), Value::Number(salary));
            if salary > f64::from(threshold) {
                kept.push((
                    salary,
                    vec![
                        Value::Text(name),
                        Value::Text(dept.into()),
                        Value::Number(salary),
                    ],
                ));
            }
        }
        kept.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut cells = vec![["Name", "Dept", "Salary"]
            .iter()
            .map(|h| Value::Text(h.to_string()))
            .collect::<Vec<_>>()];
        cells.extend(kept.into_iter().map(|(_, row)| row));
        cases.push((wb, block(to, 3, n + 1, &cells)));
    }
    let instruction = format!(
        "In this workbook, {}. Add a sheet named '{to}' with the headers Name, Dept, Salary in \
         A1:C1 and below them only the rows whose Salary is above {threshold}, highest Salary \
         first, starting at A2 and leaving nothing else on the sheet.",
        table.described()
    );
    let reference = format!(
        "{}{}out = wb.create_sheet('{to}')\nout.append(['Name', 'Dept', 'Salary'])\nfor row in sorted((r for r in rows if r[2] > {threshold}), key=lambda r: -r[2]):\n    out.append(row)\n{SAVE}",
        prologue(on),
        rows_of(&table)
    );
    Draft {
        kind: Kind::FilterSort,
        instruction,
        answer_position: format!("'{to}'!A1:{}", address(n + 1, 3)),
        reference,
        cases,
    }
}
