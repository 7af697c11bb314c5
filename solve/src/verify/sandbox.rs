//! One test of one candidate program, run as two `python3 -I -S` processes,
//! each inside its own bubblewrap (`bwrap`) sandbox: the subprocess half of
//! the online judge ([`super::judge`] schedules the tests and keeps the
//! reports).
//!
//! The candidate's program runs in one sandbox and the test in the other;
//! they talk only through two pipes, over which the test calls the
//! program's functions with plain data and gets plain data back. The verdict
//! is what only the test's process can produce (its exit status and a
//! per-run pass token it alone was given), so no introspection inside the
//! candidate's process (its frames, `gc`, an object equal to everything)
//! can pass a test it fails.
//!
//! Each sandbox gets fresh namespaces (user, mount, PID, IPC, UTS, network,
//! cgroup): no network at all, no other process visible or signalable, and a
//! read-only view of the host holding only the system libraries, the Python
//! runtime and `/etc/ld.so.cache`, plus an empty 16 MiB `/tmp` as the working
//! directory. Inside, the process is `nobody`, has no capabilities, cannot
//! gain privileges (`no_new_privs`) or create user namespaces, and runs under
//! the system-call filter of [`super::seccomp`] (an allow list: no new
//! processes, no sockets, no shared memory or memory files). Address space,
//! CPU time, file size and open files are capped by resource limits set
//! before bubblewrap starts, which hold for root too (nothing inside has
//! `CAP_SYS_RESOURCE` to raise them); where the machine lets the judge make
//! control groups, each process also gets its own ([`super::cgroup`]:
//! memory including the kernel's, tasks, one core). At most
//! [`super::gate::max_sandboxes`] sandboxes run at once in the process;
//! more wait their turn. The wall clock is
//! enforced from here, and killing bubblewrap takes the whole PID namespace
//! with it. The program, test and pass token arrive on stdin, so nothing of
//! the job is ever a file the candidate could read back.
//!
//! Where the sandbox cannot be built (no `bwrap`, user namespaces disabled),
//! the judge refuses with [`JudgeError::Sandbox`]; it never runs code without it.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::cgroup::{Cgroups, Group};
use super::gate;

mod files;
pub(super) use files::FileRun;

/// How much of a candidate's stderr a [`Verdict::Crash`] keeps (its tail).
pub const STDERR_CAP: usize = 64 * 1024;
/// Largest file a candidate may write, and the size of its `/tmp`.
const FILE_SIZE_CAP: u64 = 16 * 1024 * 1024;
/// Most open files inside the sandbox.
const OPEN_FILES_CAP: u64 = 64;
/// The harness's own stdout carries only the pass token.
const TOKEN_CAP: usize = 4 * 1024;
/// Exit status the harness uses for a failed assertion.
const FAIL_EXIT: i32 = 3;
/// Prefix of the harness's failure line on stderr.
const FAIL_MARKER: &str = "[tern-judge] fail: ";
/// Linux's SIGXCPU: the CPU-time limit was reached.
const SIGXCPU: i32 = 24;
/// bubblewrap exits with 128 + the signal when its command was killed by one.
const SIGNAL_EXIT_BASE: i32 = 128;
/// Longest sleep between polls of a running test.
const POLL_MAX: Duration = Duration::from_millis(10);
/// How long to wait for pipes to close once the process is gone.
const PIPE_GRACE: Duration = Duration::from_millis(500);
/// The user and group the candidate runs as inside its namespace.
const NOBODY: &str = "65534";
/// The file descriptors bubblewrap reads the seccomp programs from.
const FILTER_FDS: [RawFd; 2] = [3, 4];

/// Exit status the test's harness uses when the candidate's process went
/// away mid-test (its channel closed): the judge then asks the kernel how
/// the candidate ended.
const GONE_EXIT: i32 = 4;
/// The descriptors the two harnesses talk over: each reads at the first and
/// writes at the second (set up by [`child_setup`]).
const CHANNEL_FDS: [RawFd; 2] = [5, 6];

/// The candidate's harness (`python3 -I -S -c CANDIDATE`): runs the program,
/// then serves calls to its functions as plain data over the channel.
const CANDIDATE: &str = include_str!("harness/candidate.py");
/// The test's harness (`python3 -I -S -c TEST`), in a sandbox of its own:
/// the program's names are proxies to the candidate's process, replies are
/// decoded strictly into built-in types, and only this process holds the
/// pass token, so nothing inside the candidate's process can forge a pass.
const TEST: &str = include_str!("harness/test.py");

/// Resource limits for one test run.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Wall-clock time for one test, interpreter start-up included.
    pub time: Duration,
    /// Address-space limit (`RLIMIT_AS`) for the test's process.
    pub memory_bytes: u64,
    /// Stops the run early (a client that went away): running tests are
    /// killed and no more start.
    pub cancel: Cancel,
}

impl Default for Limits {
    /// 2 s and 256 MiB, never cancelled.
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(2),
            memory_bytes: 256 * 1024 * 1024,
            cancel: Cancel::default(),
        }
    }
}

/// A shared switch that cancels judge work: set it (or drop the guard from
/// [`Cancel::on_drop`]) and every test of the run stops.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Asks the work to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A guard that cancels when dropped: held by a request handler, it
    /// stops the judge when the handler is dropped because its client left.
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

impl PartialEq for Cancel {
    /// The same switch.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Cancels its [`Cancel`] when dropped.
#[derive(Debug)]
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
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
    /// Any other error: a syntax error, an exception, the memory limit, a
    /// signal, a call the sandbox denies.
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
    /// The isolation boundary cannot be built here, so no code runs.
    #[error("code execution is unavailable: {0}")]
    Sandbox(String),
    /// The run was cancelled through [`Limits::cancel`].
    #[error("the code judge was cancelled")]
    Cancelled,
    /// The operating system refused a step (pipes, processes, threads).
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
/// that needs the environment the sandbox clears) and the directories it
/// loads its standard library and shared libraries from.
#[derive(Clone, Debug)]
struct Python {
    executable: PathBuf,
    dirs: Vec<PathBuf>,
}

/// Asks `python3` where it lives.
fn find_python() -> Result<Python, JudgeError> {
    const WHERE: &str = "import os, sys, sysconfig\n\
        print(os.path.realpath(sys.executable))\n\
        print(os.path.dirname(os.path.realpath(os.__file__)))\n\
        print(sysconfig.get_config_var('LIBDIR') or '')\n\
        print(sysconfig.get_config_var('DESTSHARED') or '')";
    let output = Command::new("python3")
        .args(["-I", "-S", "-c", WHERE])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let out = match output {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(JudgeError::PythonNotFound),
        Err(e) => {
            return Err(JudgeError::Io {
                action: "start python3",
                source: e,
            })
        }
        Ok(out) if out.status.success() => out,
        Ok(_) => return Err(JudgeError::PythonNotFound),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().map(str::trim);
    let executable = PathBuf::from(lines.next().unwrap_or(""));
    if !executable.is_absolute() {
        return Err(JudgeError::PythonNotFound);
    }
    let dirs = lines
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .collect();
    Ok(Python { executable, dirs })
}

/// One piece of the sandbox's filesystem view.
#[derive(Clone, Debug)]
enum Mount {
    /// A host path bound read-only at the same place.
    ReadOnly(PathBuf),
    /// A symbolic link `at` -> `target`, as on the host (merged `/usr`).
    Symlink { target: PathBuf, at: PathBuf },
}

/// Everything needed to start a sandboxed test: found and probed once.
#[derive(Debug)]
pub(super) struct Sandbox {
    bwrap: PathBuf,
    python: PathBuf,
    view: Vec<Mount>,
    filters: Vec<Vec<u8>>,
    /// Per-process control groups, or why this machine gives none.
    cgroups: Result<Cgroups, String>,
}

/// What isolates judged code on this machine, in one line (the server and
/// `tern bon` print it when they start): the sandbox, and whether each
/// process gets a control group or why not.
pub fn isolation() -> Result<String, JudgeError> {
    let sandbox = sandbox()?;
    Ok(match &sandbox.cgroups {
        Ok(cgroups) => format!(
            "bubblewrap + seccomp allow list, a control group per process ({})",
            cgroups.describe()
        ),
        Err(why) => format!(
            "bubblewrap + seccomp allow list and resource limits; no control groups ({why})"
        ),
    })
}

/// The sandbox, built and probed once per process (a passing trivial test
/// proves namespaces, mounts and the filter work here). Failures are not
/// remembered, so installing bubblewrap later is noticed.
pub(super) fn sandbox() -> Result<&'static Sandbox, JudgeError> {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    static PROBE: Mutex<()> = Mutex::new(());
    if let Some(sandbox) = SANDBOX.get() {
        return Ok(sandbox);
    }
    let _one_probe = PROBE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(sandbox) = SANDBOX.get() {
        return Ok(sandbox);
    }
    let sandbox = Sandbox::build()?;
    sandbox.probe()?;
    Ok(SANDBOX.get_or_init(|| sandbox))
}

/// Checks that code execution works on this machine (bubblewrap present,
/// user namespaces allowed, Python found), so a server or trainer that will
/// run code can refuse at start rather than on its first request.
pub fn check() -> Result<(), JudgeError> {
    sandbox().map(|_| ())
}

/// `bwrap` on `PATH`, or a clear error saying how to get it.
fn find_bwrap() -> Result<PathBuf, JudgeError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/bin".into()])
        .map(|dir| dir.join("bwrap"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            JudgeError::Sandbox(
                "bubblewrap (`bwrap`) was not found on PATH; install it (Debian/Ubuntu: \
                 apt-get install bubblewrap) to run candidate code in a sandbox"
                    .into(),
            )
        })
}

impl Sandbox {
    fn build() -> Result<Sandbox, JudgeError> {
        #[cfg(not(target_os = "linux"))]
        return Err(JudgeError::Sandbox(
            "the sandbox needs Linux namespaces and seccomp".into(),
        ));
        #[cfg(target_os = "linux")]
        let filters = super::seccomp::programs()
            .map_err(|e| JudgeError::Sandbox(format!("the seccomp filter cannot be built: {e}")))?;
        let bwrap = find_bwrap()?;
        let python = find_python()?;
        let mut view = Vec::new();
        for dir in ["/usr/lib", "/usr/lib64", "/usr/lib32"] {
            if Path::new(dir).is_dir() {
                view.push(Mount::ReadOnly(dir.into()));
            }
        }
        for top in ["/lib", "/lib64", "/lib32", "/libx32"] {
            let at = PathBuf::from(top);
            match std::fs::read_link(&at) {
                Ok(target) => view.push(Mount::Symlink { target, at }),
                Err(_) if at.is_dir() => view.push(Mount::ReadOnly(at)),
                Err(_) => {}
            }
        }
        if Path::new("/etc/ld.so.cache").is_file() {
            view.push(Mount::ReadOnly("/etc/ld.so.cache".into()));
        }
        view.extend(python.dirs.iter().cloned().map(Mount::ReadOnly));
        view.push(Mount::ReadOnly(python.executable.clone()));
        Ok(Sandbox {
            bwrap,
            python: python.executable,
            view,
            filters,
            cgroups: Cgroups::detect(),
        })
    }

    /// Runs a trivial passing test; anything else means the sandbox does not
    /// work here, with bubblewrap's own words as the reason.
    fn probe(&self) -> Result<(), JudgeError> {
        match self.run("x = 1\n", "assert x == 1\n", &Limits::default())? {
            Verdict::Pass => Ok(()),
            other => {
                let detail = match other {
                    Verdict::Crash { stderr } => stderr,
                    other => format!("{other:?}"),
                };
                let detail = detail.trim();
                let hint =
                    if detail.contains("namespace") || detail.contains("Operation not permitted") {
                        " (are unprivileged user namespaces disabled? see \
                     kernel.unprivileged_userns_clone and user.max_user_namespaces)"
                    } else {
                        ""
                    };
                Err(JudgeError::Sandbox(format!(
                    "the bubblewrap sandbox does not start here: {}{hint}",
                    detail.lines().last().unwrap_or("no output")
                )))
            }
        }
    }

    /// bubblewrap's arguments up to the command.
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--unshare-user",
            "--unshare-all",
            "--uid",
            NOBODY,
            "--gid",
            NOBODY,
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "tern-judge",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
        ]
        .map(String::from)
        .into();
        for mount in &self.view {
            match mount {
                Mount::ReadOnly(path) => {
                    let p = path.display().to_string();
                    args.extend(["--ro-bind".into(), p.clone(), p]);
                }
                Mount::Symlink { target, at } => args.extend([
                    "--symlink".into(),
                    target.display().to_string(),
                    at.display().to_string(),
                ]),
            }
        }
        args.extend(
            [
                // A /dev of the five harmless devices only: no pseudo-terminals,
                // no /dev/shm.
                "--dev-bind",
                "/dev/null",
                "/dev/null",
                "--dev-bind",
                "/dev/zero",
                "/dev/zero",
                "--dev-bind",
                "/dev/full",
                "/dev/full",
                "--dev-bind",
                "/dev/random",
                "/dev/random",
                "--dev-bind",
                "/dev/urandom",
                "/dev/urandom",
                "--size",
                &FILE_SIZE_CAP.to_string(),
                "--tmpfs",
                "/tmp",
                "--remount-ro",
                "/",
                "--chdir",
                "/tmp",
            ]
            .map(String::from),
        );
        for fd in FILTER_FDS.iter().take(self.filters.len()) {
            args.extend(["--add-seccomp-fd".into(), fd.to_string()]);
        }
        args
    }

    /// Runs one test against one program and classifies the outcome: the
    /// program in one sandbox, the test in another, joined by two pipes.
    pub(super) fn run(
        &self,
        program: &str,
        test: &str,
        limits: &Limits,
    ) -> Result<Verdict, JudgeError> {
        if limits.cancel.is_cancelled() {
            return Err(JudgeError::Cancelled);
        }
        let _permit = gate::acquire(2, &limits.cancel).ok_or(JudgeError::Cancelled)?;
        let token = format!("tern-pass-{:016x}{:016x}", random_u64(), random_u64());
        let (requests_in, requests_out) = io::pipe().map_err(io_error("create a pipe"))?;
        let (replies_in, replies_out) = io::pipe().map_err(io_error("create a pipe"))?;
        // One stderr for both: the program's output and the test's traceback
        // in the order they were written.
        let (stderr_in, stderr_out) = io::pipe().map_err(io_error("create a pipe"))?;
        let stderr_copy = stderr_out.try_clone().map_err(io_error("create a pipe"))?;
        let mut candidate = self.spawn(
            CANDIDATE,
            Some([requests_in.as_raw_fd(), replies_out.as_raw_fd()]),
            Stdio::null(),
            stderr_copy.into(),
            limits,
        )?;
        let test_side = self.spawn(
            TEST,
            Some([replies_in.as_raw_fd(), requests_out.as_raw_fd()]),
            Stdio::piped(),
            stderr_out.into(),
            limits,
        );
        // The parent's ends go, so each side sees the other's exit as EOF.
        drop((requests_in, requests_out, replies_in, replies_out));
        let mut test_side = match test_side {
            Ok(spawned) => spawned,
            Err(e) => {
                candidate.kill();
                return Err(e);
            }
        };
        let stdout = Capture::start(test_side.child.stdout.take(), TOKEN_CAP);
        let stderr = Capture::start(Some(stderr_in), STDERR_CAP);
        candidate.send(serde_json::json!({ "program": program }).to_string())?;
        test_side.send(serde_json::json!({ "test": test, "token": token }).to_string())?;
        let waited = wait_until(&mut test_side.child, limits.time, &limits.cancel);
        let test_status = match &waited {
            Ok(Some(status)) => Some(*status),
            _ => {
                test_side.kill();
                None
            }
        };
        // A test that reports the candidate gone gives the candidate a moment
        // to be reaped, so its end (a signal, the CPU limit) can be read.
        let candidate_status = if test_status.and_then(|s| s.code()) == Some(GONE_EXIT) {
            wait_until(&mut candidate.child, PIPE_GRACE, &Cancel::default())
                .ok()
                .flatten()
        } else {
            None
        };
        candidate.kill();
        waited.map_err(io_error("wait for bubblewrap"))?;
        let (stdout, stderr) = (stdout?.finish(), stderr?.finish());
        if test_status.is_none() && limits.cancel.is_cancelled() {
            return Err(JudgeError::Cancelled);
        }
        let ends = Ends {
            test: test_status,
            candidate: candidate_status,
            out_of_memory: candidate.out_of_memory() || test_side.out_of_memory(),
        };
        Ok(classify(&ends, &stdout, stderr, &token))
    }

    /// Starts `harness` in a fresh sandbox: the filters on [`FILTER_FDS`],
    /// `channel` (read end, write end), if any, on [`CHANNEL_FDS`], the resource
    /// limits, and a control group joined before exec where there is one.
    fn spawn(
        &self,
        harness: &str,
        channel: Option<[RawFd; 2]>,
        stdout: Stdio,
        stderr: Stdio,
        limits: &Limits,
    ) -> Result<Spawned, JudgeError> {
        let filters = self
            .filters
            .iter()
            .map(|bytes| filled_pipe(bytes))
            .collect::<Result<Vec<OwnedFd>, JudgeError>>()?;
        let mut moves: Vec<(RawFd, RawFd)> = filters
            .iter()
            .map(AsRawFd::as_raw_fd)
            .zip(FILTER_FDS)
            .collect();
        moves.extend(channel.into_iter().flatten().zip(CHANNEL_FDS));
        let group = match &self.cgroups {
            Ok(cgroups) => Some(
                cgroups
                    .create(limits.memory_bytes)
                    .map_err(io_error("create the sandbox's control group"))?,
            ),
            Err(_) => None,
        };
        let procs = group.as_ref().map(Group::procs_fds).unwrap_or_default();
        let cpu_seconds = limits.time.as_secs_f64().ceil() as u64 + 1;
        let rlimits = [
            (libc::RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
            (libc::RLIMIT_CPU, cpu_seconds, cpu_seconds + 1),
            (libc::RLIMIT_FSIZE, FILE_SIZE_CAP, FILE_SIZE_CAP),
            (libc::RLIMIT_CORE, 0, 0),
            (libc::RLIMIT_NOFILE, OPEN_FILES_CAP, OPEN_FILES_CAP),
        ];
        let mut command = Command::new(&self.bwrap);
        command
            .args(self.args())
            .arg("--")
            .arg(&self.python)
            .args(["-I", "-S", "-c", harness])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        // SAFETY: between fork and exec the closure only calls
        // async-signal-safe functions (fcntl, dup2, write, setrlimit) on
        // values computed before the fork; it allocates nothing.
        unsafe {
            command.pre_exec(move || child_setup(&moves, &procs, &rlimits));
        }
        let child = command.spawn().map_err(io_error("start bubblewrap"))?;
        drop(filters);
        Ok(Spawned { child, group })
    }
}

/// A started sandbox and its control group (removed once the child is reaped).
struct Spawned {
    child: Child,
    group: Option<Group>,
}

impl Spawned {
    /// Writes the job to the harness's stdin on a thread of its own (a child
    /// that dies before reading leaves a broken pipe: its verdict says why).
    fn send(&mut self, job: String) -> Result<(), JudgeError> {
        if let Some(mut stdin) = self.child.stdin.take() {
            thread::Builder::new()
                .name("judge-stdin".into())
                .spawn(move || {
                    let _ = stdin.write_all(job.as_bytes());
                })
                .map_err(io_error("start a stdin writer"))?;
        }
        Ok(())
    }

    /// Kills bubblewrap (and with it its PID namespace) and reaps it.
    fn kill(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// Whether the kernel killed a task of this sandbox at its memory cap.
    fn out_of_memory(&self) -> bool {
        self.group.as_ref().is_some_and(Group::out_of_memory)
    }
}

/// How the two processes of a test ended.
struct Ends {
    /// The test's exit status; `None` when the wall clock (or a cancel) ran out.
    test: Option<ExitStatus>,
    /// The candidate's, read only when the test reports it gone.
    candidate: Option<ExitStatus>,
    /// A control group's memory cap was reached.
    out_of_memory: bool,
}

/// The C library's type for `setrlimit`'s resource argument.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type Resource = libc::c_int;

/// In the forked child: joins each control group by writing `0` to its
/// `cgroup.procs`, moves each `(source, target)` descriptor into place
/// (through high descriptors first, so no source is overwritten by an
/// earlier move), and sets the resource limits.
fn child_setup(
    moves: &[(RawFd, RawFd)],
    procs: &[RawFd],
    rlimits: &[(Resource, u64, u64)],
) -> io::Result<()> {
    // First, while every descriptor is still where the parent opened it (the
    // moves below may land on a `cgroup.procs` descriptor's number).
    for &fd in procs {
        // SAFETY: write(2) of a static byte to a descriptor opened before fork.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    const MOST: usize = FILTER_FDS.len() + CHANNEL_FDS.len();
    let mut high = [0 as RawFd; MOST];
    for (slot, &(source, _)) in high.iter_mut().zip(moves) {
        // SAFETY: fcntl on a descriptor this process owns.
        let fd = unsafe { libc::fcntl(source, libc::F_DUPFD_CLOEXEC, 64) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        *slot = fd;
    }
    for (&fd, &(_, target)) in high.iter().zip(moves) {
        // SAFETY: dup2 onto a fixed low descriptor; it clears close-on-exec.
        if unsafe { libc::dup2(fd, target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for &(resource, soft, hard) in rlimits {
        let limit = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: setrlimit with a valid pointer to a local struct.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A pipe's read end holding `bytes` (a seccomp program: far below the pipe's
/// buffer), its write end already closed.
fn filled_pipe(bytes: &[u8]) -> Result<OwnedFd, JudgeError> {
    let (reader, mut writer) = io::pipe().map_err(io_error("create a pipe"))?;
    writer
        .write_all(bytes)
        .map_err(io_error("write the seccomp filter"))?;
    drop(writer);
    Ok(reader.into())
}

/// The exit status, or `None` if `limit` passed (or the run was cancelled)
/// first; the child then still runs.
fn wait_until(
    child: &mut Child,
    limit: Duration,
    cancel: &Cancel,
) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline || cancel.is_cancelled() {
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// The signal that ended a process: bubblewrap reports its command's death
/// by signal N as exit 128 + N.
fn signal_of(status: &ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal().or_else(|| {
        status
            .code()
            .filter(|&c| c > SIGNAL_EXIT_BASE && c < SIGNAL_EXIT_BASE + 65)
            .map(|c| c - SIGNAL_EXIT_BASE)
    })
}

/// What a signal means for the verdict's text.
fn killed(stderr: String, who: &str, signal: i32, out_of_memory: bool) -> Verdict {
    let why = if out_of_memory {
        " (the sandbox's memory limit)"
    } else {
        ""
    };
    Verdict::Crash {
        stderr: format!("{stderr}\n[{who} killed by signal {signal}{why}]"),
    }
}

fn classify(ends: &Ends, stdout: &str, stderr: String, token: &str) -> Verdict {
    let Some(status) = ends.test else {
        return Verdict::Timeout;
    };
    let signal = signal_of(&status);
    if signal == Some(SIGXCPU) {
        return Verdict::Timeout;
    }
    if status.success() {
        return if stdout.contains(token) {
            Verdict::Pass
        } else {
            Verdict::Fail {
                reason: "the test exited before it finished".into(),
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
    if status.code() == Some(GONE_EXIT) {
        return match ends.candidate.as_ref().map(signal_of) {
            Some(Some(SIGXCPU)) => Verdict::Timeout,
            Some(Some(signal)) => killed(stderr, "the program was", signal, ends.out_of_memory),
            _ => Verdict::Fail {
                reason: "the program exited before the test finished".into(),
            },
        };
    }
    match signal {
        Some(signal) => killed(stderr, "the test was", signal, ends.out_of_memory),
        None => Verdict::Crash { stderr },
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_sandbox_that_cannot_start_refuses_with_the_reason() {
        let mut sandbox = Sandbox::build().expect("the sandbox builds here");
        // A bubblewrap that fails as it does on a kernel without
        // unprivileged user namespaces.
        let dir = std::env::temp_dir().join(format!("tern-fake-bwrap-{:016x}", random_u64()));
        std::fs::create_dir(&dir).unwrap();
        let fake = dir.join("bwrap");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        sandbox.bwrap = fake;
        let err = sandbox.probe().expect_err("a failing sandbox must refuse");
        let _ = std::fs::remove_dir_all(&dir);
        let message = err.to_string();
        assert!(matches!(err, JudgeError::Sandbox(_)), "{err:?}");
        assert!(
            message.starts_with("code execution is unavailable")
                && message.contains("No permissions to create a new namespace")
                && message.contains("user namespaces"),
            "{message}"
        );
    }

    #[test]
    fn the_candidate_is_nobody_without_capabilities_under_the_filter() {
        let sandbox = sandbox().expect("the sandbox works here");
        let status = "fields = dict(l.split(':', 1) for l in open('/proc/self/status'))";
        // No procfs is mounted: the candidate cannot read its own status either.
        let verdict = sandbox
            .run("", &format!("{status}\n"), &Limits::default())
            .unwrap();
        assert!(
            matches!(&verdict, Verdict::Crash { stderr } if stderr.contains("FileNotFoundError")),
            "{verdict:?}"
        );
        let checks = "import ctypes, os\n\
            libc = ctypes.CDLL(None)\n\
            assert os.getuid() == 65534 and os.getgid() == 65534, (os.getuid(), os.getgid())\n\
            assert os.getcwd() == '/tmp' and os.listdir('/tmp') == []\n\
            assert 'home' not in os.listdir('/') and not os.path.exists('/etc/passwd')\n\
            assert libc.prctl(39, 0, 0, 0, 0) == 1, 'no_new_privs'\n\
            assert libc.prctl(21, 0, 0, 0, 0) == 2, 'seccomp filter mode'\n\
            assert all(libc.prctl(23, cap, 0, 0, 0) != 1 for cap in range(64)), 'bounding set'\n";
        assert_eq!(
            sandbox.run("", checks, &Limits::default()).unwrap(),
            Verdict::Pass
        );
    }
}
