//! Final answers: find the answer in a model's text, compare two answers
//! (numerically when both are numbers), vote among candidates, and decide when
//! a vote is settled.
//!
//! Text comes in from finished generations (best-of-N candidates, the trainer's
//! rollouts, a dataset's reference answer); strings, votes and booleans go out.
//! Pure string and integer arithmetic: no I/O, no model, no randomness. Code is
//! judged by running it, in [`super::judge`], not here.

/// The answer a model committed to in `text`, raw and trimmed.
///
/// In priority order: the last balanced `\boxed{...}` (nested braces are
/// fine); the last "... answer is X" / "Answer: X" (case-insensitive; X runs to
/// the end of its sentence or line, without trailing `.`, `$` or `**`);
/// GSM8K's last `#### X`; the last number anywhere. `None` when there is none.
/// A stated answer written as a calculation (`2 x 2 = 4 bolts`) is its
/// result, the part after the last `=`.
pub fn extract_answer(text: &str) -> Option<String> {
    last_boxed(text)
        .or_else(|| last_stated(text).map(equation_result))
        .or_else(|| last_gsm8k(text).map(equation_result))
        .or_else(|| last_number(text))
        .map(str::to_string)
}

/// What follows the last `=` of `s` (`16 - 3 - 4 = 9` is `9`), or all of `s`
/// when it has no `=` with something after it.
fn equation_result(s: &str) -> &str {
    match s.rsplit_once('=') {
        Some((_, result)) if !clean_stated(result).is_empty() => clean_stated(result),
        _ => s,
    }
}

/// The body of the last `\boxed{...}` whose braces balance and that is not empty.
fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed";
    text.rmatch_indices(OPEN).find_map(|(at, _)| {
        let body = braced_body(text[at + OPEN.len()..].trim_start())?.trim();
        (!body.is_empty()).then_some(body)
    })
}

/// The text inside the balanced `{...}` that `s` starts with; `\{` and `\}` do
/// not count as braces.
fn braced_body(s: &str) -> Option<&str> {
    let inner = s.strip_prefix('{')?;
    let bytes = inner.as_bytes();
    let mut depth = 1usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    // `}` is ASCII, so `i` is a char boundary.
                    return Some(&inner[..i]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// X from the last "answer is X" or "answer: X" (which also covers "The final
/// answer is X" and "**Answer:** X").
fn last_stated(text: &str) -> Option<&str> {
    // ASCII lowercasing keeps byte offsets, so positions in `lower` index `text`.
    let lower = text.to_ascii_lowercase();
    let mut starts: Vec<usize> = ["answer is", "answer:"]
        .iter()
        .flat_map(|phrase| {
            lower.match_indices(phrase).filter_map(|(at, m)| {
                let end = at + m.len();
                let word_before = lower[..at]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_alphanumeric);
                let word_after = m.ends_with("is")
                    && lower[end..]
                        .chars()
                        .next()
                        .is_some_and(char::is_alphanumeric);
                (!word_before && !word_after).then_some(end)
            })
        })
        .collect();
    starts.sort_unstable();
    starts.iter().rev().find_map(|&start| {
        let rest = text[start..].trim_start_matches(|c: char| c == ':' || c.is_whitespace());
        let answer = clean_stated(first_sentence(rest));
        // "The answer is\n\nThe final answer is" states nothing: the text
        // after an empty "answer is" is another opening, not an answer.
        let lower = answer.to_ascii_lowercase();
        let opening = lower.contains("answer is") || lower.contains("answer:");
        (!answer.is_empty() && !opening).then_some(answer)
    })
}

/// `s` up to its first newline, or its first `.`, `!` or `?` that ends a
/// sentence (followed by whitespace or the end), so `3.5` stays whole.
fn first_sentence(s: &str) -> &str {
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let ends = match b {
            b'\n' => true,
            b'.' | b'!' | b'?' => bytes.get(i + 1).is_none_or(u8::is_ascii_whitespace),
            _ => false,
        };
        if ends {
            return &s[..i];
        }
    }
    s
}

/// Strips the decoration models put around a stated answer: markdown bold,
/// math `$...$`, a trailing period or stray `$`.
fn clean_stated(s: &str) -> &str {
    let mut s = s.trim();
    loop {
        let before = s.len();
        s = s
            .trim_end_matches(['.', '*'])
            .trim_start_matches('*')
            .trim();
        s = match s.strip_prefix('$').and_then(|t| t.strip_suffix('$')) {
            Some(inner) => inner.trim(),
            None => s.trim_end_matches('$').trim(),
        };
        if s.len() == before {
            return s;
        }
    }
}

/// X from GSM8K's last non-empty `#### X` line.
fn last_gsm8k(text: &str) -> Option<&str> {
    text.rmatch_indices("####").find_map(|(at, m)| {
        let line = text[at + m.len()..].lines().next().unwrap_or("");
        let answer = clean_stated(line.trim_start_matches('#'));
        (!answer.is_empty()).then_some(answer)
    })
}

/// The last number written in `text`: an optional minus, digits with optional
/// thousands commas, an optional decimal part and an optional `/denominator`.
fn last_number(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let digit_at = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let mut last = None;
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let mut start = i;
        // `.5`, unless the dot follows a digit (then it is a version or list).
        if start > 0 && b[start - 1] == b'.' && !(start > 1 && b[start - 2].is_ascii_digit()) {
            start -= 1;
        }
        // A minus sign, unless it is subtraction (`5-3`) or a hyphen (`x-3`).
        if start > 0 && b[start - 1] == b'-' && !(start > 1 && b[start - 2].is_ascii_alphanumeric())
        {
            start -= 1;
        }
        let mut j = i;
        while digit_at(j) || (b.get(j) == Some(&b',') && digit_at(j + 1)) {
            j += 1;
        }
        if b.get(j) == Some(&b'.') && digit_at(j + 1) {
            j += 1;
            while digit_at(j) {
                j += 1;
            }
        }
        if b.get(j) == Some(&b'/') && digit_at(j + 1) {
            j += 1;
            while digit_at(j) {
                j += 1;
            }
        }
        // Every boundary here is next to an ASCII byte, so slicing is safe.
        last = Some(&text[start..j]);
        i = j;
    }
    last
}

/// The value of an answer written as a number, the way answers are written:
/// `1,234`, `$12.50`, `-3`, `+4`, `3.0`, `50%` (50), `1/2`, `\frac{1}{2}`,
/// `1e3`, `x = 5`, `$\frac{3}{4}$`, followed by nothing, punctuation or words
/// and units (`12 apples`, `5 cm`, `90^\circ`). `None` when it is not a
/// number, or is an expression that starts with one (`2^3`, `5x`, `1, 2`).
pub fn normalize_number(s: &str) -> Option<f64> {
    let s = strip_variable(strip_math_wrappers(s));
    let (value, rest) = leading_number(s)?;
    (value.is_finite() && is_annotation(rest)).then_some(value)
}

/// `s` without surrounding `$...$`, `\(...\)`, `\[...\]` or markdown `**...**`.
fn strip_math_wrappers(s: &str) -> &str {
    let mut s = s.trim();
    loop {
        let before = s.len();
        for (open, close) in [("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**")] {
            if let Some(inner) = s.strip_prefix(open).and_then(|t| t.strip_suffix(close)) {
                s = inner.trim();
            }
        }
        if s.len() == before {
            return s;
        }
    }
}

/// `s` without a leading one-letter assignment such as `x = `.
fn strip_variable(s: &str) -> &str {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() => {
            let rest = chars.as_str().trim_start();
            match rest.strip_prefix('=') {
                Some(value) if !value.starts_with('=') => value.trim_start(),
                _ => s,
            }
        }
        _ => s,
    }
}

/// A signed number (decimal, ratio or `\frac`), optionally a percentage, at the
/// start of `s`, and the text after it.
fn leading_number(s: &str) -> Option<(f64, &str)> {
    let s = strip_currency(s);
    let (negative, s) =
        if let Some(rest) = s.strip_prefix('-').or_else(|| s.strip_prefix('\u{2212}')) {
            (true, rest)
        } else {
            (false, s.strip_prefix('+').unwrap_or(s))
        };
    let s = strip_currency(s);
    let (magnitude, rest) = match ["\\frac", "\\dfrac", "\\tfrac"]
        .iter()
        .find_map(|cmd| s.strip_prefix(cmd))
    {
        Some(args) => latex_fraction(args)?,
        None => decimal_or_ratio(s)?,
    };
    let rest = strip_percent(rest);
    Some((if negative { -magnitude } else { magnitude }, rest))
}

fn strip_currency(s: &str) -> &str {
    ["\\$", "$", "\u{20ac}", "\u{a3}", "\u{a5}"]
        .iter()
        .find_map(|sign| s.strip_prefix(sign))
        .map_or(s, str::trim_start)
}

fn strip_percent(rest: &str) -> &str {
    let t = rest.trim_start();
    t.strip_prefix('%')
        .or_else(|| t.strip_prefix("\\%"))
        .unwrap_or(rest)
}

/// The two arguments of `\frac` (`{1}{2}` or the shorthand `12`), each a whole
/// number, as numerator / denominator.
fn latex_fraction(args: &str) -> Option<(f64, &str)> {
    let (numerator, rest) = latex_argument(args)?;
    let (denominator, rest) = latex_argument(rest)?;
    let (numerator, denominator) = (exact_number(numerator)?, exact_number(denominator)?);
    (denominator != 0.0).then(|| (numerator / denominator, rest))
}

/// One TeX macro argument: a braced group or a single character.
fn latex_argument(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if s.starts_with('{') {
        let body = braced_body(s)?;
        // The body plus its two ASCII braces.
        Some((body, &s[body.len() + 2..]))
    } else {
        let c = s.chars().next()?;
        Some(s.split_at(c.len_utf8()))
    }
}

/// `s` as a number with nothing after it.
fn exact_number(s: &str) -> Option<f64> {
    let (value, rest) = leading_number(strip_math_wrappers(s))?;
    rest.trim().is_empty().then_some(value)
}

/// An unsigned decimal, optionally over a denominator (`1/2`, `3 / 4`).
fn decimal_or_ratio(s: &str) -> Option<(f64, &str)> {
    let (value, rest) = unsigned_decimal(s)?;
    let ratio = rest
        .trim_start()
        .strip_prefix('/')
        .and_then(|d| unsigned_decimal(d.trim_start()));
    match ratio {
        Some((denominator, after)) if denominator != 0.0 => Some((value / denominator, after)),
        Some(_) => None,
        None => Some((value, rest)),
    }
}

/// Digits with optional thousands commas (`1,234`), an optional fraction
/// (`.5`) and an optional exponent (`1e3`).
fn unsigned_decimal(s: &str) -> Option<(f64, &str)> {
    let b = s.as_bytes();
    let digit_at = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let mut literal = String::new();
    let mut i = 0;
    loop {
        if digit_at(i) {
            literal.push(char::from(b[i]));
        } else if b.get(i) == Some(&b',') && !literal.is_empty() && is_thousands_group(&b[i + 1..])
        {
            // A separator: skipped.
        } else {
            break;
        }
        i += 1;
    }
    if b.get(i) == Some(&b'.') && digit_at(i + 1) {
        literal.push('.');
        i += 1;
        while digit_at(i) {
            literal.push(char::from(b[i]));
            i += 1;
        }
    }
    if literal.is_empty() {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let signed = matches!(b.get(i + 1), Some(b'+' | b'-'));
        let first_digit = i + 1 + usize::from(signed);
        if digit_at(first_digit) {
            literal.push('e');
            if b[i + 1] == b'-' {
                literal.push('-');
            }
            i = first_digit;
            while digit_at(i) {
                literal.push(char::from(b[i]));
                i += 1;
            }
        }
    }
    // Only ASCII bytes were consumed, so `i` is a char boundary.
    Some((literal.parse().ok()?, &s[i..]))
}

/// Exactly three digits, then a non-digit or the end.
fn is_thousands_group(b: &[u8]) -> bool {
    b.len() >= 3
        && b[..3].iter().all(u8::is_ascii_digit)
        && b.get(3).is_none_or(|c| !c.is_ascii_digit())
}

/// Whether what follows a number only annotates it (units, words, closing
/// punctuation) rather than continuing an expression or a list.
fn is_annotation(rest: &str) -> bool {
    const LATEX_ANNOTATIONS: [&str; 14] = [
        "\\text", "\\mathrm", "\\mbox", "\\textbf", "\\%", "\\,", "\\;", "\\!", "\\ ", "\\quad",
        "\\qquad", "\\$", "\\)", "\\]",
    ];
    let t = rest.trim_start();
    let spaced = t.len() < rest.len();
    let Some(c) = t.chars().next() else {
        return true;
    };
    let after = t[c.len_utf8()..].trim_start();
    match c {
        // `12 apples`, `5cm`; but not `5x`, `2i` or `2 x 3`, which are expressions.
        c if c.is_ascii_alphabetic() => {
            let times = matches!(c, 'x' | 'X') && after.starts_with(|d: char| d.is_ascii_digit());
            !times && (spaced || t.bytes().take_while(u8::is_ascii_alphabetic).count() >= 2)
        }
        // Sentence punctuation, unless a list or a time follows (`1, 2`, `5:30`).
        '.' | ',' | ';' | ':' => !after.starts_with(|d: char| d.is_ascii_digit()),
        ')' | ']' | '}' | '$' | '\'' | '"' | '`' => true,
        '!' | '?' => spaced,
        '*' => t.bytes().all(|b| b == b'*'),
        '^' => t.starts_with("^\\circ") || t.starts_with("^{\\circ}"),
        '\\' => LATEX_ANNOTATIONS.iter().any(|p| t.starts_with(p)),
        // Units and symbols such as `°` or `€`, but not math operators.
        c if !c.is_ascii() => !matches!(
            c,
            '\u{2212}'
                | '\u{d7}'
                | '\u{f7}'
                | '\u{b7}'
                | '\u{22c5}'
                | '\u{b1}'
                | '\u{221a}'
                | '\u{b2}'
                | '\u{b3}'
        ),
        _ => false,
    }
}

/// Whether two answers say the same thing.
///
/// Numerically when both are numbers ([`normalize_number`]): equal within a
/// relative tolerance of 1e-6 or an absolute one of 1e-9. Otherwise as strings,
/// ignoring case, whitespace, `\text{}`-style wrappers, `$` and `\( \)`
/// delimiters, `\left`/`\right`, surrounding markdown bold or quotes, trailing
/// `.`, `,` or `;`, and parentheses around a single choice (`(A)` is `A`).
pub fn answers_match(a: &str, b: &str) -> bool {
    match (normalize_number(a), normalize_number(b)) {
        (Some(x), Some(y)) => {
            let gap = (x - y).abs();
            gap <= 1e-9 || gap <= 1e-6 * x.abs().max(y.abs())
        }
        _ => canonical_text(a) == canonical_text(b),
    }
}

/// The form of a non-numeric answer that [`answers_match`] compares.
fn canonical_text(s: &str) -> String {
    let mut s = unwrap_text_commands(s);
    for (from, to) in [
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\left", ""),
        ("\\right", ""),
    ] {
        s = s.replace(from, to);
    }
    for noise in ["\\(", "\\)", "\\!", "\\,", "\\;", "\\ ", "$"] {
        s = s.replace(noise, "");
    }
    let s: String = s
        .chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect();
    let s = s
        .trim_matches(['*', '"', '\'', '`'])
        .trim_end_matches(['.', ',', ';']);
    let choice = s.strip_prefix('(').and_then(|t| t.strip_suffix(')'));
    match choice {
        Some(inner) if inner.chars().count() == 1 => inner.to_string(),
        _ => s.to_string(),
    }
}

/// `s` with `\text{X}`, `\textbf{X}`, `\mathrm{X}` and `\mbox{X}` replaced by X.
fn unwrap_text_commands(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'scan: while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let command = &rest[at..];
        for name in ["\\textbf", "\\text", "\\mathrm", "\\mbox"] {
            if let Some(args) = command.strip_prefix(name) {
                if let Some(body) = braced_body(args.trim_start()) {
                    out.push_str(body);
                    let consumed = command.len() - args.trim_start().len() + body.len() + 2;
                    rest = &command[consumed..];
                    continue 'scan;
                }
            }
        }
        out.push('\\');
        rest = &command[1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_follows_priority() {
        let cases: &[(&str, Option<&str>)] = &[
            ("so \\boxed{\\frac{1}{2}} and then", Some("\\frac{1}{2}")),
            (
                "first \\boxed{1}, finally \\boxed{ {a}+{b} }",
                Some("{a}+{b}"),
            ),
            ("\\boxed{\\{1, 2\\}}", Some("\\{1, 2\\}")),
            ("\\boxed{7} and a truncated \\boxed{8", Some("7")),
            (
                "The answer is 42. The answer is 42 too, really",
                Some("42 too, really"),
            ),
            ("Thinking 3 then 5.\nThe answer is 42.", Some("42")),
            ("The answer is\n\nThe final answer is", None),
            ("The answer is\n\nThe final answer is 6", Some("6")),
            ("the final answer is $\\frac{3}{4}$.", Some("\\frac{3}{4}")),
            ("THE ANSWER IS: **17**", Some("17")),
            ("**Answer:** $12.50", Some("$12.50")),
            ("Answer: 3.5 liters\nmore text with 9", Some("3.5 liters")),
            ("my answer isn't 3; it is 4", Some("4")),
            ("Natalia sold 48 clips.\n#### 1,234", Some("1,234")),
            // A calculation stated as the answer is its result.
            ("So the answer is 2 x 2 = 4 bolts.", Some("4 bolts")),
            ("#### 16 - 3 - 4 = 9", Some("9")),
            (
                "Answer: 3 + 5 = 8, so he has 8\nmore",
                Some("8, so he has 8"),
            ),
            ("The answer is x = 5.", Some("5")),
            ("The answer is 5 =", Some("5 =")),
            ("The answer is 5 but \\boxed{6}", Some("6")),
            ("he had 3 apples and ate -2.5 of them", Some("-2.5")),
            ("pages 5-3 gives 1/2", Some("1/2")),
            ("it costs 1,000,000 dollars", Some("1,000,000")),
            ("no digits here", None),
            ("", None),
        ];
        for &(text, want) in cases {
            assert_eq!(extract_answer(text).as_deref(), want, "text: {text:?}");
        }
    }

    #[test]
    fn numbers_normalize_the_way_answers_are_written() {
        let cases: &[(&str, Option<f64>)] = &[
            ("1,234", Some(1234.0)),
            ("1,234,567.5", Some(1_234_567.5)),
            ("$12.50", Some(12.5)),
            ("\\$12.50", Some(12.5)),
            ("-$3", Some(-3.0)),
            ("-3", Some(-3.0)),
            ("\u{2212}3", Some(-3.0)),
            ("+4", Some(4.0)),
            ("3.0", Some(3.0)),
            (".5", Some(0.5)),
            ("50%", Some(50.0)),
            ("50\\%", Some(50.0)),
            ("1/2", Some(0.5)),
            ("\\frac{1}{2}", Some(0.5)),
            ("-\\dfrac{3}{4}", Some(-0.75)),
            ("\\frac12", Some(0.5)),
            ("$\\frac{1}{4}$", Some(0.25)),
            ("1e3", Some(1000.0)),
            ("2.5E-2", Some(0.025)),
            ("12 apples", Some(12.0)),
            ("5cm", Some(5.0)),
            ("90^\\circ", Some(90.0)),
            ("12 \\text{ apples}", Some(12.0)),
            ("x = 5", Some(5.0)),
            ("**7**", Some(7.0)),
            ("7.", Some(7.0)),
            ("2^3", None),
            ("5x", None),
            ("1, 2, 3", None),
            ("1,23", None),
            ("5 + 3", None),
            ("2 x 3", None),
            ("4 X 2 bolts", None),
            ("4 bolts of blue fiber in total", Some(4.0)),
            ("3 x-rays", Some(3.0)),
            ("1/0", None),
            ("\\frac{\\sqrt{2}}{2}", None),
            ("x^2 + 1", None),
            ("apples", None),
            ("", None),
        ];
        for &(text, want) in cases {
            assert_eq!(normalize_number(text), want, "text: {text:?}");
        }
    }

    #[test]
    fn answers_match_numerically_or_as_text() {
        let same = [
            ("1,234", "1234"),
            ("$12.50", "12.5"),
            ("0.5", "\\frac{1}{2}"),
            ("3", "3.0000000001"),
            ("1e-12", "0"),
            ("50%", "50"),
            ("\\text{Paris}", "paris."),
            ("$x^2 + 1$", "x^2+1"),
            ("(B)", "b"),
            ("\\left( 1, 2 \\right)", "(1,2)"),
            ("\\dfrac{\\pi}{2}", "\\frac{\\pi}{2}"),
        ];
        for (a, b) in same {
            assert!(answers_match(a, b), "{a:?} should match {b:?}");
            assert!(answers_match(b, a), "{b:?} should match {a:?}");
        }
        let different = [
            ("3", "3.01"),
            ("x+1", "x-1"),
            ("(1,2)", "[1,2]"),
            ("5", "five"),
            ("2^3", "2"),
            ("1,2", "12"),
        ];
        for (a, b) in different {
            assert!(!answers_match(a, b), "{a:?} should not match {b:?}");
        }
    }
}
