//! Needle in a haystack, RULER's three retrieval variants: one needle
//! (`niah_single`), the queried needle among needles with other keys
//! (`niah_multikey`), and one key holding several values that must all be
//! returned (`niah_multivalue`).
//!
//! A needle reads "One of the special magic numbers for KEY is: VALUE." with a
//! two-word key and a 7-digit value, at a random depth of the noise haystack.
//! The prompt ends with the start of the answer, so a base model continues it
//! with the number.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::haystack::{fit, noise_with, Fitted};
use super::words::WORDS;
use crate::error::Result;
use tern_runtime::tokenizer::Tokenizer;

/// Needles in `niah_multikey` (one queried, the rest distractors) and values
/// of the key in `niah_multivalue`, as RULER's defaults.
const NEEDLES: usize = 4;

const INTRO: &str = "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the numbers afterwards.\n";

/// Which retrieval variant to build.
#[derive(Clone, Copy, Debug)]
pub(super) enum Niah {
    Single,
    MultiKey,
    MultiValue,
}

/// Distinct two-word keys such as `harbor-violin`.
fn keys(rng: &mut ChaCha8Rng, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    while out.len() < n {
        let pair: Vec<&&str> = WORDS.choose_multiple(rng, 2).collect();
        let key = format!("{}-{}", pair[0], pair[1]);
        if !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

/// Distinct 7-digit values.
fn values(rng: &mut ChaCha8Rng, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    while out.len() < n {
        let v = rng.gen_range(1_000_000u32..10_000_000).to_string();
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// A prompt of at most `target` tokens and the values its answer must contain.
pub(super) fn build(
    tok: &Tokenizer,
    kind: Niah,
    target: usize,
    rng: &mut ChaCha8Rng,
) -> Result<(Fitted, Vec<String>)> {
    let (n_keys, n_values) = match kind {
        Niah::Single => (1, 1),
        Niah::MultiKey => (NEEDLES, NEEDLES),
        Niah::MultiValue => (1, NEEDLES),
    };
    let keys = keys(rng, n_keys);
    let values = values(rng, n_values);
    // Needle i holds value i under key i (multikey) or under the one key.
    let mut needles: Vec<(f64, String)> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let key = &keys[i.min(n_keys - 1)];
            (
                rng.gen::<f64>(),
                format!("One of the special magic numbers for {key} is: {v}."),
            )
        })
        .collect();
    needles.sort_by(|a, b| a.0.total_cmp(&b.0));
    // The queried key: for multikey a random one of the four, else the only one.
    let q = rng.gen_range(0..n_keys);
    let key = &keys[q];
    let (question, expected) = match kind {
        Niah::MultiValue => (
            format!("\nWhat are all the special magic numbers for {key} mentioned in the provided text? The special magic numbers for {key} mentioned in the provided text are"),
            values.clone(),
        ),
        _ => (
            format!("\nWhat is the special magic number for {key} mentioned in the provided text? The special magic number for {key} mentioned in the provided text is"),
            vec![values[q].clone()],
        ),
    };
    let fitted = fit(tok, target, target, "\nWhat ", |n| {
        format!("{INTRO}{}{question}", noise_with(n, &needles))
    })?;
    Ok((fitted, expected))
}
