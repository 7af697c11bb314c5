//! Stop sequences over streamed text: text that could begin a sequence is
//! held back until it cannot, so a sequence split across tokens is found
//! and never sent, and a match says which sequence it was (Anthropic's
//! answer names it; the engine's own stop strings do not say).

/// Holds back text that could be the start of a stop sequence, so a
/// sequence split across tokens is found and never sent.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (none: every piece passes straight through).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to send and, on a match, the
    /// sequence (the earliest in the text; the first listed on a tie). The
    /// text after a match is dropped.
    pub fn feed(&mut self, piece: &str) -> (String, Option<String>) {
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            let text = self.held[..at].to_string();
            self.held.clear();
            return (text, Some(stop));
        }
        // Keep the longest suffix that is a proper prefix of a sequence.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (text, None)
    }

    /// What is held back, once no more text comes.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matcher_holds_prefixes_and_finds_the_earliest() {
        let mut m = StopMatcher::new(vec!["bc".into(), "abx".into()]);
        assert_eq!(m.feed("xa"), ("x".into(), None));
        assert_eq!(m.feed("b"), (String::new(), None));
        assert_eq!(m.feed("c"), ("a".into(), Some("bc".into())));
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.feed("café"), ("caf".into(), None));
        assert_eq!(m.flush(), "é");
        let mut none = StopMatcher::new(Vec::new());
        assert_eq!(none.feed("abc"), ("abc".into(), None));
    }
}
