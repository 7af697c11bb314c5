//! Cell-level operations: the answer is a named range of cells on the
//! input's own sheets (a column next to a table, a small summary block, a
//! column filled in place). Each draws its layout once per task, then the
//! values of every test case, computes the expected cells in Rust (the
//! reference program must then reproduce them through the judge: two
//! independent computations), and writes the reference program.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::layout::Table;
use super::workbook::{address, column_letters, Sheet, Value, Workbook};
use super::{Draft, Expected, Kind, CASES};

const FIRST: [&str; 12] = [
    "maria", "john", "aisha", "li", "peter", "sofia", "omar", "anna", "carlos", "yuki", "ivan",
    "grace",
];
const LAST: [&str; 12] = [
    "lopez", "smith", "khan", "wang", "novak", "rossi", "haddad", "berg", "silva", "tanaka",
    "petrov", "okafor",
];
const PRODUCTS: [&str; 8] = [
    "Stapler",
    "Desk lamp",
    "Notebook",
    "Cable",
    "Monitor",
    "Chair",
    "Mug",
    "Headset",
];
const REGIONS: [&str; 6] = ["North", "South", "East", "West", "Central", "Coast"];
const CATEGORIES: [&str; 6] = ["Tools", "Paper", "Garden", "Kitchen", "Toys", "Paint"];

/// The lines every reference program starts with.
fn prologue(sheet: &str) -> String {
    format!("import openpyxl\nwb = openpyxl.load_workbook('input.xlsx')\nws = wb['{sheet}']\n")
}

const SAVE: &str = "wb.save('output.xlsx')\n";

/// A fresh workbook per case holding `sheets` (names), in order.
fn book(names: &[&str]) -> Workbook {
    Workbook {
        sheets: names.iter().map(|n| Sheet::new(n)).collect(),
    }
}

fn sheet<'a>(wb: &'a mut Workbook, name: &str) -> &'a mut Sheet {
    wb.sheet_mut(name)
        .expect("the case's workbook has the sheet")
}

fn expect(sheet: &str, row: u32, col: u32, value: Value) -> Expected {
    Expected {
        sheet: sheet.to_string(),
        row,
        col,
        value: Some(value),
        as_formula: false,
    }
}

fn pick<'a>(rng: &mut ChaCha8Rng, from: &[&'a str]) -> &'a str {
    from[rng.gen_range(0..from.len())]
}

/// Qty times a price looked up on another sheet by code.
pub(super) fn lookup(rng: &mut ChaCha8Rng) -> Draft {
    let on = pick(rng, &["Orders", "Sales lines", "Invoices"]);
    let from = pick(rng, &["Price list", "Products", "Catalogue"]);
    let n = rng.gen_range(6..=12);
    let k = rng.gen_range(4..=7);
    let orders = Table::draw(rng, on, &["Order", "Code", "Qty"], n, 0);
    let prices = Table::draw(rng, from, &["Code", "Product", "Unit price"], k, 0);
    let mut codes: Vec<String> = (0..k)
        .map(|i| format!("P-{}", 100 + 7 * i + rng.gen_range(0..7)))
        .collect();
    codes.shuffle(rng);
    let out_col = orders.next_col();
    let t = column_letters(out_col);
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = book(&[on, from]);
        let mut order: Vec<usize> = (0..k as usize).collect();
        order.shuffle(rng);
        let price: Vec<f64> = (0..k)
            .map(|_| rng.gen_range(150..=9999) as f64 / 100.0)
            .collect();
        let ps = sheet(&mut wb, from);
        prices.write_frame(ps);
        for (row, &i) in order.iter().enumerate() {
            let r = prices.row(row as u32);
            ps.text(r, prices.col(0), &codes[i]);
            ps.text(r, prices.col(1), PRODUCTS[i % PRODUCTS.len()]);
            ps.set(r, prices.col(2), Value::Number(price[i]));
        }
        let os = sheet(&mut wb, on);
        orders.write_frame(os);
        os.text(orders.header_row, out_col, "Total");
        let mut expected = Vec::new();
        for j in 0..n {
            let r = orders.row(j);
            let i = rng.gen_range(0..k as usize);
            let qty = rng.gen_range(1..=20);
            os.text(
                r,
                orders.col(0),
                &format!("SO-{}", rng.gen_range(1000..10000)),
            );
            os.text(r, orders.col(1), &codes[i]);
            os.set(r, orders.col(2), Value::Number(qty as f64));
            expected.push(expect(on, r, out_col, Value::Number(qty as f64 * price[i])));
        }
        cases.push((wb, expected));
    }
    let (a, b) = (orders.first_row(), orders.last_row());
    let instruction = format!(
        "In this workbook, {}; {}. For each order, find its Code in the price table and write \
         Qty times that Unit price into {t}{a}:{t}{b} (the column headed 'Total'). Write the \
         numbers, not formulas.",
        orders.described(),
        prices.described()
    );
    let reference = format!(
        "{}ps = wb['{from}']\nprices = {{}}\nfor r in range({}, {}):\n    prices[ps.cell(r, {}).value] = ps.cell(r, {}).value\n\
         for r in range({a}, {}):\n    ws.cell(r, {out_col}).value = ws.cell(r, {}).value * prices[ws.cell(r, {}).value]\n{SAVE}",
        prologue(on),
        prices.first_row(),
        prices.last_row() + 1,
        prices.col(0),
        prices.col(2),
        b + 1,
        orders.col(2),
        orders.col(1),
    );
    Draft {
        kind: Kind::Lookup,
        instruction,
        answer_position: format!("'{on}'!{t}{a}:{t}{b}"),
        reference,
        cases,
    }
}

/// Per-region totals of the amounts at or above a threshold (SUMIFS).
pub(super) fn conditional_sum(rng: &mut ChaCha8Rng) -> Draft {
    let on = pick(rng, &["Sales", "Deals", "Pipeline"]);
    let n = rng.gen_range(8..=14);
    let mut regions: Vec<&str> = REGIONS.to_vec();
    regions.shuffle(rng);
    regions.truncate(rng.gen_range(3..=4));
    let threshold = [50, 100, 150, 200][rng.gen_range(0..4)];
    let table = Table::draw(rng, on, &["Region", "Rep", "Amount"], n, 0);
    let sc = table.next_col() + 1;
    let (s1, s2) = (
        table.header_row + 1,
        table.header_row + regions.len() as u32,
    );
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = book(&[on]);
        let ws = sheet(&mut wb, on);
        table.write_frame(ws);
        ws.text(table.header_row, sc, "Region");
        ws.text(table.header_row, sc + 1, "Total");
        let mut totals = vec![0.0; regions.len()];
        for j in 0..n {
            let r = table.row(j);
            let g = rng.gen_range(0..regions.len());
            let amount = rng.gen_range(10..=400);
            ws.text(r, table.col(0), regions[g]);
            ws.text(r, table.col(1), &capitalized(pick(rng, &FIRST)));
            ws.set(r, table.col(2), Value::Number(amount as f64));
            if amount >= threshold {
                totals[g] += amount as f64;
            }
        }
        let mut expected = Vec::new();
        for (g, region) in regions.iter().enumerate() {
            ws.text(s1 + g as u32, sc, region);
            expected.push(expect(on, s1 + g as u32, sc + 1, Value::Number(totals[g])));
        }
        cases.push((wb, expected));
    }
    let (sl, tl) = (column_letters(sc), column_letters(sc + 1));
    let instruction = format!(
        "In this workbook, {}. For each region listed in {sl}{s1}:{sl}{s2}, write into \
         {tl}{s1}:{tl}{s2} the sum of Amount over that region's rows whose Amount is at least \
         {threshold} (0 if there are none). Write the numbers, not formulas.",
        table.described()
    );
    let reference = format!(
        "{}tot = {{}}\nfor r in range({}, {}):\n    reg, amt = ws.cell(r, {}).value, ws.cell(r, {}).value\n    if amt >= {threshold}:\n        tot[reg] = tot.get(reg, 0) + amt\n\
         for r in range({s1}, {}):\n    ws.cell(r, {}).value = tot.get(ws.cell(r, {sc}).value, 0)\n{SAVE}",
        prologue(on),
        table.first_row(),
        table.last_row() + 1,
        table.col(0),
        table.col(2),
        s2 + 1,
        sc + 1,
    );
    Draft {
        kind: Kind::ConditionalSum,
        instruction,
        answer_position: format!("'{on}'!{tl}{s1}:{tl}{s2}"),
        reference,
        cases,
    }
}

/// Due dates from a start date and a number of days, or days between two dates.
pub(super) fn dates(rng: &mut ChaCha8Rng) -> Draft {
    let on = pick(rng, &["Projects", "Tasks", "Schedule"]);
    let n = rng.gen_range(6..=12);
    let due = rng.gen_bool(0.5);
    let headers: [&str; 3] = if due {
        ["Task", "Start", "Days"]
    } else {
        ["Task", "Start", "End"]
    };
    let table = Table::draw(rng, on, &headers, n, 0);
    let out_col = table.next_col();
    let t = column_letters(out_col);
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = book(&[on]);
        let ws = sheet(&mut wb, on);
        table.write_frame(ws);
        ws.text(
            table.header_row,
            out_col,
            if due { "Due" } else { "Duration" },
        );
        let mut expected = Vec::new();
        for j in 0..n {
            let r = table.row(j);
            let start = rng.gen_range(44_927..45_658); // 2023-01-01 .. 2024-12-31
            let days = rng.gen_range(1..=90);
            ws.text(
                r,
                table.col(0),
                &format!(
                    "{} {}",
                    pick(rng, &["Plan", "Build", "Test", "Ship", "Review"]),
                    j + 1
                ),
            );
            ws.set(r, table.col(1), Value::Date(start));
            let answer = if due {
                ws.set(r, table.col(2), Value::Number(days as f64));
                Value::Date(start + days)
            } else {
                ws.set(r, table.col(2), Value::Date(start + days));
                Value::Number(days as f64)
            };
            expected.push(expect(on, r, out_col, answer));
        }
        cases.push((wb, expected));
    }
    let (a, b) = (table.first_row(), table.last_row());
    let (what, line) = if due {
        (
            "the date that is Days days after Start (a date)",
            format!(
                "ws.cell(r, {out_col}).value = ws.cell(r, {}).value + datetime.timedelta(days=ws.cell(r, {}).value)",
                table.col(1),
                table.col(2)
            ),
        )
    } else {
        (
            "the number of days from Start to End (a number)",
            format!(
                "ws.cell(r, {out_col}).value = (ws.cell(r, {}).value - ws.cell(r, {}).value).days",
                table.col(2),
                table.col(1)
            ),
        )
    };
    let instruction = format!(
        "In this workbook, {}. For each row write into {t}{a}:{t}{b} {what}.",
        table.described()
    );
    let reference = format!(
        "import datetime\n{}for r in range({a}, {}):\n    {line}\n{SAVE}",
        prologue(on),
        b + 1
    );
    Draft {
        kind: Kind::Dates,
        instruction,
        answer_position: format!("'{on}'!{t}{a}:{t}{b}"),
        reference,
        cases,
    }
}

fn capitalized(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase(),
        None => String::new(),
    }
}

/// A word as someone typed it: any case, a shifted capital.
fn messy_word(rng: &mut ChaCha8Rng, w: &str) -> String {
    match rng.gen_range(0..4) {
        0 => w.to_ascii_uppercase(),
        1 => w.to_string(),
        2 => capitalized(w),
        _ => w
            .chars()
            .enumerate()
            .map(|(i, c)| if i == 0 { c } else { c.to_ascii_uppercase() })
            .collect(),
    }
}

/// Names with stray spaces and mixed case cleaned to `First Last`.
pub(super) fn text_cleanup(rng: &mut ChaCha8Rng) -> Draft {
    let on = pick(rng, &["Contacts", "Members", "Guests"]);
    let n = rng.gen_range(6..=12);
    let table = Table::draw(rng, on, &["ID", "Name", "City"], n, 0);
    let out_col = table.next_col();
    let t = column_letters(out_col);
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = book(&[on]);
        let ws = sheet(&mut wb, on);
        table.write_frame(ws);
        ws.text(table.header_row, out_col, "Clean name");
        let mut expected = Vec::new();
        for j in 0..n {
            let r = table.row(j);
            let (f, l) = (pick(rng, &FIRST), pick(rng, &LAST));
            let pad = |rng: &mut ChaCha8Rng| " ".repeat(rng.gen_range(0..=2));
            let gap = " ".repeat(rng.gen_range(1..=3));
            let messy = format!(
                "{}{}{gap}{}{}",
                pad(rng),
                messy_word(rng, f),
                messy_word(rng, l),
                pad(rng)
            );
            ws.set(
                r,
                table.col(0),
                Value::Number(rng.gen_range(100..1000) as f64),
            );
            ws.text(r, table.col(1), &messy);
            ws.text(
                r,
                table.col(2),
                pick(rng, &["Lyon", "Oslo", "Porto", "Graz", "Turku"]),
            );
            let clean = format!("{} {}", capitalized(f), capitalized(l));
            expected.push(expect(on, r, out_col, Value::Text(clean)));
        }
        cases.push((wb, expected));
    }
    let (a, b) = (table.first_row(), table.last_row());
    let instruction = format!(
        "In this workbook, {}. The names were typed carelessly. Write each name cleaned into \
         {t}{a}:{t}{b}: no leading, trailing or repeated spaces, each word with a capital first \
         letter and the rest lower case (e.g. '  mARIA   lopez' -> 'Maria Lopez').",
        table.described()
    );
    let reference = format!(
        "{}for r in range({a}, {}):\n    v = str(ws.cell(r, {}).value)\n    ws.cell(r, {out_col}).value = ' '.join(w.capitalize() for w in v.split())\n{SAVE}",
        prologue(on),
        b + 1,
        table.col(1)
    );
    Draft {
        kind: Kind::TextCleanup,
        instruction,
        answer_position: format!("'{on}'!{t}{a}:{t}{b}"),
        reference,
        cases,
    }
}

/// A category column written only on each group's first row, filled down.
pub(super) fn fill_gaps(rng: &mut ChaCha8Rng) -> Draft {
    let on = pick(rng, &["Inventory", "Stock", "Store"]);
    let n = rng.gen_range(8..=14);
    let table = Table::draw(rng, on, &["Category", "Item", "Stock"], n, 0);
    let c = table.col(0);
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = book(&[on]);
        let ws = sheet(&mut wb, on);
        table.write_frame(ws);
        let mut cats: Vec<&str> = CATEGORIES.to_vec();
        cats.shuffle(rng);
        // Group starts: row 0 always, then each later row with chance 1/3.
        let mut g = 0;
        let mut expected = Vec::new();
        for j in 0..n {
            let r = table.row(j);
            if j > 0 && rng.gen_bool(1.0 / 3.0) && g + 1 < cats.len() {
                g += 1;
                ws.text(r, c, cats[g]);
            } else if j == 0 {
                ws.text(r, c, cats[g]);
            }
            ws.text(
                r,
                table.col(1),
                &format!("{} {}", pick(rng, &PRODUCTS), rng.gen_range(1..100)),
            );
            ws.set(r, table.col(2), Value::Number(rng.gen_range(0..60) as f64));
            expected.push(expect(on, r, c, Value::Text(cats[g].to_string())));
        }
        cases.push((wb, expected));
    }
    let range = table.column_range(0);
    let instruction = format!(
        "In this workbook, {}. Category is written only on the first row of each group and \
         left blank below it. Fill every blank cell of {range} with the category above it, \
         leaving the filled ones as they are.",
        table.described()
    );
    let reference = format!(
        "{}last = None\nfor r in range({}, {}):\n    v = ws.cell(r, {c}).value\n    if v is None or str(v).strip() == '':\n        ws.cell(r, {c}).value = last\n    else:\n        last = v\n{SAVE}",
        prologue(on),
        table.first_row(),
        table.last_row() + 1
    );
    Draft {
        kind: Kind::FillGaps,
        instruction,
        answer_position: format!("'{on}'!{range}"),
        reference,
        cases,
    }
}

/// Formulas written as formulas: a product per row and their sum.
pub(super) fn formulas(rng: &mut ChaCha8Rng) -> Draft {
    let on = pick(rng, &["Budget", "Costs", "Quote"]);
    let n = rng.gen_range(5..=10);
    let table = Table::draw(rng, on, &["Item", "Qty", "Unit cost"], n, 1);
    let e = table.next_col();
    let t = column_letters(e);
    let (q, u) = (table.letter(1), table.letter(2));
    let (a, b) = (table.first_row(), table.last_row());
    let mut cases = Vec::new();
    for _ in 0..CASES {
        let mut wb = book(&[on]);
        let ws = sheet(&mut wb, on);
        table.write_frame(ws);
        ws.text(table.header_row, e, "Cost");
        ws.text(b + 1, e - 1, "Total");
        let mut expected = Vec::new();
        let mut sum = 0.0;
        for j in 0..n {
            let r = table.row(j);
            let (qty, cost) = (
                rng.gen_range(1..=12) as f64,
                rng.gen_range(50..=5000) as f64 / 10.0,
            );
            ws.text(r, table.col(0), pick(rng, &PRODUCTS));
            ws.set(r, table.col(1), Value::Number(qty));
            ws.set(r, table.col(2), Value::Number(cost));
            sum += qty * cost;
            expected.push(Expected {
                as_formula: true,
                ..expect(on, r, e, Value::Number(qty * cost))
            });
        }
        expected.push(Expected {
            as_formula: true,
            ..expect(on, b + 1, e, Value::Number(sum))
        });
        cases.push((wb, expected));
    }
    let instruction = format!(
        "In this workbook, {}. Write formulas, not values: in {t}{a}:{t}{b} a formula for the \
         row's Qty times its Unit cost (like ={q}{a}*{u}{a}), and in {t}{} a formula for the \
         sum of {t}{a}:{t}{b}. The formulas must still be right if the numbers change.",
        table.described(),
        b + 1
    );
    let reference = format!(
        "{}for r in range({a}, {}):\n    ws.cell(r, {e}).value = f'={q}{{r}}*{u}{{r}}'\nws.cell({}, {e}).value = '=SUM({t}{a}:{t}{b})'\n{SAVE}",
        prologue(on),
        b + 1,
        b + 1
    );
    Draft {
        kind: Kind::Formulas,
        instruction,
        answer_position: format!("'{on}'!{}:{}", address(a, e), address(b + 1, e)),
        reference,
        cases,
    }
}
