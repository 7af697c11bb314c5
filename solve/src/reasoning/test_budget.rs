//! Dynamic scaling of unit tests (issue 60, item 3): a run's test budget
//! spread over its problems by how hard each one looks, measured before any
//! test is written.
//!
//! The difficulty signal is the candidates' disagreement
//! ([`disagreement`]): the number of distinct programs among the N
//! candidates, compared in a normalized form (the code block a reply holds,
//! trailing whitespace, blank lines and whole-line comments dropped). N
//! copies of one program leave nothing for tests to choose between (the
//! earliest is chosen whatever the matrix says); N different programs are
//! where the paper's finding says more tests pay. It costs nothing beyond
//! the candidates, which are sampled anyway.
//!
//! [`allocate`] turns difficulties into per-problem counts with the run's
//! total fixed at `K x problems`, so `reward@N:tests=K` (K for every problem)
//! and its dynamic form spend the same number of tests.

use crate::verify;

/// How hard a problem looks from its candidates alone: the number of
/// distinct programs among them (1 when they all agree, N when no two do),
/// each compared in [`normalized_program`]'s form.
pub fn disagreement(candidates: &[String]) -> usize {
    let mut seen: Vec<String> = Vec::new();
    for c in candidates {
        let p = normalized_program(c);
        if !seen.contains(&p) {
            seen.push(p);
        }
    }
    seen.len()
}

/// A candidate's program as [`disagreement`] compares it: the code
/// [`verify::extract_code`] reads out of the reply, each line's trailing
/// whitespace dropped, and blank lines and lines that are only a comment
/// left out.
pub fn normalized_program(text: &str) -> String {
    verify::extract_code(text)
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Tests per problem from the problems' `disagreement` (distinct programs
/// among each one's candidates), spending exactly `k_avg x problems` in
/// all, each count in `1..=max`:
///
/// - every problem starts at 1 (the floor, so every record has a matrix);
/// - each further test goes to the problem with the largest
///   `(disagreement - 1) / (count + 1)` among those below `max` (the
///   D'Hondt rule of proportional seats: counts end close to proportional
///   to `disagreement - 1`, the number of programs beyond the first that
///   tests have to tell apart); ties go to the problem with fewer tests,
///   then the earlier one;
/// - a problem whose candidates all agree (weight 0) gets more than 1 only
///   once every problem that disagrees is at `max`, and then round-robin,
///   so the total is always spent. When no problem disagrees every one gets
///   `k_avg`, as the fixed form.
///
/// So counts are monotone in difficulty (more disagreement never gets fewer
/// tests, equal disagreement differs by at most one) and sum to the budget
/// whenever `1 <= k_avg <= max`.
///
/// # Panics
/// If `k_avg` is 0 or above `max` (the budget could not be spent within
/// the bounds).
pub fn allocate(disagreement: &[usize], k_avg: usize, max: usize) -> Vec<usize> {
    assert!(
        (1..=max).contains(&k_avg),
        "the average test count {k_avg} must be within 1..={max}"
    );
    let weight: Vec<f64> = disagreement
        .iter()
        .map(|&d| d.saturating_sub(1) as f64)
        .collect();
    let mut counts = vec![1usize; disagreement.len()];
    let total = k_avg * disagreement.len();
    for _ in disagreement.len()..total {
        let next = (0..counts.len())
            .filter(|&i| counts[i] < max)
            .max_by(|&a, &b| {
                let qa = weight[a] / (counts[a] + 1) as f64;
                let qb = weight[b] / (counts[b] + 1) as f64;
                // Largest quotient, then fewest tests, then the earliest.
                qa.total_cmp(&qb)
                    .then(counts[b].cmp(&counts[a]))
                    .then(b.cmp(&a))
            })
            .expect("k_avg <= max leaves room below max");
        counts[next] += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disagreement_counts_programs_up_to_layout_and_comments() {
        let a = "```python\ndef f(x):\n    return x + 1\n```";
        let a_again = "Here:\n```python\n# adds one\ndef f(x):  \n\n    return x + 1\n```\nDone.";
        let b = "```python\ndef f(x):\n    return 1 + x\n```";
        assert_eq!(normalized_program(a), normalized_program(a_again));
        assert_eq!(disagreement(&[a.into(), a_again.into()]), 1);
        assert_eq!(disagreement(&[a.into(), b.into(), a_again.into()]), 2);
        assert_eq!(disagreement(&[]), 0);
    }

    #[test]
    fn the_budget_is_spent_exactly_within_the_bounds() {
        let cases: Vec<Vec<usize>> = vec![
            vec![1, 2, 3, 4, 5, 6, 7, 8],
            vec![8, 8, 1, 1, 1, 1, 1, 1],
            vec![1; 10],
            vec![8; 5],
            vec![3],
            vec![],
            vec![2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        ];
        for d in &cases {
            for k in [1, 2, 4, 8, 16, 32, 64] {
                for max in [k, 16, 64].into_iter().filter(|&m| m >= k) {
                    let c = allocate(d, k, max);
                    assert_eq!(c.len(), d.len());
                    assert_eq!(
                        c.iter().sum::<usize>(),
                        k * d.len(),
                        "{d:?} k={k} max={max}"
                    );
                    assert!(c.iter().all(|&n| (1..=max).contains(&n)), "{d:?} {c:?}");
                    // Monotone in difficulty.
                    for i in 0..d.len() {
                        for j in 0..d.len() {
                            if d[i] > d[j] {
                                assert!(c[i] >= c[j], "{d:?} k={k} max={max}: {c:?}");
                            }
                            if d[i] == d[j] {
                                assert!(c[i].abs_diff(c[j]) <= 1, "{d:?}: {c:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tests_go_where_the_candidates_disagree() {
        // No disagreement anywhere: the fixed allocation.
        assert_eq!(allocate(&[1, 1, 1, 1], 4, 64), vec![4; 4]);
        // Equal disagreement: equal shares.
        assert_eq!(allocate(&[5, 5, 5], 8, 64), vec![8; 3]);
        // Unanimous problems keep the floor; the rest goes by the programs
        // beyond the first (2 - 1 and 4 - 1), D'Hondt leaning a little to
        // the larger.
        assert_eq!(allocate(&[1, 1, 2, 4], 4, 64), vec![1, 1, 3, 11]);
        assert_eq!(
            allocate(&[1, 2, 3, 4, 5, 6, 7, 8], 4, 64),
            vec![1, 1, 2, 3, 4, 6, 7, 8]
        );
        // Capped at max: what the hardest cannot take goes to the next, and
        // only then to the unanimous ones.
        assert_eq!(allocate(&[8, 2, 1], 8, 12), vec![12, 11, 1]);
        assert_eq!(allocate(&[8, 1, 1], 8, 12), vec![12, 6, 6]);
        // max = k: nothing can move, every problem gets k.
        assert_eq!(allocate(&[8, 1, 3], 4, 4), vec![4; 3]);
    }

    #[test]
    #[should_panic(expected = "within 1..=8")]
    fn an_average_above_the_cap_cannot_be_spent() {
        allocate(&[1, 2], 9, 8);
    }
}
