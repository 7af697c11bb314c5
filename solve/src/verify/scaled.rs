//! Difficulty-scaled judging: run a few unit tests on every candidate first,
//! estimate how hard the question is from how much the candidates' pass
//! patterns disagree, and run more of the tests only where they disagree.
//!
//! Tests exist to tell candidates apart. When every candidate passes and
//! fails the same screening tests, more tests rarely change which one wins,
//! and each costs a sandboxed interpreter per candidate; when they split,
//! more tests separate them. Programs and tests come from best-of-N; the
//! reports go back to it for [`super::best_by_tests`].

use super::judge::{judge_many, tests_for_difficulty, JudgeError, JudgeReport, Limits};

/// Tests every candidate runs before the difficulty is estimated.
pub const SCREEN_TESTS: usize = 2;

/// The share of candidates outside the largest group with one pass pattern,
/// in `[0, 1]`: 0 when all behave alike on the tests run, near 1 when every
/// candidate behaves differently.
pub fn pattern_disagreement(reports: &[JudgeReport]) -> f64 {
    if reports.is_empty() {
        return 0.0;
    }
    let patterns: Vec<Vec<bool>> = reports.iter().map(JudgeReport::pass_pattern).collect();
    let largest = patterns
        .iter()
        .map(|p| patterns.iter().filter(|q| *q == p).count())
        .max()
        .unwrap_or(0);
    1.0 - largest as f64 / reports.len() as f64
}

/// What difficulty-scaled judging ran and found.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaledJudgement {
    /// One report per program, over the tests run.
    pub reports: Vec<JudgeReport>,
    /// Tests each program ran (the first `tests_run` of the given tests).
    pub tests_run: usize,
    /// The screening round's [`pattern_disagreement`]: the difficulty estimate.
    pub disagreement: f64,
}

/// Judges `programs` on the first [`SCREEN_TESTS`] (or `screen`) of `tests`,
/// then on as many more as [`tests_for_difficulty`] gives for the screening
/// round's disagreement.
pub fn judge_scaled(
    programs: &[String],
    tests: &[String],
    screen: usize,
    limits: &Limits,
) -> Result<ScaledJudgement, JudgeError> {
    let screen = screen.max(1).min(tests.len());
    let mut reports = judge_many(programs, &tests[..screen], limits)?;
    let disagreement = pattern_disagreement(&reports);
    let chosen = tests_for_difficulty(tests, disagreement, screen);
    if chosen.len() > screen {
        let more = judge_many(programs, &chosen[screen..], limits)?;
        for (r, m) in reports.iter_mut().zip(more) {
            r.verdicts.extend(m.verdicts);
            r.passed += m.passed;
            r.total += m.total;
        }
    }
    Ok(ScaledJudgement {
        reports,
        tests_run: chosen.len(),
        disagreement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::judge::Verdict;

    fn report(pattern: &[bool]) -> JudgeReport {
        let verdicts: Vec<Verdict> = pattern
            .iter()
            .map(|&p| {
                if p {
                    Verdict::Pass
                } else {
                    Verdict::Fail {
                        reason: "assert".into(),
                    }
                }
            })
            .collect();
        JudgeReport {
            passed: pattern.iter().filter(|p| **p).count(),
            total: pattern.len(),
            verdicts,
        }
    }

    #[test]
    fn disagreement_is_the_share_outside_the_largest_pattern_group() {
        assert_eq!(pattern_disagreement(&[]), 0.0);
        let same = [report(&[true, false]), report(&[true, false])];
        assert_eq!(pattern_disagreement(&same), 0.0);
        let split = [
            report(&[true, true]),
            report(&[true, true]),
            report(&[false, true]),
            report(&[false, false]),
        ];
        assert_eq!(pattern_disagreement(&split), 0.5);
    }

    fn tests() -> Vec<String> {
        (0..8)
            .map(|i| format!("assert add({i}, 3) == {}", i + 3))
            .collect()
    }

    #[test]
    fn agreeing_candidates_run_only_the_screening_tests() {
        let correct = "def add(a, b):\n    return a + b\n".to_string();
        let j = judge_scaled(&vec![correct; 3], &tests(), 2, &Limits::default()).unwrap();
        assert_eq!(j.tests_run, 2);
        assert_eq!(j.disagreement, 0.0);
        assert!(j.reports.iter().all(|r| r.total == 2 && r.passed == 2));
    }

    #[test]
    fn disagreeing_candidates_run_more_tests() {
        let programs = vec![
            "def add(a, b):\n    return a + b\n".to_string(),
            // Right only when a == 0: fails the second screening test.
            "def add(a, b):\n    return 3\n".to_string(),
        ];
        let j = judge_scaled(&programs, &tests(), 2, &Limits::default()).unwrap();
        assert_eq!(j.disagreement, 0.5);
        // 2 + round(6 * 0.5) tests, and every report covers all of them.
        assert_eq!(j.tests_run, 5);
        assert!(j.reports.iter().all(|r| r.total == 5));
        assert_eq!((j.reports[0].passed, j.reports[1].passed), (5, 1));
    }
}
