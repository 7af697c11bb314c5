//! The model's vocabulary as llguidance sees it: a token trie over each
//! token's bytes.

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// Tern's vocabulary behind llguidance's [`TokenizerEnv`].
pub(super) struct Vocab {
    trie: TokTrie,
}

impl Vocab {
    /// Builds the trie. Control tokens are entered as llguidance's special
    /// marker byte plus their text, so no grammar can spell them as text;
    /// `stop` are the ids that end generation, allowed only where the
    /// grammar may end.
    pub(super) fn new(tokenizer: &Tokenizer, stop: &[u32]) -> Self {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|t| {
                if tokenizer.is_control(t) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.bytes_of(t, true));
                    w
                } else {
                    tokenizer.bytes_of(t, false).to_vec()
                }
            })
            .collect();
        let eos = stop
            .first()
            .copied()
            .or(tokenizer.eos())
            .unwrap_or(n as u32 - 1);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tokenizer.bos();
        let mut trie = TokTrie::from(&info, &words);
        if !stop.is_empty() {
            trie = trie.with_eos_tokens(stop);
        }
        Vocab { trie }
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only for text a grammar would force, which Tern never asks for (it
    /// samples under the mask): the trie's greedy split.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}
