//! Incremental JSON prefix validation for `response_format: json_object`.
//!
//! [`JsonPrefix`] consumes the raw bytes of sampled tokens (byte-level BPE, so
//! a token may end in the middle of a UTF-8 character or an escape) and says
//! whether the text so far can still be extended into one RFC 8259 document
//! whose top-level value is an object. It is exact in both directions: every
//! prefix of such a document is accepted, and every accepted text can still
//! be completed, so constrained sampling never paints itself into a corner.
//!
//! The whole state is a few bytes (a mode plus a `u64` bitset for the nesting
//! stack, capped at [`MAX_DEPTH`]), so [`JsonPrefix::accepts`] simulates on a
//! copy and never allocates; it runs once per vocabulary entry whenever the
//! sampler's first choice is rejected.

/// Deepest nesting of objects and arrays accepted, the top-level object
/// counting as 1; it keeps the nesting stack within one `u64` bitset.
pub const MAX_DEPTH: u8 = 64;

/// Validates, byte by byte, that generated text is a prefix of one JSON object.
///
/// Strings are checked for valid UTF-8 (no overlongs, surrogates or bytes past
/// U+10FFFF) even when a character is split across tokens, and `\u` escapes
/// must pair surrogates as strict parsers such as `serde_json` require.
/// Leading whitespace is allowed; nothing is accepted after the closing `}`.
#[derive(Clone, Debug)]
pub struct JsonPrefix {
    m: Machine,
}

impl JsonPrefix {
    /// Empty document; the top-level value must be an object.
    pub fn new() -> Self {
        Self { m: Machine::new() }
    }

    /// Whether appending `bytes` keeps the text a valid prefix; `self` is unchanged.
    ///
    /// Empty `bytes` are rejected (a token that adds nothing never makes
    /// progress), and so is everything once the object is complete: the engine
    /// stops generating there. Never allocates.
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        let mut m = self.m;
        m.feed(bytes)
    }

    /// Appends `bytes`; returns false (and leaves `self` unchanged) if they are
    /// not [accepted](Self::accepts).
    pub fn advance(&mut self, bytes: &[u8]) -> bool {
        let mut m = self.m;
        let ok = m.feed(bytes);
        if ok {
            self.m = m;
        }
        ok
    }

    /// Whether the top-level object's closing `}` has been consumed, so the
    /// output is a complete JSON object and generation should stop.
    pub fn is_complete(&self) -> bool {
        self.m.mode == Mode::Done
    }
}

impl Default for JsonPrefix {
    /// Same as [`JsonPrefix::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// Where in the grammar the next byte lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Before the top-level `{`; only whitespace or `{`.
    Start,
    /// Right after `{`: a key or `}`.
    ObjectOpen,
    /// After `,` in an object: a key.
    ObjectComma,
    /// After a key: `:`.
    AfterKey,
    /// After `:` or after `,` in an array: a value.
    Value,
    /// Right after `[`: a value or `]`.
    ArrayOpen,
    /// After a complete value: `,` or the enclosing container's closer.
    AfterValue,
    /// Inside a string; `key` says whether it is an object key.
    Str { key: bool, at: Str },
    /// Inside a number.
    Num(Num),
    /// Inside `true`/`false`/`null`; the bytes still due.
    Lit(&'static [u8]),
    /// The top-level object is closed.
    Done,
}

/// Position inside a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Str {
    /// Ordinary characters, or the closing quote.
    Plain,
    /// Right after `\`.
    Escape,
    /// Inside `\uXXXX`: `left` hex digits still due, `value` so far; `low` if
    /// this escape must be the low half of a surrogate pair.
    Hex { left: u8, value: u16, low: bool },
    /// After a high-surrogate escape: the `\` of its low half.
    LowBackslash,
    /// After that `\`: the `u`.
    LowU,
    /// Inside a multi-byte UTF-8 character: `left` continuation bytes due, the
    /// next one in `lo..=hi` (narrowed after some lead bytes to reject
    /// overlongs, surrogates and code points past U+10FFFF).
    Utf8 { left: u8, lo: u8, hi: u8 },
}

/// Position inside `-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpInt,
}

impl Num {
    /// Whether the number may end here.
    fn is_complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpInt)
    }

    /// The state after `b`, or `None` if `b` cannot continue the number.
    fn next(self, b: u8) -> Option<Num> {
        Some(match (self, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus | Num::Int, b'1'..=b'9') | (Num::Int, b'0') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign | Num::ExpInt, b'0'..=b'9') => Num::ExpInt,
            _ => return None,
        })
    }
}

/// The complete, `Copy` validator state: bit `i` of `stack` is set when the
/// container at nesting level `i` is an object (clear for an array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Machine {
    mode: Mode,
    stack: u64,
    depth: u8,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn hex_digit(b: u8) -> Option<u16> {
    (b as char).to_digit(16).map(|d| d as u16)
}

impl Machine {
    const fn new() -> Self {
        Self {
            mode: Mode::Start,
            stack: 0,
            depth: 0,
        }
    }

    /// Consumes `bytes`; on false the state is garbage and must be discarded.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        !bytes.is_empty() && bytes.iter().all(|&b| self.step(b))
    }

    fn step(&mut self, b: u8) -> bool {
        match self.mode {
            Mode::Start => match b {
                b'{' => self.push(true),
                _ => is_ws(b),
            },
            Mode::ObjectOpen => match b {
                b'"' => self.start_key(),
                b'}' => self.close(true),
                _ => is_ws(b),
            },
            Mode::ObjectComma => match b {
                b'"' => self.start_key(),
                _ => is_ws(b),
            },
            Mode::AfterKey => match b {
                b':' => {
                    self.mode = Mode::Value;
                    true
                }
                _ => is_ws(b),
            },
            Mode::Value => self.start_value(b) || is_ws(b),
            Mode::ArrayOpen => match b {
                b']' => self.close(false),
                _ => self.start_value(b) || is_ws(b),
            },
            Mode::AfterValue => self.after_value(b),
            Mode::Str { key, at } => self.string(key, at, b),
            Mode::Num(n) => match n.next(b) {
                Some(n) => {
                    self.mode = Mode::Num(n);
                    true
                }
                // The number ends here; `b` must then follow a value.
                None if n.is_complete() => {
                    self.mode = Mode::AfterValue;
                    self.after_value(b)
                }
                None => false,
            },
            Mode::Lit(rest) => {
                if rest[0] != b {
                    return false;
                }
                self.mode = match rest {
                    [_] => Mode::AfterValue,
                    [_, tail @ ..] => Mode::Lit(tail),
                    [] => unreachable!("literal state always has bytes due"),
                };
                true
            }
            Mode::Done => false,
        }
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && (self.stack >> (self.depth - 1)) & 1 == 1
    }

    fn push(&mut self, object: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        self.stack |= u64::from(object) << self.depth;
        self.depth += 1;
        self.mode = if object {
            Mode::ObjectOpen
        } else {
            Mode::ArrayOpen
        };
        true
    }

    fn close(&mut self, object: bool) -> bool {
        if self.depth == 0 || self.top_is_object() != object {
            return false;
        }
        self.depth -= 1;
        self.stack &= !(1u64 << self.depth);
        self.mode = if self.depth == 0 {
            Mode::Done
        } else {
            Mode::AfterValue
        };
        true
    }

    fn start_key(&mut self) -> bool {
        self.mode = Mode::Str {
            key: true,
            at: Str::Plain,
        };
        true
    }

    fn start_value(&mut self, b: u8) -> bool {
        self.mode = match b {
            b'{' => return self.push(true),
            b'[' => return self.push(false),
            b'"' => Mode::Str {
                key: false,
                at: Str::Plain,
            },
            b'-' => Mode::Num(Num::Minus),
            b'0' => Mode::Num(Num::Zero),
            b'1'..=b'9' => Mode::Num(Num::Int),
            b't' => Mode::Lit(b"rue"),
            b'f' => Mode::Lit(b"alse"),
            b'n' => Mode::Lit(b"ull"),
            _ => return false,
        };
        true
    }

    fn after_value(&mut self, b: u8) -> bool {
        match b {
            b',' => {
                self.mode = if self.top_is_object() {
                    Mode::ObjectComma
                } else {
                    Mode::Value
                };
                true
            }
            b'}' => self.close(true),
            b']' => self.close(false),
            _ => is_ws(b),
        }
    }

    fn string(&mut self, key: bool, at: Str, b: u8) -> bool {
        let utf8 = |left, lo, hi| Str::Utf8 { left, lo, hi };
        let at = match at {
            Str::Plain => match b {
                b'"' => {
                    self.mode = if key {
                        Mode::AfterKey
                    } else {
                        Mode::AfterValue
                    };
                    return true;
                }
                b'\\' => Str::Escape,
                0x00..=0x1f => return false,
                0x20..=0x7f => Str::Plain,
                0xc2..=0xdf => utf8(1, 0x80, 0xbf),
                0xe0 => utf8(2, 0xa0, 0xbf),
                0xe1..=0xec | 0xee..=0xef => utf8(2, 0x80, 0xbf),
                0xed => utf8(2, 0x80, 0x9f),
                0xf0 => utf8(3, 0x90, 0xbf),
                0xf1..=0xf3 => utf8(3, 0x80, 0xbf),
                0xf4 => utf8(3, 0x80, 0x8f),
                _ => return false,
            },
            Str::Utf8 { left, lo, hi } => {
                if !(lo..=hi).contains(&b) {
                    return false;
                }
                if left == 1 {
                    Str::Plain
                } else {
                    utf8(left - 1, 0x80, 0xbf)
                }
            }
            Str::Escape => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Str::Plain,
                b'u' => Str::Hex {
                    left: 4,
                    value: 0,
                    low: false,
                },
                _ => return false,
            },
            Str::LowBackslash if b == b'\\' => Str::LowU,
            Str::LowU if b == b'u' => Str::Hex {
                left: 4,
                value: 0,
                low: true,
            },
            Str::LowBackslash | Str::LowU => return false,
            Str::Hex { left, value, low } => {
                let Some(d) = hex_digit(b) else {
                    return false;
                };
                let value = (value << 4) | d;
                let left = left - 1;
                // Reject as soon as no completion of the escape can be valid,
                // so an accepted prefix is never a dead end.
                let shift = 4 * u32::from(left);
                let (min, max) = (value << shift, (value << shift) | ((1u16 << shift) - 1));
                let all_low = min >= 0xdc00 && max <= 0xdfff;
                let some_low = min <= 0xdfff && max >= 0xdc00;
                if (low && !some_low) || (!low && all_low) {
                    return false;
                }
                match left {
                    0 if !low && (0xd800..=0xdbff).contains(&value) => Str::LowBackslash,
                    0 => Str::Plain,
                    _ => Str::Hex { left, value, low },
                }
            }
        };
        self.mode = Mode::Str { key, at };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Valid documents covering every construct; all must also parse with serde_json.
    const VALID: &[&str] = &[
        "{}",
        " \n\t\r{}",
        r#"{"a":1}"#,
        r#"{"a": [1, -0.5e+10, 1E5, 0, 2.25, -0, 0e0, 10.01E-3, 7e+00, true, false, null, {}, [], "s"]}"#,
        r#"{"nested":{"x":[[],[{}],[[1]],[{"k":[null]}]],"y":{"z":null}},"after":"x"}"#,
        r#"{"esc":"\" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00 \u0000 \uFFFF \uE000"}"#,
        "{\"unicode\":\"h\u{e9}llo w\u{f6}rld \u{65e5}\u{672c}\u{8a9e} \u{1f389} \u{10ffff} \u{7f}\", \"k\u{e9}y\": \"\"}",
        "{\n\t\"ws\" :\r\n [ 1 , 2 ] ,\"b\" : { } \n}",
        r#"{"":""}"#,
        r#"{"a":{"b":{"c":{"d":[1,[2,[3,[4]]]]}}}}"#,
    ];

    /// Tiny deterministic xorshift so tests need no rng crate setup.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn serde_object(bytes: &[u8]) -> Result<bool, serde_json::Error> {
        serde_json::from_slice::<serde_json::Value>(bytes).map(|v| v.is_object())
    }

    /// Whole-input verdict: accepted and complete.
    fn complete_doc(bytes: &[u8]) -> bool {
        let mut p = JsonPrefix::new();
        p.advance(bytes) && p.is_complete()
    }

    /// Greedily finishes the document from `m`; panics if it cannot, which
    /// would mean an accepted prefix is a dead end.
    fn completion(mut m: Machine) -> Vec<u8> {
        let prefs: Vec<u8> = b"\"}]:0"
            .iter()
            .copied()
            .chain(b'a'..=b'z')
            .chain(0x80..=0xbf)
            .chain([b'\\', b'{'])
            .collect();
        let mut out = Vec::new();
        while m.mode != Mode::Done {
            assert!(out.len() < 1000, "completion does not terminate: {m:?}");
            let b = *prefs
                .iter()
                .find(|&&b| {
                    let mut t = m;
                    t.step(b)
                })
                .unwrap_or_else(|| panic!("dead end after accepted prefix: {m:?}"));
            assert!(m.step(b));
            out.push(b);
        }
        out
    }

    #[test]
    fn valid_documents_byte_by_byte() {
        for doc in VALID {
            assert_eq!(serde_object(doc.as_bytes()).ok(), Some(true), "{doc}");
            let bytes = doc.as_bytes();
            let mut p = JsonPrefix::new();
            for (i, b) in bytes.iter().enumerate() {
                assert!(!p.is_complete(), "{doc}: complete early at {i}");
                assert!(p.advance(&[*b]), "{doc}: rejected byte {i}");
            }
            assert!(p.is_complete(), "{doc}");
        }
    }

    #[test]
    fn valid_documents_random_splits() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for doc in VALID {
            let bytes = doc.as_bytes();
            for _ in 0..50 {
                let mut p = JsonPrefix::new();
                let mut i = 0;
                while i < bytes.len() {
                    let n = (1 + rng.below(8)).min(bytes.len() - i);
                    let chunk = &bytes[i..i + n];
                    assert!(!p.is_complete());
                    let before = p.m;
                    assert!(p.accepts(chunk), "{doc}: chunk at {i}");
                    assert_eq!(p.m, before, "accepts mutated the state");
                    assert!(p.advance(chunk));
                    i += n;
                }
                assert!(p.is_complete(), "{doc}");
            }
        }
    }

    #[test]
    fn every_prefix_accepted_and_completable() {
        for doc in VALID {
            let bytes = doc.as_bytes();
            for i in 1..=bytes.len() {
                let mut p = JsonPrefix::new();
                assert!(p.accepts(&bytes[..i]), "{doc}: prefix {i}");
                assert!(p.advance(&bytes[..i]));
                if i < bytes.len() {
                    assert!(p.accepts(&bytes[i..]), "{doc}: suffix {i}");
                    let mut full = bytes[..i].to_vec();
                    full.extend(completion(p.m));
                    assert_eq!(serde_object(&full).ok(), Some(true), "{full:?}");
                }
            }
        }
    }

    #[test]
    fn invalid_prefixes_rejected() {
        let cases: &[&[u8]] = &[
            b"[",
            b"\"x\"",
            b"{,",
            b"{\"a\" 1}",
            b"{\"a\":01}",
            b"{\"a\":1,}",
            b"{\"a\":tru e}",
            b"{\"a\":\"\\q\"}",
            b"{\"a\":\"\x01\"}",
            b"{\"a\":\"line\nbreak\"}",
            b"{\"a\":1}}",
            b"{\"a\":1} ",
            b"{\"a\":\"\xff\"}",
            b"{\"a\":\"\x80\"}",
            b"{\"a\":\"\xc0\xaf\"}",
            b"{\"a\":\"\xe0\x80\xaf\"}",
            b"{\"a\":\"\xed\xa0\x80\"}",
            b"{\"a\":\"\xf4\x90\x80\x80\"}",
            b"{\"a\":\"\xe2\x28\xa1\"}",
            b"{\xc3\xa9",
            b"\xef\xbb\xbf{}",
            b"x{}",
            b"{1:2}",
            b"{\"a\",1}",
            b"{\"a\"::1}",
            b"{\"a\":1;}",
            b"{'a':1}",
            b"{\"a\":1 2}",
            b"{\"a\":[1,]}",
            b"{\"a\":[1}",
            b"{\"a\":{]}",
            b"{\"a\":[,1]}",
            b"{\"a\":+1}",
            b"{\"a\":.5}",
            b"{\"a\":1.e5}",
            b"{\"a\":-}",
            b"{\"a\":1.}",
            b"{\"a\":1e}",
            b"{\"a\":1e+}",
            b"{\"a\":nul}",
            b"{\"a\":True}",
            b"{\"a\":NaN}",
            b"{\"a\":truex}",
            b"{\"a\":\"\\u12G4\"}",
            b"{\"a\":\"\\u12\"}",
            b"{\"a\":\"\\uD800\"}",
            b"{\"a\":\"\\uDC00\"}",
            b"{\"a\":\"\\uD800\\u0041\"}",
            b"{\"a\":\"\\uD800x\"}",
            b"{\"a\":\"\\uD800\\uD800\"}",
            b"{\"a\":1}{",
        ];
        for &case in cases {
            let shown = String::from_utf8_lossy(case);
            assert!(!JsonPrefix::new().accepts(case), "accepted {shown:?}");
            assert!(!complete_doc(case), "{shown:?}");
            let mut p = JsonPrefix::new();
            assert!(
                !case.iter().all(|&b| p.advance(&[b])),
                "byte-wise accepted {shown:?}"
            );
            // Sanity-check the table: a strict parser rejects these too
            // (trailing whitespace is the one thing we reject and it allows).
            if !is_ws(*case.last().unwrap()) {
                assert_ne!(serde_object(case).ok(), Some(true), "{shown:?}");
            }
        }
    }

    #[test]
    fn rejected_bytes_leave_state_unchanged() {
        let mut p = JsonPrefix::new();
        assert!(p.advance(b"{\"a\":[1, \"x"));
        let tokens: &[&[u8]] = &[
            b"",
            b"y",
            b"\"",
            b"\"]",
            b"\"]}",
            b"\"}",
            b"\x01",
            b"\xf0\x9f",
            b"\xff",
            b"\\",
            b"\\u",
            b"\\z",
        ];
        for &t in tokens {
            let before = p.m;
            let accepted = p.accepts(t);
            assert_eq!(p.m, before);
            let mut q = p.clone();
            assert_eq!(q.advance(t), accepted, "{t:?}");
            if !accepted {
                assert_eq!(q.m, before, "failed advance mutated the state");
            }
        }
        assert!(!p.accepts(b""));
        assert!(p.accepts(b"\"]}"));
        assert!(!p.accepts(b"\"]}\n"));
    }

    #[test]
    fn split_multibyte_characters() {
        let emoji = "\u{1f600}".as_bytes();
        for cut in 1..emoji.len() {
            let mut p = JsonPrefix::new();
            assert!(p.advance(b"{\"e\":\""));
            assert!(p.advance(&emoji[..cut]));
            // Mid-character, neither a quote nor an ASCII byte may follow.
            assert!(!p.accepts(b"\""));
            assert!(!p.accepts(b"a"));
            assert!(p.advance(&emoji[cut..]));
            assert!(p.advance(b"\"}"));
            assert!(p.is_complete());
        }
    }

    #[test]
    fn nesting_depth_cap() {
        let mut p = JsonPrefix::new();
        assert!(p.advance(b"{\"a\":"));
        for _ in 1..MAX_DEPTH - 1 {
            assert!(p.advance(b"["));
        }
        assert!(p.advance(b"{"), "depth {MAX_DEPTH} must be allowed");
        assert!(!p.accepts(b"[") && !p.accepts(b"\"k\":{"));
        assert!(p.advance(b"\"k\":1}"));
        for _ in 1..MAX_DEPTH - 1 {
            assert!(!p.is_complete());
            assert!(!p.accepts(b"}"));
            assert!(p.advance(b"]"));
        }
        assert!(p.advance(b"}"));
        assert!(p.is_complete());
    }

    #[test]
    fn numbers() {
        for n in ["-0.5e+10", "1E5", "0", "-0", "12.5e-3", "9E+9", "0.0"] {
            assert!(complete_doc(format!("{{\"a\":{n}}}").as_bytes()), "{n}");
            assert!(
                complete_doc(format!("{{\"a\":[{n},{n} ]}}").as_bytes()),
                "{n}"
            );
        }
        for n in ["-", "1.", "1e", "1E-", "-0."] {
            let mut p = JsonPrefix::new();
            assert!(p.advance(format!("{{\"a\":{n}").as_bytes()), "{n}");
            for next in [b"}", b",", b" ", b"]"] {
                assert!(!p.accepts(next), "{n} then {next:?}");
            }
            assert!(p.accepts(b"1}"));
        }
    }

    #[test]
    fn nothing_after_completion() {
        let mut p = JsonPrefix::default();
        assert!(!p.accepts(b""));
        assert!(p.advance(b"{}"));
        assert!(p.is_complete());
        for t in [&b" "[..], b"\n", b"}", b"{", b"x"] {
            assert!(!p.accepts(t));
            assert!(!p.advance(t));
        }
        assert!(p.is_complete());
    }

    /// Differential check against serde_json on random mutations of valid
    /// documents: same verdict on whole inputs, and every accepted prefix can
    /// still be completed into an object serde_json parses.
    #[test]
    fn mutations_agree_with_serde_json() {
        let alphabet: &[u8] =
            b"{}[]:,\"\\ \n01-+.eEtrufalsn9xuD\x01\x7f\xc3\xa9\xe2\x82\xac\xf0\x9f\xed\xa0\x80";
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        let mut verdicts = [0usize; 2];
        for _ in 0..10_000 {
            let mut doc = VALID[rng.below(VALID.len())].as_bytes().to_vec();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(doc.len() + 1);
                let b = alphabet[rng.below(alphabet.len())];
                match rng.below(3) {
                    0 if at < doc.len() => doc[at] = b,
                    1 if at < doc.len() => {
                        doc.remove(at);
                    }
                    _ => doc.insert(at, b),
                }
            }
            if doc.is_empty() {
                continue;
            }
            let theirs = match serde_object(&doc) {
                Err(e) if e.to_string().contains("out of range") => continue,
                r => r.unwrap_or(false) && !is_ws(*doc.last().unwrap()),
            };
            verdicts[usize::from(theirs)] += 1;
            assert_eq!(
                complete_doc(&doc),
                theirs,
                "{:?}",
                String::from_utf8_lossy(&doc)
            );
            // Longest accepted prefix must be completable.
            let mut p = JsonPrefix::new();
            let mut len = 0;
            while len < doc.len() && p.advance(&doc[len..len + 1]) {
                len += 1;
            }
            if !p.is_complete() {
                let mut full = doc[..len].to_vec();
                full.extend(completion(p.m));
                match serde_object(&full) {
                    Err(e) if e.to_string().contains("out of range") => {}
                    r => assert!(r.unwrap_or(false), "{:?}", String::from_utf8_lossy(&full)),
                }
            }
        }
        // Both verdicts must be well exercised for the comparison to mean much.
        assert!(verdicts[0] > 5000 && verdicts[1] > 500, "{verdicts:?}");
    }
}
