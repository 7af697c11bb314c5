//! The attack programs and the host they attack: a secret key file, a file
//! to delete, a directory to write into and a TCP listener, each checked
//! afterwards for what the attack changed.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

/// What a case must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The attack fails: the test never reaches its end.
    Refused,
    /// The attack may finish, but its cost to the host stays capped (output).
    Bounded,
}

/// One attack program from `tests/security/attacks/`.
#[derive(Clone, Debug)]
pub struct Attack {
    /// The file's stem.
    pub name: String,
    /// Its `# attack:` line.
    pub what: String,
    /// The program, placeholders unfilled.
    pub code: String,
    /// Its `# expect:` line.
    pub expect: Expect,
    /// Its `# expect-reason:` line: a failed assertion must say this.
    pub reason: Option<String>,
}

/// Every attack, by name.
pub fn attacks() -> Vec<Attack> {
    let dir = crate::support::repo_root().join("tests/security/attacks");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/security/attacks")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .collect();
    paths.sort();
    let attacks: Vec<Attack> = paths
        .iter()
        .map(|path| {
            let code = std::fs::read_to_string(path).expect("attack file");
            let header = |key: &str| {
                code.lines()
                    .find_map(|l| l.strip_prefix(&format!("# {key}: ")))
                    .map(|v| v.trim().to_string())
            };
            let expect = match header("expect").as_deref() {
                Some("refused") => Expect::Refused,
                Some("bounded") => Expect::Bounded,
                other => panic!("{}: bad `# expect:` {other:?}", path.display()),
            };
            Attack {
                name: path.file_stem().unwrap().to_string_lossy().into_owned(),
                what: header("attack").unwrap_or_default(),
                expect,
                reason: header("expect-reason"),
                code,
            }
        })
        .collect();
    assert!(attacks.len() >= 20, "only {} attacks found", attacks.len());
    attacks
}

/// The tiny generated model, written into `dir` (the file attacks try to read).
pub fn tiny_model(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("tiny.gguf");
    crate::support::tiny::write_tiny_model(&path, &crate::support::tiny::TinySpec::default());
    path
}

/// The secret every key-reading attack is after.
pub const SECRET: &str = "tern-secret-key-3f9c1e77";

/// What the attacks aim at on this machine.
pub struct Host {
    _dir: tempfile::TempDir,
    /// A file holding [`SECRET`] (the server's `--api-key-file`).
    pub key_file: PathBuf,
    /// A host file that must survive.
    pub victim: PathBuf,
    /// A host directory that must stay empty.
    pub host_dir: PathBuf,
    /// The model file served.
    pub model_file: PathBuf,
    /// A host listener no attack may reach.
    listener: TcpListener,
    /// The port attacks connect to (the listener's, or the server's own).
    pub port: u16,
    /// The process attacks signal and read /proc of.
    pub pid: u32,
}

impl Host {
    /// A fresh host around `model_file` (copied here, so a read of it is
    /// a read of a real GGUF).
    pub fn new(model_file: &Path) -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let key_file = dir.path().join("api-key");
        std::fs::write(&key_file, SECRET).unwrap();
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "still here").unwrap();
        let host_dir = dir.path().join("outside");
        std::fs::create_dir(&host_dir).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        Host {
            key_file,
            victim,
            host_dir,
            model_file: model_file.to_path_buf(),
            listener,
            port,
            pid: std::process::id(),
            _dir: dir,
        }
    }

    /// `attack`'s program with this host's paths, port and pid filled in.
    pub fn render(&self, attack: &Attack) -> String {
        attack
            .code
            .replace("{KEY_FILE}", &self.key_file.display().to_string())
            .replace("{MODEL_FILE}", &self.model_file.display().to_string())
            .replace("{VICTIM}", &self.victim.display().to_string())
            .replace("{HOST_DIR}", &self.host_dir.display().to_string())
            .replace("{REPO}", &crate::support::repo_root().display().to_string())
            .replace("{CARGO_HOME}", &cargo_home())
            .replace("{PORT}", &self.port.to_string())
            .replace("{PID}", &self.pid.to_string())
    }

    /// What the attacks changed on the host; empty when nothing.
    pub fn breaches(&self) -> Vec<String> {
        let mut seen = Vec::new();
        match self.listener.accept() {
            Ok((_, from)) => seen.push(format!("the host listener got a connection from {from}")),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => seen.push(format!("the host listener failed: {e}")),
        }
        if std::fs::read_to_string(&self.victim).ok().as_deref() != Some("still here") {
            seen.push(format!("{} was changed or deleted", self.victim.display()));
        }
        let written: Vec<_> = std::fs::read_dir(&self.host_dir).unwrap().collect();
        if !written.is_empty() {
            seen.push(format!(
                "{} files appeared in {}",
                written.len(),
                self.host_dir.display()
            ));
        }
        if std::fs::read_to_string(&self.key_file).ok().as_deref() != Some(SECRET) {
            seen.push("the key file was changed".into());
        }
        seen
    }
}

/// Where cargo keeps its registry and credentials (a real user directory).
fn cargo_home() -> String {
    std::env::var("CARGO_HOME").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        format!("{home}/.cargo")
    })
}

/// Why `attack`'s outcome breaks the sandbox's promise, if it does.
pub fn judge_outcome(attack: &Attack, verdict: &tern_solve::verify::Verdict) -> Option<String> {
    use tern_solve::verify::judge::STDERR_CAP;
    use tern_solve::verify::Verdict;
    match (attack.expect, verdict) {
        (Expect::Refused, Verdict::Pass) => Some(format!("{}: the attack succeeded", attack.name)),
        (Expect::Refused, Verdict::Fail { reason }) => match &attack.reason {
            Some(want) if !reason.contains(want.as_str()) => Some(format!(
                "{}: failed with `{reason}`, not `{want}`",
                attack.name
            )),
            _ => None,
        },
        (Expect::Refused, _) if attack.reason.is_some() => Some(format!(
            "{}: expected a failed assertion `{}`, got {verdict:?}",
            attack.name,
            attack.reason.as_deref().unwrap_or_default()
        )),
        (_, Verdict::Crash { stderr }) if stderr.len() > STDERR_CAP + 200 => Some(format!(
            "{}: {} bytes of stderr kept",
            attack.name,
            stderr.len()
        )),
        _ => None,
    }
}

/// A one-line summary of a verdict, for the suite's printed table.
pub fn summary(verdict: &tern_solve::verify::Verdict) -> String {
    use tern_solve::verify::Verdict;
    match verdict {
        Verdict::Pass => "pass".into(),
        Verdict::Timeout => "timeout".into(),
        Verdict::Fail { reason } => {
            format!("fail: {}", reason.chars().take(90).collect::<String>())
        }
        Verdict::Crash { stderr } => {
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            format!("crash: {}", last.chars().take(90).collect::<String>())
        }
    }
}
