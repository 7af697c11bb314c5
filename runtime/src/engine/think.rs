//! Thinking budgets and answer probes (adaptive length, DESIGN.md §5): what a
//! request asks for ([`ThinkSpec`]) and the per-completion state the scheduler
//! keeps for it ([`ThinkState`], [`Probe`]).
//!
//! A completion with a think spec reasons freely until it has generated
//! `budget` tokens; then the engine appends the forced answer suffix to it
//! (into its cache and its text) and lets it write `answer_tokens` more. With
//! probes, every `every` tokens the engine forks the completion's cache, feeds
//! the suffix to the fork, decodes it greedily for a few tokens and hands the
//! probe's text to the caller's [`ConvergenceRule`]; the fork is then freed.
//! When the rule says the answer has settled, the completion is concluded at
//! once, exactly where the probe was taken (the parent waits while its probe
//! runs). The engine knows nothing about answers: deciding what "settled"
//! means is the rule's job, which `runtime::reasoning` supplies.

use std::fmt;
use std::sync::Arc;

use super::sequence::Completion;

/// The rule's function: probe texts so far in, "stop reasoning" out.
type SettledFn = dyn Fn(&[String]) -> bool + Send + Sync;

/// Decides from a completion's probe texts so far (oldest first) whether its
/// answer has settled and the reasoning can stop.
#[derive(Clone)]
pub struct ConvergenceRule(Arc<SettledFn>);

impl ConvergenceRule {
    /// Wraps `rule`.
    pub fn new(rule: impl Fn(&[String]) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(rule))
    }

    /// Applies the rule.
    pub fn settled(&self, probes: &[String]) -> bool {
        (self.0)(probes)
    }
}

impl fmt::Debug for ConvergenceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConvergenceRule(..)")
    }
}

/// Answer probes taken while a completion reasons.
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    /// Generated tokens between probes (the first probe comes after this many).
    pub every: usize,
    /// Most tokens a probe decodes after the suffix.
    pub max_tokens: usize,
    /// Strings that end a probe early (e.g. a newline after the answer).
    pub stop: Vec<String>,
    /// When to stop reasoning, given the probe texts so far.
    pub rule: ConvergenceRule,
}

/// A thinking budget: reason up to `budget` tokens, then answer.
#[derive(Clone, Debug)]
pub struct ThinkSpec {
    /// Most reasoning tokens before the answer is forced.
    pub budget: usize,
    /// Tokens that force the final answer (e.g. "\n\nThe final answer is"),
    /// used by probes and when the reasoning is concluded.
    pub answer_suffix: Vec<u32>,
    /// Most tokens the completion writes after the suffix.
    pub answer_tokens: usize,
    /// Stop strings that end the answer once it has begun (its sentence's
    /// end), so a forced answer does not ramble on to `answer_tokens`.
    pub answer_stop: Vec<String>,
    /// Probes that can conclude the reasoning before the budget.
    pub probe: Option<ProbeSpec>,
    /// Text with which the model ends its reasoning itself (`</think>` for
    /// a template that marks reasoning): once written, the reasoning is
    /// concluded and the budget no longer applies. `None`: the model's
    /// reasoning has no end mark, and the budget always forces the answer.
    pub closes_with: Option<String>,
}

/// Where one completion is in its think-then-answer life.
#[derive(Debug, Default)]
pub(super) struct ThinkState {
    /// Probe texts so far, oldest first.
    pub probes: Vec<String>,
    /// A probe of this completion is running; the completion waits for it.
    pub probe_live: bool,
    /// Generated-token count at which the reasoning was concluded.
    pub concluded_at: Option<usize>,
    /// Generated-token count of the last probe (never probe one point twice).
    pub last_probe: Option<usize>,
    /// The end of the text so far, as long as the spec's end mark, to find
    /// that mark however the tokens cut it.
    tail: String,
}

impl ThinkState {
    /// Whether the completion should be probed now, having generated `generated` tokens.
    pub fn probe_due(&self, spec: &ThinkSpec, generated: usize) -> bool {
        match &spec.probe {
            Some(p) => {
                self.concluded_at.is_none()
                    && !self.probe_live
                    && self.last_probe != Some(generated)
                    && generated > 0
                    && generated.is_multiple_of(p.every.max(1))
                    && generated < spec.budget
            }
            None => false,
        }
    }

    /// Whether the reasoning has hit the budget without being concluded.
    pub fn over_budget(&self, spec: &ThinkSpec, generated: usize) -> bool {
        self.concluded_at.is_none() && generated >= spec.budget
    }

    /// Reads the text of the completion's latest token: when it completes
    /// the spec's end mark, the model has ended its reasoning by itself,
    /// and the reasoning is concluded there with nothing forced.
    pub fn watch(&mut self, spec: &ThinkSpec, text: &str, generated: usize) {
        let Some(mark) = spec.closes_with.as_deref().filter(|m| !m.is_empty()) else {
            return;
        };
        if self.concluded_at.is_some() {
            return;
        }
        self.tail.push_str(text);
        if self.tail.contains(mark) {
            self.concluded_at = Some(generated);
            self.tail.clear();
            return;
        }
        let keep = self.tail.len().saturating_sub(mark.len());
        let cut = (keep..=self.tail.len())
            .find(|&i| self.tail.is_char_boundary(i))
            .unwrap_or(self.tail.len());
        self.tail.drain(..cut);
    }

    /// The generated-token limit once the answer phase has begun.
    pub fn answer_limit(&self, spec: &ThinkSpec) -> Option<usize> {
        self.concluded_at.map(|at| at + spec.answer_tokens)
    }
}

/// A live probe: a greedy fork of completion `parent` with the suffix appended.
pub(super) struct Probe {
    /// The probed completion's index.
    pub parent: usize,
    /// The parent's generated tokens when it was forked.
    pub at: usize,
    /// The fork, decoding the forced answer.
    pub completion: Completion,
    /// The probe's text so far.
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(every: usize, budget: usize) -> ThinkSpec {
        ThinkSpec {
            budget,
            answer_suffix: vec![1, 2],
            answer_tokens: 8,
            answer_stop: Vec::new(),
            probe: Some(ProbeSpec {
                every,
                max_tokens: 4,
                stop: Vec::new(),
                rule: ConvergenceRule::new(|p| p.len() >= 3),
            }),
            closes_with: None,
        }
    }

    #[test]
    fn probes_fall_every_k_tokens_below_the_budget_only() {
        let s = spec(4, 12);
        let mut t = ThinkState::default();
        let due: Vec<usize> = (0..20).filter(|&g| t.probe_due(&s, g)).collect();
        assert_eq!(due, vec![4, 8]);
        t.probe_live = true;
        assert!(!t.probe_due(&s, 4));
        t.probe_live = false;
        t.last_probe = Some(4);
        assert!(!t.probe_due(&s, 4), "one probe per point");
        assert!(t.probe_due(&s, 8));
        t.concluded_at = Some(6);
        assert!(!t.probe_due(&s, 8));
        assert_eq!(t.answer_limit(&s), Some(14));
        let no_probe = ThinkSpec { probe: None, ..s };
        assert!(!ThinkState::default().probe_due(&no_probe, 4));
    }

    #[test]
    fn a_model_that_closes_its_reasoning_escapes_the_budget() {
        let s = ThinkSpec {
            closes_with: Some("</think>".into()),
            probe: None,
            ..spec(4, 12)
        };
        let mut t = ThinkState::default();
        for (i, piece) in ["<think>", "a <", "/thi", "nk"].iter().enumerate() {
            t.watch(&s, piece, i + 1);
            assert_eq!(t.concluded_at, None, "after {piece:?}");
        }
        t.watch(&s, ">\n\nAnswer", 5);
        assert_eq!(t.concluded_at, Some(5));
        assert!(!t.over_budget(&s, 12), "the budget forces nothing now");
        // Without an end mark the same text concludes nothing.
        let mut t = ThinkState::default();
        t.watch(&spec(4, 12), "</think>", 1);
        assert!(t.over_budget(&spec(4, 12), 12));
    }

    #[test]
    fn the_budget_concludes_only_once() {
        let s = spec(4, 12);
        let mut t = ThinkState::default();
        assert!(!t.over_budget(&s, 11));
        assert!(t.over_budget(&s, 12));
        t.concluded_at = Some(12);
        assert!(!t.over_budget(&s, 13));
        assert!(s
            .probe
            .as_ref()
            .unwrap()
            .rule
            .settled(&["a", "a", "a"].map(String::from)));
        assert!(!s
            .probe
            .as_ref()
            .unwrap()
            .rule
            .settled(&["a", "a"].map(String::from)));
    }
}
