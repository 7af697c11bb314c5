//! JSON text the way chat templates expect it: Python's `json.dumps` as
//! Hugging Face's template environment (and llama.cpp's Jinja engine after it)
//! calls it for `tojson`: `", "` and `": "` between items without `indent`,
//! `","` and `": "` with it, keys in their given order, non-ASCII kept as is,
//! nothing HTML-escaped. minijinja's own `tojson` writes compact, HTML-safe
//! JSON, so a template's tool list would render differently from the
//! prompt the model was trained on.

use serde_json::Value;

/// Separators and indentation of one `tojson` call.
#[derive(Debug, Clone)]
pub struct Style {
    /// Spaces per level; `None` writes everything on one line.
    pub indent: Option<usize>,
    /// Between items of an array or object.
    pub item_sep: String,
    /// Between a key and its value.
    pub key_sep: String,
    /// Escape non-ASCII characters as `\uXXXX` (`ensure_ascii=True`).
    pub ensure_ascii: bool,
}

impl Style {
    /// Python's defaults for the given `indent`.
    pub fn python(indent: Option<usize>) -> Self {
        Self {
            indent,
            item_sep: if indent.is_some() { "," } else { ", " }.to_string(),
            key_sep: ": ".to_string(),
            ensure_ascii: false,
        }
    }
}

/// `value` as `json.dumps(value, ...)` with `style` writes it.
pub fn dumps(value: &Value, style: &Style) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style, 0);
    out
}

fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s, style.ensure_ascii),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Object(map) if map.is_empty() => out.push_str("{}"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                write_value(out, item, style, depth + 1);
            }
            newline(out, style, depth);
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                write_string(out, k, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_value(out, v, style, depth + 1);
            }
            newline(out, style, depth);
            out.push('}');
        }
    }
}

/// Integers as integers; floats as Python's `repr` (shortest round trip, with
/// a `.0` on integral values).
fn write_number(out: &mut String, n: &serde_json::Number) {
    if n.is_i64() || n.is_u64() {
        out.push_str(&n.to_string());
        return;
    }
    let f = n.as_f64().unwrap_or(0.0);
    if f.is_finite() && f == f.trunc() && f.abs() < 1e16 {
        out.push_str(&format!("{f:.1}"));
    } else {
        out.push_str(&f.to_string());
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_line_with_python_separators() {
        let v = json!({"name": "get_weather", "args": [1, 2.5, true, null], "q": "é\"\n"});
        assert_eq!(
            dumps(&v, &Style::python(None)),
            r#"{"name": "get_weather", "args": [1, 2.5, true, null], "q": "é\"\n"}"#
        );
    }

    #[test]
    fn indented_like_python() {
        let v = json!({"a": [1, {"b": {}}], "c": []});
        assert_eq!(
            dumps(&v, &Style::python(Some(2))),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": {}\n    }\n  ],\n  \"c\": []\n}"
        );
    }

    #[test]
    fn integral_floats_keep_their_point_and_ascii_escapes() {
        let v = json!([3.0, "ü😀"]);
        let style = Style {
            ensure_ascii: true,
            ..Style::python(None)
        };
        assert_eq!(dumps(&v, &style), r#"[3.0, "\u00fc\ud83d\ude00"]"#);
    }
}
