//! What a judged program can make the machine hold: memory outside its
//! address-space limit (System V shared memory, memory files, the kernel's
//! memory behind files in its /tmp) and pseudo-terminals. The system-call
//! filter refuses the first two outright; the per-process control group
//! (where the machine gives one) charges the rest to the sandbox and kills
//! it at the cap.

use std::time::Duration;

use tern_solve::verify::{isolation, judge_python, Limits, Verdict};

fn run(program: &str, limits: &Limits) -> Verdict {
    let mut report =
        judge_python(program, &["pass".to_string()], limits).expect("the judge runs here");
    report.verdicts.remove(0)
}

/// The error a refused call gives inside the sandbox.
fn crashed_with(verdict: &Verdict, needle: &str) -> bool {
    matches!(verdict, Verdict::Crash { stderr } if stderr.contains(needle))
}

#[test]
fn shared_memory_and_memory_files_are_refused() {
    let limits = Limits::default();
    let shm = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
        shmid = libc.shmget(0, ctypes.c_size_t(64 << 20), 0o1600)\n\
        assert shmid >= 0, 'shmget errno %d' % ctypes.get_errno()\n";
    let verdict = run(shm, &limits);
    // EPERM is 1: the filter's answer, not a missing kernel feature.
    assert_eq!(
        verdict,
        Verdict::Fail {
            reason: "shmget errno 1".into()
        }
    );
    let memfd = "import os\nfd = os.memfd_create('x')\n";
    let verdict = run(memfd, &limits);
    assert!(crashed_with(&verdict, "PermissionError"), "{verdict:?}");
    let queue = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
        assert libc.msgget(0, 0o1600) >= 0, 'msgget errno %d' % ctypes.get_errno()\n";
    assert_eq!(
        run(queue, &limits),
        Verdict::Fail {
            reason: "msgget errno 1".into()
        }
    );
}

#[test]
fn no_pseudo_terminal_and_only_five_devices() {
    let limits = Limits::default();
    let verdict = run("import os\nos.openpty()\n", &limits);
    assert!(crashed_with(&verdict, "FileNotFoundError"), "{verdict:?}");
    let listing = "import os\nassert sorted(os.listdir('/dev')) == ['full', 'null', 'random', 'urandom', 'zero'], os.listdir('/dev')\n\
        with open('/dev/null', 'w') as f:\n    f.write('fine')\n\
        assert len(open('/dev/urandom', 'rb').read(8)) == 8\n";
    assert_eq!(run(listing, &limits), Verdict::Pass);
}

#[test]
fn kernel_memory_behind_files_counts_against_the_cap() {
    let isolation = isolation().expect("the sandbox works here");
    eprintln!("isolation: {isolation}");
    if !isolation.contains("a control group per process") {
        // Documented in docs/SECURITY.md: without a control group, files in
        // /tmp are bounded by its 16 MiB and the wall clock only.
        eprintln!("no control groups here: the file-count bound is not checked");
        return;
    }
    // Empty files hold no tmpfs bytes, only inodes and directory entries:
    // kernel memory that RLIMIT_AS does not see. Under a 48 MiB cap the
    // sandbox must be killed long before a million of them exist.
    let limits = Limits {
        time: Duration::from_secs(30),
        memory_bytes: 48 << 20,
        ..Limits::default()
    };
    let files = "import os\nfor i in range(1_000_000):\n    os.close(os.open('/tmp/f%d' % i, os.O_CREAT | os.O_WRONLY, 0o600))\n";
    let verdict = run(files, &limits);
    assert!(
        crashed_with(&verdict, "the sandbox's memory limit"),
        "{verdict:?}"
    );
    // The judge still works, and its groups are gone.
    assert_eq!(run("x = 1\n", &Limits::default()), Verdict::Pass);
}
