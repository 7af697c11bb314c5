//! Passkey retrieval: a long filler text hides a random 5-digit key at a chosen
//! depth and the model is asked for it. A compressed KV cache that dropped the
//! key's tokens cannot answer; this measures what a policy keeps.

use crate::error::Result;
use tern_runtime::tokenizer::Tokenizer;

const INTRO: &str = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about it.\n";
const FILLER: &str =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const QUESTION: &str = "\nWhat is the pass key? The pass key is";

/// One passkey prompt, tokenized.
#[derive(Debug, Clone)]
pub struct PasskeyPrompt {
    /// The key the model must repeat.
    pub key: u32,
    /// Prompt token ids (about the requested length).
    pub tokens: Vec<u32>,
}

/// Builds a prompt of about `n_tokens` tokens with `key` at `depth` (0.0 = right
/// after the introduction, 1.0 = just before the question).
pub fn build(tok: &Tokenizer, key: u32, n_tokens: usize, depth: f64) -> Result<PasskeyPrompt> {
    let needle = format!(" The pass key is {key}. Remember it. {key} is the pass key.");
    let fixed = tok.encode(INTRO, true, false)?.len()
        + tok.encode(&needle, false, false)?.len()
        + tok.encode(QUESTION, false, false)?.len();
    let per_filler = tok.encode(FILLER, false, false)?.len().max(1);
    let n_fill = n_tokens.saturating_sub(fixed) / per_filler;
    let before = ((n_fill as f64) * depth.clamp(0.0, 1.0)).round() as usize;
    let text = format!(
        "{INTRO}{}{needle}{}{QUESTION}",
        FILLER.repeat(before),
        FILLER.repeat(n_fill - before)
    );
    Ok(PasskeyPrompt {
        key,
        tokens: tok.encode(&text, true, false)?,
    })
}

/// Whether a completion states the key.
pub fn is_correct(key: u32, completion: &str) -> bool {
    completion.contains(&key.to_string())
}

/// A deterministic 5-digit key for trial `i` under `seed`.
pub fn key_for(seed: u64, i: u64) -> u32 {
    let mut x = seed ^ (i.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    10_000 + (x % 90_000) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_five_digits_and_vary() {
        let keys: Vec<u32> = (0..50).map(|i| key_for(7, i)).collect();
        assert!(keys.iter().all(|k| (10_000..100_000).contains(k)));
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert!(distinct.len() > 45);
    }

    #[test]
    fn correctness_is_substring() {
        assert!(is_correct(48213, " 48213. Remember"));
        assert!(!is_correct(48213, " 4821"));
    }
}
