//! Records summed into one row per strategy: accuracy, tokens, samples and
//! time per task, adaptive stops, and task-by-task wins and losses against
//! the first strategy listed.

use std::collections::BTreeSet;

use serde::Serialize;

use super::{EvalError, Record, Records, Strategy};

/// Totals of one strategy over the tasks.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// Tasks solved.
    pub correct: usize,
    /// Tokens generated.
    pub tokens: usize,
    /// Candidates sampled.
    pub candidates: usize,
    /// Tasks an adaptive-width strategy answered with fewer than its N samples.
    pub width_stops: usize,
    /// Adaptive length's answer probes.
    pub probes: usize,
    /// Candidates whose reasoning stopped early.
    pub stopped_early: usize,
    /// Reasoning tokens those early stops saved.
    pub tokens_saved: usize,
    /// Wall seconds, summed over the records.
    pub seconds: f64,
    /// Some record came from samples shared with other strategies.
    pub shared: bool,
    /// The tasks it got right, for the head-to-head line.
    pub right: BTreeSet<usize>,
}

impl Totals {
    /// Counts strategy `s`'s record `r`.
    pub fn add(&mut self, s: &Strategy, r: &Record) {
        self.correct += r.ok as usize;
        self.width_stops += (s.adaptive && r.candidates < s.n) as usize;
        if r.ok {
            self.right.insert(r.task);
        }
        self.tokens += r.tokens;
        self.candidates += r.candidates;
        self.probes += r.probes;
        self.stopped_early += r.stopped_early;
        self.tokens_saved += r.tokens_saved;
        self.seconds += r.seconds;
        self.shared |= r.shared;
    }
}

/// One strategy's results.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The strategy's label.
    pub strategy: String,
    /// Tasks counted.
    pub tasks: usize,
    /// Tasks solved.
    pub correct: usize,
    /// Their share.
    pub accuracy: f64,
    /// Tokens generated.
    pub tokens: usize,
    /// Per task.
    pub tokens_per_task: f64,
    /// Candidates sampled per task.
    pub candidates_per_task: f64,
    /// Adaptive width: tasks whose vote settled before all N samples were drawn.
    pub width_stops: usize,
    /// Adaptive length: answer probes per task, tasks whose probes stopped
    /// the reasoning early, reasoning tokens those early stops saved.
    pub probes_per_task: f64,
    /// See `probes_per_task`.
    pub stopped_early: usize,
    /// See `probes_per_task`.
    pub tokens_saved: usize,
    /// Wall seconds.
    pub seconds: f64,
    /// Its candidates were shared with the other strategies of its group, so
    /// `seconds` is the shared sampling's time, not its own.
    pub shared_samples: bool,
    /// Against the first strategy listed (absent on its own row): tasks this
    /// one gets right where that one is wrong, and the other way round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_first: Option<HeadToHead>,
}

/// Task by task against a baseline: where two strategies' verdicts differ.
#[derive(Debug, Serialize)]
pub struct HeadToHead {
    /// The baseline strategy's label.
    pub baseline: String,
    /// Tasks this one solves and the baseline does not.
    pub wins: usize,
    /// Tasks the baseline solves and this one does not.
    pub losses: usize,
    /// McNemar's exact test on those discordant tasks: the two-sided
    /// binomial probability of a split at least this uneven if neither
    /// strategy were better (1 when they never differ).
    pub mcnemar_p: f64,
}

/// McNemar's exact two-sided p-value for `wins` against `losses` discordant
/// pairs: `min(1, 2 P(X <= min))`, X ~ Binomial(wins + losses, 1/2), summed
/// in log space so thousands of pairs do not underflow.
pub fn mcnemar_exact(wins: usize, losses: usize) -> f64 {
    let n = wins + losses;
    if n == 0 {
        return 1.0;
    }
    let k = wins.min(losses);
    // ln C(n, i) / 2^n, term by term.
    let mut ln_term = -(n as f64) * std::f64::consts::LN_2;
    let mut terms = vec![ln_term];
    for i in 1..=k {
        ln_term += ((n - i + 1) as f64 / i as f64).ln();
        terms.push(ln_term);
    }
    let top = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let tail = top.exp() * terms.iter().map(|t| (t - top).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
}

/// Each strategy's row from its totals over `tasks` tasks.
pub fn rows(strategies: &[Strategy], totals: &[Totals], tasks: usize) -> Vec<Row> {
    let n = tasks as f64;
    strategies
        .iter()
        .zip(totals)
        .enumerate()
        .map(|(k, (s, t))| Row {
            strategy: s.label.clone(),
            tasks,
            correct: t.correct,
            accuracy: t.correct as f64 / n,
            tokens: t.tokens,
            tokens_per_task: t.tokens as f64 / n,
            candidates_per_task: t.candidates as f64 / n,
            width_stops: t.width_stops,
            probes_per_task: t.probes as f64 / n,
            stopped_early: t.stopped_early,
            tokens_saved: t.tokens_saved,
            seconds: t.seconds,
            shared_samples: t.shared,
            vs_first: (k > 0).then(|| {
                let wins = t.right.difference(&totals[0].right).count();
                let losses = totals[0].right.difference(&t.right).count();
                HeadToHead {
                    baseline: strategies[0].label.clone(),
                    wins,
                    losses,
                    mcnemar_p: mcnemar_exact(wins, losses),
                }
            }),
        })
        .collect()
}

/// Totals from records on file alone, over only the tasks every strategy
/// has a record for (so the rows compare the same tasks); returns how many
/// tasks that is.
pub fn totals_from_records(
    tasks: &[usize],
    strategies: &[Strategy],
    done: &Records,
) -> Result<(usize, Vec<Totals>), EvalError> {
    let mut acc: Vec<Totals> = strategies.iter().map(|_| Totals::default()).collect();
    let mut complete = 0;
    for i in tasks {
        let recs: Option<Vec<&Record>> = strategies
            .iter()
            .map(|s| done.get(&(s.label.clone(), *i)))
            .collect();
        if let Some(recs) = recs {
            complete += 1;
            for ((t, s), r) in acc.iter_mut().zip(strategies).zip(recs) {
                t.add(s, r);
            }
        }
    }
    if complete == 0 {
        return Err(EvalError::NoCompleteTask);
    }
    Ok((complete, acc))
}

#[cfg(test)]
mod tests {
    use super::mcnemar_exact;

    #[test]
    fn mcnemar_matches_the_exact_binomial_sums() {
        // Reference values: 2 * sum_{i<=k} C(n, i) / 2^n in exact integers
        // (Python's math.comb), for the synthesizer's 16 wins / 47 losses,
        // a tie, an all-one-sided split, and 1,300 pairs (no underflow).
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.max(1e-300);
        assert!(close(mcnemar_exact(16, 47), 0.000_117_055_416_300_323_01));
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        assert!(close(mcnemar_exact(0, 5), 0.0625));
        assert!(close(mcnemar_exact(47, 16), mcnemar_exact(16, 47)));
        assert!(close(mcnemar_exact(600, 700), 0.006_015_793_861_044_952_5));
        assert_eq!(mcnemar_exact(0, 0), 1.0);
    }
}
