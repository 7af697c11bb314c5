//! What the code judge's sandbox costs per test: one trivial test judged end
//! to end (bubblewrap, namespaces, seccomp, the harness) beside the bare
//! interpreter start it wraps (`python3 -I -S -c pass`), which every judged
//! test paid before the sandbox too. Their difference is the sandbox's
//! per-test overhead (docs/BENCHMARKS.md, docs/SECURITY.md).

use std::process::{Command, Stdio};

use criterion::{criterion_group, criterion_main, Criterion};
use tern_solve::verify::{judge_python, Limits};

fn judge(c: &mut Criterion) {
    let limits = Limits::default();
    let tests = vec!["assert add(2, 3) == 5".to_string()];
    let program = "def add(a, b):\n    return a + b\n";
    // The first call builds and probes the sandbox; time the steady state.
    judge_python(program, &tests, &limits).expect("the sandbox works here");
    // The real interpreter, as the judge finds it (`python3` may be a shim).
    let out = Command::new("python3")
        .args(["-I", "-S", "-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs");
    let python = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut g = c.benchmark_group("judge_one_test");
    g.sample_size(30);
    g.bench_function("sandboxed", |b| {
        b.iter(|| {
            let report = judge_python(program, &tests, &limits).expect("judged");
            assert_eq!(report.passed, 1);
        })
    });
    g.bench_function("bare_python", |b| {
        b.iter(|| {
            let status = Command::new(&python)
                .args(["-I", "-S", "-c", "pass"])
                .stdin(Stdio::null())
                .status()
                .expect("python3 runs");
            assert!(status.success());
        })
    });
    g.finish();
}

criterion_group!(benches, judge);
criterion_main!(benches);
