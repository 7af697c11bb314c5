//! Unit tests a model wrote, read out of its replies: the CodeRM setting,
//! where the judge of N candidate programs is not a hidden test suite but
//! tests written for the problem by a model (`reasoning::unit_tests` asks for
//! them through the engine; this file never talks to the engine).
//!
//! A reply is read as a script: its Python blocks (or the whole reply when it
//! has none), and in them every top-level `assert` statement (and those of an
//! `if __name__ == "__main__":` block) is one test, and every `def test_*()`
//! function (or `def check(candidate):`, HumanEval's own shape) is one test
//! that is defined, then called. A test carries the reply's imports and the
//! plain assignments the script made before it (`nums = [1, 2]`), so a test
//! that names a variable set above it runs as the script would have; other
//! top-level code (the model's own solution, prints, loops) is left out, so
//! the candidate's functions are the ones tested.
//!
//! Nothing here decides whether a test is well formed: a test with a syntax
//! error, a wrong expectation or an endless loop is simply a test every
//! candidate fails (the sandbox reports it as a crash or a timeout), never an
//! error of the run.

use std::collections::HashSet;

use super::judge::{JudgeReport, Verdict};

/// Every test in one model reply, in the order the reply states them.
pub fn parse_tests(reply: &str) -> Vec<String> {
    let mut tests = Vec::new();
    for block in python_blocks(reply) {
        let lines: Vec<&str> = block.lines().collect();
        let imports: Vec<String> = statements(&lines)
            .into_iter()
            .filter(|s| is_import(s))
            .collect();
        read_script(&lines, &imports, &[], &mut tests);
    }
    tests
}

/// `test` reduced to what makes two tests the same test: its imports, an
/// assertion's message (`assert f(1) == 2, "case 1"`), and whitespace and
/// comments outside string literals are dropped; string literals are kept
/// as written. So `assert f(1)==2` and `import math\nassert f(1) == 2, "one"`
/// are one test.
pub fn normalize_test(test: &str) -> String {
    let lines: Vec<&str> = test.lines().collect();
    let mut kept: Vec<String> = Vec::new();
    for stmt in statements(&lines) {
        if is_import(&stmt) {
            continue;
        }
        let stmt = if is_assert(&stmt) {
            without_message(&stmt)
        } else {
            &stmt
        };
        kept.push(squeeze(stmt));
    }
    // Indented lines (a test function's body) are not top-level statements:
    // keep them too, so two functions with different bodies stay apart.
    let body: String = lines
        .iter()
        .filter(|l| indent(l) > 0)
        .map(|l| squeeze(l))
        .collect::<Vec<_>>()
        .join("\n");
    if !body.is_empty() {
        kept.push(body);
    }
    kept.join("\n")
}

/// `code` without whitespace or comments outside string literals.
fn squeeze(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    lex(code, |c, at| match at {
        Where::String => out.push(c),
        Where::Code if !c.is_whitespace() => out.push(c),
        _ => {}
    });
    out
}

/// An `assert` statement up to its message: the text before its first comma
/// outside brackets and strings.
fn without_message(stmt: &str) -> &str {
    let mut depth = 0;
    let mut chars = 0;
    let mut cut = None;
    lex(stmt, |c, at| {
        if cut.is_none() && at == Where::Code {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                ',' if depth == 0 => cut = Some(chars),
                _ => {}
            }
        }
        chars += 1;
    });
    match cut {
        Some(n) => {
            let byte = stmt.char_indices().nth(n).map_or(stmt.len(), |(b, _)| b);
            &stmt[..byte]
        }
        None => stmt,
    }
}

/// At most `k` distinct tests from the replies' tests (`per_reply[r]` in the
/// order reply `r` states them), taken round-robin: every reply's first
/// test, then every reply's second, so one long reply does not fill the
/// budget with its own cases. Duplicates (by [`normalize_test`]) are
/// skipped, so fewer than `k` come back when the replies repeat each other.
pub fn pick_tests(per_reply: &[Vec<String>], k: usize) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut picked = Vec::new();
    let rounds = per_reply.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..rounds {
        for tests in per_reply {
            if picked.len() == k {
                return picked;
            }
            let Some(test) = tests.get(round) else {
                continue;
            };
            if seen.insert(normalize_test(test)) {
                picked.push(test.clone());
            }
        }
    }
    picked
}

/// One row of a pass matrix: a character per test, in test order: `P`
/// passed, `F` an assertion failed (or the program left early), `T` timed
/// out, `E` any other error (a syntax error in the test or the program, an
/// exception, a denied call). Only `P` counts toward a candidate's reward.
pub fn matrix_row(report: &JudgeReport) -> String {
    report
        .verdicts
        .iter()
        .map(|v| match v {
            Verdict::Pass => 'P',
            Verdict::Fail { .. } => 'F',
            Verdict::Timeout => 'T',
            Verdict::Crash { .. } => 'E',
        })
        .collect()
}

/// The Python in `reply`: the body of every fenced block marked `python`
/// (`py`, `python3`) or unmarked, an unclosed last one included; the whole
/// reply when it has no fence.
fn python_blocks(reply: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, Vec<&str>)> = None;
    let mut fenced = false;
    for line in reply.lines() {
        let fence = line.trim();
        match open.as_mut() {
            None => {
                if let Some(info) = fence.strip_prefix("```") {
                    fenced = true;
                    let lang = info
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_ascii_lowercase();
                    let python = matches!(lang.as_str(), "" | "python" | "py" | "python3");
                    open = Some((python, Vec::new()));
                }
            }
            Some((python, body)) => {
                if fence.starts_with("```") && fence.bytes().all(|b| b == b'`') {
                    if *python {
                        blocks.push(body.join("\n"));
                    }
                    open = None;
                } else {
                    body.push(line);
                }
            }
        }
    }
    if let Some((true, body)) = open {
        blocks.push(body.join("\n"));
    }
    if !fenced {
        blocks.push(reply.to_string());
    }
    blocks
}

/// Reads the top level of `lines` (one script, or the dedented body of its
/// `__main__` block) into `tests`: each test is `imports`, the assignments
/// made before it (`setup`, then this level's own), then the test.
fn read_script(lines: &[&str], imports: &[String], setup: &[String], tests: &mut Vec<String>) {
    let mut setup = setup.to_vec();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        let code = line.trim_start();
        if code.is_empty() || code.starts_with('#') || indent(line) > 0 {
            // Blank, a comment, or an indented line with no statement of
            // its own at this level (the rest of a block already read).
            at += 1;
            continue;
        }
        let (stmt, next) = statement(lines, at);
        if let Some(class) = test_case_class(code) {
            // A unittest class: each `test*` method is a test, run through
            // `TestCase.debug()` (setUp, the method, tearDown; a failure raises).
            let end = block_end(lines, at);
            let block = lines[at..end].join("\n");
            let body = &lines[at + 1..end];
            let depth = body
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| indent(l))
                .min()
                .unwrap_or(0);
            for l in body.iter().filter(|l| indent(l) == depth) {
                if let Some(method) = def_name(l.trim_start()).filter(|m| m.starts_with("test")) {
                    let run = format!("{}\n{class}(\"{method}\").debug()", block.trim_end());
                    tests.push(assemble(imports, &setup, &run));
                }
            }
            at = end;
            continue;
        }
        if let Some(name) = def_name(code) {
            let end = block_end(lines, at);
            let call = if name.starts_with("test") && code.contains(&format!("{name}()")) {
                Some(format!("{name}()"))
            } else if code.starts_with("def check(candidate)") {
                Some("check(candidate)".to_string())
            } else {
                None
            };
            if let Some(call) = call {
                let body = lines[at..end].join("\n");
                tests.push(assemble(
                    imports,
                    &setup,
                    &format!("{}\n{call}", body.trim_end()),
                ));
            }
            at = end;
            continue;
        }
        if is_main_guard(code) {
            let end = block_end(lines, at);
            let body: Vec<&str> = lines[at + 1..end].to_vec();
            let depth = body
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| indent(l))
                .min()
                .unwrap_or(0);
            let dedented: Vec<&str> = body
                .iter()
                .map(|l| {
                    if l.len() >= depth {
                        &l[depth..]
                    } else {
                        l.trim_start()
                    }
                })
                .collect();
            read_script(&dedented, imports, &setup, tests);
            at = end;
            continue;
        }
        if is_assert(code) {
            tests.push(assemble(imports, &setup, &stmt));
        } else if is_assignment(code) {
            setup.push(stmt);
        }
        // Anything else at the top level (a class, a loop, a print, a call)
        // is not part of any test; a compound statement's indented body is
        // skipped line by line above.
        at = next;
    }
}

/// A test's text: imports, setup, then `body`.
fn assemble(imports: &[String], setup: &[String], body: &str) -> String {
    let mut parts: Vec<&str> = imports.iter().map(String::as_str).collect();
    parts.extend(setup.iter().map(String::as_str));
    parts.push(body);
    parts.join("\n")
}

/// Every top-level statement of `lines`, whole (continuation lines joined).
fn statements(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if line.trim().is_empty() || indent(line) > 0 {
            at += 1;
            continue;
        }
        let (stmt, next) = statement(lines, at);
        out.push(stmt);
        at = next;
    }
    out
}

/// The statement starting at line `at` and the index of the line after it:
/// it goes on while a bracket or a string is open or a line ends in `\`,
/// but not into a line that starts a statement of its own at the top level
/// (`assert`, `def`, `class`, ...), so one cut-off assertion stays one
/// malformed test instead of swallowing the tests after it.
fn statement(lines: &[&str], at: usize) -> (String, usize) {
    let mut text = lines[at].trim_end().to_string();
    let mut next = at + 1;
    while next < lines.len() && continues(&text) && !starts_statement(lines[next]) {
        text.push('\n');
        text.push_str(lines[next].trim_end());
        next += 1;
    }
    (text, next)
}

/// Whether `text` is an unfinished statement.
fn continues(text: &str) -> bool {
    let (depth, open) = lex(text, |_, _| {});
    depth > 0 || open || text.ends_with('\\')
}

/// The index of the first line after the block opened at line `at`: the
/// following lines that are blank or indented deeper than it.
fn block_end(lines: &[&str], at: usize) -> usize {
    let base = indent(lines[at]);
    let mut end = at + 1;
    let mut last = at + 1;
    while end < lines.len() {
        let l = lines[end];
        if l.trim().is_empty() {
            end += 1;
            continue;
        }
        if indent(l) <= base {
            break;
        }
        end += 1;
        last = end;
    }
    last.min(lines.len())
}

/// A top-level line that can only begin a statement (never continue one).
fn starts_statement(line: &str) -> bool {
    indent(line) == 0
        && [
            "assert ",
            "def ",
            "class ",
            "import ",
            "from ",
            "if ",
            "for ",
            "async def ",
        ]
        .iter()
        .any(|k| line.starts_with(k))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_assert(code: &str) -> bool {
    code.strip_prefix("assert")
        .is_some_and(|rest| rest.starts_with([' ', '(', '\t']))
}

fn is_import(stmt: &str) -> bool {
    stmt.starts_with("import ") || (stmt.starts_with("from ") && stmt.contains(" import "))
}

fn is_main_guard(code: &str) -> bool {
    let c: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    c == "if__name__==\"__main__\":" || c == "if__name__=='__main__':"
}

/// The name of a class a `class` line derives from unittest's `TestCase`.
fn test_case_class(code: &str) -> Option<&str> {
    let rest = code.strip_prefix("class ")?;
    let (name, bases) = rest.split_once('(')?;
    bases.contains("TestCase").then_some(name.trim())
}

/// The function name a `def` line defines.
fn def_name(code: &str) -> Option<&str> {
    let rest = code
        .strip_prefix("def ")
        .or_else(|| code.strip_prefix("async def "))?;
    let name = rest.split('(').next()?.trim();
    (!name.is_empty()).then_some(name)
}

/// `name = ...` or `a, b = ...` (not `==`, not an augmented `+=`).
fn is_assignment(code: &str) -> bool {
    let Some(eq) = code.find('=') else {
        return false;
    };
    let (target, rest) = (&code[..eq], &code[eq + 1..]);
    !rest.starts_with('=')
        && !target.is_empty()
        && target
            .trim_end()
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ',' || c == ' ')
        && !target.trim().is_empty()
        && !target
            .trim_start()
            .starts_with(|c: char| c.is_ascii_digit())
}

/// Where a character of Python source stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Code,
    /// Inside a string literal, its quotes included.
    String,
    /// A `#` comment, to the end of its line.
    Comment,
}

/// Just enough of Python's lexer to tell code from string literals and
/// comments (single, double and triple quotes, backslash escapes): shows
/// `visit` every character with where it stands, and returns the bracket
/// depth at the end and whether a string is still open there.
fn lex(text: &str, mut visit: impl FnMut(char, Where)) -> (i32, bool) {
    let chars: Vec<char> = text.chars().collect();
    let mut depth = 0;
    // The open string's quote character and length (1 or 3).
    let mut quote: Option<(char, usize)> = None;
    let mut i = 0;
    let triple = |i: usize, q: char| {
        chars
            .get(i..i + 3)
            .is_some_and(|s| s.iter().all(|&c| c == q))
    };
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some((q, len)) => {
                if c == '\\' {
                    visit(c, Where::String);
                    if let Some(&d) = chars.get(i + 1) {
                        visit(d, Where::String);
                    }
                    i += 2;
                    continue;
                }
                if c == q && (len == 1 || triple(i, q)) {
                    for _ in 0..len {
                        visit(q, Where::String);
                    }
                    quote = None;
                    i += len;
                    continue;
                }
                if len == 1 && c == '\n' {
                    // An unterminated one-line string ends with its line.
                    quote = None;
                    visit(c, Where::Code);
                } else {
                    visit(c, Where::String);
                }
                i += 1;
            }
            None => {
                match c {
                    '#' => {
                        while i < chars.len() && chars[i] != '\n' {
                            visit(chars[i], Where::Comment);
                            i += 1;
                        }
                        continue;
                    }
                    '\'' | '"' => {
                        let len = if triple(i, c) { 3 } else { 1 };
                        for _ in 0..len {
                            visit(c, Where::String);
                        }
                        quote = Some((c, len));
                        i += len;
                        continue;
                    }
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth -= 1,
                    _ => {}
                }
                visit(c, Where::Code);
                i += 1;
            }
        }
    }
    (depth, quote.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asserts_in_a_fence_are_tests_and_the_solution_is_left_out() {
        let reply = "Here are tests:\n```python\nimport math\n\ndef add(a, b):\n    return a + b\n\n# simple\nassert add(2, 3) == 5\nassert add(\n    -1, 1) == 0, \"zero\"\nprint(add(1, 1))\n```\nDone.";
        assert_eq!(
            parse_tests(reply),
            vec![
                "import math\nassert add(2, 3) == 5".to_string(),
                "import math\nassert add(\n    -1, 1) == 0, \"zero\"".to_string(),
            ]
        );
    }

    #[test]
    fn test_functions_are_called_and_main_blocks_are_read() {
        let reply = "```python\ndef test_empty():\n    assert f([]) == []\n\n    assert f([1]) == [1]\n\ndef helper(x):\n    return x\n\ndef check(candidate):\n    assert candidate(2) == 2\n\nif __name__ == \"__main__\":\n    xs = [3, 1]\n    assert f(xs) == [1, 3]\n    test_empty()\n```";
        assert_eq!(
            parse_tests(reply),
            vec![
                "def test_empty():\n    assert f([]) == []\n\n    assert f([1]) == [1]\ntest_empty()"
                    .to_string(),
                "def check(candidate):\n    assert candidate(2) == 2\ncheck(candidate)".to_string(),
                "xs = [3, 1]\nassert f(xs) == [1, 3]".to_string(),
            ]
        );
        // A test function that takes arguments cannot be called bare.
        assert!(parse_tests("def test_x(a):\n    assert a\n").is_empty());
    }

    #[test]
    fn unittest_methods_are_tests_run_through_debug() {
        let reply = "```python\nimport unittest\n\nclass TestF(unittest.TestCase):\n    def setUp(self):\n        self.x = 1\n\n    def test_one(self):\n        self.assertEqual(f(self.x), 1)\n\n    def test_two(self):\n        self.assertTrue(f(2))\n\nif __name__ == \"__main__\":\n    unittest.main()\n```";
        let tests = parse_tests(reply);
        assert_eq!(tests.len(), 2, "{tests:?}");
        assert!(tests[0].starts_with("import unittest\nclass TestF(unittest.TestCase):"));
        assert!(tests[0].ends_with("self.assertTrue(f(2))\nTestF(\"test_one\").debug()"));
        assert!(tests[1].ends_with("TestF(\"test_two\").debug()"));
    }

    #[test]
    fn assignments_before_an_assert_are_its_setup() {
        let reply = "nums = [1.0, 2.0]\nthreshold = 0.5\nassert close(nums, threshold) == False\nresult = close([1.0, 1.1], 0.2)\nassert result == True\nfor x in nums:\n    assert x > 0\n";
        let tests = parse_tests(reply);
        assert_eq!(tests.len(), 2, "{tests:?}");
        assert_eq!(
            tests[0],
            "nums = [1.0, 2.0]\nthreshold = 0.5\nassert close(nums, threshold) == False"
        );
        assert!(tests[1].ends_with("result = close([1.0, 1.1], 0.2)\nassert result == True"));
    }

    #[test]
    fn brackets_and_hashes_inside_strings_do_not_confuse_the_reader() {
        let reply = "assert f(\"(#\") == ')'\nassert g('''a\n]''') == 1\nassert h('x') == 2  # (\n";
        assert_eq!(
            parse_tests(reply),
            vec![
                "assert f(\"(#\") == ')'".to_string(),
                "assert g('''a\n]''') == 1".to_string(),
                "assert h('x') == 2  # (".to_string(),
            ]
        );
    }

    #[test]
    fn a_reply_cut_mid_assert_keeps_the_cut_test() {
        // Malformed tests are not dropped here: the sandbox fails them.
        let tests = parse_tests("```python\nassert f(1) == 1\nassert f([1, 2,\n");
        assert_eq!(tests.len(), 2);
        assert_eq!(tests[1], "assert f([1, 2,");
        assert!(parse_tests("no code at all, sorry").is_empty());
    }

    #[test]
    fn normalizing_drops_spacing_and_comments_but_not_strings() {
        assert_eq!(
            normalize_test("assert f(1) == 2  # one"),
            normalize_test("assert f(1)==2")
        );
        assert_ne!(
            normalize_test("assert f('a b') == 1"),
            normalize_test("assert f('ab') == 1")
        );
        assert_eq!(normalize_test("assert s == '# x'"), "asserts=='# x'");
        // Imports and an assertion's message do not make another test.
        assert_eq!(
            normalize_test("from typing import List\nassert f([1, 2]) == 3, \"case 1\""),
            normalize_test("assert f([1, 2]) == 3")
        );
        assert_ne!(
            normalize_test("assert f(1, 2) == 3"),
            normalize_test("assert f(1) == 3")
        );
        // Test functions with different bodies stay apart.
        assert_ne!(
            normalize_test("def test_a():\n    assert f(1) == 1\ntest_a()"),
            normalize_test("def test_a():\n    assert f(2) == 2\ntest_a()")
        );
    }

    #[test]
    fn picking_goes_round_robin_skips_duplicates_and_caps_at_k() {
        let r = |ts: &[&str]| ts.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        let replies = vec![
            r(&["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"]),
            r(&["assert f(1)==1", "assert f(4) == 4"]),
            r(&[]),
            r(&["assert f(5) == 5"]),
        ];
        assert_eq!(
            pick_tests(&replies, 10),
            r(&[
                "assert f(1) == 1",
                "assert f(5) == 5",
                "assert f(2) == 2",
                "assert f(4) == 4",
                "assert f(3) == 3"
            ])
        );
        assert_eq!(
            pick_tests(&replies, 2),
            r(&["assert f(1) == 1", "assert f(5) == 5"])
        );
        assert!(pick_tests(&[], 4).is_empty());
    }

    /// Parsed tests run in the real sandbox: an assert, a unittest method
    /// and a test function pass on a right program; a malformed test and an
    /// endless one are verdicts the candidate fails, not errors of the run.
    #[test]
    fn parsed_tests_run_in_the_sandbox_and_bad_ones_only_fail() {
        if let Err(e) = crate::verify::check() {
            panic!("{e}");
        }
        let reply = "```python\nimport unittest\nassert add(2, 3) == 5\nassert add(1, 1) == 3\nassert add(1,\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(add(0, 0), 0)\n\ndef test_loop():\n    while True:\n        pass\n```";
        let tests = parse_tests(reply);
        assert_eq!(tests.len(), 5, "{tests:?}");
        let limits = crate::verify::Limits {
            time: std::time::Duration::from_secs(1),
            ..crate::verify::Limits::default()
        };
        let program = "def add(a, b):\n    return a + b\n";
        let report = crate::verify::judge_python(program, &tests, &limits).expect("judge runs");
        // The cut `assert add(1,` is a test of its own, an error for everyone.
        assert_eq!(matrix_row(&report), "PFEPT", "{report:?}");
    }

    #[test]
    fn a_matrix_row_has_a_letter_per_verdict() {
        let report = JudgeReport {
            passed: 1,
            total: 4,
            verdicts: vec![
                Verdict::Pass,
                Verdict::Fail { reason: "x".into() },
                Verdict::Timeout,
                Verdict::Crash { stderr: "y".into() },
            ],
        };
        assert_eq!(matrix_row(&report), "PFTE");
    }
}
