//! Turns the engine's per-token log-probabilities ([`TokenLogprob`]: ids and
//! numbers) into OpenAI's two shapes: chat's `{content: [{token, logprob,
//! bytes, top_logprobs}]}` and the legacy completions lists.
//!
//! Token text comes from a [`Vocab`], so the shapes can be tested without a
//! model. End-of-turn control tokens are not output text, so the chat shape
//! leaves them out; alternatives keep their control-token text (`<|im_end|>`),
//! since "the model wanted to stop here" is what they say.

use tern_runtime::engine::TokenLogprob;
use tern_runtime::tokenizer::Tokenizer;
use tern_runtime::LoadedModel;

use crate::openai::chat::{ChatTokenLogprob, TopLogprob};
use crate::openai::completion::{LegacyLogprobs, TopTokens};

/// What a token's text is, for rendering logprobs.
pub trait Vocab: Send + Sync {
    /// The token's bytes, control tokens spelled out.
    fn token_bytes(&self, id: u32) -> Vec<u8>;
    /// Whether the token is a control token (not part of the output text).
    fn is_control(&self, id: u32) -> bool;
}

impl Vocab for Tokenizer {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.bytes_of(id, true).to_vec()
    }
    fn is_control(&self, id: u32) -> bool {
        Tokenizer::is_control(self, id)
    }
}

impl Vocab for LoadedModel {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_bytes(id)
    }
    fn is_control(&self, id: u32) -> bool {
        self.tokenizer.is_control(id)
    }
}

/// JSON has no infinities: OpenAI reports impossible tokens as -9999.
fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

/// A token's text and bytes.
fn text_of(vocab: &dyn Vocab, id: u32) -> (String, Vec<u8>) {
    let bytes = vocab.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// The chat entry for one generated token, or `None` for a control token
/// (end of turn), which is not part of the message.
pub fn chat_entry(vocab: &dyn Vocab, lp: &TokenLogprob) -> Option<ChatTokenLogprob> {
    if vocab.is_control(lp.token) {
        return None;
    }
    let (token, bytes) = text_of(vocab, lp.token);
    let top_logprobs = lp
        .top
        .iter()
        .map(|&(id, p)| {
            let (token, bytes) = text_of(vocab, id);
            TopLogprob {
                token,
                logprob: finite(p),
                bytes,
            }
        })
        .collect();
    Some(ChatTokenLogprob {
        token,
        logprob: finite(lp.logprob),
        bytes,
        top_logprobs,
    })
}

/// Builds one completion's legacy logprobs token by token, tracking each
/// token's character offset in the completion text.
#[derive(Debug, Default)]
pub struct LegacyBuilder {
    offset: usize,
    /// Tokens as `token_id:N` (`return_tokens_as_token_ids`).
    ids: bool,
}

impl LegacyBuilder {
    /// A builder naming tokens by text, or by `token_id:N` when `ids`.
    pub fn new(ids: bool) -> Self {
        Self { offset: 0, ids }
    }

    /// Appends `lp` to `out`. By text, control tokens are skipped, as in the
    /// text; by id, every sampled token is listed, so a client gets exactly
    /// the sequence the model produced.
    pub fn push(&mut self, vocab: &dyn Vocab, lp: &TokenLogprob, out: &mut LegacyLogprobs) {
        let control = vocab.is_control(lp.token);
        if control && !self.ids {
            return;
        }
        let name = |id: u32| {
            if self.ids {
                format!("token_id:{id}")
            } else {
                text_of(vocab, id).0
            }
        };
        let token = name(lp.token);
        let mut top: Vec<(String, f32)> = lp
            .top
            .iter()
            .map(|&(id, p)| (name(id), finite(p)))
            .collect();
        // The legacy API lists the chosen token among the alternatives.
        if !lp.top.iter().any(|&(id, _)| id == lp.token) {
            top.push((token.clone(), finite(lp.logprob)));
        }
        out.text_offset.push(self.offset);
        if !control {
            self.offset += text_of(vocab, lp.token).0.chars().count();
        }
        out.tokens.push(token);
        out.token_logprobs.push(finite(lp.logprob));
        out.top_logprobs.push(TopTokens(top));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Token `i` is the letter `a + i`; token 99 is a control token `<|end|>`.
    pub struct Letters;

    impl Vocab for Letters {
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            if id == 99 {
                return b"<|end|>".to_vec();
            }
            vec![b'a' + (id % 26) as u8]
        }
        fn is_control(&self, id: u32) -> bool {
            id == 99
        }
    }

    fn lp(token: u32, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            token,
            logprob: -0.5,
            top: top.to_vec(),
        }
    }

    #[test]
    fn chat_entry_has_text_bytes_and_alternatives() {
        let e = chat_entry(&Letters, &lp(1, &[(1, -0.5), (99, -1.0)])).unwrap();
        assert_eq!(e.token, "b");
        assert_eq!(e.bytes, b"b");
        assert_eq!(e.top_logprobs.len(), 2);
        assert_eq!(e.top_logprobs[1].token, "<|end|>");
        assert!(chat_entry(&Letters, &lp(99, &[])).is_none());
    }

    #[test]
    fn infinite_logprobs_become_minus_9999() {
        let mut l = lp(0, &[(2, f32::NEG_INFINITY)]);
        l.logprob = f32::NEG_INFINITY;
        let e = chat_entry(&Letters, &l).unwrap();
        assert_eq!(e.logprob, -9999.0);
        assert_eq!(e.top_logprobs[0].logprob, -9999.0);
    }

    #[test]
    fn legacy_offsets_accumulate_and_include_the_chosen_token() {
        let mut b = LegacyBuilder::default();
        let mut out = LegacyLogprobs::default();
        b.push(&Letters, &lp(0, &[(2, -0.1)]), &mut out);
        b.push(&Letters, &lp(99, &[]), &mut out);
        b.push(&Letters, &lp(1, &[(1, -0.5)]), &mut out);
        assert_eq!(out.tokens, vec!["a", "b"]);
        assert_eq!(out.text_offset, vec![0, 1]);
        assert_eq!(out.top_logprobs[0].0.len(), 2);
        assert_eq!(out.top_logprobs[1].0.len(), 1);
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["top_logprobs"][0]["c"], -0.1f32 as f64);
    }
}
