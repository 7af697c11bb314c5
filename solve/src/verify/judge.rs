//! Online-judge execution of candidate Python programs against test snippets.
//!
//! Schedules the tests (each run by [`super::sandbox`]: a fresh `python3 -I -S`
//! inside a bubblewrap sandbox with its own namespaces, a read-only view of
//! the Python runtime only, no network, no new processes, resource limits and
//! a wall clock enforced from here, capped output) over the cores, and owns
//! the per-candidate [`JudgeReport`] and the choice of a best candidate by
//! tests ([`best_by_tests`]). Programs come from model generations
//! ([`extract_code`]) and tests from a dataset, the model or an API client;
//! best-of-N's `reward` mode and the trainer's code rewards consume the
//! reports. Answers in prose are compared in [`super::answer`], not here.
//!
//! The sandbox is the security boundary (docs/SECURITY.md says what it
//! guarantees and how it is attacked in CI). The verdict is decided outside
//! the candidate's process: the program and the test run in two sandboxes,
//! the test calls the program's functions over a pipe with plain data, and
//! a test passes only if the test's process, the one holding the per-run
//! token, exits 0 after writing it. Nothing inside the candidate's process
//! (its frames, `gc`, an object equal to everything, an early exit) can
//! pass a test it fails.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use serde::Serialize;

use super::sandbox::sandbox;
pub use super::sandbox::{check, Cancel, CancelOnDrop, JudgeError, Limits, Verdict, STDERR_CAP};

/// One program's verdicts on every test, in test order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JudgeReport {
    /// How many tests passed: the candidate's reward in best-of-N.
    pub passed: usize,
    /// How many tests ran.
    pub total: usize,
    /// One verdict per test.
    pub verdicts: Vec<Verdict>,
}

impl JudgeReport {
    fn new(verdicts: Vec<Verdict>) -> Self {
        let passed = verdicts.iter().filter(|v| v.passed()).count();
        JudgeReport {
            passed,
            total: verdicts.len(),
            verdicts,
        }
    }

    /// Which tests passed, in test order: candidates sharing a pattern likely
    /// share behaviour, which [`best_by_tests`] uses to break ties.
    pub fn pass_pattern(&self) -> Vec<bool> {
        self.verdicts.iter().map(Verdict::passed).collect()
    }

    /// `passed / total` in `[0, 1]`; 0 when there were no tests.
    pub fn pass_rate(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.passed as f64 / self.total as f64
        }
    }
}

/// Runs `program` against each test, each in a fresh sandboxed `python3`.
///
/// A test is Python (`assert f(1) == 2`) run once the program has run, in a
/// namespace holding the program's names: its functions as proxies that
/// call into the program's process with plain data, its plain values as
/// copies, its modules imported again. `candidate` names the program's last top-level function unless
/// the program defines `candidate` itself, so HumanEval-style
/// `assert candidate(1) == 2` works. The program runs with `__name__` set to
/// `"candidate"`, so its `if __name__ == "__main__":` block does not.
pub fn judge_python(
    program: &str,
    tests: &[String],
    limits: &Limits,
) -> Result<JudgeReport, JudgeError> {
    let mut reports = judge_all(&[program], tests, limits)?;
    Ok(reports
        .pop()
        .unwrap_or_else(|| JudgeReport::new(Vec::new())))
}

/// [`judge_python`] for every program, one report per program in order; tests
/// run in parallel, one per available core.
pub fn judge_many(
    programs: &[String],
    tests: &[String],
    limits: &Limits,
) -> Result<Vec<JudgeReport>, JudgeError> {
    let programs: Vec<&str> = programs.iter().map(String::as_str).collect();
    judge_all(&programs, tests, limits)
}

fn judge_all(
    programs: &[&str],
    tests: &[String],
    limits: &Limits,
) -> Result<Vec<JudgeReport>, JudgeError> {
    let jobs = programs.len() * tests.len();
    if jobs == 0 {
        return Ok(programs
            .iter()
            .map(|_| JudgeReport::new(Vec::new()))
            .collect());
    }
    if limits.cancel.is_cancelled() {
        return Err(JudgeError::Cancelled);
    }
    let sandbox = sandbox()?;
    let workers = thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(jobs);
    let next = AtomicUsize::new(0);
    let run_jobs = || {
        let mut done = Vec::new();
        loop {
            let job = next.fetch_add(1, Ordering::Relaxed);
            if job >= jobs {
                return done;
            }
            let outcome = sandbox.run(
                programs[job / tests.len()],
                &tests[job % tests.len()],
                limits,
            );
            let failed = outcome.is_err();
            done.push((job, outcome));
            if failed {
                // Stop the other workers too: the judge cannot run.
                next.store(jobs, Ordering::Relaxed);
            }
        }
    };
    let outcomes: Vec<(usize, Result<Verdict, JudgeError>)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..workers).map(|_| scope.spawn(run_jobs)).collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut grid: Vec<Option<Verdict>> = vec![None; jobs];
    for (job, outcome) in outcomes {
        grid[job] = Some(outcome?);
    }
    let mut verdicts = grid.into_iter();
    Ok(programs
        .iter()
        .map(|_| {
            // Every job ran (no error returned above), so every cell is filled.
            JudgeReport::new(verdicts.by_ref().take(tests.len()).flatten().collect())
        })
        .collect())
}

/// The candidate that passes the most tests; ties go to the pass pattern shared
/// by the most candidates (agreeing programs are likelier right), then to the
/// lowest index. `None` when there are no reports.
pub fn best_by_tests(reports: &[JudgeReport]) -> Option<usize> {
    let top = reports.iter().map(|r| r.passed).max()?;
    let patterns: Vec<Vec<bool>> = reports.iter().map(JudgeReport::pass_pattern).collect();
    let support = |i: usize| patterns.iter().filter(|p| **p == patterns[i]).count();
    (0..reports.len())
        .filter(|&i| reports[i].passed == top)
        .max_by(|&i, &j| support(i).cmp(&support(j)).then(j.cmp(&i)))
}

/// The first tests to run for a question of estimated difficulty
/// `disagreement` in `[0, 1]` (e.g. [`super::answer::Vote::disagreement`]):
/// `min + round((all.len() - min) * disagreement)` of them, clamped to
/// `all.len()`. Where candidates agree a few tests do; where they disagree,
/// more tests separate them. An unknown (NaN) difficulty uses all tests.
pub fn tests_for_difficulty<T>(all: &[T], disagreement: f64, min: usize) -> &[T] {
    let min = min.min(all.len());
    let disagreement = if disagreement.is_nan() {
        1.0
    } else {
        disagreement.clamp(0.0, 1.0)
    };
    let extra = ((all.len() - min) as f64 * disagreement).round() as usize;
    &all[..(min + extra).min(all.len())]
}

/// `code` after `prelude` (when there is one), as one program: a code task's
/// imports and signature, then the candidate's code (whose own definition of
/// the function, if it has one, replaces the prelude's bare signature).
pub fn with_prelude(prelude: &str, code: &str) -> String {
    if prelude.is_empty() {
        return code.to_string();
    }
    format!("{}\n{}\n", prelude.trim_end(), code)
}

/// The program in a model's reply: the body of the last fenced block marked
/// `python` (or `py`, `python3`) or unmarked; an unclosed last block (a reply
/// cut off by the token limit) counts. Otherwise the whole text, trimmed.
pub fn extract_code(text: &str) -> String {
    let mut last: Option<Vec<&str>> = None;
    // Inside a fence: whether it is Python, and its lines so far.
    let mut open: Option<(bool, Vec<&str>)> = None;
    for line in text.lines() {
        let fence = line.trim();
        match open.as_mut() {
            None => {
                if let Some(info) = fence.strip_prefix("```") {
                    let lang = info
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_ascii_lowercase();
                    open = Some((
                        matches!(lang.as_str(), "" | "python" | "py" | "python3"),
                        Vec::new(),
                    ));
                }
            }
            Some((is_python, body)) => {
                if fence.starts_with("```") && fence.bytes().all(|b| b == b'`') {
                    if *is_python {
                        last = Some(std::mem::take(body));
                    }
                    open = None;
                } else {
                    body.push(line);
                }
            }
        }
    }
    if let Some((true, body)) = open {
        if body.iter().any(|l| !l.trim().is_empty()) {
            last = Some(body);
        }
    }
    match last {
        Some(body) => body.join("\n").trim_matches('\n').to_string(),
        None => text.trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The judge must run wherever the tests run: a machine without the
    /// sandbox fails these tests loudly rather than skipping them.
    fn require_sandbox() {
        if let Err(e) = check() {
            panic!("{e}");
        }
    }

    fn tests(snippets: &[&str]) -> Vec<String> {
        snippets.iter().map(|s| s.to_string()).collect()
    }

    const ADD: &str = "def helper(x):\n    return x\n\ndef add(a, b):\n    return helper(a) + b\n";

    #[test]
    fn a_correct_program_passes_every_test() {
        require_sandbox();
        let cases = tests(&[
            "assert add(1, 2) == 3",
            "assert candidate(2, 2) == 4",
            "import math\nassert math.isclose(add(0.1, 0.2), 0.3)",
        ]);
        let report = judge_python(ADD, &cases, &Limits::default()).expect("judge runs");
        assert_eq!(report.verdicts, vec![Verdict::Pass; 3]);
        assert_eq!(
            (report.passed, report.total, report.pass_rate()),
            (3, 3, 1.0)
        );
    }

    #[test]
    fn a_wrong_program_fails_with_the_failing_line() {
        require_sandbox();
        let program = "def add(a, b):\n    return a - b\n";
        let cases = tests(&[
            "assert add(0, 0) == 0",
            "assert add(1, 2) == 3",
            "assert add(1, 2) == 3, 'one plus two'",
        ]);
        let report = judge_python(program, &cases, &Limits::default()).expect("judge runs");
        assert_eq!(report.pass_pattern(), vec![true, false, false]);
        assert_eq!(
            report.verdicts[1],
            Verdict::Fail {
                reason: "assertion failed: assert add(1, 2) == 3".into()
            }
        );
        assert_eq!(
            report.verdicts[2],
            Verdict::Fail {
                reason: "one plus two".into()
            }
        );
    }

    #[test]
    fn errors_crash_and_exiting_early_fails() {
        require_sandbox();
        let limits = Limits::default();
        let cases = tests(&["assert f() == 1"]);
        let syntax = judge_python("def f(:\n", &cases, &limits).expect("judge runs");
        assert!(
            matches!(&syntax.verdicts[0], Verdict::Crash { stderr } if stderr.contains("SyntaxError")),
            "{syntax:?}"
        );
        let exit = judge_python("import sys\nsys.exit(0)\n", &cases, &limits).expect("judge runs");
        assert!(
            matches!(&exit.verdicts[0], Verdict::Crash { stderr } if stderr.contains("SystemExit")),
            "{exit:?}"
        );
        let hard_exit =
            judge_python("import os\nos._exit(0)\n", &cases, &limits).expect("judge runs");
        assert!(
            matches!(hard_exit.verdicts[0], Verdict::Fail { .. }),
            "{hard_exit:?}"
        );
    }

    #[test]
    fn an_infinite_loop_times_out() {
        require_sandbox();
        let limits = Limits {
            time: Duration::from_secs(1),
            ..Limits::default()
        };
        let started = Instant::now();
        let report = judge_python("while True:\n    pass\n", &tests(&["pass"]), &limits)
            .expect("judge runs");
        let elapsed = started.elapsed();
        assert_eq!(report.verdicts, vec![Verdict::Timeout]);
        assert!(
            elapsed < limits.time + Duration::from_secs(1),
            "took {elapsed:?}"
        );
    }

    #[test]
    fn a_memory_hog_is_stopped_by_its_limit() {
        require_sandbox();
        let program = "data = bytearray(1 << 30)\ndef f():\n    return len(data)\n";
        let report = judge_python(
            program,
            &tests(&["assert f() == 1 << 30"]),
            &Limits::default(),
        )
        .expect("judge runs");
        assert!(
            matches!(&report.verdicts[0], Verdict::Crash { stderr } if stderr.contains("MemoryError")),
            "{report:?}"
        );
    }

    #[test]
    fn sockets_are_denied_and_the_environment_is_empty() {
        require_sandbox();
        let cases = tests(&[
            "import socket\nsocket.create_connection(('127.0.0.1', 9))",
            "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
            "import os\nassert 'HOME' not in os.environ and os.listdir('.') == []",
            "import threading\nout = []\nt = threading.Thread(target=lambda: out.append(1))\nt.start(); t.join()\nassert out == [1]",
        ]);
        let report = judge_python("x = 1\n", &cases, &Limits::default()).expect("judge runs");
        for verdict in &report.verdicts[..2] {
            assert!(
                matches!(verdict, Verdict::Crash { stderr } if stderr.contains("PermissionError")),
                "{verdict:?}"
            );
        }
        assert_eq!(
            report.verdicts[2],
            Verdict::Pass,
            "an empty environment and /tmp"
        );
        assert_eq!(report.verdicts[3], Verdict::Pass, "threads still work");
    }

    #[test]
    fn a_cancelled_run_stops_its_tests() {
        require_sandbox();
        let limits = Limits {
            time: Duration::from_secs(30),
            ..Limits::default()
        };
        let cancel = limits.cancel.clone();
        let started = Instant::now();
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            cancel.cancel();
        });
        let sleepy = tests(&["import time\ntime.sleep(60)"; 6]);
        let outcome = judge_python("x = 1\n", &sleepy, &limits);
        stopper.join().unwrap();
        assert!(matches!(outcome, Err(JudgeError::Cancelled)), "{outcome:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
        // A cancelled switch refuses new work at once.
        assert!(matches!(
            judge_python("x = 1\n", &tests(&["pass"]), &limits),
            Err(JudgeError::Cancelled)
        ));
    }

    #[test]
    fn output_is_capped() {
        require_sandbox();
        let loud = "import sys\nprint('y' * (1 << 20))\nsys.stderr.write('x' * (1 << 20))\ndef f():\n    return 1\n";
        let cases = tests(&["assert f() == 1", "raise ValueError('boom')"]);
        let report = judge_python(loud, &cases, &Limits::default()).expect("judge runs");
        assert_eq!(report.verdicts[0], Verdict::Pass);
        let Verdict::Crash { stderr } = &report.verdicts[1] else {
            panic!("{:?}", report.verdicts[1])
        };
        assert!(
            stderr.len() < STDERR_CAP + 100,
            "{} bytes kept",
            stderr.len()
        );
        assert!(stderr.starts_with('[') && stderr.contains("earlier bytes dropped"));
        assert!(stderr.contains("ValueError: boom"));
    }

    #[test]
    fn judge_many_reports_each_program_in_order() {
        require_sandbox();
        let programs = vec![
            "def f(x):\n    return x\n".to_string(),
            "def f(x):\n    return 2 * x\n".to_string(),
            "def f(x):\n    return x + x\n".to_string(),
        ];
        let cases = tests(&["assert f(0) == 0", "assert f(1) == 2", "assert f(3) == 6"]);
        let reports = judge_many(&programs, &cases, &Limits::default()).expect("judge runs");
        let passed: Vec<usize> = reports.iter().map(|r| r.passed).collect();
        assert_eq!(passed, vec![1, 3, 3]);
        assert_eq!(best_by_tests(&reports), Some(1));
        assert_eq!(
            judge_many(&programs, &[], &Limits::default())
                .expect("no tests")
                .len(),
            3
        );
    }

    fn report(pattern: &[bool]) -> JudgeReport {
        JudgeReport::new(
            pattern
                .iter()
                .map(|&p| if p { Verdict::Pass } else { Verdict::Timeout })
                .collect(),
        )
    }

    #[test]
    fn best_by_tests_prefers_passes_then_shared_patterns_then_index() {
        let (t, f) = (true, false);
        assert_eq!(best_by_tests(&[]), None);
        assert_eq!(best_by_tests(&[report(&[t, f]), report(&[t, t])]), Some(1));
        // 0, 1 and 2 tie on passes; 1's pattern is shared by two candidates, so 1 wins.
        let reports = [
            report(&[t, f, t]),
            report(&[f, t, t]),
            report(&[f, t, t]),
            report(&[f, f, f]),
        ];
        assert_eq!(best_by_tests(&reports), Some(1));
        // Equal passes and equal support: the lowest index.
        assert_eq!(best_by_tests(&[report(&[f, t]), report(&[t, f])]), Some(0));
    }

    #[test]
    fn test_count_scales_with_disagreement() {
        let all: Vec<u32> = (0..10).collect();
        assert_eq!(tests_for_difficulty(&all, 0.0, 3).len(), 3);
        assert_eq!(tests_for_difficulty(&all, 0.5, 3).len(), 7);
        assert_eq!(tests_for_difficulty(&all, 1.0, 3).len(), 10);
        assert_eq!(tests_for_difficulty(&all, 7.0, 3).len(), 10);
        assert_eq!(tests_for_difficulty(&all, -1.0, 3).len(), 3);
        assert_eq!(tests_for_difficulty(&all, f64::NAN, 3).len(), 10);
        assert_eq!(tests_for_difficulty(&all, 0.0, 50).len(), 10);
        assert_eq!(tests_for_difficulty(&all[..0], 0.5, 2).len(), 0);
    }

    #[test]
    fn extract_code_takes_the_last_python_block() {
        let reply = "First try:\n```python\ndef f():\n    return 1\n```\nBetter:\n```py\ndef f():\n    return 2\n```\nShell:\n```bash\nls\n```\n";
        assert_eq!(extract_code(reply), "def f():\n    return 2");
        assert_eq!(extract_code("```\nx = 1\n```"), "x = 1");
        assert_eq!(extract_code("  def g():\n    pass\n"), "def g():\n    pass");
        assert_eq!(
            extract_code("```python\nx = 1\n```\n```python\ny = 2\n"),
            "y = 2",
            "an unclosed block counts"
        );
        assert_eq!(extract_code("```bash\nls\n```"), "```bash\nls\n```");
    }
}
