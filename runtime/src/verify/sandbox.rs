//! One test of one candidate program in a fresh, limited `python3`: the
//! subprocess half of the online judge ([`super::judge`] schedules the tests
//! and keeps the reports).
//!
//! Each test gets a fresh temporary directory and a `python3 -I -S` started by
//! a small harness that reads the job, sets the limits, disables sockets and
//! hides the real stdout; the wall clock is enforced from here and the whole
//! process group is killed afterwards. What this does and does not guard
//! against is written down in [`super::judge`].

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
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

/// The real interpreter behind `python3` (which may be a shim, like pyenv's,
/// that needs the environment the sandbox clears).
///
/// Found once per process and remembered: resolving a shim costs a few hundred
/// milliseconds, which best-of-N would otherwise pay per question. Failures are
/// not remembered, so installing Python later is noticed.
pub(super) fn find_python() -> Result<PathBuf, JudgeError> {
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
pub(super) fn run_test(
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
