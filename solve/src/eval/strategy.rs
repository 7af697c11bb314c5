//! Answer strategies: what `single`, `majority@8`, `adaptive@8:wave=1`,
//! `length@auto` mean, which strategies fit a task set, and which ones can
//! share one set of samples per task.

use crate::reasoning::{Aggregate, Effort, LengthPolicy, DEFAULT_CONFIDENCE, MAX_GENERATED_TESTS};
use crate::tasks::Task;
use tern_runtime::engine::MAX_N;

use super::EvalError;

/// One way to answer a task.
#[derive(Clone, Debug)]
pub struct Strategy {
    /// The spec it was parsed from (its name in records and rows).
    pub label: String,
    /// Candidates sampled (at most).
    pub n: usize,
    /// How the candidates become one answer.
    pub aggregate: Aggregate,
    /// Adaptive width: stop sampling once the vote is settled.
    pub adaptive: bool,
    /// Candidates per wave when adaptive (`adaptive@N:wave=W`, default 2).
    pub wave: usize,
    /// When adaptive: the posterior probability of the leading answer being
    /// the majority at which sampling stops (`adaptive@N:confidence=C`).
    pub confidence: f64,
    /// Adaptive length (`length@EFFORT`), if any.
    pub length: Option<LengthPolicy>,
    /// `synthesize@N:with=NAME`: the synthesizer named NAME writes the
    /// synthesis (the caller maps names to models); `None`: the default one.
    /// `single:with=NAME`: the model named NAME answers the question alone,
    /// greedily, with no candidates shown: how the SFT-only control (a model
    /// fine-tuned on the synthesizer's targets without the candidates,
    /// `tern synth-data --control-of`) is evaluated beside the synthesizer
    /// over the same tasks.
    pub synthesizer: Option<String>,
    /// `reward@N:tests=K`: a model writes K unit tests per task and the
    /// candidates are chosen by them (`reasoning::best_of_n_generated_tests`);
    /// the task's own tests then grade only the chosen candidate (and, in
    /// the record, every candidate). `None`: `reward@N` chooses by the
    /// task's own tests (the oracle).
    pub tests: Option<usize>,
    /// `reward@N:tests=K:dynamic`: K is the run's average, not every
    /// problem's: the run's `K x tasks` tests are spread over the tasks by
    /// their candidates' disagreement (`reasoning::allocate`).
    pub dynamic: bool,
}

/// Adaptive width's default wave: 2 candidates per engine request, as `tern bon`.
pub const DEFAULT_WAVE: usize = 2;

impl Strategy {
    /// Parses a spec: `single`, `majority@N`, `synthesize@N`, `adaptive[@N]`
    /// (options after the count, `adaptive@8:wave=1`), `synthesize@N:with=NAME`
    /// (a named synthesizer), `single:with=NAME` (a named model answers
    /// alone), `reward@N`, `reward@N:tests=K` (K tests written
    /// by a model choose) or `length@EFFORT`; a bare name
    /// samples 8. `probe_every` is adaptive
    /// length's probe interval.
    pub fn parse(s: &str, probe_every: usize) -> Result<Strategy, EvalError> {
        if let Some(effort) = s.strip_prefix("length@") {
            return parse_length(s, effort, probe_every);
        }
        let bad = |reason: String| EvalError::Strategy {
            spec: s.to_string(),
            reason,
        };
        let (head, options) = match s.split_once(':') {
            Some((head, options)) => (head, Some(options)),
            None => (s, None),
        };
        let (name, n) = match head.split_once('@') {
            Some((name, n)) => (
                name,
                n.parse::<usize>().map_err(|source| EvalError::NotACount {
                    spec: s.to_string(),
                    count: n.to_string(),
                    source,
                })?,
            ),
            None => (head, 8),
        };
        let (n, aggregate, adaptive) = match name {
            "single" => (1, Aggregate::Majority, false),
            "majority" => (n, Aggregate::Majority, false),
            "synthesize" => (n, Aggregate::Synthesize, false),
            "adaptive" => (n, Aggregate::Majority, true),
            "reward" => (n, Aggregate::Reward, false),
            other => return Err(EvalError::UnknownStrategy(other.to_string())),
        };
        if n == 0 || n > MAX_N {
            return Err(bad(format!("N must be between 1 and {MAX_N}")));
        }
        let mut wave = DEFAULT_WAVE.min(n);
        let mut synthesizer = None;
        let mut confidence = DEFAULT_CONFIDENCE;
        let mut tests = None;
        let mut dynamic = false;
        if let (Some(options), "single") = (options, name) {
            // `single:with=NAME`: the named model answers alone.
            let model = options
                .strip_prefix("with=")
                .filter(|m| !m.is_empty() && !m.contains(':'))
                .ok_or_else(|| {
                    bad("single takes one option, with=NAME (the model that answers)".into())
                })?;
            synthesizer = Some(model.to_string());
        } else if let Some(options) = options {
            if !adaptive && aggregate == Aggregate::Majority {
                return Err(bad(
                    "only adaptive@N (`:wave=W`), synthesize@N (`:with=NAME`), single (`:with=NAME`) and reward@N (`:tests=K`) take options"
                        .into(),
                ));
            }
            for kv in options.split(':') {
                match kv.split_once('=') {
                    Some(("tests", k)) if aggregate == Aggregate::Reward => {
                        tests = Some(
                            k.parse::<usize>()
                                .ok()
                                .filter(|k| (1..=MAX_GENERATED_TESTS).contains(k))
                                .ok_or_else(|| {
                                    bad(format!(
                                        "tests must be a count from 1 to {MAX_GENERATED_TESTS}, got `{k}`"
                                    ))
                                })?,
                        )
                    }
                    None if kv == "dynamic" && aggregate == Aggregate::Reward => dynamic = true,
                    _ if aggregate == Aggregate::Reward => {
                        return Err(bad(format!(
                            "unknown option `{kv}` (reward@N takes tests=K and dynamic)"
                        )))
                    }
                    Some(("with", name)) if aggregate == Aggregate::Synthesize => {
                        if name.is_empty() {
                            return Err(bad("`with=` needs a synthesizer's name".into()));
                        }
                        synthesizer = Some(name.to_string());
                    }
                    _ if aggregate == Aggregate::Synthesize => {
                        return Err(bad(format!(
                            "unknown option `{kv}` (synthesize@N takes with=NAME)"
                        )))
                    }
                    Some(("wave", w)) => {
                        wave = w
                            .parse::<usize>()
                            .ok()
                            .filter(|w| (1..=n).contains(w))
                            .ok_or_else(|| {
                                bad(format!("wave must be a count from 1 to {n}, got `{w}`"))
                            })?
                    }
                    Some(("confidence", c)) => {
                        confidence = c
                            .parse::<f64>()
                            .ok()
                            .filter(|c| *c > 0.5 && *c < 1.0)
                            .ok_or_else(|| {
                                bad(format!(
                                    "confidence must be above 0.5 and below 1, got `{c}`"
                                ))
                            })?
                    }
                    _ => {
                        return Err(bad(format!(
                            "unknown option `{kv}` (adaptive@N takes wave=W and confidence=C)"
                        )))
                    }
                }
            }
        }
        if dynamic && tests.is_none() {
            return Err(bad(
                "`dynamic` spreads generated tests: it needs tests=K (the average per task)".into(),
            ));
        }
        Ok(Strategy {
            label: s.to_string(),
            n,
            aggregate,
            adaptive,
            wave,
            confidence,
            synthesizer,
            length: None,
            tests,
            dynamic,
        })
    }

    /// One greedy sample: the strategy held-out accuracy is measured with.
    pub fn single() -> Strategy {
        Strategy {
            label: "single".into(),
            n: 1,
            aggregate: Aggregate::Majority,
            adaptive: false,
            wave: 1,
            confidence: DEFAULT_CONFIDENCE,
            length: None,
            synthesizer: None,
            tests: None,
            dynamic: false,
        }
    }
}

/// `length@EFFORT`: one greedy sample under adaptive length, EFFORT an effort
/// name or a bare token cap.
fn parse_length(s: &str, effort: &str, probe_every: usize) -> Result<Strategy, EvalError> {
    let policy = match effort.parse::<usize>() {
        Ok(cap) => LengthPolicy::new(None, Some(cap), probe_every)?,
        Err(_) => {
            let e: Effort = effort.parse().map_err(|reason| EvalError::Strategy {
                spec: s.to_string(),
                reason,
            })?;
            LengthPolicy::new(Some(e), None, probe_every)?
        }
    };
    Ok(Strategy {
        label: s.to_string(),
        n: 1,
        aggregate: Aggregate::Majority,
        adaptive: false,
        wave: DEFAULT_WAVE,
        confidence: DEFAULT_CONFIDENCE,
        length: policy,
        synthesizer: None,
        tests: None,
        dynamic: false,
    })
}

/// Code tasks are graded by their tests, so their strategies are `single`
/// (or `length@`) and `reward@N`; a vote or a synthesis needs answers to
/// compare, and `reward@N` needs tests.
pub fn check_fit(strategies: &[Strategy], tasks: &[(usize, Task)]) -> Result<(), EvalError> {
    let code = tasks.iter().filter(|(_, t)| t.is_code()).count();
    for s in strategies {
        if code > 0 && s.n > 1 && s.aggregate != Aggregate::Reward {
            return Err(EvalError::NeedsAnswers(s.label.clone()));
        }
        if code < tasks.len() && s.aggregate == Aggregate::Reward {
            return Err(EvalError::NeedsCode(s.label.clone()));
        }
    }
    Ok(())
}

/// Strategies that run together: a group of several majority / synthesize /
/// adaptive strategies with the same N shares one set of N samples per task
/// (see `reasoning::best_of_n_shared`); everything else (one sample,
/// adaptive length, tests written by a model) runs alone.
pub fn share_samples(strategies: &[Strategy]) -> Vec<Vec<usize>> {
    let shareable = |s: &Strategy| s.n > 1 && s.length.is_none() && s.tests.is_none();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, s) in strategies.iter().enumerate() {
        let joined = shareable(s)
            && groups.iter_mut().any(|g| {
                let first = &strategies[g[0]];
                let fits = first.n == s.n && shareable(first);
                if fits {
                    g.push(i);
                }
                fits
            });
        if !joined {
            groups.push(vec![i]);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_strategies_take_a_wave() {
        let s = Strategy::parse("adaptive@8:wave=1", 64).unwrap();
        assert!(s.adaptive);
        assert_eq!((s.n, s.wave, s.label.as_str()), (8, 1, "adaptive@8:wave=1"));
        assert_eq!(Strategy::parse("adaptive@8", 64).unwrap().wave, 2);
        assert_eq!(Strategy::parse("adaptive@1", 64).unwrap().wave, 1);
        let sure = Strategy::parse("adaptive@8:wave=1:confidence=0.9", 64).unwrap();
        assert_eq!((sure.wave, sure.confidence), (1, 0.9));
        assert_eq!(Strategy::parse("adaptive@8", 64).unwrap().confidence, 0.95);
        for bad in [
            "adaptive@8:confidence=0.5",
            "adaptive@8:confidence=1",
            "adaptive@8:confidence=x",
        ] {
            assert!(Strategy::parse(bad, 64).is_err(), "{bad}");
        }
        // The SFT-only control: a named model answering alone, greedily.
        let control = Strategy::parse("single:with=control", 64).unwrap();
        assert_eq!(control.synthesizer.as_deref(), Some("control"));
        assert_eq!((control.n, control.aggregate), (1, Aggregate::Majority));
        assert_eq!(Strategy::parse("single", 64).unwrap().synthesizer, None);
        for bad in ["single:with=", "single:wave=1", "single:with=a:with=b"] {
            let e = Strategy::parse(bad, 64).unwrap_err().to_string();
            assert!(e.contains("single takes one option"), "{bad}: {e}");
        }
        let named = Strategy::parse("synthesize@8:with=trained", 64).unwrap();
        assert_eq!(named.synthesizer.as_deref(), Some("trained"));
        assert_eq!(
            Strategy::parse("synthesize@8", 64).unwrap().synthesizer,
            None
        );
        for bad in [
            "adaptive@8:wave=0",
            "adaptive@8:wave=9",
            "adaptive@8:wave=x",
            "adaptive@8:step=1",
            "majority@8:wave=1",
            "majority@8:with=x",
            "synthesize@8:with=",
            "synthesize@8:wave=2",
            "reward@4:tests=0",
            "reward@4:tests=65",
            "reward@4:tests=x",
            "reward@4:with=a",
        ] {
            let e = Strategy::parse(bad, 64).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn reward_takes_a_count_of_generated_tests() {
        let s = Strategy::parse("reward@4:tests=8", 64).unwrap();
        assert_eq!((s.n, s.tests, s.aggregate), (4, Some(8), Aggregate::Reward));
        assert_eq!(Strategy::parse("reward@4", 64).unwrap().tests, None);
        assert!(!s.dynamic);
        let d = Strategy::parse("reward@4:tests=8:dynamic", 64).unwrap();
        assert_eq!((d.tests, d.dynamic), (Some(8), true));
        for bad in [
            "reward@4:tests=0:dynamic",
            "reward@4:tests=65:dynamic",
            "reward@4:tests=8:dyn",
            "reward@4:dynamic",
        ] {
            assert!(Strategy::parse(bad, 64).is_err(), "{bad}");
        }
        // Generated tests run alone; the task's own tests share as before.
        let s: Vec<Strategy> = [
            "reward@4",
            "reward@4:tests=4",
            "reward@4:tests=8",
            "reward@4",
        ]
        .iter()
        .map(|s| Strategy::parse(s, 64).unwrap())
        .collect();
        assert_eq!(share_samples(&s), vec![vec![0, 3], vec![1], vec![2]]);
    }

    #[test]
    fn strategies_with_one_n_share_their_samples() {
        let s: Vec<Strategy> = [
            "single",
            "majority@8",
            "length@16",
            "adaptive@8",
            "majority@4",
        ]
        .iter()
        .map(|s| Strategy::parse(s, 64).unwrap())
        .collect();
        assert_eq!(
            share_samples(&s),
            vec![vec![0], vec![1, 3], vec![2], vec![4]]
        );
    }
}
