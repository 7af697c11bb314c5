//! GBNF (llama.cpp's grammar format) translated to llguidance's Lark
//! dialect, so clients written for llama-server can send their `grammar`
//! unchanged while Tern enforces it with the same llguidance engine as its
//! other constraints.
//!
//! Covered: rules `name ::= ...` (`root` is the start), alternatives `|`,
//! grouping `( ... )`, `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`,
//! string literals with llama.cpp's escapes (`\n`, `\r`, `\t`, `\\`, `\"`,
//! `\[`, `\]`, `\xHH`, `\uHHHH`, `\UHHHHHHHH`), character classes with
//! ranges and negation `[^...]`, `.` (any character) and `#` comments.
//! Token references (`<...>`, `!<...>`) are refused by name; so is any
//! other construct the parser does not know.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// Why a GBNF grammar cannot be translated; each message says where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GbnfError {
    /// The text does not parse as GBNF.
    #[error("GBNF syntax error at line {line}, column {col}: {msg}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column (characters).
        col: usize,
        /// What was expected or found.
        msg: String,
    },
    /// A construct GBNF has that the translation does not support.
    #[error("GBNF {what} (line {line}) is not supported")]
    Unsupported {
        /// The construct, named.
        what: &'static str,
        /// 1-based line.
        line: usize,
    },
    /// No `root` rule.
    #[error("GBNF grammar has no `root` rule")]
    NoRoot,
    /// A rule refers to a name no rule defines.
    #[error("GBNF rule `{rule}` refers to undefined rule `{name}`")]
    Undefined {
        /// The rule the reference is in.
        rule: String,
        /// The undefined name.
        name: String,
    },
    /// Two rules share a name.
    #[error("GBNF rule `{0}` is defined twice")]
    Duplicate(String),
}

/// Translates a GBNF grammar into a Lark grammar whose `start` is its `root`.
pub fn gbnf_to_lark(src: &str) -> Result<String, GbnfError> {
    let rules = Parser::new(src).grammar()?;
    let defined: HashSet<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    if !defined.contains("root") {
        return Err(GbnfError::NoRoot);
    }
    for r in &rules {
        let mut refs = Vec::new();
        collect_refs(&r.body, &mut refs);
        if let Some(name) = refs.into_iter().find(|n| !defined.contains(n.as_str())) {
            return Err(GbnfError::Undefined {
                rule: r.name.clone(),
                name,
            });
        }
    }
    let names = lark_names(&rules);
    let mut out = String::new();
    // `start` first, then the rest in the order given.
    let root = rules.iter().position(|r| r.name == "root").unwrap_or(0);
    let order = std::iter::once(root).chain((0..rules.len()).filter(|&i| i != root));
    for i in order {
        let r = &rules[i];
        let _ = writeln!(out, "{}: {}", names[&r.name], emit_alts(&r.body, &names));
    }
    Ok(out)
}

/// One rule: its name and alternatives.
struct Rule {
    name: String,
    body: Alts,
}

/// Alternatives, each a sequence.
type Alts = Vec<Vec<Node>>;

/// One element of a sequence.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    /// A literal string (possibly empty).
    Lit(String),
    /// A character class: inclusive ranges, negated or not.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `.`: any one character.
    Any,
    /// A rule reference.
    Ref(String),
    /// `( ... )`.
    Group(Alts),
    /// A repetition of its node, `min` to `max` (`None`: unbounded) times.
    Repeat(Box<Node>, u32, Option<u32>),
}

fn collect_refs(alts: &Alts, out: &mut Vec<String>) {
    for node in alts.iter().flatten() {
        collect_node(node, out);
    }
}

fn collect_node(node: &Node, out: &mut Vec<String>) {
    match node {
        Node::Ref(n) => out.push(n.clone()),
        Node::Group(a) => collect_refs(a, out),
        Node::Repeat(n, ..) => collect_node(n, out),
        Node::Lit(_) | Node::Class { .. } | Node::Any => {}
    }
}

/// Lark names for the GBNF rules: `root` becomes `start`; a name that is
/// already a valid lowercase Lark name (`a-z` first, then `a-z`, `0-9`,
/// `-`) stays; any other (uppercase letters would make a Lark terminal, a
/// digit may lead in GBNF) becomes `x_N_` plus its lowercased form. GBNF
/// names have no `_`, so these never collide with the kept ones.
fn lark_names(rules: &[Rule]) -> HashMap<String, String> {
    let mut names = HashMap::new();
    for (i, r) in rules.iter().enumerate() {
        let n = &r.name;
        let plain = n.starts_with(|c: char| c.is_ascii_lowercase())
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        let lark = if n == "root" {
            "start".to_string()
        } else if plain && n != "start" {
            n.clone()
        } else {
            format!("x_{i}_{}", n.to_ascii_lowercase())
        };
        names.insert(n.clone(), lark);
    }
    names
}

fn emit_alts(alts: &Alts, names: &HashMap<String, String>) -> String {
    alts.iter()
        .map(|seq| emit_seq(seq, names))
        .collect::<Vec<_>>()
        .join(" | ")
}

fn emit_seq(seq: &[Node], names: &HashMap<String, String>) -> String {
    let parts: Vec<String> = seq
        .iter()
        .filter(|n| !matches!(n, Node::Lit(s) if s.is_empty()))
        .map(|n| emit_node(n, names))
        .collect();
    if parts.is_empty() {
        // The empty string.
        "\"\"".to_string()
    } else {
        parts.join(" ")
    }
}

fn emit_node(node: &Node, names: &HashMap<String, String>) -> String {
    match node {
        Node::Lit(s) => lark_string(s),
        Node::Class { negated, ranges } => {
            let mut re = String::from("/[");
            if *negated {
                re.push('^');
            }
            for &(a, b) in ranges {
                re.push_str(&class_char(a));
                if a != b {
                    re.push('-');
                    re.push_str(&class_char(b));
                }
            }
            re.push_str("]/");
            re
        }
        Node::Any => "/(?s:.)/".to_string(),
        Node::Ref(n) => names[n].clone(),
        Node::Group(a) => format!("({})", emit_alts(a, names)),
        Node::Repeat(inner, min, max) => {
            let base = match inner.as_ref() {
                Node::Group(_) | Node::Lit(_) | Node::Class { .. } | Node::Any | Node::Ref(_) => {
                    emit_node(inner, names)
                }
                Node::Repeat(..) => format!("({})", emit_node(inner, names)),
            };
            match (min, max) {
                (0, None) => format!("{base}*"),
                (1, None) => format!("{base}+"),
                (0, Some(1)) => format!("{base}?"),
                (m, None) => format!("{base}{{{m},}}"),
                (m, Some(n)) if m == n => format!("{base}{{{m}}}"),
                (m, Some(n)) => format!("{base}{{{m},{n}}}"),
            }
        }
    }
}

/// A Lark string literal: JSON-style escapes for `"`, `\` and control
/// characters (which the Lark lexer does not take raw), everything else raw.
fn lark_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a regex class: ASCII letters and digits raw, the
/// rest as `\x{H}` so no class or Lark delimiter needs thought.
fn class_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\x{{{:x}}}", c as u32)
    }
}

/// Recursive-descent parser over the GBNF text.
struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Self { src, pos: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.src[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn line(&self) -> usize {
        self.src[..self.pos].matches('\n').count() + 1
    }

    fn err(&self, msg: impl Into<String>) -> GbnfError {
        let before = &self.src[..self.pos];
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError::Syntax {
            line: self.line(),
            col,
            msg: msg.into(),
        }
    }

    /// Skips spaces, tabs, newlines and `#` comments.
    fn space(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => {
                    while let Some(c) = self.bump() {
                        if c == '\n' {
                            break;
                        }
                    }
                }
                _ => return,
            }
        }
    }

    fn is_name_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-'
    }

    fn name(&mut self) -> Option<String> {
        let len: usize = self
            .rest()
            .chars()
            .take_while(|&c| Self::is_name_char(c))
            .map(char::len_utf8)
            .sum();
        if len == 0 {
            return None;
        }
        let n = self.rest()[..len].to_string();
        self.pos += len;
        Some(n)
    }

    /// Whether a rule definition (`name ::=`) starts here.
    fn at_rule_start(&self) -> bool {
        let mut p = Parser {
            src: self.src,
            pos: self.pos,
        };
        if p.name().is_none() {
            return false;
        }
        p.space();
        p.rest().starts_with("::=")
    }

    fn grammar(&mut self) -> Result<Vec<Rule>, GbnfError> {
        let mut rules: Vec<Rule> = Vec::new();
        self.space();
        while self.peek().is_some() {
            let name = self
                .name()
                .ok_or_else(|| self.err("expected a rule name"))?;
            self.space();
            if !self.rest().starts_with("::=") {
                return Err(self.err(format!("expected `::=` after rule name `{name}`")));
            }
            self.pos += 3;
            let body = self.alternates(false)?;
            if rules.iter().any(|r| r.name == name) {
                return Err(GbnfError::Duplicate(name));
            }
            rules.push(Rule { name, body });
            self.space();
        }
        Ok(rules)
    }

    /// Alternatives up to `)` (nested) or the next rule / the end (top level).
    fn alternates(&mut self, nested: bool) -> Result<Alts, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.bump();
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>, GbnfError> {
        let mut seq = Vec::new();
        loop {
            self.space();
            let Some(c) = self.peek() else {
                if nested {
                    return Err(self.err("unclosed `(`"));
                }
                return Ok(seq);
            };
            let node = match c {
                '|' => return Ok(seq),
                ')' if nested => return Ok(seq),
                ')' => return Err(self.err("unmatched `)`")),
                '"' => {
                    self.bump();
                    Node::Lit(self.literal()?)
                }
                '[' => {
                    self.bump();
                    self.class()?
                }
                '.' => {
                    self.bump();
                    Node::Any
                }
                '(' => {
                    self.bump();
                    let alts = self.alternates(true)?;
                    self.space();
                    if self.bump() != Some(')') {
                        return Err(self.err("expected `)`"));
                    }
                    Node::Group(alts)
                }
                '<' | '!' => {
                    return Err(GbnfError::Unsupported {
                        what: "token reference (`<...>` / `!<...>`)",
                        line: self.line(),
                    })
                }
                c if Self::is_name_char(c) => {
                    if !nested && self.at_rule_start() {
                        return Ok(seq);
                    }
                    Node::Ref(self.name().unwrap_or_default())
                }
                '*' | '+' | '?' | '{' => {
                    return Err(self.err(format!("`{c}` with nothing before it to repeat")))
                }
                other => return Err(self.err(format!("unexpected `{other}`"))),
            };
            seq.push(self.postfix(node)?);
        }
    }

    /// `*`, `+`, `?` and `{m,n}` after an element (several may follow).
    fn postfix(&mut self, mut node: Node) -> Result<Node, GbnfError> {
        loop {
            // Postfix operators sit right after their element (spaces allowed).
            let save = self.pos;
            while matches!(self.peek(), Some(' ' | '\t')) {
                self.bump();
            }
            let (min, max) = match self.peek() {
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('?') => (0, Some(1)),
                Some('{') => {
                    self.bump();
                    let r = self.braces()?;
                    node = Node::Repeat(Box::new(node), r.0, r.1);
                    continue;
                }
                _ => {
                    self.pos = save;
                    return Ok(node);
                }
            };
            self.bump();
            node = Node::Repeat(Box::new(node), min, max);
        }
    }

    /// The inside of `{m}`, `{m,}`, `{m,n}` or `{,n}`, past the `{`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let number = |p: &mut Self| -> Result<Option<u32>, GbnfError> {
            while matches!(p.peek(), Some(' ' | '\t')) {
                p.bump();
            }
            let digits: String = p.rest().chars().take_while(char::is_ascii_digit).collect();
            p.pos += digits.len();
            while matches!(p.peek(), Some(' ' | '\t')) {
                p.bump();
            }
            if digits.is_empty() {
                return Ok(None);
            }
            digits
                .parse()
                .map(Some)
                .map_err(|_| p.err(format!("repetition count `{digits}` is too large")))
        };
        let min = number(self)?;
        let (min, max) = match self.bump() {
            Some('}') => {
                let m = min.ok_or_else(|| self.err("expected a number in `{}`"))?;
                (m, Some(m))
            }
            Some(',') => {
                let max = number(self)?;
                if self.bump() != Some('}') {
                    return Err(self.err("expected `}`"));
                }
                (min.unwrap_or(0), max)
            }
            _ => return Err(self.err("expected `,` or `}` in a repetition")),
        };
        if max.is_some_and(|n| n < min) {
            return Err(self.err(format!(
                "repetition {{{min},{}}} has max below min",
                max.unwrap_or(0)
            )));
        }
        Ok((min, max))
    }

    /// A string literal's text, past the opening quote.
    fn literal(&mut self) -> Result<String, GbnfError> {
        let mut s = String::new();
        loop {
            match self.bump() {
                None => return Err(self.err("unterminated string literal")),
                Some('"') => return Ok(s),
                Some('\\') => s.push(self.escape()?),
                Some(c) => s.push(c),
            }
        }
    }

    /// A character class's ranges, past the `[`.
    fn class(&mut self) -> Result<Node, GbnfError> {
        let negated = self.peek() == Some('^');
        if negated {
            self.bump();
        }
        let mut ranges = Vec::new();
        loop {
            let lo = match self.bump() {
                None => return Err(self.err("unterminated character class")),
                Some(']') => break,
                Some('\\') => self.escape()?,
                Some(c) => c,
            };
            let hi = if self.peek() == Some('-') && !self.rest()[1..].starts_with(']') {
                self.bump();
                match self.bump() {
                    None => return Err(self.err("unterminated character class")),
                    Some('\\') => self.escape()?,
                    Some(c) => c,
                }
            } else {
                lo
            };
            if hi < lo {
                return Err(self.err(format!("character range `{lo}-{hi}` is reversed")));
            }
            ranges.push((lo, hi));
        }
        Ok(Node::Class { negated, ranges })
    }

    /// One escape, past the backslash.
    fn escape(&mut self) -> Result<char, GbnfError> {
        let hex = |p: &mut Self, n: usize| -> Result<char, GbnfError> {
            let digits: String = p.rest().chars().take(n).collect();
            if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(p.err(format!("expected {n} hex digits in an escape")));
            }
            p.pos += n;
            u32::from_str_radix(&digits, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| p.err(format!("`{digits}` is not a character")))
        };
        match self.bump() {
            Some('n') => Ok('\n'),
            Some('r') => Ok('\r'),
            Some('t') => Ok('\t'),
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^' | '/')) => Ok(c),
            Some(c) => Err(self.err(format!("unknown escape `\\{c}`"))),
            None => Err(self.err("unterminated escape")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether llguidance, given the translated grammar, accepts `text`
    /// whole and lets it end there (over a byte-level vocabulary, so no
    /// model is needed).
    fn accepts(lark: &str, text: &str) -> bool {
        crate::constraint::byte_vocab::accepts(lark, &[], text)
    }

    const JSON: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

    const ARITHMETIC: &str = r#"
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"#;

    const LIST: &str = r#"
root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
"#;

    #[test]
    fn translates_the_json_grammar() {
        let lark = gbnf_to_lark(JSON).unwrap();
        assert!(lark.starts_with("start: object\n"), "{lark}");
        for ok in [
            r#"{"a": [1, 2.5, -3e7], "b": {"c": "x\n\u00e9"}, "d": true}"#,
            "{}",
            r#"{"k": null}"#,
        ] {
            assert!(accepts(&lark, ok), "{ok}");
        }
        for bad in [r#"{"a": }"#, "[1]", r#"{"a": 01}"#, r#"{"a": "x"#] {
            assert!(!accepts(&lark, bad), "{bad}");
        }
    }

    #[test]
    fn translates_the_arithmetic_and_list_grammars() {
        let lark = gbnf_to_lark(ARITHMETIC).unwrap();
        assert!(accepts(&lark, "x+2*(y-1)= 7\n"), "{lark}");
        assert!(!accepts(&lark, "x+= 7\n"));
        let lark = gbnf_to_lark(LIST).unwrap();
        assert!(accepts(&lark, "- milk\n- eggs\n"), "{lark}");
        assert!(!accepts(&lark, "- milk\n\n"));
        assert!(!accepts(&lark, "* milk\n"));
    }

    #[test]
    fn repetitions_classes_escapes_and_names() {
        let g = r#"
root ::= Greeting-1 " " [^a-c\]]{2,3} "\x41\u00e9" digits? tail
Greeting-1 ::= ("hi" | "yo")   # a comment
digits ::= [0-9]{2}
tail ::= "!"{1,}
"#;
        let lark = gbnf_to_lark(g).unwrap();
        assert!(accepts(&lark, "hi xyzAé12!!"), "{lark}");
        assert!(!accepts(&lark, "yo ]]]Aé!"), "`]` is excluded");
        assert!(accepts(&lark, "yo dd\"Aé!"), "{lark}");
        assert!(!accepts(&lark, "hi ab!Aé!"), "a-c excluded");
        assert!(!accepts(&lark, "hi xyzwAé!"), "at most 3");
        assert!(!accepts(&lark, "hi xyzAé1!"), "digits is exactly 2");
        assert!(!accepts(&lark, "hi xyzAé"), "at least one !");
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = |g: &str| gbnf_to_lark(g).unwrap_err().to_string();
        assert!(e("item ::= \"a\"").contains("no `root`"));
        assert!(e("root ::= item").contains("undefined rule `item`"));
        assert!(e("root ::= <|eot_id|>").contains("token reference"));
        assert!(e("root ::= \"a\"\nroot ::= \"b\"").contains("defined twice"));
        let m = e("root ::= (\"a\"");
        assert!(m.contains("line 1") && m.contains("unclosed"), "{m}");
        let m = e("root ::= \"a\" \\q");
        assert!(m.contains("unexpected `\\`"), "{m}");
        assert!(e("root ::= [a-z]{3,1}").contains("max below min"));
    }
}
