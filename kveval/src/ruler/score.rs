//! RULER's score for its synthetic tasks: string-match recall.
//!
//! A sample scores the share of its expected strings that occur anywhere in
//! the model's output, ignoring case ("string_match_all" in RULER). Extra words
//! cost nothing; a list answer earns partial credit per item found.

/// Score of one output, 0 to 100: the percentage of `expected` found in
/// `output`, case-insensitively. An empty `expected` scores 0.
pub fn score(expected: &[String], output: &str) -> f64 {
    if expected.is_empty() {
        return 0.0;
    }
    let out = output.to_lowercase();
    let found = expected
        .iter()
        .filter(|e| out.contains(&e.to_lowercase()))
        .count();
    100.0 * found as f64 / expected.len() as f64
}

#[cfg(test)]
mod tests {
    use super::score;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn full_credit_none_and_partial() {
        assert_eq!(score(&v(&["4812093"]), " 4812093."), 100.0);
        assert_eq!(score(&v(&["4812093"]), " 4812039."), 0.0);
        let four = v(&["1111111", "2222222", "3333333", "4444444"]);
        assert_eq!(score(&four, "1111111, 3333333 and 9999999"), 50.0);
        assert_eq!(score(&v(&["QWERT"]), "they are: qwert"), 100.0);
        assert_eq!(score(&[], "anything"), 0.0);
    }
}
