//! Reasoning read out of a reply as it is generated: the text between
//! `<think>` and `</think>` that reasoning models (Qwen3, DeepSeek-R1 and
//! their distills) write before their answer.
//!
//! [`ThinkReader`] is fed the reply piece by piece, however the tokenizer cut
//! it (a tag may arrive whole, as one token, or split over several), and says
//! as soon as it can which text is reasoning and which is the answer, holding
//! back only what could still be the start of a tag. It reads as llama.cpp's
//! reasoning parser does (`--reasoning-format deepseek`), so a client sees the
//! same split from Tern and from llama-server:
//! - the reply opens with `<think>` (after optional whitespace), or the
//!   prompt already opened it (a template that ends the generation prompt
//!   with `<think>`: [`ThinkReader::opened`]);
//! - the reasoning is trimmed of whitespace at both ends, and the answer of
//!   the whitespace that follows `</think>`;
//! - a reasoning block the reply never closes (the token limit came first)
//!   is all reasoning, and the answer is empty;
//! - a reply that does not open with `<think>` is all answer.
//!
//! The whole-text reading ([`ThinkReader::split`]) is the same reader fed
//! once, so a streamed and a collected answer agree. It knows no wire format:
//! the server writes `reasoning_content`.

/// The tag that opens a reasoning block.
pub const THINK_OPEN: &str = "<think>";
/// The tag that closes it.
pub const THINK_CLOSE: &str = "</think>";

/// What the reader can say about the text so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThinkPiece {
    /// Reasoning text (inside the think block, tags removed).
    Reasoning(String),
    /// Answer text.
    Content(String),
}

/// Where the reader is in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace and a possible opening tag's start seen yet.
    Start,
    /// Inside the think block.
    Reasoning,
    /// Right after `</think>`: its trailing whitespace is dropped.
    Closed,
    /// The answer.
    Content,
}

/// Splits a reply's text into reasoning and answer as it arrives.
#[derive(Clone, Debug)]
pub struct ThinkReader {
    phase: Phase,
    /// Text not yet said: in `Start`, a possible opening tag; in
    /// `Reasoning`, trailing whitespace and a possible closing tag's start.
    held: String,
    /// Whether any reasoning text has been said (its leading whitespace is
    /// dropped until then).
    said_reasoning: bool,
}

impl ThinkReader {
    /// A reader for a reply that must open its own think block.
    pub fn new() -> Self {
        Self {
            phase: Phase::Start,
            held: String::new(),
            said_reasoning: false,
        }
    }

    /// A reader for a reply whose prompt already opened the think block:
    /// the reply starts inside the reasoning.
    pub fn opened() -> Self {
        Self {
            phase: Phase::Reasoning,
            ..Self::new()
        }
    }

    /// Reads `text` and returns what can be said of it now.
    pub fn push(&mut self, text: &str) -> Vec<ThinkPiece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Start => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(THINK_OPEN) {
                        self.held = after.to_string();
                        self.phase = Phase::Reasoning;
                    } else if THINK_OPEN.starts_with(rest) {
                        return out;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Reasoning => {
                    if let Some(at) = self.held.find(THINK_CLOSE) {
                        let rest = self.held.split_off(at);
                        let reasoning = std::mem::take(&mut self.held);
                        self.say_reasoning(reasoning.trim_end(), &mut out);
                        self.held = rest[THINK_CLOSE.len()..].to_string();
                        self.phase = Phase::Closed;
                        continue;
                    }
                    // Keep a possible tag start, and the whitespace before
                    // it (the reasoning's end is trimmed).
                    let tag = partial_suffix(&self.held, THINK_CLOSE);
                    let body = self.held[..self.held.len() - tag].trim_end().len();
                    let held = self.held.split_off(body);
                    let said = std::mem::replace(&mut self.held, held);
                    self.say_reasoning(&said, &mut out);
                    return out;
                }
                Phase::Closed => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.phase = Phase::Content;
                }
                Phase::Content => {
                    if !self.held.is_empty() {
                        out.push(ThinkPiece::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// The reply has ended: says what was held back.
    pub fn finish(&mut self) -> Vec<ThinkPiece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.phase {
            // A lone partial tag or whitespace is the answer's text.
            Phase::Start if !held.is_empty() => out.push(ThinkPiece::Content(held)),
            // An unclosed block: a partial closing tag is reasoning text.
            Phase::Reasoning => self.say_reasoning(held.trim_end(), &mut out),
            _ => {}
        }
        out
    }

    /// A whole reply split at once: `(reasoning, content)`, `None` for a
    /// reply with no reasoning (reads as the streamed pieces joined).
    pub fn split(mut self, text: &str) -> (Option<String>, String) {
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        let mut reasoning: Option<String> = None;
        let mut content = String::new();
        for p in pieces {
            match p {
                ThinkPiece::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
                ThinkPiece::Content(c) => content.push_str(&c),
            }
        }
        (reasoning, content)
    }

    fn say_reasoning(&mut self, text: &str, out: &mut Vec<ThinkPiece>) {
        let text = if self.said_reasoning {
            text
        } else {
            text.trim_start()
        };
        if !text.is_empty() {
            self.said_reasoning = true;
            out.push(ThinkPiece::Reasoning(text.to_string()));
        }
    }
}

impl Default for ThinkReader {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a rendered prompt leaves its reply inside a think block: the
/// template ended the generation prompt with `<think>` (whitespace after it
/// allowed), as DeepSeek-R1's and Qwen3's thinking-only templates do.
pub fn prompt_opens_reasoning(prompt_tail: &str) -> bool {
    let tail = prompt_tail.trim_end();
    tail.ends_with(THINK_OPEN)
}

/// Bytes at the end of `text` that are a proper prefix of `tag` (the start
/// of a tag that may be completed by the next piece).
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k) && tag.starts_with(&text[text.len() - k..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one, returning the joined reasoning and content
    /// and checking that no piece said reasoning after content began.
    fn feed(mut r: ThinkReader, pieces: &[&str]) -> (String, String) {
        let mut said = Vec::new();
        for p in pieces {
            said.extend(r.push(p));
        }
        said.extend(r.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in said {
            match p {
                ThinkPiece::Reasoning(t) => {
                    assert!(content.is_empty(), "reasoning after content: {t:?}");
                    reasoning.push_str(&t);
                }
                ThinkPiece::Content(t) => content.push_str(&t),
            }
        }
        (reasoning, content)
    }

    /// Every way of cutting `text` into three pieces.
    fn all_cuts(text: &str) -> Vec<Vec<&str>> {
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        let mut out = Vec::new();
        for &a in &bounds {
            for &b in bounds.iter().filter(|&&b| b >= a) {
                out.push(vec![&text[..a], &text[a..b], &text[b..]]);
            }
        }
        out
    }

    #[test]
    fn tags_cut_anywhere_across_pieces_split_the_same() {
        let text = "<think>\n2 and 2 make 4 <not a tag>\n</think>\n\nIt is 4.";
        for cuts in all_cuts(text) {
            assert_eq!(
                feed(ThinkReader::new(), &cuts),
                ("2 and 2 make 4 <not a tag>".into(), "It is 4.".into()),
                "{cuts:?}"
            );
        }
        // One character a piece, as a vocabulary without the tags as
        // tokens writes them.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(ThinkReader::new(), &chars).1, "It is 4.");
    }

    #[test]
    fn a_partial_closing_tag_is_held_then_said_as_reasoning() {
        let mut r = ThinkReader::new();
        assert_eq!(
            r.push("<think>a </"),
            vec![ThinkPiece::Reasoning("a".into())]
        );
        // "</" and the space before it wait: a tag may follow.
        assert_eq!(r.push("b"), vec![ThinkPiece::Reasoning(" </b".into())]);
        assert_eq!(r.push("</thi"), vec![]);
        assert_eq!(r.push("nk>ok"), vec![ThinkPiece::Content("ok".into())]);
        assert_eq!(r.finish(), vec![]);
    }

    #[test]
    fn a_block_left_open_is_all_reasoning() {
        for cuts in all_cuts("<think>still going </thi") {
            assert_eq!(
                feed(ThinkReader::new(), &cuts),
                ("still going </thi".into(), String::new()),
                "{cuts:?}"
            );
        }
    }

    #[test]
    fn a_prompt_that_opened_the_block_starts_inside_it() {
        assert_eq!(
            feed(ThinkReader::opened(), &["\nhm", "m</think>", "\n\nYes"]),
            ("hmm".into(), "Yes".into())
        );
        assert_eq!(
            feed(ThinkReader::opened(), &["no close"]),
            ("no close".into(), String::new())
        );
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
        assert!(!prompt_opens_reasoning("<think>\n\n</think>\n\n"));
    }

    #[test]
    fn a_reply_without_a_block_is_all_content() {
        for pieces in [
            &["Hello", " <think>x</think>"][..],
            &["  ", "<th", "is"][..],
            &["<thi"][..],
        ] {
            let joined: String = pieces.concat();
            assert_eq!(feed(ThinkReader::new(), pieces), (String::new(), joined));
        }
        assert_eq!(ThinkReader::new().split("plain"), (None, "plain".into()));
        assert_eq!(
            ThinkReader::new().split("<think>r</think>c"),
            (Some("r".into()), "c".into())
        );
        // An empty block says no reasoning, as llama.cpp's parser does.
        assert_eq!(
            ThinkReader::new().split("<think>\n\n</think>\n\nc"),
            (None, "c".into())
        );
    }
}
