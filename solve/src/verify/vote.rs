//! Voting among candidates' extracted answers (self-consistency), and the
//! Beta-posterior rule adaptive width uses to stop sampling once the leading
//! answer is settled (DESIGN.md §5).

use serde::Serialize;

use super::answer::answers_match;

/// The outcome of a majority vote among candidates' answers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Vote {
    /// The winning answer, as the first candidate holding it wrote it.
    pub answer: String,
    /// How many candidates gave an answer equivalent to the winner.
    pub count: usize,
    /// The size of the next largest group of equivalent answers (0 if none).
    pub runner_up: usize,
    /// All candidates, including those without an answer.
    pub total: usize,
    /// The index of the first candidate holding the winning answer.
    pub index: usize,
}

impl Vote {
    /// The share of candidates that did not give the winning answer, in `[0, 1]`:
    /// an estimate of how hard the question is (see
    /// [`super::judge::tests_for_difficulty`]).
    pub fn disagreement(&self) -> f64 {
        1.0 - self.count as f64 / self.total as f64
    }
}

/// Majority vote (self-consistency) over candidates' answers.
///
/// Equivalent answers ([`answers_match`], compared with each group's first
/// answer) form one group; `None` is a candidate without an answer and joins no
/// group. The largest group wins and ties go to the group seen first. `None`
/// when no candidate has an answer.
pub fn vote<'a>(answers: impl IntoIterator<Item = Option<&'a str>>) -> Option<Vote> {
    struct Group<'a> {
        answer: &'a str,
        first: usize,
        count: usize,
    }
    let mut groups: Vec<Group<'a>> = Vec::new();
    let mut total = 0;
    for (index, answer) in answers.into_iter().enumerate() {
        total += 1;
        let Some(answer) = answer else { continue };
        match groups.iter_mut().find(|g| answers_match(g.answer, answer)) {
            Some(group) => group.count += 1,
            None => groups.push(Group {
                answer,
                first: index,
                count: 1,
            }),
        }
    }
    let mut winner: Option<usize> = None;
    for (g, group) in groups.iter().enumerate() {
        // Strictly greater: on a tie the earlier group keeps the lead.
        if winner.is_none_or(|w| group.count > groups[w].count) {
            winner = Some(g);
        }
    }
    let winner = winner?;
    let runner_up = groups
        .iter()
        .enumerate()
        .filter(|&(g, _)| g != winner)
        .map(|(_, group)| group.count)
        .max();
    let group = &groups[winner];
    Some(Vote {
        answer: group.answer.to_string(),
        count: group.count,
        runner_up: runner_up.unwrap_or(0),
        total,
        index: group.first,
    })
}

/// The posterior probability that the leading answer is the true majority,
/// P(p > 1/2), after `top` votes for it and `runner_up` for its closest rival.
///
/// Model: p, the leader's share of the two-way race, has a uniform prior, so
/// after the votes its posterior is Beta(a, b) with a = top + 1 and
/// b = runner_up + 1. Then P(p > 1/2) = 1 - I_{1/2}(a, b), and for integer a, b
/// the regularized incomplete beta is a binomial tail: with n = a + b - 1,
/// I_x(a, b) = sum_{j=a}^{n} C(n, j) x^j (1-x)^(n-j); at x = 1/2 this leaves
/// P(p > 1/2) = 2^-n * sum_{j=0}^{a-1} C(n, j). Computed with iterated binomial
/// coefficients in f64, exact for the counts best-of-N sees (n <= 53), and
/// rescaled so large counts neither overflow nor underflow.
pub fn majority_posterior(top: usize, runner_up: usize) -> f64 {
    let n = top.saturating_add(runner_up).saturating_add(1);
    // Rescale when sums get this large; 2^n itself would overflow past n = 1023.
    const RESCALE: f64 = 1e280;
    let (mut term, mut below, mut total) = (1.0f64, 0.0f64, 0.0f64);
    for j in 0..=n {
        if j <= top {
            below += term;
        }
        total += term;
        if total > RESCALE {
            (term, below, total) = (term / RESCALE, below / RESCALE, total / RESCALE);
        }
        // C(n, j + 1) = C(n, j) * (n - j) / (j + 1).
        term = term * (n - j) as f64 / (j + 1) as f64;
    }
    below / total
}

/// The adaptive-width stopping rule (DESIGN.md §5): stop sampling candidates
/// once the leading answer is confidently the majority, that is when
/// [`majority_posterior`]`(top, runner_up) >= threshold` (Tern uses 0.95).
///
/// With no rival, 4 agreeing votes suffice at 0.95 (P = 31/32), 3 do not
/// (P = 15/16); against one rival it takes 6 (P = 247/256).
pub fn majority_confident(top: usize, runner_up: usize, threshold: f64) -> bool {
    majority_posterior(top, runner_up) >= threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vote_groups_equivalent_answers_and_breaks_ties_by_first_seen() {
        let v = vote([
            Some("2"),
            None,
            Some("1,000"),
            Some("2.0"),
            Some("1000"),
            Some("3"),
        ])
        .expect("answers exist");
        assert_eq!(
            v,
            Vote {
                answer: "2".into(),
                count: 2,
                runner_up: 2,
                total: 6,
                index: 0
            },
            "a 2-2 tie goes to the answer seen first"
        );
        let v = vote([None, Some("7"), Some("$7$"), Some("8")]).expect("answers exist");
        assert_eq!(
            (v.answer.as_str(), v.count, v.runner_up, v.total, v.index),
            ("7", 2, 1, 4, 1)
        );
        assert!((v.disagreement() - 0.5).abs() < 1e-12);
        assert_eq!(vote([None, None]), None);
        assert_eq!(vote(std::iter::empty()), None);
    }

    #[test]
    fn majority_posterior_is_the_exact_beta_tail() {
        let cases = [
            ((0, 0), 0.5),
            ((1, 1), 0.5),
            ((1, 0), 0.75),
            ((3, 0), 15.0 / 16.0),
            ((4, 0), 31.0 / 32.0),
            ((5, 1), 120.0 / 128.0),
            ((6, 1), 247.0 / 256.0),
            ((2, 3), 22.0 / 64.0),
        ];
        for ((top, runner_up), want) in cases {
            assert_eq!(
                majority_posterior(top, runner_up),
                want,
                "({top}, {runner_up})"
            );
        }
        assert!(!majority_confident(3, 0, 0.95));
        assert!(majority_confident(4, 0, 0.95));
        assert!(!majority_confident(5, 1, 0.95));
        assert!(majority_confident(6, 1, 0.95));
        assert!(!majority_confident(32, 32, 0.95));
    }

    #[test]
    fn majority_posterior_survives_large_counts() {
        let p = majority_posterior(3000, 2000);
        assert!(p.is_finite() && p > 0.999_999, "{p}");
        let q = majority_posterior(2000, 3000);
        assert!(q.is_finite() && q < 1e-6, "{q}");
        assert!((majority_posterior(700, 700) - 0.5).abs() < 0.02);
    }
}
