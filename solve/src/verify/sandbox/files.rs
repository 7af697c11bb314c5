//! One program run on one file: the spreadsheet judge's use of the sandbox.
//!
//! The program runs in one fresh sandbox (the same namespaces, read-only
//! view, seccomp filter, resource limits and control group as a code test),
//! with the test case's workbook as `/tmp/input.xlsx` in its private 16 MiB
//! `/tmp`; what it leaves as `/tmp/output.xlsx` comes back over its stdout.
//! The input arrives on stdin, so the host's copy is never visible inside:
//! a program that deletes or overwrites its input touches only the
//! sandbox's copy, and one that writes a huge file hits the file-size limit
//! and the tmpfs's size, never the host's disk. Unlike a code test there is
//! no pass token: the verdict comes from comparing the returned workbook
//! with the expected cells, outside the sandbox (`verify::spreadsheet`).

use std::io;
use std::process::Stdio;

use super::{
    gate, io_error, killed, signal_of, wait_until, Capture, JudgeError, Limits, Sandbox, Verdict,
    FILE_SIZE_CAP, SIGXCPU, STDERR_CAP,
};

/// The harness (`python3 -I -S -c WORKBOOK`).
const WORKBOOK: &str = include_str!("../harness/workbook.py");
/// Exit status of the harness when the program left no `output.xlsx`.
const NO_OUTPUT_EXIT: i32 = 5;
/// Most stdout kept: the largest file the sandbox can hold, in hex.
const OUTPUT_CAP: usize = 2 * FILE_SIZE_CAP as usize + 1024;

/// How a run on a file ended.
#[derive(Debug)]
pub(in crate::verify) enum FileRun {
    /// The program finished and left this `output.xlsx`.
    Output(Vec<u8>),
    /// It did not: a timeout, a crash, no output file (never `Pass`).
    Ended(Verdict),
}

impl Sandbox {
    /// Runs `program` with `input` as `input.xlsx` and returns its
    /// `output.xlsx`, or how it failed.
    pub(in crate::verify) fn run_with_file(
        &self,
        program: &str,
        input: &[u8],
        limits: &Limits,
    ) -> Result<FileRun, JudgeError> {
        if limits.cancel.is_cancelled() {
            return Err(JudgeError::Cancelled);
        }
        let _permit = gate::acquire(1, &limits.cancel).ok_or(JudgeError::Cancelled)?;
        let (stderr_in, stderr_out) = io::pipe().map_err(io_error("create a pipe"))?;
        let mut run = self.spawn(WORKBOOK, None, Stdio::piped(), stderr_out.into(), limits)?;
        let stdout = Capture::start(run.child.stdout.take(), OUTPUT_CAP)?;
        let stderr = Capture::start(Some(stderr_in), STDERR_CAP)?;
        let job = serde_json::json!({ "program": program, "input": hex(input) });
        run.send(job.to_string())?;
        let waited = wait_until(&mut run.child, limits.time, &limits.cancel);
        let status = match waited {
            Ok(Some(status)) => Some(status),
            _ => None,
        };
        run.kill();
        waited.map_err(io_error("wait for bubblewrap"))?;
        let (stdout, stderr) = (stdout.finish(), stderr.finish());
        let Some(status) = status else {
            if limits.cancel.is_cancelled() {
                return Err(JudgeError::Cancelled);
            }
            return Ok(FileRun::Ended(Verdict::Timeout));
        };
        let signal = signal_of(&status);
        Ok(FileRun::Ended(match (status.code(), signal) {
            (_, Some(SIGXCPU)) => Verdict::Timeout,
            (Some(0), _) => {
                return Ok(match unhex(stdout.trim()) {
                    Some(bytes) => FileRun::Output(bytes),
                    None => FileRun::Ended(Verdict::Fail {
                        reason: "output.xlsx could not be read back (too large or garbled)".into(),
                    }),
                })
            }
            (Some(NO_OUTPUT_EXIT), _) => Verdict::Fail {
                reason: "the program wrote no output.xlsx".into(),
            },
            (_, Some(signal)) => killed(stderr, "the program was", signal, run.out_of_memory()),
            _ => Verdict::Crash { stderr },
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Bytes of lower- or upper-case hex; `None` for anything else (an odd
/// length, another character, the capture's "bytes dropped" note).
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_anything_else() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&bytes)), Some(bytes.to_vec()));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("[1 earlier bytes dropped]\nab"), None);
    }
}
