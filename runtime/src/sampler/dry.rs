//! DRY, "don't repeat yourself" (from koboldcpp, as llama.cpp's `dry`
//! sampler applies it): a token that would extend a sequence already seen
//! in the recent history is penalised by `multiplier * base^(n - allowed)`,
//! `n` the length of the repeat it would continue. Unlike the repetition
//! penalty it leaves single words alone and stops loops of whole phrases.
//! Sequence breakers (newline, `:`, `"`, `*` by default) cut the matching,
//! so a template's recurring structure is not penalised.

use std::collections::HashMap;

/// Longest breaker text used, in bytes (llama.cpp truncates to the same).
pub const MAX_BREAKER_BYTES: usize = 40;
/// Most tokens of a breaker's tail after its first token.
const MAX_TAIL_TOKENS: usize = 20;

/// The sequence breakers as token sequences: each entry is a head token and
/// the tokens that must follow it (empty for a token that contains a
/// breaker whole). Built once per request from the vocabulary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DryBreakers {
    heads: HashMap<u32, Vec<Vec<u32>>>,
}

impl DryBreakers {
    /// Breakers given directly as token sequences (first token the head).
    pub fn from_sequences(seqs: &[Vec<u32>]) -> Self {
        let mut b = Self::default();
        for s in seqs {
            if let Some((&head, tail)) = s.split_first() {
                b.add(head, tail.to_vec());
            }
        }
        b
    }

    /// Breakers for a vocabulary, as llama.cpp finds them: every token whose
    /// text contains a breaker is a breaker by itself; a token whose text
    /// ends with the start of a breaker is the head of a sequence whose tail
    /// is the rest of the breaker, tokenized. `piece` gives a token's bytes,
    /// `encode` tokenizes text; breakers are cut to [`MAX_BREAKER_BYTES`].
    pub fn build<'a>(
        vocab_size: usize,
        piece: impl Fn(u32) -> &'a [u8],
        encode: impl Fn(&str) -> Vec<u32>,
        breakers: &[String],
    ) -> Self {
        let mut b = Self::default();
        for text in breakers {
            let mut end = text.len().min(MAX_BREAKER_BYTES);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let s = &text.as_bytes()[..end];
            if s.is_empty() {
                continue;
            }
            let mut tails: HashMap<usize, Vec<u32>> = HashMap::new();
            for id in 0..vocab_size as u32 {
                let word = piece(id);
                if contains(word, s) {
                    b.add(id, Vec::new());
                    continue;
                }
                // Each place the word's tail is a prefix of the breaker.
                for pos in (0..word.len()).filter(|&p| word[p] == s[0]) {
                    let overlap = word.len() - pos;
                    if overlap < s.len() && word[pos..] == s[..overlap] {
                        let tail = tails.entry(overlap).or_insert_with(|| {
                            let rest = String::from_utf8_lossy(&s[overlap..]);
                            let mut t = encode(&rest);
                            t.truncate(MAX_TAIL_TOKENS);
                            t
                        });
                        let tail = tail.clone();
                        b.add(id, tail);
                    }
                }
            }
        }
        b
    }

    fn add(&mut self, head: u32, tail: Vec<u32>) {
        let tails = self.heads.entry(head).or_default();
        if !tails.contains(&tail) {
            tails.push(tail);
        }
    }

    /// Whether `token` is a breaker by itself (such tokens are never penalised).
    fn is_single(&self, token: u32) -> bool {
        self.heads
            .get(&token)
            .is_some_and(|t| t.iter().any(Vec::is_empty))
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// DRY's settings, as the sampler passes them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    /// Tokens of history scanned; `None` is the whole history.
    pub last_n: Option<usize>,
}

impl Dry {
    /// Whether it can change anything (llama.cpp's condition).
    pub(crate) fn enabled(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.last_n != Some(0)
    }

    /// Subtracts each penalty from `logits` given `history` (oldest first).
    pub(crate) fn apply(&self, logits: &mut [f32], history: &[u32], breakers: &DryBreakers) {
        if !self.enabled() {
            return;
        }
        let n = self.last_n.map_or(history.len(), |l| l.min(history.len()));
        if n <= self.allowed_length {
            return;
        }
        let window = &history[history.len() - n..];
        // `rat(i)`: the token `i` places before the last one.
        let rat = |i: usize| window[n - 1 - i];

        // A breaker ending `i` tokens from the end limits how far back a
        // repeat may reach.
        let mut rep_limit = n;
        for i in 0..n {
            let Some(tails) = breakers.heads.get(&rat(i)) else {
                continue;
            };
            let longest = tails
                .iter()
                .filter(|t| {
                    t.len() <= i && t.iter().enumerate().all(|(o, &tok)| tok == rat(i - o - 1))
                })
                .map(Vec::len)
                .max();
            if let Some(len) = longest {
                rep_limit = i - len;
                break;
            }
        }
        if rep_limit < self.allowed_length {
            return;
        }

        // z[k]: how many tokens ending `k` places before the last one match
        // the tokens ending at the last one (the Z-algorithm on the reversed
        // window), capped at `rep_limit`.
        let mut z = vec![0usize; n];
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..n {
            let mut len = 0;
            if k <= rt {
                len = z[k - lt].min(rt - k + 1);
            }
            while k + len < n && rat(len) == rat(k + len) {
                len += 1;
            }
            if len > 0 && k + len - 1 > rt {
                lt = k;
                rt = k + len - 1;
            }
            z[k] = len;
        }

        // The token after each long enough repeat would extend it.
        let mut longest: HashMap<u32, usize> = HashMap::new();
        for (k, &len) in z.iter().enumerate().skip(1) {
            let len = len.min(rep_limit);
            if len >= self.allowed_length {
                let next = rat(k - 1);
                let e = longest.entry(next).or_insert(0);
                *e = (*e).max(len);
            }
        }

        // Clamp the exponent so `base^exp` stays finite.
        const FLOAT_MAX_LOG: f32 = 88.722_84;
        let max_exp = if self.base > 1.000_001 {
            (FLOAT_MAX_LOG / self.base.ln()) as usize
        } else {
            0
        };
        for (token, len) in longest {
            if breakers.is_single(token) {
                continue;
            }
            let Some(l) = logits.get_mut(token as usize) else {
                continue;
            };
            let mut exp = len - self.allowed_length;
            if max_exp > 0 {
                exp = exp.min(max_exp);
            }
            *l -= self.multiplier * self.base.powi(exp as i32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dry(allowed: usize) -> Dry {
        Dry {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: allowed,
            last_n: None,
        }
    }

    #[test]
    fn penalizes_the_token_that_would_extend_a_repeat() {
        // History "a b c d ... a b c": emitting d would repeat "a b c d".
        let history = [1, 2, 3, 4, 9, 8, 1, 2, 3];
        let mut logits = vec![0.0f32; 10];
        dry(2).apply(&mut logits, &history, &DryBreakers::default());
        // The repeat is 3 long: penalty 1 * 2^(3 - 2) = 2 on token 4 only.
        assert_eq!(logits[4], -2.0);
        let others: f32 = logits
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 4)
            .map(|(_, l)| l.abs())
            .sum();
        assert_eq!(others, 0.0);
    }

    #[test]
    fn matches_llama_cpp_example_and_respects_allowed_length() {
        // llama.cpp's example: a b c c b c y a b c gives c: 3, b: 1, y: 2.
        let (a, b, c, y) = (0u32, 1, 2, 3);
        let history = [a, b, c, c, b, c, y, a, b, c];
        let mut logits = vec![0.0f32; 4];
        dry(1).apply(&mut logits, &history, &DryBreakers::default());
        assert_eq!(logits, vec![0.0, -1.0, -4.0, -2.0]);
        // Allowed length 3: only the 3-long repeat (followed by c) counts.
        let mut logits = vec![0.0f32; 4];
        dry(3).apply(&mut logits, &history, &DryBreakers::default());
        assert_eq!(logits, vec![0.0, 0.0, -1.0, 0.0]);
    }

    #[test]
    fn a_breaker_cuts_the_repeat() {
        let history = [1, 2, 3, 4, 9, 8, 1, 2, 3];
        // Token 2 breaks sequences: the repeat can reach back only to it.
        let breakers = DryBreakers::from_sequences(&[vec![2]]);
        let mut logits = vec![0.0f32; 10];
        dry(2).apply(&mut logits, &history, &breakers);
        assert!(logits.iter().all(|&l| l == 0.0), "{logits:?}");
    }

    #[test]
    fn breakers_are_found_in_the_vocabulary() {
        // Tokens: "a", "b:", ":", "x\"", "\"y"; breaker ":" and "\"y".
        let pieces: Vec<&[u8]> = vec![b"a", b"b:", b":", b"x\"", b"\"y", b"y"];
        let encode = |s: &str| match s {
            "y" => vec![5],
            _ => vec![],
        };
        let b = DryBreakers::build(
            6,
            |i| pieces[i as usize],
            encode,
            &[":".into(), "\"y".into()],
        );
        assert!(b.is_single(1) && b.is_single(2) && b.is_single(4));
        assert!(!b.is_single(0));
        // "x\"" ends with the start of "\"y": head 3, tail ["y"].
        assert_eq!(b.heads.get(&3), Some(&vec![vec![5]]));
    }
}
