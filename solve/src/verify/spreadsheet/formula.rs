//! A small evaluator for the formulas a candidate writes where a task asks
//! for formulas: numbers, cell references on the same sheet, `+ - * /`,
//! parentheses and `SUM`, `AVERAGE`, `MIN`, `MAX`, `COUNT`, `PRODUCT` over
//! cells and ranges. Why: openpyxl writes formulas without their values,
//! and comparing formula text would fail `=D6*C6` where `=C6*D6` was
//! expected; evaluating both on the output's own cells checks what the
//! formula computes. A formula outside this subset is an error (the cell
//! fails), said so in the verdict.

/// What the evaluator needs of a sheet: a cell's formula (without `=`), or
/// its number (`Ok(None)` for an empty cell, `Err` for text and the like).
pub(super) trait Cells {
    /// The formula at `(row, col)`, 1-based, if the cell holds one.
    fn formula(&self, row: u32, col: u32) -> Option<String>;
    /// The number at `(row, col)`; empty is `Ok(None)`.
    fn number(&self, row: u32, col: u32) -> Result<Option<f64>, String>;
}

/// Deepest chain of formulas referring to formulas.
const MAX_DEPTH: usize = 32;

/// The value of `formula` (with or without its leading `=`) on `cells`.
pub(super) fn evaluate(formula: &str, cells: &dyn Cells) -> Result<f64, String> {
    eval_at(formula, cells, 0)
}

fn eval_at(formula: &str, cells: &dyn Cells, depth: usize) -> Result<f64, String> {
    if depth > MAX_DEPTH {
        return Err("formulas refer to each other too deeply (a cycle?)".into());
    }
    let text = formula.trim().trim_start_matches('=');
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
        cells,
        depth,
    };
    let v = p.expr()?;
    p.space();
    if p.at != p.s.len() {
        return Err(format!(
            "cannot evaluate the formula `={text}` past `{}`",
            &text[..p.at]
        ));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    cells: &'a dyn Cells,
    depth: usize,
}

impl Parser<'_> {
    fn space(&mut self) {
        while self.s.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.space();
        self.s.get(self.at).copied()
    }

    fn expr(&mut self) -> Result<f64, String> {
        let mut v = self.term()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.at += 1;
            let r = self.term()?;
            v = if op == b'+' { v + r } else { v - r };
        }
        Ok(v)
    }

    fn term(&mut self) -> Result<f64, String> {
        let mut v = self.factor()?;
        while let Some(op @ (b'*' | b'/')) = self.peek() {
            self.at += 1;
            let r = self.factor()?;
            v = if op == b'*' { v * r } else { v / r };
        }
        Ok(v)
    }

    fn factor(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some(b'-') => {
                self.at += 1;
                Ok(-self.factor()?)
            }
            Some(b'+') => {
                self.at += 1;
                self.factor()
            }
            Some(b'(') => {
                self.at += 1;
                let v = self.expr()?;
                self.expect(b')')?;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() || c == b'.' => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'$' => {
                let word = self.word();
                if self.peek() == Some(b'(') {
                    self.at += 1;
                    self.function(&word)
                } else {
                    let (r, c) = cell(&word)?;
                    self.cell_value(r, c).map(|v| v.unwrap_or(0.0))
                }
            }
            other => Err(format!(
                "unexpected {} in the formula",
                other.map_or("end".to_string(), |c| format!("`{}`", c as char))
            )),
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected `{}` in the formula", c as char))
        }
    }

    fn number(&mut self) -> Result<f64, String> {
        let start = self.at;
        while self
            .s
            .get(self.at)
            .is_some_and(|c| c.is_ascii_digit() || *c == b'.')
        {
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
        text.parse()
            .map_err(|_| format!("`{text}` is not a number"))
    }

    /// Letters, digits and `$`: a function name or a cell address.
    fn word(&mut self) -> String {
        let start = self.at;
        while self
            .s
            .get(self.at)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'$' || *c == b'.')
        {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.at]).to_ascii_uppercase()
    }

    fn cell_value(&self, row: u32, col: u32) -> Result<Option<f64>, String> {
        match self.cells.formula(row, col) {
            Some(f) => eval_at(&f, self.cells, self.depth + 1).map(Some),
            None => self.cells.number(row, col),
        }
    }

    /// The numbers of one argument: a cell, a range, or an expression.
    fn argument(&mut self, out: &mut Vec<f64>) -> Result<(), String> {
        let save = self.at;
        if let Some(c) = self.peek() {
            if c.is_ascii_alphabetic() || c == b'$' {
                let word = self.word();
                if let (Ok((r1, c1)), Some(b':')) = (cell(&word), self.peek()) {
                    self.at += 1;
                    let end = self.word();
                    let (r2, c2) = cell(&end)?;
                    for r in r1.min(r2)..=r1.max(r2) {
                        for c in c1.min(c2)..=c1.max(c2) {
                            if let Some(v) = self.cell_value(r, c).ok().flatten() {
                                out.push(v);
                            }
                        }
                    }
                    return Ok(());
                }
                self.at = save;
            }
        }
        out.push(self.expr()?);
        Ok(())
    }

    fn function(&mut self, name: &str) -> Result<f64, String> {
        let mut args = Vec::new();
        if self.peek() != Some(b')') {
            loop {
                self.argument(&mut args)?;
                match self.peek() {
                    Some(b',') => self.at += 1,
                    _ => break,
                }
            }
        }
        self.expect(b')')?;
        let n = args.len() as f64;
        Ok(match name {
            "SUM" => args.iter().sum(),
            "PRODUCT" => args.iter().product(),
            "COUNT" => n,
            "AVERAGE" if n > 0.0 => args.iter().sum::<f64>() / n,
            "MIN" => args.iter().copied().reduce(f64::min).unwrap_or(0.0),
            "MAX" => args.iter().copied().reduce(f64::max).unwrap_or(0.0),
            other => return Err(format!("the judge does not evaluate {other}()")),
        })
    }
}

/// `(row, col)` of a same-sheet address.
fn cell(word: &str) -> Result<(u32, u32), String> {
    crate::tasks::spreadsheet::parse_address(word)
        .ok_or_else(|| format!("`{word}` is not a cell on this sheet"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Grid(HashMap<(u32, u32), Result<f64, String>>);

    impl Cells for Grid {
        fn formula(&self, row: u32, col: u32) -> Option<String> {
            self.0.get(&(row, col))?.clone().err()
        }
        fn number(&self, row: u32, col: u32) -> Result<Option<f64>, String> {
            Ok(self.0.get(&(row, col)).and_then(|v| v.clone().ok()))
        }
    }

    #[test]
    fn formulas_compute_what_a_spreadsheet_would() {
        // C1 = 3, D1 = 4, C2 = 5, D2 = 6, E1 = C1*D1, E2 = D2*C2.
        let g = Grid(HashMap::from([
            ((1, 3), Ok(3.0)),
            ((1, 4), Ok(4.0)),
            ((2, 3), Ok(5.0)),
            ((2, 4), Ok(6.0)),
            ((1, 5), Err("C1*D1".into())),
            ((2, 5), Err("=$D$2*C2".into())),
        ]));
        assert_eq!(evaluate("=SUM(E1:E2)", &g), Ok(42.0));
        assert_eq!(evaluate("E1+E2-(2*3)/2", &g), Ok(39.0));
        assert_eq!(evaluate("AVERAGE(C1:D2, 2)", &g), Ok(4.0));
        assert!(evaluate("VLOOKUP(C1,D1:D2,1)", &g).is_err());
        assert!(evaluate("Other!C1", &g).is_err());
        let cyclic = Grid(HashMap::from([((1, 1), Err("A1+1".into()))]));
        assert!(evaluate("A1", &cyclic).is_err());
    }
}
