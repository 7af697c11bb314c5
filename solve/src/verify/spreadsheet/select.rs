//! Best-of-N selection among programs judged on the same task: by the
//! agreement of their outputs on the test-case workbooks (no hidden
//! answers), and the oracle (the reference comparison, an upper bound).
//!
//! Agreement: a candidate's support is the number of (other candidate,
//! test case) pairs in which both produced an answer range
//! ([`super::answers`]) and the two are the same, cell by cell. The most
//! support wins; among equals, the one that produced an answer on more test
//! cases, then the earliest. So a program whose outputs several others
//! reproduce on every workbook beats a lone one, and a program that ran
//! beats one that crashed when nobody agrees with anybody. Programs that
//! crash, time out, or leave the range empty or as the input had it
//! produce no answer and agree with nothing.

use super::WorkbookReport;

/// A candidate's agreement with the others, as [`by_agreement`] ranks it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Support {
    /// (other candidate, test case) pairs with the same answer range.
    pub agreements: usize,
    /// Test cases on which the candidate produced an answer range.
    pub answered: usize,
}

/// Each candidate's [`Support`], in candidate order.
pub fn supports(reports: &[WorkbookReport]) -> Vec<Support> {
    reports
        .iter()
        .enumerate()
        .map(|(i, mine)| {
            let mut s = Support::default();
            for (case, answer) in mine.answers.iter().enumerate() {
                let Some(answer) = answer else { continue };
                s.answered += 1;
                s.agreements += reports
                    .iter()
                    .enumerate()
                    .filter(|&(j, other)| {
                        j != i && other.answers.get(case).and_then(Option::as_ref) == Some(answer)
                    })
                    .count();
            }
            s
        })
        .collect()
}

/// The candidate chosen by agreement (module docs); `None` with no
/// candidates.
pub fn by_agreement(reports: &[WorkbookReport]) -> Option<usize> {
    earliest_max(&supports(reports))
}

/// The oracle's choice: the candidate solving the most test cases by the
/// reference comparison (every one, where any does), the earliest among
/// equals; `None` with no candidates.
pub fn by_oracle(reports: &[WorkbookReport]) -> Option<usize> {
    let passed: Vec<usize> = reports.iter().map(WorkbookReport::passed).collect();
    earliest_max(&passed)
}

/// The index of the first greatest key.
fn earliest_max<K: Ord>(keys: &[K]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, k) in keys.iter().enumerate() {
        if best.is_none_or(|b| *k > keys[b]) {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::Verdict;

    /// A judged candidate: its answers per case (`None`: no answer) and
    /// which cases passed.
    fn cand(answers: &[Option<&str>], passed: &[bool]) -> WorkbookReport {
        WorkbookReport {
            verdicts: passed
                .iter()
                .map(|&p| {
                    if p {
                        Verdict::Pass
                    } else {
                        Verdict::Fail {
                            reason: "differs".into(),
                        }
                    }
                })
                .collect(),
            answers: answers
                .iter()
                .map(|a| a.map(|t| vec![t.to_string()]))
                .collect(),
        }
    }

    #[test]
    fn the_output_most_candidates_share_wins_over_an_earlier_lone_one() {
        let none = [false; 3];
        let reports = [
            cand(&[Some("n:1"), Some("n:2"), Some("n:3")], &none),
            cand(&[Some("n:5"), Some("n:6"), Some("n:7")], &none),
            cand(&[None, None, None], &none),
            cand(&[Some("n:5"), Some("n:6"), Some("n:7")], &none),
            cand(&[Some("n:5"), Some("n:6"), Some("n:9")], &none),
        ];
        let s = supports(&reports);
        // Candidate 1 agrees with 3 on every case and with 4 on two.
        assert_eq!(
            s[1],
            Support {
                agreements: 5,
                answered: 3
            }
        );
        assert_eq!(
            s[4],
            Support {
                agreements: 4,
                answered: 3
            }
        );
        assert_eq!(s[2], Support::default());
        assert_eq!(by_agreement(&reports), Some(1));
    }

    #[test]
    fn ties_go_to_answering_more_cases_then_to_the_earliest() {
        let none = [false; 2];
        // Nobody agrees: the one with answers on both cases beats a crash.
        let reports = [
            cand(&[None, None], &none),
            cand(&[Some("t:a"), None], &none),
            cand(&[Some("t:b"), Some("t:c")], &none),
            cand(&[Some("t:d"), Some("t:e")], &none),
        ];
        assert_eq!(by_agreement(&reports), Some(2));
        // Two equal pairs: the earlier pair wins.
        let reports = [
            cand(&[Some("t:x"), Some("t:y")], &none),
            cand(&[Some("t:p"), Some("t:q")], &none),
            cand(&[Some("t:p"), Some("t:q")], &none),
            cand(&[Some("t:x"), Some("t:y")], &none),
        ];
        assert_eq!(by_agreement(&reports), Some(0));
        assert_eq!(by_agreement(&[]), None);
    }

    #[test]
    fn agreement_ignores_the_hidden_answers_and_the_oracle_uses_them() {
        // Three wrong programs agree; the one right program is alone.
        let wrong = [false; 2];
        let reports = [
            cand(&[Some("n:0"), Some("n:0")], &wrong),
            cand(&[Some("n:0"), Some("n:0")], &wrong),
            cand(&[Some("n:4"), Some("n:8")], &[true, true]),
            cand(&[Some("n:0"), Some("n:0")], &wrong),
            cand(&[Some("n:4"), Some("n:1")], &[true, false]),
        ];
        assert_eq!(by_agreement(&reports), Some(0));
        assert_eq!(by_oracle(&reports), Some(2));
        // With no program passing everything the oracle takes the most cases.
        let reports = [
            cand(&[Some("n:0"), None], &wrong),
            cand(&[Some("n:4"), None], &[true, false]),
            cand(&[Some("n:4"), None], &[true, false]),
        ];
        assert_eq!(by_oracle(&reports), Some(1));
    }
}
