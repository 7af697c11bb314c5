//! Variable tracking (`vt`), RULER's multi-hop task: a chain of assignments
//! `VAR QWERT = 12345.`, `VAR ASDFG = VAR QWERT.`, ... is scattered through the
//! haystack and the model must name every variable that ends up holding the
//! number. A short worked example with its own chain comes first, as in RULER,
//! so the model sees the answer's format.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::haystack::{fit, noise_with, Fitted};
use crate::error::Result;
use tern_runtime::tokenizer::Tokenizer;

/// Variables in the chain: one assignment of the number, then four hops.
const CHAIN: usize = 5;
/// Noise sentences in the worked example.
const EXAMPLE_NOISE: usize = 10;

/// Distinct 5-letter upper-case names, none equal to one in `taken`.
fn names(rng: &mut ChaCha8Rng, n: usize, taken: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(n);
    while out.len() < n {
        let name: String = (0..5).map(|_| rng.gen_range(b'A'..=b'Z') as char).collect();
        if !out.contains(&name) && !taken.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The chain's statements: the first variable gets `value`, each next one the
/// previous variable.
fn statements(vars: &[String], value: u32) -> Vec<String> {
    vars.iter()
        .enumerate()
        .map(|(i, v)| match i {
            0 => format!("VAR {v} = {value}."),
            _ => format!("VAR {v} = VAR {}.", vars[i - 1]),
        })
        .collect()
}

/// The chain's statements at sorted random depths.
fn scatter(rng: &mut ChaCha8Rng, vars: &[String], value: u32) -> Vec<(f64, String)> {
    let mut depths: Vec<f64> = (0..vars.len()).map(|_| rng.gen::<f64>()).collect();
    depths.sort_by(f64::total_cmp);
    depths.into_iter().zip(statements(vars, value)).collect()
}

/// One task block, up to the answer's opening words.
fn block(context: &str, value: u32) -> String {
    format!(
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: According to the chain(s) of variable assignment in the text above, {CHAIN} variables are assigned the value {value}, they are:"
    )
}

/// A prompt of at most `target` tokens and the variable names its answer must contain.
pub(super) fn build(
    tok: &Tokenizer,
    target: usize,
    rng: &mut ChaCha8Rng,
) -> Result<(Fitted, Vec<String>)> {
    let example_vars = names(rng, CHAIN, &[]);
    let example_value = rng.gen_range(10_000u32..100_000);
    let example_chain = scatter(rng, &example_vars, example_value);
    let example = format!(
        "{} {}\n\n",
        block(&noise_with(EXAMPLE_NOISE, &example_chain), example_value),
        example_vars.join(" ")
    );
    let vars = names(rng, CHAIN, &example_vars);
    let mut value = rng.gen_range(10_000u32..100_000);
    while value == example_value {
        value = rng.gen_range(10_000u32..100_000);
    }
    let chain = scatter(rng, &vars, value);
    let fitted = fit(tok, target, target, "\nQuestion:", |n| {
        format!("{example}{}", block(&noise_with(n, &chain), value))
    })?;
    Ok((fitted, vars))
}
