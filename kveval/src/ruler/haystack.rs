//! The haystack RULER hides its needles in, and the search that sizes a prompt
//! to a token budget.
//!
//! RULER's "repeat" haystack: five plain sentences cycled, so nothing in the
//! filler competes with the needles for attention by meaning. A prompt's length
//! is set in tokens of the model's own tokenizer by searching for the largest
//! filler that still fits, as RULER does.

use crate::error::{KvEvalError, Result};
use tern_runtime::tokenizer::Tokenizer;

/// The noise sentences, cycled in this order.
const NOISE: [&str; 5] = [
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
];

/// `n` noise sentences with each `(depth, text)` insert placed between them:
/// depth 0.0 before the first sentence, 1.0 after the last. Inserts at the
/// same place keep their order.
pub(super) fn noise_with(n: usize, inserts: &[(f64, String)]) -> String {
    let mut at: Vec<(usize, &str)> = inserts
        .iter()
        .map(|(d, t)| {
            (
                ((n as f64) * d.clamp(0.0, 1.0)).round() as usize,
                t.as_str(),
            )
        })
        .collect();
    at.sort_by_key(|(i, _)| *i);
    let mut parts: Vec<&str> = Vec::with_capacity(n + inserts.len());
    let mut next = at.iter().peekable();
    for i in 0..=n {
        while let Some((_, text)) = next.next_if(|(j, _)| *j == i) {
            parts.push(text);
        }
        if i < n {
            parts.push(NOISE[i % NOISE.len()]);
        }
    }
    parts.join(" ")
}

/// A prompt sized by [`fit`].
pub(super) struct Fitted {
    /// Its token ids (with BOS).
    pub tokens: Vec<u32>,
    /// How many of them come before the question: the longest prefix the
    /// text before the last `marker` tokenizes to.
    pub context: usize,
}

/// The largest `n` in `0..=max` whose `render(n)` tokenizes (with BOS) to at
/// most `target` tokens, and those tokens, split where the question (the last
/// `marker` in the text) begins. Token counts grow with `n` (up to a token
/// where two pieces merge), so a bisection finds it in a dozen encodes.
pub(super) fn fit(
    tok: &Tokenizer,
    target: usize,
    max: usize,
    marker: &str,
    render: impl Fn(usize) -> String,
) -> Result<Fitted> {
    let (n, tokens) = fit_count(tok, target, max, &render)?;
    let text = render(n);
    let at = text.rfind(marker).unwrap_or(text.len());
    let before = tok.encode(&text[..at], true, false)?;
    let context = before
        .iter()
        .zip(&tokens)
        .take_while(|(a, b)| a == b)
        .count();
    Ok(Fitted { tokens, context })
}

fn fit_count(
    tok: &Tokenizer,
    target: usize,
    max: usize,
    render: &impl Fn(usize) -> String,
) -> Result<(usize, Vec<u32>)> {
    let encode = |n: usize| tok.encode(&render(n), true, false);
    let base = encode(0)?;
    if base.len() > target {
        return Err(KvEvalError::TooShortForTask {
            target,
            needed: base.len(),
        });
    }
    // First guess from the cost of a few units, then widen until past the target.
    let probe = max.min(16);
    let per_unit = if probe == 0 {
        1.0
    } else {
        (encode(probe)?.len().saturating_sub(base.len()) as f64 / probe as f64).max(0.5)
    };
    let guess = ((target - base.len()) as f64 / per_unit) as usize;
    let (mut lo, mut lo_tokens) = (0, base);
    let mut hi = (guess + guess / 8 + 8).min(max);
    loop {
        let t = encode(hi)?;
        if t.len() > target {
            break;
        }
        (lo, lo_tokens) = (hi, t);
        if hi == max {
            return Ok((lo, lo_tokens));
        }
        hi = (hi * 2).min(max);
    }
    // Invariant: render(lo) fits, render(hi) does not.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let t = encode(mid)?;
        if t.len() <= target {
            (lo, lo_tokens) = (mid, t);
        } else {
            hi = mid;
        }
    }
    Ok((lo, lo_tokens))
}

#[cfg(test)]
mod tests {
    use super::noise_with;

    #[test]
    fn inserts_land_at_their_depths_in_order() {
        let text = noise_with(
            10,
            &[(0.0, "A.".into()), (0.5, "B.".into()), (1.0, "C.".into())],
        );
        assert!(text.starts_with("A. The grass is green."));
        assert!(text.ends_with("There and back again. C."));
        let b = text.find("B.").unwrap();
        assert_eq!(text[..b].matches('.').count(), 6, "{text}");
    }
}
