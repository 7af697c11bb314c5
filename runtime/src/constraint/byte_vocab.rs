//! A byte-level vocabulary under llguidance, for the grammar unit tests:
//! every byte a token, then the given special words, then an end token, so
//! a grammar can be checked against text without a model.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

struct Bytes(TokTrie);

impl TokenizerEnv for Bytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.0
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.0.greedy_tokenize(s)
    }
}

/// Whether the Lark `grammar` lets a model whose vocabulary is the 256
/// bytes plus `words` write `text` (tokenized greedily, so a word is one
/// token) and then end. Panics on a grammar llguidance refuses.
pub(crate) fn accepts(grammar: &str, words: &[&str], text: &str) -> bool {
    let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    vocab.extend(words.iter().map(|w| w.as_bytes().to_vec()));
    let end = vocab.len() as u32;
    let mut eos = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    eos.extend_from_slice(b"<eos>");
    vocab.push(eos);
    let info = TokRxInfo::new(vocab.len() as u32, end);
    let env: TokEnv = Arc::new(Bytes(TokTrie::from(&info, &vocab)));
    let mut factory = llguidance::ParserFactory::new_simple(&env).expect("factory");
    factory.quiet();
    let top = llguidance::api::TopLevelGrammar::from_lark(grammar.to_string());
    let parser = factory.create_parser(top).expect("parser");
    let mut m = llguidance::Matcher::new(Ok(parser));
    assert!(m.get_error().is_none(), "{:?}\n{grammar}", m.get_error());
    for &t in &env.tok_trie().greedy_tokenize(text.as_bytes()) {
        if m.consume_token(t).is_err() {
            return false;
        }
    }
    // The mask, not `validate_tokens`: a lexeme still open at the end,
    // like a closing brace that whitespace could follow, is only settled
    // there.
    m.compute_mask().is_ok_and(|v| v.is_allowed(end))
}
