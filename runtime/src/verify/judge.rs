//! Online-judge execution of candidate Python programs against test snippets.
//!
//! Owns the per-test subprocess (a fresh `python3 -I -S` in a fresh temporary
//! directory, resource limits, sockets disabled, a wall-clock timeout enforced
//! from here, capped output), the per-test [`Verdict`], the per-candidate
//! [`JudgeReport`] and the choice of a best candidate by tests
//! ([`best_by_tests`]). Programs come from model generations ([`extract_code`])
//! and tests from a dataset or from the model; best-of-N's `reward` mode and the
//! trainer's code rewards consume the reports. Answers in prose are compared in
//! [`super::answer`], not here.
//!
//! This is a guard against accidents and the common reward hacks, not a
//! security boundary: the candidate runs as this user, can read what this user
//! can read, and could defeat the Python-level guards (socket patching, the
//! pass token) by deliberate introspection. Under the limits:
//! - memory: `RLIMIT_AS`; CPU: `RLIMIT_CPU` (a backstop behind the wall clock);
//!   file writes: `RLIMIT_FSIZE` 16 MiB; no core dumps; no new processes
//!   (`RLIMIT_NPROC` 0, which root ignores, so the whole process group is also
//!   killed after every test);
//! - an empty environment but `PATH`, no `site` (so no site-packages), stdin
//!   at end of file, the candidate's stdout discarded, stderr kept to its last
//!   64 KiB;
//! - a test passes only if the process exits 0 after printing a per-run random
//!   token that the harness prints once the test has finished, so
//!   `sys.exit(0)` or `os._exit(0)` in the program cannot pass a test.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read};
use std::num::NonZeroUsize;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How much of a candidate's stderr a [`Verdict::Crash`] keeps (its tail).
pub const STDERR_CAP: usize = 64 * 1024;
/// Largest file a candidate may write.
const FILE_SIZE_CAP: u64 = 16 * 1024 * 1024;
/// The harness's own stdout carries only the pass token.
const TOKEN_CAP: usize = 4 * 1024;
/// `PATH` inside the sandbox.
const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Exit status the harness uses for a failed assertion.
const FAIL_EXIT: i32 = 3;
/// Prefix of the harness's failure line on stderr.
const FAIL_MARKER: &str = "[tern-judge] fail: ";
/// Linux's SIGXCPU: the CPU-time limit was reached.
const SIGXCPU: i32 = 24;
/// Longest sleep between polls of a running test.
const POLL_MAX: Duration = Duration::from_millis(10);
/// How long to wait for pipes to close once the process is gone.
const PIPE_GRACE: Duration = Duration::from_millis(500);

/// The harness run as `python3 -I -S -c HARNESS memory cpu fsize` in the test's
/// directory. It reads and deletes the job files, sets limits, disables
/// sockets, hides the real stdout from the candidate, runs the program then the
/// test in one namespace, and reports through the exit status, a failure line
/// on stderr and the pass token on the saved stdout.
const HARNESS: &str = r#"
import os, sys
def _tern_judge():
    import resource, socket, _socket, traceback
    def read(name):
        with open(name, encoding="utf-8") as f:
            text = f.read()
        os.remove(name)
        return text
    program, test, token = read("program.py"), read("test.py"), read("token")
    memory, cpu, fsize = (int(arg) for arg in sys.argv[1:4])
    for which, soft, hard in ((resource.RLIMIT_AS, memory, memory), (resource.RLIMIT_CPU, cpu, cpu + 1),
                              (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_CORE, 0, 0),
                              (resource.RLIMIT_NPROC, 0, 0)):
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass
    class NoSocket:
        def __init__(self, *args, **kwargs):
            raise OSError("network disabled")
    def no_network(*args, **kwargs):
        raise OSError("network disabled")
    for module in (socket, _socket):
        for name in ("socket", "SocketType"):
            setattr(module, name, NoSocket)
        for name in ("socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo"):
            if hasattr(module, name):
                setattr(module, name, no_network)
    verdict = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    ns = {"__name__": "candidate"}
    try:
        exec(compile(program, "candidate", "exec", dont_inherit=True), ns)
        if "candidate" not in ns:
            functions = [v for v in ns.values()
                         if getattr(getattr(v, "__code__", None), "co_filename", None) == "candidate"]
            if functions:
                ns["candidate"] = functions[-1]
        exec(compile(test, "test", "exec", dont_inherit=True), ns)
    except AssertionError as error:
        reason = str(error)
        if not reason:
            lines = test.splitlines()
            at = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == "test"]
            line = lines[at[-1] - 1].strip() if at and at[-1] and at[-1] <= len(lines) else ""
            reason = "assertion failed" + (": " + line if line else "")
        sys.stderr.write("\n[tern-judge] fail: " + reason.replace("\n", " ") + "\n")
        sys.stderr.flush()
        os._exit(3)
    except BaseException:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(2)
    sys.stderr.flush()
    os.write(verdict, token.encode())
    os._exit(0)
_tern_judge()
"#;

/// Resource limits for one test run.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Wall-clock time for one test, interpreter start-up included.
    pub time: Duration,
    /// Address-space limit (`RLIMIT_AS`) for the test's process.
    pub memory_bytes: u64,
}

impl Default for Limits {
    /// 2 s and 256 MiB.
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(2),
            memory_bytes: 256 * 1024 * 1024,
        }
    }
}

/// The outcome of running one test against one program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The test ran to the end without an exception.
    Pass,
    /// An assertion failed, or the program exited before the test finished.
    Fail { reason: String },
    /// The wall-clock or CPU limit was reached.
    Timeout,
    /// Any other error: a syntax error, an exception, the memory limit, a signal.
    Crash { stderr: String },
}

impl Verdict {
    /// Whether this is [`Verdict::Pass`].
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
}

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

/// What stops the judge from running tests at all.
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// No working `python3` on `PATH`.
    #[error("python3 was not found on PATH; the code judge needs it to run candidates")]
    PythonNotFound,
    /// The operating system refused a step (temporary files, processes, threads).
    #[error("the code judge could not {action}: {source}")]
    Io {
        /// What the judge was doing.
        action: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn io_error(action: &'static str) -> impl FnOnce(io::Error) -> JudgeError {
    move |source| JudgeError::Io { action, source }
}

/// Runs `program` against each test, each in a fresh sandboxed `python3`.
///
/// A test is Python (`assert f(1) == 2`) run after the program in the same
/// namespace. `candidate` names the program's last top-level function unless
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
    let python = find_python()?;
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
            let outcome = run_test(
                &python,
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

/// The real interpreter behind `python3` (which may be a shim, like pyenv's,
/// that needs the environment the sandbox clears).
///
/// Found once per process and remembered: resolving a shim costs a few hundred
/// milliseconds, which best-of-N would otherwise pay per question. Failures are
/// not remembered, so installing Python later is noticed.
fn find_python() -> Result<PathBuf, JudgeError> {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    if let Some(path) = PYTHON.get() {
        return Ok(path.clone());
    }
    let output = Command::new("python3")
        .args(["-I", "-S", "-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let path = match output {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(JudgeError::PythonNotFound),
        Err(e) => {
            return Err(JudgeError::Io {
                action: "start python3",
                source: e,
            })
        }
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
        Ok(_) => return Err(JudgeError::PythonNotFound),
    };
    if path.as_os_str().is_empty() {
        return Err(JudgeError::PythonNotFound);
    }
    Ok(PYTHON.get_or_init(|| path).clone())
}

/// Runs one test against one program and classifies the outcome.
fn run_test(
    python: &Path,
    program: &str,
    test: &str,
    limits: &Limits,
) -> Result<Verdict, JudgeError> {
    let dir = ScratchDir::create()?;
    let token = format!("tern-pass-{:016x}{:016x}", random_u64(), random_u64());
    for (name, text) in [
        ("program.py", program),
        ("test.py", test),
        ("token", token.as_str()),
    ] {
        std::fs::write(dir.path.join(name), text).map_err(io_error("write a test file"))?;
    }
    let cpu_seconds = limits.time.as_secs_f64().ceil() as u64 + 1;
    let mut child = Command::new(python)
        .args(["-I", "-S", "-c", HARNESS])
        .args([limits.memory_bytes, cpu_seconds, FILE_SIZE_CAP].map(|n| n.to_string()))
        .env_clear()
        .env("PATH", SANDBOX_PATH)
        .current_dir(&dir.path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(io_error("start python3"))?;
    let stdout = Capture::start(child.stdout.take(), TOKEN_CAP);
    let stderr = Capture::start(child.stderr.take(), STDERR_CAP);
    let waited = wait_until(&mut child, limits.time);
    // Kill the group before reaping on timeout (the leader still holds the
    // group id). After a normal exit the id cannot be reused while any group
    // member lives, so killing it only reaches stragglers.
    kill_group(child.id());
    if !matches!(waited, Ok(Some(_))) {
        let _ = child.kill();
        let _ = child.wait();
    }
    let status = waited.map_err(io_error("wait for python3"))?;
    let (stdout, stderr) = (stdout?.finish(), stderr?.finish());
    Ok(classify(status, &stdout, stderr, &token))
}

/// The exit status, or `None` if `limit` passed first (the child then still runs).
fn wait_until(child: &mut Child, limit: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// SIGKILL to the process group `pgid`, best effort (`kill` may be missing;
/// the leader is killed directly anyway).
fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn classify(status: Option<ExitStatus>, stdout: &str, stderr: String, token: &str) -> Verdict {
    let Some(status) = status else {
        return Verdict::Timeout;
    };
    if status.signal() == Some(SIGXCPU) {
        return Verdict::Timeout;
    }
    if status.success() {
        return if stdout.contains(token) {
            Verdict::Pass
        } else {
            Verdict::Fail {
                reason: "the program exited before the test finished".into(),
            }
        };
    }
    if status.code() == Some(FAIL_EXIT) {
        if let Some(at) = stderr.rfind(FAIL_MARKER) {
            return Verdict::Fail {
                reason: stderr[at + FAIL_MARKER.len()..].trim().to_string(),
            };
        }
    }
    match status.signal() {
        Some(signal) => Verdict::Crash {
            stderr: format!("{stderr}\n[killed by signal {signal}]"),
        },
        None => Verdict::Crash { stderr },
    }
}

/// A fresh directory under the system temp dir, removed on drop.
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn create() -> Result<Self, JudgeError> {
        let mut last_error = io::Error::other("no attempt made");
        for _ in 0..8 {
            let path = std::env::temp_dir().join(format!("tern-judge-{:016x}", random_u64()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(ScratchDir { path }),
                Err(e) => last_error = e,
            }
        }
        Err(JudgeError::Io {
            action: "create a temporary directory",
            source: last_error,
        })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// 64 unpredictable bits from std's per-process random hash keys.
fn random_u64() -> u64 {
    RandomState::new().build_hasher().finish()
}

/// The last `cap` bytes a pipe produced, read on its own thread so a chatty
/// child never blocks on a full pipe.
struct Capture {
    tail: Arc<Mutex<Tail>>,
    closed: mpsc::Receiver<()>,
    cap: usize,
}

#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    dropped: usize,
}

impl Capture {
    fn start(pipe: Option<impl Read + Send + 'static>, cap: usize) -> Result<Capture, JudgeError> {
        let tail = Arc::new(Mutex::new(Tail::default()));
        let (closed_tx, closed) = mpsc::channel();
        if let Some(mut pipe) = pipe {
            let shared = Arc::clone(&tail);
            thread::Builder::new()
                .name("judge-pipe".into())
                .spawn(move || {
                    let mut buf = [0u8; 8192];
                    loop {
                        match pipe.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => {
                                let mut tail =
                                    shared.lock().unwrap_or_else(PoisonError::into_inner);
                                tail.bytes.extend_from_slice(&buf[..n]);
                                // Trim in batches so each byte is moved O(1) times.
                                if tail.bytes.len() > 2 * cap {
                                    let excess = tail.bytes.len() - cap;
                                    tail.bytes.drain(..excess);
                                    tail.dropped += excess;
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                    let _ = closed_tx.send(());
                })
                .map_err(io_error("start a pipe reader"))?;
        }
        Ok(Capture { tail, closed, cap })
    }

    /// The captured tail as text, waiting briefly for the pipe to close (a
    /// process that escaped the group may hold it open; it is not waited for).
    fn finish(self) -> String {
        let _ = self.closed.recv_timeout(PIPE_GRACE);
        let tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = tail.bytes.len().min(self.cap);
        let start = tail.bytes.len() - keep;
        let text = String::from_utf8_lossy(&tail.bytes[start..]);
        match tail.dropped + start {
            0 => text.into_owned(),
            dropped => format!("[{dropped} earlier bytes dropped]\n{text}"),
        }
    }
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

    /// Whether the judge can run here; prints why not otherwise.
    fn have_python() -> bool {
        match find_python() {
            Ok(_) => true,
            Err(e) => {
                eprintln!("note: skipping a judge test: {e}");
                false
            }
        }
    }

    fn tests(snippets: &[&str]) -> Vec<String> {
        snippets.iter().map(|s| s.to_string()).collect()
    }

    const ADD: &str = "def helper(x):\n    return x\n\ndef add(a, b):\n    return helper(a) + b\n";

    #[test]
    fn a_correct_program_passes_every_test() {
        if !have_python() {
            return;
        }
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
        if !have_python() {
            return;
        }
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
        if !have_python() {
            return;
        }
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
        if !have_python() {
            return;
        }
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
        if !have_python() {
            return;
        }
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
    fn sockets_are_disabled_and_the_environment_is_empty() {
        if !have_python() {
            return;
        }
        let cases = tests(&[
            "import socket\nsocket.create_connection(('127.0.0.1', 9))",
            "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)",
            "import os\nassert 'HOME' not in os.environ and os.listdir('.') == []",
        ]);
        let report = judge_python("x = 1\n", &cases, &Limits::default()).expect("judge runs");
        for verdict in &report.verdicts[..2] {
            assert!(
                matches!(verdict, Verdict::Crash { stderr } if stderr.contains("network disabled")),
                "{verdict:?}"
            );
        }
        assert_eq!(report.verdicts[2], Verdict::Pass);
    }

    #[test]
    fn output_is_capped() {
        if !have_python() {
            return;
        }
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
        if !have_python() {
            return;
        }
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
