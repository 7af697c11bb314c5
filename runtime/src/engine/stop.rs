//! Stop strings over streamed text.

/// Holds back text that could be the start of a stop string, so a stop string
/// split across tokens is never emitted.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What [`StopMatcher::feed`] lets out: text safe to show, and whether a stop
/// string ended it.
pub struct Emit {
    /// Text before any stop string, no longer held back.
    pub text: String,
    /// Whether a stop string was found (`text` ends where it began).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings never match).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    /// Adds `piece`; returns text safe to emit, and whether a stop string hit.
    pub fn feed(&mut self, piece: &str) -> Option<Emit> {
        self.held.push_str(piece);
        let stops = self.stops.iter().filter(|s| !s.is_empty());
        if let Some(at) = stops.filter_map(|s| self.held.find(s.as_str())).min() {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Some(Emit {
                text,
                stopped: true,
            });
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        if cut == 0 {
            return None;
        }
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Some(Emit {
            text,
            stopped: false,
        })
    }

    /// Adds stop strings from here on (text already emitted is not searched).
    pub(crate) fn add(&mut self, more: Vec<String>) {
        self.stops.extend(more);
    }

    /// Ends the text: what was held back, followed by `rest`.
    pub fn flush(&mut self, rest: String) -> String {
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&rest);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(stops);
        let mut out = String::new();
        for p in pieces {
            if let Some(e) = m.feed(p) {
                out.push_str(&e.text);
                if e.stopped {
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush(String::new()));
        (out, false)
    }

    #[test]
    fn stop_string_split_across_pieces_is_never_emitted() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".into(), true)
        );
        assert_eq!(run(&["END"], &["abc E", "x"]), ("abc Ex".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            run(&["\n\n", "###"], &["x\n", "\nmore"]),
            ("x".into(), true)
        );
    }
}
