//! SentencePiece-style vocabularies (GGUF `tokenizer.ggml.model = llama`:
//! Llama 1/2, Gemma 1-3, Mistral v1 ...), encoded and decoded the way
//! llama.cpp's SPM tokenizer does, so Tern's ids are llama.cpp's.
//!
//! Encoding: the text is first cut at special tokens (control tokens only when
//! asked to parse them; user-defined ones always), longest token first. Each
//! remaining piece of text gets a leading space when the GGUF asks for one and
//! the piece starts the prompt or follows a special token, has its spaces
//! replaced by U+2581, and is split into characters; then the adjacent pair
//! whose concatenation is the highest-scoring vocabulary token is merged,
//! again and again (ties: the leftmost pair), until no pair forms a token.
//! A character no token covers falls back to its bytes' `<0xXX>` tokens.
//!
//! Not `tokenizers`' BPE: that needs merges, which these GGUFs do not carry,
//! and ranks merges by list order instead of scoring each pair by the token
//! it forms.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use aho_corasick::AhoCorasick;

use crate::error::{Result, RuntimeError};

/// A token's attributes, as llama.cpp derives them from the GGUF token type
/// (and from the token's text, for end-of-generation and FIM tokens).
pub(super) mod attr {
    pub const NORMAL: u8 = 1;
    pub const UNKNOWN: u8 = 1 << 1;
    pub const CONTROL: u8 = 1 << 2;
    pub const USER_DEFINED: u8 = 1 << 3;
    pub const UNUSED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;
    /// Spaces before the token are dropped from the text to its left.
    pub const LSTRIP: u8 = 1 << 6;
    /// Spaces after the token are dropped from the text to its right.
    pub const RSTRIP: u8 = 1 << 7;
}

/// Texts llama.cpp treats as end-of-generation tokens, made control tokens
/// even where the GGUF types them otherwise.
const CONTROL_LOOKING: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fill-in-the-middle token texts by role, with the GGUF keys that declare
/// the role's id; an undeclared role's token is found by text and made a
/// control token.
const FIM_ROLES: &[(&[&str], &[&str])] = &[
    (
        &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        &["tokenizer.ggml.fim_pad_token_id"],
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        &["tokenizer.ggml.fim_rep_token_id"],
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    (&["tokenizer.ggml.fim_sep_token_id"], &["<|file_sep|>"]),
];

/// Attributes of every token from its GGUF type (0 undefined, 1 normal,
/// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), then llama.cpp's
/// text rules: end-of-generation and undeclared FIM tokens become control
/// tokens; for Phi-3 (by `general.name`) special tokens strip the spaces to
/// their right. `declared(key)` says whether the GGUF sets a key.
pub(super) fn attributes(
    tokens: &[&str],
    types: &[i32],
    by_text: &HashMap<String, u32>,
    declared: impl Fn(&str) -> bool,
    model_name: &str,
) -> Vec<u8> {
    let mut attrs: Vec<u8> = types
        .iter()
        .map(|&t| match t {
            1 => attr::NORMAL,
            2 => attr::UNKNOWN,
            3 => attr::CONTROL,
            4 => attr::USER_DEFINED,
            5 => attr::UNUSED,
            6 => attr::BYTE,
            _ => 0,
        })
        .collect();
    attrs.resize(tokens.len(), attr::NORMAL);
    for (keys, texts) in FIM_ROLES {
        if keys.iter().any(|k| declared(k)) {
            continue;
        }
        // llama.cpp takes the first match in its hash map's order; with one
        // match per role (every vocabulary seen so far) that is this one.
        if let Some(&id) = texts.iter().filter_map(|t| by_text.get(*t)).min() {
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    for t in CONTROL_LOOKING {
        if let Some(&id) = by_text.get(*t) {
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    let name = model_name.to_lowercase();
    if name.contains("phi-3") || name.contains("phi3") {
        for a in attrs.iter_mut() {
            if *a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
                *a |= attr::RSTRIP;
            }
        }
        for (t, on) in [
            ("</s>", true),
            ("<unk>", false),
            ("<s>", false),
            ("<|endoftext|>", false),
        ] {
            if let Some(&id) = by_text.get(t) {
                if on {
                    attrs[id as usize] |= attr::RSTRIP;
                } else {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }
    }
    attrs
}

/// The bytes token `id` stands for in text: a normal token with U+2581 back
/// to spaces, a byte token's byte, a control/unknown/user-defined token's own
/// text, nothing for unused and undefined ones.
pub(super) fn piece(text: &str, attrs: u8) -> Vec<u8> {
    if attrs & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
        text.as_bytes().to_vec()
    } else if attrs & attr::NORMAL != 0 {
        text.replace('\u{2581}', " ").into_bytes()
    } else if attrs & attr::BYTE != 0 {
        byte_of(text).map(|b| vec![b]).unwrap_or_default()
    } else {
        Vec::new()
    }
}

/// The byte a `<0xXX>` token stands for.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// One piece of the text after special tokens are cut out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fragment {
    /// Ordinary text, `start..end` in bytes of the input.
    Text(usize, usize),
    /// A special token matched whole.
    Token(u32),
}

struct Special {
    id: u32,
    text: String,
    /// Control or unknown: only matched when special tokens are parsed.
    parse_only: bool,
    lstrip: bool,
    rstrip: bool,
}

/// The special tokens text is cut at, longest first.
pub(super) struct Specials {
    tokens: Vec<Special>,
    /// Finds which of them occur in a text at all, so only those are tried.
    finder: Option<AhoCorasick>,
}

impl Specials {
    /// Every control, user-defined and unknown token, longest text first
    /// (llama.cpp's order; among equal lengths, by id).
    pub(super) fn new(tokens: &[&str], attrs: &[u8]) -> Result<Self> {
        let mut list: Vec<Special> = tokens
            .iter()
            .zip(attrs)
            .enumerate()
            .filter(|(_, (_, &a))| a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .map(|(id, (t, &a))| Special {
                id: id as u32,
                text: t.to_string(),
                parse_only: a & (attr::CONTROL | attr::UNKNOWN) != 0,
                lstrip: a & attr::LSTRIP != 0,
                rstrip: a & attr::RSTRIP != 0,
            })
            .collect();
        list.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let finder = if list.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::new(list.iter().map(|s| s.text.as_str()))
                    .map_err(|e| RuntimeError::Tokenizer(format!("special tokens: {e}")))?,
            )
        };
        Ok(Self {
            tokens: list,
            finder,
        })
    }

    /// Cuts `text` at every special token in it: for each token in order,
    /// every non-overlapping occurrence (leftmost first) in what is still
    /// ordinary text becomes that token. Control and unknown tokens are only
    /// cut out with `parse_special`; user-defined ones always are.
    pub(super) fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        // Empty text is no fragment at all (so it gets no space prefix).
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0, text.len())];
        let Some(finder) = &self.finder else {
            return frags;
        };
        // A token absent from the whole text is absent from every piece of it.
        let mut present = vec![false; self.tokens.len()];
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        let bytes = text.as_bytes();
        for (special, _) in self.tokens.iter().zip(&present).filter(|(_, &p)| p) {
            if special.parse_only && !parse_special {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut start, end) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(at) = text[start..end].find(special.text.as_str()) {
                    let at = start + at;
                    let mut left_end = at;
                    if special.lstrip {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Text(start, left_end));
                    }
                    next.push(Fragment::Token(special.id));
                    start = at + special.text.len();
                    if special.rstrip {
                        while start < end && is_c_space(bytes[start]) {
                            start += 1;
                        }
                    }
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            frags = next;
        }
        frags
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A candidate merge of two adjacent symbols, ordered as llama.cpp's queue
/// pops them: higher token score first, then the leftmost.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // (`<` on the scores, as llama.cpp compares them: equal is equal.)
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// A run of the text that is one symbol so far, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The score-driven merging of one fragment of text.
pub(super) struct Spm {
    scores: Vec<f32>,
    /// The `<0xXX>` token of each byte (or the byte's own one-character token).
    byte_tokens: Vec<Option<u32>>,
}

impl Spm {
    /// `scores` by token id (all zero when the GGUF has none).
    pub(super) fn new(scores: Vec<f32>, by_text: &HashMap<String, u32>) -> Self {
        let byte_tokens = (0..=255u8)
            .map(|b| {
                by_text.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                    // Falls back to the byte itself, which is only a string
                    // when it is ASCII.
                    b.is_ascii()
                        .then(|| by_text.get(&(b as char).to_string()).copied())
                        .flatten()
                })
            })
            .collect();
        Self {
            scores,
            byte_tokens,
        }
    }

    /// Appends the ids of `text` (already escaped: spaces as U+2581) to `out`.
    pub(super) fn encode(
        &self,
        text: &str,
        by_text: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let token = |s: &str| by_text.get(s).copied();
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut queue = BinaryHeap::new();
        let try_add = |symbols: &[Symbol],
                       queue: &mut BinaryHeap<Bigram>,
                       left: Option<usize>,
                       right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r) = (symbols[left], symbols[right]);
            let span = &text[l.start..l.start + l.len + r.len];
            if let Some(id) = token(span) {
                queue.push(Bigram {
                    left,
                    right,
                    score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                    size: span.len(),
                });
            }
        };
        for i in 1..symbols.len() {
            try_add(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Stale: one side was merged away or grew since this was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.left].next = r.next;
            symbols[b.right].len = 0;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            let prev = symbols[b.left].prev;
            let next = symbols[b.left].next;
            try_add(&symbols, &mut queue, prev, Some(b.left));
            try_add(&symbols, &mut queue, Some(b.left), next);
        }
        let mut at = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let s = symbols[i];
            let span = &text[s.start..s.start + s.len];
            match token(span) {
                Some(id) => out.push(id),
                None => {
                    for &b in span.as_bytes() {
                        let id = self.byte_tokens[b as usize].ok_or_else(|| {
                            RuntimeError::Tokenizer(format!(
                                "the vocabulary has no token for byte 0x{b:02X} (no <0x{b:02X}> token) \
                                 needed to encode {span:?}"
                            ))
                        })?;
                        out.push(id);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> (HashMap<String, u32>, Spm) {
        let mut all: Vec<(String, f32)> = tokens.iter().map(|(t, s)| (t.to_string(), *s)).collect();
        for b in 0..=255u8 {
            all.push((format!("<0x{b:02X}>"), 0.0));
        }
        let by_text: HashMap<String, u32> = all
            .iter()
            .enumerate()
            .map(|(i, (t, _))| (t.clone(), i as u32))
            .collect();
        let spm = Spm::new(all.iter().map(|(_, s)| *s).collect(), &by_text);
        (by_text, spm)
    }

    fn encode(v: &(HashMap<String, u32>, Spm), text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        v.1.encode(text, &v.0, &mut out).unwrap();
        out
    }

    #[test]
    fn merges_by_score_not_by_position() {
        // "abc": "bc" outscores "ab", so b and c merge first, then nothing
        // covers "a"+"bc" but "abc" does not exist: a, bc.
        let v = vocab(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -2.0),
            ("bc", -1.0),
        ]);
        assert_eq!(encode(&v, "abc"), vec![0, 4]);
        // Flip the scores and "ab" wins.
        let v = vocab(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -1.0),
            ("bc", -2.0),
        ]);
        assert_eq!(encode(&v, "abc"), vec![3, 2]);
    }

    #[test]
    fn equal_scores_merge_the_leftmost_pair_first() {
        let v = vocab(&[("a", 0.0), ("aa", -1.0)]);
        // a a a: the leftmost pair merges, leaving the last a alone.
        assert_eq!(encode(&v, "aaa"), vec![1, 0]);
    }

    #[test]
    fn uncovered_characters_fall_back_to_byte_tokens() {
        let v = vocab(&[("a", 0.0)]);
        // é is 0xC3 0xA9; the byte tokens follow the one listed token.
        assert_eq!(encode(&v, "aé"), vec![0, 1 + 0xC3, 1 + 0xA9]);
    }

    #[test]
    fn a_missing_byte_token_is_an_error_naming_the_byte() {
        let by_text: HashMap<String, u32> = [("a".to_string(), 0)].into();
        let spm = Spm::new(vec![0.0], &by_text);
        let err = spm.encode("aé", &by_text, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("0xC3"), "{err}");
    }

    #[test]
    fn specials_cut_longest_first_and_control_only_when_parsing() {
        let tokens = ["<a>", "<a><b>", "\n\n", "x"];
        let attrs = [
            attr::CONTROL,
            attr::CONTROL,
            attr::USER_DEFINED,
            attr::NORMAL,
        ];
        let s = Specials::new(&tokens, &attrs).unwrap();
        let text = "p<a><b>q\n\n<a>";
        assert_eq!(
            s.partition(text, true),
            vec![
                Fragment::Text(0, 1),
                Fragment::Token(1),
                Fragment::Text(7, 8),
                Fragment::Token(2),
                Fragment::Token(0),
            ]
        );
        // Control tokens stay text; the user-defined one is still cut out.
        assert_eq!(
            s.partition(text, false),
            vec![
                Fragment::Text(0, 8),
                Fragment::Token(2),
                Fragment::Text(10, 13)
            ]
        );
    }

    #[test]
    fn rstrip_tokens_eat_the_spaces_after_them() {
        let tokens = ["<|user|>"];
        let s = Specials::new(&tokens, &[attr::CONTROL | attr::RSTRIP]).unwrap();
        assert_eq!(
            s.partition("<|user|> \n hi", true),
            vec![Fragment::Token(0), Fragment::Text(11, 13)]
        );
    }

    #[test]
    fn pieces_unescape_spaces_and_decode_bytes() {
        assert_eq!(piece("\u{2581}hi\u{2581}", attr::NORMAL), b" hi ");
        assert_eq!(piece("<0x0A>", attr::BYTE), b"\n");
        assert_eq!(
            piece("\u{2581}<x>", attr::USER_DEFINED),
            "\u{2581}<x>".as_bytes()
        );
        assert_eq!(piece("<unused0>", attr::UNUSED), b"");
    }
}
