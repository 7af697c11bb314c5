//! The verdict cannot be forged from inside the candidate's process: the
//! program runs in one sandbox, the test in another, and only the test's
//! process holds the pass token and compares values. Each forgery below
//! passed every test when program and test shared one interpreter (the
//! token sat in the harness's frame); each must now fail. The rest checks
//! that honest programs are judged as before across the process boundary.

use tern_solve::verify::{judge_python, Limits, Verdict};

fn one(program: &str, test: &str) -> Verdict {
    let mut report = judge_python(program, &[test.to_string()], &Limits::default())
        .expect("the judge runs here");
    report.verdicts.remove(0)
}

/// Every forgery is judged against a test the honest answer (`x + 1`)
/// passes and the forger's real answer (`-1`) fails.
const TEST: &str = "assert candidate(1) == 2\nassert candidate(41) == 42";

/// Writes `secret` to every descriptor it can and exits as a passing
/// harness would.
const WRITE_EVERYWHERE: &str = "
def _claim(secret):
    import os
    for fd in range(0, 1024):
        try:
            os.write(fd, secret.encode())
        except OSError:
            pass
    os._exit(0)
";

#[test]
fn a_token_read_from_the_harness_frames_passes_nothing() {
    // The old harness kept the token in a local of its frame: walk every
    // frame (at import and at call time) and every thread's frame.
    let program = format!(
        "{WRITE_EVERYWHERE}
import sys
def _hunt():
    frames = list(sys._current_frames().values()) + [sys._getframe()]
    for frame in frames:
        while frame is not None:
            for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
                if isinstance(value, str) and value.startswith('tern-pass-'):
                    _claim(value)
                if isinstance(value, dict):
                    for v in value.values():
                        if isinstance(v, str) and v.startswith('tern-pass-'):
                            _claim(v)
            frame = frame.f_back
_hunt()
def f(x):
    _hunt()
    return -1
"
    );
    let verdict = one(&program, TEST);
    assert!(!verdict.passed(), "{verdict:?}");
    assert!(
        matches!(&verdict, Verdict::Fail { reason } if reason.contains("assert candidate(1) == 2")),
        "the honest failure, not an early exit: {verdict:?}"
    );
}

#[test]
fn a_token_found_through_gc_passes_nothing() {
    let program = format!(
        "{WRITE_EVERYWHERE}
import gc
def _hunt():
    for obj in gc.get_objects():
        values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
        for v in list(values):
            if isinstance(v, str) and v.startswith('tern-pass-'):
                _claim(v)
_hunt()
def f(x):
    _hunt()
    return -1
"
    );
    let verdict = one(&program, TEST);
    assert!(!verdict.passed(), "{verdict:?}");
}

#[test]
fn objects_equal_to_everything_pass_nothing() {
    let forgeries = [
        // A plain object whose == is always true.
        "class Anything:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\ndef f(x):\n    return Anything()\n",
        // Subclasses of the built-in types the judge does accept.
        "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\ndef f(x):\n    return I(-1)\n",
        "class S(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\ndef f(x):\n    return S('no')\n",
        "class L(list):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return L()\n",
        // Nested inside an honest container.
        "class A:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return [A()][0] if False else (A(),)\n",
        // Patching the comparison the test would use, in its own process.
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\ndef f(x):\n    return -1\n",
    ];
    for program in forgeries {
        let verdict = one(program, TEST);
        assert!(!verdict.passed(), "{program}\n=> {verdict:?}");
    }
    let Verdict::Crash { stderr } = one(forgeries[0], TEST) else {
        panic!("an uncomparable value is a crash")
    };
    assert!(
        stderr.contains("cannot compare") && stderr.contains("Anything"),
        "the reason is named: {stderr}"
    );
}

/// (A reply written ahead of the question is no forgery: it is what a
/// function with state could return, so it is judged like one.)
#[test]
fn exiting_or_closing_the_channel_passes_nothing() {
    let cases = [
        "import os\ndef f(x):\n    os._exit(0)\n",
        "import os\nos.close(6)\ndef f(x):\n    return x + 1\n",
        // Replies the test's side does not accept: a claimed verdict, a
        // value outside the plain-data encoding.
        "import os\ndef f(x):\n    os.write(6, b'{\"pass\": true}\\n')\n    os._exit(0)\n",
        "import os\ndef f(x):\n    os.write(6, b'{\"ret\": {\"eq\": \"always\"}}\\n')\n    os._exit(0)\n",
        "import sys\ndef f(x):\n    sys.exit(0)\n",
    ];
    for program in cases {
        let verdict = one(program, TEST);
        assert!(!verdict.passed(), "{program}\n=> {verdict:?}");
    }
}

#[test]
fn honest_programs_are_judged_as_before() {
    // Exceptions keep their built-in type, so tests can expect them.
    let raises = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n";
    assert_eq!(
        one(
            raises,
            "try:\n    candidate(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    assert False"
        ),
        Verdict::Pass
    );
    // In-place changes to list and dict arguments reach the test.
    let mutates = "def f(xs, d):\n    xs.sort()\n    d['k'] = len(xs)\n";
    assert_eq!(
        one(
            mutates,
            "xs, d = [3, 1, 2], {}\nf(xs, d)\nassert xs == [1, 2, 3] and d == {'k': 3}"
        ),
        Verdict::Pass
    );
    // Plain data of every kind round-trips exactly, floats bit for bit.
    let data = "import math\nLIMIT = 10\ndef f():\n    return (1, 2.5, 0.1 + 0.2, 'é', None, True, [1, {2: 'x'}], {3}, frozenset([4]), b'\\x00', 2 ** 100, 1j, float('inf'))\ndef helper(a):\n    return math.sqrt(a)\n";
    assert_eq!(
        one(
            data,
            "v = f()\nassert v == (1, 2.5, 0.30000000000000004, 'é', None, True, [1, {2: 'x'}], {3}, frozenset([4]), b'\\x00', 2 ** 100, 1j, float('inf'))\nassert type(v[5]) is bool and LIMIT == 10\nassert math.isclose(helper(2.0), 2 ** 0.5)"
        ),
        Verdict::Pass
    );
    // NaN compares as NaN does.
    assert_eq!(
        one(
            "def f():\n    return float('nan')\n",
            "import math\nassert math.isnan(candidate())"
        ),
        Verdict::Pass
    );
    // Helpers of the program call each other inside its process, with state.
    let stateful =
        "calls = []\ndef g(x):\n    calls.append(x)\n    return len(calls)\ndef f(x):\n    return g(x) + g(x)\n";
    assert_eq!(
        one(stateful, "assert f(0) == 3\nassert f(0) == 7"),
        Verdict::Pass
    );
    // A generator is not plain data: a crash that says so.
    let verdict = one(
        "def f(n):\n    return (i for i in range(n))\n",
        "assert list(f(3)) == [0, 1, 2]",
    );
    assert!(
        matches!(&verdict, Verdict::Crash { stderr } if stderr.contains("cannot compare") && stderr.contains("generator")),
        "{verdict:?}"
    );
    // The program's own failures are reported as before.
    let verdict = one(
        "assert 1 == 2, 'broken at import'\ndef f(x):\n    return x\n",
        TEST,
    );
    assert_eq!(
        verdict,
        Verdict::Fail {
            reason: "broken at import".into()
        }
    );
}
