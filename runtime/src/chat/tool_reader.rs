//! Tool calls read out of a reply as it is generated, in the shapes small
//! models actually write them.
//!
//! A model asked for Hermes blocks (`<tool_call>{...}</tool_call>`, Qwen
//! 2.5's template) often writes the bare object instead
//! (`{"name": "lookup_price", "arguments": {...}}`), inside a ```` ```json ````
//! fence, or doubled (`{{...}}`, copying a template's escaped braces).
//! [`CallReader`] is fed the reply piece by piece and says, as soon as it can,
//! which text is prose and which is a call: a call's name once it is read, then
//! its arguments' text as it arrives, so a server can stream `tool_calls`
//! deltas instead of holding the answer to the end. The whole-text reading
//! ([`CallReader::read_all`]) is the same reader fed once, so a streamed and a
//! collected answer agree.
//!
//! What counts as a call: a Hermes block anywhere in the reply, or a bare
//! object at the start of the reply (or right after another call) whose
//! `name` is one of the declared tools. Only declared names count; prose that
//! merely contains JSON stays prose. A call identical to an earlier one in
//! the same reply (same name, equal arguments) is dropped and marks the reply
//! [`repeated`](CallReader::repeated): small models under a forced call tend
//! to write the same call again and again, and the engine ends the reply there.
//!
//! It knows no wire format (the server writes OpenAI's deltas) and no grammar
//! (`tools.rs` builds the one that keeps the arguments valid).

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FENCE: &str = "```";
const PYTHON_TAG: &str = "<|python_tag|>";

/// What the reader can say about the text so far.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Prose.
    Content(String),
    /// A call begins: its position among the reply's calls and its name.
    Begin {
        /// Index of the call in the reply's `tool_calls`.
        index: usize,
        /// The declared function it calls.
        name: String,
    },
    /// More of the arguments' JSON text of call `index` (the fragments of a
    /// call, joined, are one JSON object).
    Args {
        /// Index of the call.
        index: usize,
        /// The next fragment.
        text: String,
    },
}

/// A whole reply read for calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadReply {
    /// Prose outside the calls, trimmed.
    pub content: String,
    /// The calls in order: `(name, arguments as JSON text)`.
    pub calls: Vec<(String, String)>,
    /// A call was begun but is not a whole, valid call (cut by the token
    /// limit, or arguments that are not a JSON object).
    pub broken: bool,
    /// A call repeated an earlier one and was dropped.
    pub repeated: bool,
}

/// Where the reader is.
#[derive(Clone, Debug)]
enum State {
    /// Prose (or the gap between calls).
    Text,
    /// After `<tool_call>` or at a bare object's `{`: reading up to the
    /// start of the arguments value.
    Header { hermes: bool, fenced: bool },
    /// Inside the arguments value.
    Args(Call),
    /// After the arguments: the closing braces, fence or `</tool_call>`.
    Tail(Call),
    /// A Hermes block whose header is not `name` first: kept whole until
    /// `</tool_call>`, then parsed.
    Whole,
}

/// The call being read.
#[derive(Clone, Debug)]
struct Call {
    name: String,
    hermes: bool,
    fenced: bool,
    double: bool,
    args: String,
    json: JsonDepth,
    /// Pieces held back while this call could still be a repeat.
    held: Vec<Piece>,
    /// Its index once announced.
    index: Option<usize>,
}

/// Brace depth over JSON text, strings respected.
#[derive(Clone, Copy, Debug, Default)]
struct JsonDepth {
    depth: i32,
    in_str: bool,
    escaped: bool,
    started: bool,
}

impl JsonDepth {
    /// Feeds one char; true when the value just closed.
    fn feed(&mut self, ch: char) -> bool {
        if self.in_str {
            match ch {
                _ if self.escaped => self.escaped = false,
                '\\' => self.escaped = true,
                '"' => self.in_str = false,
                _ => {}
            }
            return false;
        }
        match ch {
            '"' => self.in_str = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => self.depth -= 1,
            _ => {}
        }
        self.started = true;
        self.depth <= 0
    }
}

/// Reads calls out of a reply fed in pieces.
#[derive(Clone, Debug)]
pub struct CallReader {
    declared: Vec<String>,
    hermes: bool,
    state: State,
    /// Text not yet decided.
    buf: String,
    /// Whether a bare object may open here (start of the reply, or after a
    /// call).
    bare_ok: bool,
    /// Completed calls: name, arguments text without its layout
    /// ([`squeeze`]), arguments value.
    done: Vec<(String, String, Value)>,
    announced: usize,
    broken: bool,
    repeated: bool,
}

impl CallReader {
    /// A reader for a reply whose calls may name only `declared`; `hermes`:
    /// the family writes `<tool_call>` blocks (otherwise only bare objects
    /// count, as Llama 3 writes them).
    pub fn new(declared: Vec<String>, hermes: bool) -> Self {
        CallReader {
            declared,
            hermes,
            state: State::Text,
            buf: String::new(),
            bare_ok: true,
            done: Vec::new(),
            announced: 0,
            broken: false,
            repeated: false,
        }
    }

    /// Whether a call repeated an earlier one (the reply should end).
    pub fn repeated(&self) -> bool {
        self.repeated
    }

    /// Reads `text` whole.
    pub fn read_all(declared: Vec<String>, hermes: bool, text: &str) -> ReadReply {
        let mut r = CallReader::new(declared, hermes);
        let mut pieces = r.push(text);
        pieces.extend(r.finish());
        let mut out = ReadReply {
            broken: r.broken,
            repeated: r.repeated,
            ..ReadReply::default()
        };
        for p in pieces {
            match p {
                Piece::Content(t) => out.content.push_str(&t),
                Piece::Begin { name, .. } => out.calls.push((name, String::new())),
                Piece::Args { index, text } => {
                    if let Some(c) = out.calls.get_mut(index) {
                        c.1.push_str(&text);
                    }
                }
            }
        }
        out.content = out.content.trim().to_string();
        out
    }

    /// Feeds the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The reply ended: what was held is prose, or a cut call.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => {
                let rest = std::mem::take(&mut self.buf);
                if !rest.trim().is_empty() {
                    out.push(Piece::Content(rest));
                }
            }
            State::Tail(call) => {
                // Arguments whole, closing braces or tag missing: a call.
                self.buf.clear();
                self.complete(call, &mut out);
            }
            _ => {
                self.broken = true;
                self.buf.clear();
            }
        }
        out
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>, at_end: bool) -> bool {
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => self.text(out, at_end),
            State::Header { hermes, fenced } => self.header(hermes, fenced, out),
            State::Args(call) => self.args(call, out),
            State::Tail(call) => self.tail(call, out, at_end),
            State::Whole => self.whole(out),
        }
    }

    fn text(&mut self, out: &mut Vec<Piece>, at_end: bool) -> bool {
        if self.bare_ok {
            let lead = self.buf.len() - self.buf.trim_start().len();
            let body = &self.buf[lead..];
            let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
            let could_be_fence = "```json".starts_with(body) || FENCE.starts_with(body);
            if could_be_fence && !at_end {
                // Empty, or part of an opening fence: wait for more.
                return false;
            }
            let (fenced, after_fence) = match strip_fence_open(body) {
                Some(rest) => (true, rest),
                None if body.starts_with(FENCE) && !at_end => return false,
                None => (false, body),
            };
            match self.bare_open(after_fence) {
                Open::Yes => {
                    let cut = self.buf.len() - after_fence.len();
                    self.buf.drain(..cut);
                    self.state = State::Header {
                        hermes: false,
                        fenced,
                    };
                    return true;
                }
                Open::Maybe if !at_end => return false,
                _ => self.bare_ok = false,
            }
        }
        if !self.hermes {
            // Only bare objects count and none opened: the rest is prose.
            if !self.buf.is_empty() {
                out.push(Piece::Content(std::mem::take(&mut self.buf)));
            }
            return false;
        }
        if let Some(at) = self.buf.find(OPEN) {
            let before: String = self.buf.drain(..at + OPEN.len()).collect();
            let prose = &before[..at];
            if !prose.trim().is_empty() {
                out.push(Piece::Content(prose.to_string()));
            }
            self.state = State::Header {
                hermes: true,
                fenced: false,
            };
            return true;
        }
        // Hold a tail that could be the start of `<tool_call>`.
        let keep = (1..OPEN.len())
            .rev()
            .find(|&n| self.buf.ends_with(&OPEN[..n]))
            .unwrap_or(0);
        let keep = if at_end { 0 } else { keep };
        let cut = self.buf.len() - keep;
        if cut > 0 && !self.buf[..cut].trim().is_empty() {
            out.push(Piece::Content(self.buf.drain(..cut).collect()));
        }
        false
    }

    /// Whether `s` opens a bare call to a declared tool.
    fn bare_open(&self, s: &str) -> Open {
        match scan_header(s, &self.declared, false) {
            Scan::Partial => Open::Maybe,
            Scan::Name | Scan::Full { .. } => Open::Yes,
            Scan::No => Open::No,
        }
    }

    fn header(&mut self, hermes: bool, fenced: bool, out: &mut Vec<Piece>) -> bool {
        match scan_header(&self.buf, &self.declared, true) {
            Scan::Partial | Scan::Name => {
                self.state = State::Header { hermes, fenced };
                false
            }
            Scan::Full {
                name,
                double,
                consumed,
            } => {
                self.buf.drain(..consumed);
                let call = Call {
                    name,
                    hermes,
                    fenced,
                    double,
                    args: String::new(),
                    json: JsonDepth::default(),
                    held: Vec::new(),
                    index: None,
                };
                self.state = State::Args(call);
                true
            }
            Scan::No if hermes => {
                self.state = State::Whole;
                true
            }
            Scan::No => {
                // A bare object that named a tool but is not a call after
                // all: prose from here on.
                self.bare_ok = false;
                self.state = State::Text;
                self.broken = true;
                out.push(Piece::Content(std::mem::take(&mut self.buf)));
                false
            }
        }
    }

    fn args(&mut self, mut call: Call, out: &mut Vec<Piece>) -> bool {
        let mut used = 0;
        let mut closed = false;
        let before = call.args.len();
        for ch in self.buf.chars() {
            if !call.json.started && ch.is_whitespace() {
                used += ch.len_utf8();
                continue;
            }
            if !call.json.started && ch != '{' {
                if call.hermes {
                    // Arguments as a JSON string (some models encode them):
                    // read the block whole at its end.
                    let head = serde_json::json!({"name": call.name}).to_string();
                    let head = format!("{}, \"arguments\": ", &head[..head.len() - 1]);
                    self.buf.insert_str(0, &head);
                    self.state = State::Whole;
                    return true;
                }
                // A bare object whose arguments are not an object.
                self.broken = true;
                self.buf.clear();
                return false;
            }
            used += ch.len_utf8();
            call.args.push(ch);
            if call.json.feed(ch) {
                closed = true;
                break;
            }
        }
        self.buf.drain(..used);
        let fragment = call.args[before..].to_string();
        if !fragment.is_empty() {
            self.announce(&mut call, Some(fragment), out);
        }
        if closed {
            self.state = State::Tail(call);
            return true;
        }
        self.state = State::Args(call);
        false
    }

    fn tail(&mut self, call: Call, out: &mut Vec<Piece>, at_end: bool) -> bool {
        let mut want = String::from("}");
        if call.double {
            want.push('}');
        }
        let end = if call.hermes {
            CLOSE
        } else if call.fenced {
            FENCE
        } else {
            ""
        };
        // The text after the arguments, whitespace removed, must be a
        // prefix of (or begin with) the closing braces and `end`.
        let squeezed: String = self.buf.chars().filter(|c| !c.is_whitespace()).collect();
        let full = format!("{want}{end}");
        if squeezed.len() < full.len() && full.starts_with(&squeezed) && !at_end {
            self.state = State::Tail(call);
            return false;
        }
        // Consume what matches, leave the rest as the next text.
        let mut used = 0;
        let mut matched = 0;
        let target: Vec<char> = full.chars().collect();
        for ch in self.buf.chars() {
            if matched == target.len() {
                break;
            }
            if ch.is_whitespace() {
                used += ch.len_utf8();
            } else if ch == target[matched] {
                used += ch.len_utf8();
                matched += 1;
            } else {
                break;
            }
        }
        self.buf.drain(..used);
        self.complete(call, out);
        true
    }

    fn whole(&mut self, out: &mut Vec<Piece>) -> bool {
        let Some(end) = self.buf.find(CLOSE) else {
            self.state = State::Whole;
            return false;
        };
        let body: String = self.buf.drain(..end + CLOSE.len()).collect();
        let body = &body[..end];
        let call = serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = v.get("arguments").or_else(|| v.get("parameters"))?;
                let args = match args {
                    Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
                    other => other.clone(),
                };
                (args.is_object() && self.declared.contains(&name)).then_some((name, args))
            });
        match call {
            Some((name, args)) => {
                let text = args.to_string();
                let mut c = Call {
                    name,
                    hermes: true,
                    fenced: false,
                    double: false,
                    args: text.clone(),
                    json: JsonDepth::default(),
                    held: Vec::new(),
                    index: None,
                };
                self.announce(&mut c, Some(text), out);
                self.complete(c, out);
            }
            None => {
                self.broken = true;
                out.push(Piece::Content(format!("{OPEN}{body}{CLOSE}")));
                self.bare_ok = false;
            }
        }
        true
    }

    /// Sends (or holds) the call's name and a new fragment of its
    /// arguments: a call whose arguments so far match an earlier call of
    /// the same name is held, as it may be that call again.
    fn announce(&mut self, call: &mut Call, fragment: Option<String>, out: &mut Vec<Piece>) {
        if call.held.is_empty() && call.index.is_none() {
            call.held.push(Piece::Begin {
                index: usize::MAX,
                name: call.name.clone(),
            });
        }
        if let Some(text) = fragment {
            call.held.push(Piece::Args {
                index: usize::MAX,
                text,
            });
        }
        // Compared without whitespace: a model may lay the same call out
        // differently the second time.
        let so_far = squeeze(&call.args);
        let maybe_repeat = self
            .done
            .iter()
            .any(|(n, a, _)| *n == call.name && a.starts_with(&so_far));
        if !maybe_repeat {
            self.release(call, out);
        }
    }

    /// Sends what the call holds, numbering it.
    fn release(&mut self, call: &mut Call, out: &mut Vec<Piece>) {
        let index = *call.index.get_or_insert_with(|| {
            self.announced += 1;
            self.announced - 1
        });
        for p in call.held.drain(..) {
            out.push(match p {
                Piece::Begin { name, .. } => Piece::Begin { index, name },
                Piece::Args { text, .. } => Piece::Args { index, text },
                c @ Piece::Content(_) => c,
            });
        }
    }

    /// A call's arguments and closing are read: keep it, or drop a repeat.
    fn complete(&mut self, mut call: Call, out: &mut Vec<Piece>) {
        self.bare_ok = true;
        let value = match serde_json::from_str::<Value>(&call.args) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                self.broken = true;
                return;
            }
        };
        let repeat = self
            .done
            .iter()
            .any(|(n, _, v)| *n == call.name && *v == value);
        if repeat && call.index.is_none() {
            self.repeated = true;
            return;
        }
        self.release(&mut call, out);
        self.done.push((call.name, squeeze(&call.args), value));
    }
}

/// JSON text without the whitespace between its tokens (strings kept as
/// they are).
fn squeeze(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_str, mut escaped) = (false, false);
    for ch in json.chars() {
        if in_str {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
        } else if ch == '"' {
            in_str = true;
        } else if ch.is_whitespace() {
            continue;
        }
        out.push(ch);
    }
    out
}

enum Open {
    Yes,
    Maybe,
    No,
}

/// How far a call header (`{"name": "f", "arguments": `) is read.
#[derive(Debug, PartialEq)]
enum Scan {
    /// The text so far could still become a header.
    Partial,
    /// The name is read (and declared); the rest is not yet there.
    Name,
    /// The whole header: the name, whether the braces are doubled, and
    /// the bytes it spans (up to the arguments value).
    Full {
        name: String,
        double: bool,
        consumed: usize,
    },
    /// Not a header of a call to a declared tool.
    No,
}

/// Reads `{ {? "name" : "NAME" , "arguments"|"parameters" :` with free
/// whitespace; `NAME` must be declared. With `whole` false, a read name is
/// enough.
fn scan_header(s: &str, declared: &[String], whole: bool) -> Scan {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each literal: Partial if the text ends inside it, No if it differs.
    macro_rules! lit {
        ($l:expr) => {{
            let l: &[u8] = $l;
            let n = l.len().min(b.len() - i);
            if b[i..i + n] != l[..n] {
                return Scan::No;
            }
            if n < l.len() {
                return Scan::Partial;
            }
            i += l.len();
        }};
    }
    ws(&mut i);
    lit!(b"{");
    ws(&mut i);
    let double = b.get(i) == Some(&b'{');
    if double {
        i += 1;
        ws(&mut i);
    }
    lit!(b"\"name\"");
    ws(&mut i);
    lit!(b":");
    ws(&mut i);
    lit!(b"\"");
    let start = i;
    while i < b.len() && b[i] != b'"' {
        i += 1;
    }
    let so_far = &s[start..i];
    if i == b.len() {
        return if declared.iter().any(|d| d.starts_with(so_far)) {
            Scan::Partial
        } else {
            Scan::No
        };
    }
    if !declared.iter().any(|d| d == so_far) {
        return Scan::No;
    }
    let name = so_far.to_string();
    i += 1;
    if !whole {
        return Scan::Name;
    }
    ws(&mut i);
    lit!(b",");
    ws(&mut i);
    lit!(b"\"");
    let key_start = i;
    while i < b.len() && b[i] != b'"' {
        i += 1;
    }
    let key = &s[key_start..i];
    if i == b.len() {
        return if "arguments".starts_with(key) || "parameters".starts_with(key) {
            Scan::Partial
        } else {
            Scan::No
        };
    }
    if key != "arguments" && key != "parameters" {
        return Scan::No;
    }
    i += 1;
    ws(&mut i);
    lit!(b":");
    Scan::Full {
        name,
        double,
        consumed: i,
    }
}

/// The text after an opening fence (```` ``` ```` or ```` ```json ````).
fn strip_fence_open(s: &str) -> Option<&str> {
    let rest = s.strip_prefix(FENCE)?;
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    // Hold until the fence line is done (it could still be "```js…").
    let trimmed = rest.trim_start();
    if trimmed.is_empty() && !rest.contains('\n') {
        return None;
    }
    Some(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["lookup_price".into(), "multiply".into()]
    }

    fn read(text: &str) -> ReadReply {
        CallReader::read_all(names(), true, text)
    }

    /// Feeds `text` one char at a time and joins what comes out.
    fn streamed(text: &str) -> (Vec<Piece>, ReadReply) {
        let mut r = CallReader::new(names(), true);
        let mut pieces = Vec::new();
        for ch in text.chars() {
            pieces.extend(r.push(&ch.to_string()));
        }
        pieces.extend(r.finish());
        let mut joined = ReadReply::default();
        for p in &pieces {
            match p {
                Piece::Content(t) => joined.content.push_str(t),
                Piece::Begin { name, .. } => joined.calls.push((name.clone(), String::new())),
                Piece::Args { index, text } => joined.calls[*index].1.push_str(text),
            }
        }
        joined.content = joined.content.trim().to_string();
        (pieces, joined)
    }

    fn call(name: &str, args: &str) -> (String, String) {
        (name.to_string(), args.to_string())
    }

    #[test]
    fn hermes_blocks_and_bare_objects_are_calls() {
        let hermes = "Let me look.\n<tool_call>\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}\n</tool_call>";
        let r = read(hermes);
        assert_eq!(r.content, "Let me look.");
        assert_eq!(
            r.calls,
            vec![call("lookup_price", "{\"item\": \"widget\"}")]
        );
        for bare in [
            "{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}",
            "  {\"name\":\"lookup_price\",\"arguments\":{\"item\": \"widget\"}}\n",
            "```json\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}\n```",
            "```\n{\"name\": \"lookup_price\", \"parameters\": {\"item\": \"widget\"}}\n```",
            "{{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}}",
        ] {
            let r = read(bare);
            assert_eq!(
                r.calls,
                vec![call("lookup_price", "{\"item\": \"widget\"}")],
                "{bare}"
            );
            assert_eq!(r.content, "", "{bare}");
            assert!(!r.broken, "{bare}");
        }
    }

    #[test]
    fn several_calls_are_read_in_order() {
        let text = "<tool_call>\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>";
        let r = read(text);
        assert_eq!(
            r.calls,
            vec![
                call("lookup_price", "{\"item\": \"a\"}"),
                call("multiply", "{\"a\": 2, \"b\": 3}")
            ]
        );
        let bare = "{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"a\"}}\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"b\"}}";
        assert_eq!(read(bare).calls.len(), 2);
    }

    #[test]
    fn undeclared_names_and_plain_json_stay_prose() {
        for text in [
            "{\"name\": \"rm_rf\", \"arguments\": {}}",
            "{\"result\": 42}",
            "The price is {\"name\": \"lookup_price\"} in JSON.",
            "```python\nprint(1)\n```",
            "It costs $3.",
        ] {
            let r = read(text);
            assert!(r.calls.is_empty(), "{text}");
            assert_eq!(r.content, text.trim(), "{text}");
        }
        let r = read("<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>");
        assert!(r.calls.is_empty() && r.broken);
    }

    #[test]
    fn arguments_first_and_string_arguments_are_read_whole() {
        let r = read("<tool_call>{\"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\", \"name\": \"multiply\"}</tool_call>");
        assert_eq!(r.calls, vec![call("multiply", "{\"a\":1,\"b\":2}")]);
        let r = read(
            "<tool_call>{\"name\": \"multiply\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
        );
        assert_eq!(r.calls, vec![call("multiply", "{\"a\":1}")]);
    }

    #[test]
    fn a_cut_call_is_broken_and_a_repeat_is_dropped() {
        let r = read("{\"name\": \"multiply\", \"arguments\": {\"a\": 2, ");
        assert!(r.broken);
        let c = "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>\n";
        let d = "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 2, \"b\": 4}}\n</tool_call>\n";
        let r = read(&format!("{c}{d}{c}"));
        assert_eq!(r.calls.len(), 2);
        assert!(r.repeated);
        // Laid out differently, the same call is still a repeat.
        let e = "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\":2,\n \"b\": 3}}\n</tool_call>\n";
        let r = read(&format!("{c}{e}"));
        assert_eq!(r.calls.len(), 1);
        assert!(r.repeated);
        assert_eq!(
            squeeze("{\"a b\": [1, 2],\n \"c\": \"x \\\" y\"}"),
            "{\"a b\":[1,2],\"c\":\"x \\\" y\"}"
        );
    }

    #[test]
    fn streaming_names_the_call_before_its_arguments_end_and_agrees_with_whole() {
        let text = "Checking.\n<tool_call>\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"widget\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"lookup_price\", \"arguments\": {\"item\": \"gadget\"}}\n</tool_call>";
        let (pieces, joined) = streamed(text);
        let whole = read(text);
        assert_eq!(joined.content, whole.content);
        assert_eq!(joined.calls, whole.calls);
        assert_eq!(whole.calls.len(), 2);
        assert!(whole.repeated);
        // The name comes first, then several argument fragments.
        let begin = pieces
            .iter()
            .position(|p| matches!(p, Piece::Begin { index: 0, .. }))
            .unwrap();
        let frags = pieces
            .iter()
            .filter(|p| matches!(p, Piece::Args { index: 0, .. }))
            .count();
        assert!(frags > 3, "{pieces:?}");
        assert!(matches!(pieces[begin + 1], Piece::Args { index: 0, .. }));
        for text in [
            "```json\n{\"name\": \"multiply\", \"arguments\": {\"a\": 1, \"b\": 2}}\n```",
            "Plain answer with <b>tags</b> and {braces}.",
            "{{\"name\": \"multiply\", \"arguments\": {\"a\": 1, \"b\": {\"c\": \"}\"}}}}",
        ] {
            let (_, joined) = streamed(text);
            let whole = read(text);
            assert_eq!(
                (joined.content, joined.calls),
                (whole.content, whole.calls),
                "{text}"
            );
        }
    }

    #[test]
    fn llama3_reads_bare_objects_only() {
        let r = CallReader::read_all(
            names(),
            false,
            "<|python_tag|>{\"name\": \"multiply\", \"parameters\": {\"a\": 1, \"b\": 2}}",
        );
        assert_eq!(r.calls, vec![call("multiply", "{\"a\": 1, \"b\": 2}")]);
        let r = CallReader::read_all(names(), false, "<tool_call>{}</tool_call>");
        assert!(r.calls.is_empty());
    }
}
