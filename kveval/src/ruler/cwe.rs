//! Common-word extraction (`cwe`), RULER's aggregation task: a long numbered
//! list where ten words recur many times and the rest only a few times; the
//! model must name the ten. Nothing can be retrieved from one place, so the
//! whole list has to survive in the cache. A short worked example comes first,
//! as in RULER.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::haystack::{fit, Fitted};
use super::words::WORDS;
use crate::error::Result;
use tern_runtime::tokenizer::Tokenizer;

/// Words to name.
const COMMON: usize = 10;
/// Occurrences of each rare word.
const RARE_FREQ: usize = 3;
/// Occurrences of each common word at 4k tokens and beyond (RULER's 30).
const COMMON_FREQ: usize = 30;

/// How often the common words occur in a prompt of `target` tokens: RULER's
/// 30, fewer in short prompts so the common words do not crowd out the rest
/// (a list entry costs about 4 tokens; common words take under a third).
fn common_freq(target: usize) -> usize {
    (target / 136).clamp(RARE_FREQ + 2, COMMON_FREQ)
}

/// Each word of `common` `freq` times and the `rare` entries, shuffled,
/// numbered from 1.
fn numbered_list(common: &[&str], freq: usize, rare: &[&str], rng: &mut ChaCha8Rng) -> String {
    let mut list: Vec<&str> = Vec::with_capacity(common.len() * freq + rare.len());
    for w in common {
        list.extend(std::iter::repeat_n(*w, freq));
    }
    list.extend_from_slice(rare);
    list.shuffle(rng);
    let entries: Vec<String> = list
        .iter()
        .enumerate()
        .map(|(i, w)| format!("{}. {w}", i + 1))
        .collect();
    entries.join(" ")
}

/// One task block, up to the answer's opening words.
fn block(list: &str) -> String {
    format!(
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{list}\nQuestion: What are the {COMMON} most common words in the above list? Answer: The top {COMMON} words that appear most often in the list are:"
    )
}

/// A prompt of at most `target` tokens and the common words its answer must contain.
pub(super) fn build(
    tok: &Tokenizer,
    target: usize,
    rng: &mut ChaCha8Rng,
) -> Result<(Fitted, Vec<String>)> {
    let mut words: Vec<&str> = WORDS.to_vec();
    words.shuffle(rng);
    let (example_common, rest) = words.split_at(COMMON);
    let (example_rare, rest) = rest.split_at(COMMON);
    let (common, rare_pool) = rest.split_at(COMMON);
    let answer = |ws: &[&str]| -> String {
        let items: Vec<String> = ws
            .iter()
            .enumerate()
            .map(|(i, w)| format!("{}. {w}", i + 1))
            .collect();
        items.join(" ")
    };
    let example = format!(
        "{} {}\n\n",
        block(&numbered_list(example_common, RARE_FREQ, example_rare, rng)),
        answer(example_common)
    );
    let freq = common_freq(target);
    // Rare entries one at a time (each word up to RARE_FREQ times), so the
    // list can stop within an entry of the target. Each candidate length
    // reshuffles from the same seed: a rendering depends on its length alone.
    let rare: Vec<&str> = rare_pool
        .iter()
        .flat_map(|w| std::iter::repeat_n(*w, RARE_FREQ))
        .collect();
    let list_seed: u64 = rng.gen();
    let fitted = fit(tok, target, rare.len(), "\nQuestion:", |n| {
        let mut r = ChaCha8Rng::seed_from_u64(list_seed);
        format!(
            "{example}{}",
            block(&numbered_list(common, freq, &rare[..n], &mut r))
        )
    })?;
    Ok((fitted, common.iter().map(|w| w.to_string()).collect()))
}
