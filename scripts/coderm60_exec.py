"""Offline execution for issue 60's HumanEval study (records/coderm60/PROTOCOL.md).

The eval records (records/coderm60/run.jsonl) hold each task's 8
candidates, its kept generated tests and the pass matrix, but two of the
study's measures need more than pass/fail:

- test quality: whether HumanEval's canonical solution passes each
  generated test (a wrong test fails a correct program);
- majority by execution output: what each candidate *returns* on each
  generated test's input, so candidates can be grouped by behaviour.

For every task with a `reward@8:tests=32` record in runs/coderm60/run.jsonl
(the live records file) and no line yet in runs/coderm60/exec.jsonl, this runs the canonical program and every
candidate's program against every kept test and appends one line:

  {"task": i, "canonical": "PPF...",            # canonical's letter per test
   "outputs": ["aab...", ...],                   # per test: a class letter per candidate
   "rows": ["PPF...", ...]}                      # each candidate's letters here

`outputs[t][c]` is a letter naming candidate c's output on test t: equal
letters, equal outputs (the repr of the assert's subject: the left operand
of a top-level comparison, the operand of a top-level `not`, else the whole
asserted expression; an exception is its type name, a timeout `T`; a test
with no top-level assert is its pass letter). `rows` lets the script be
checked against the sandbox's matrix.

Each program runs in its own `python3 -I` process in a fresh temporary
directory, 2 s per test (a test past it is `T` and the process restarts
after it) and 256 MiB of address space, the limits of Tern's sandbox. This
is not Tern's sandbox (no seccomp filter); it runs the code the sandbox
already ran. Resumable: rerunning skips the tasks on file. Complete lines of
both files are copied to records/coderm60/ when tables are regenerated.

Usage: nice -n 19 python3 scripts/coderm60_exec.py [--records DIR] [--limit N]
"""
import argparse
import gzip
import json
import os
import pathlib
import selectors
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
STRATEGY = "reward@8:tests=32"
PER_TEST_S = 2.0
MEMORY = 256 * 1024 * 1024

# The child: defines the program once, then runs each test it is sent in a
# copy of the program's globals and prints one JSON line per test.
HARNESS = r'''
import ast, json, signal, sys, resource
resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
class Tick(BaseException):
    pass
def on_alarm(*_):
    raise Tick()
signal.signal(signal.SIGALRM, on_alarm)
program, tests, start = json.loads(sys.stdin.read())
out = sys.__stdout__
sys.stdout = open("/dev/null", "w")
def timed(f):
    signal.setitimer(signal.ITIMER_REAL, PER_TEST_S)
    try:
        return f()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
base = {"__name__": "__main__"}
try:
    timed(lambda: exec(compile(program, "solution.py", "exec"), base))
    broken = None
except Tick:
    broken = "T"
except BaseException as e:
    broken = "E:" + type(e).__name__
def subject(node):
    t = node.test
    if isinstance(t, ast.Compare):
        return t.left
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
        return t.operand
    return t
for i in range(start, len(tests)):
    test = tests[i]
    if broken:
        # As the sandbox reads a program that dies before the test: an
        # assertion or an exit of its own is `F` (it left early), a timeout
        # `T`, anything else `E`.
        letter = {"T": "T", "E:AssertionError": "F", "E:SystemExit": "F"}.get(broken, "E")
        print(json.dumps([i, letter, broken]), file=out, flush=True)
        continue
    # The letter: the whole test, as the sandbox runs it.
    g = dict(base)
    try:
        timed(lambda: exec(compile(test, "test.py", "exec"), g))
        letter = "P"
    except Tick:
        letter = "T"
    except AssertionError:
        letter = "F"
    except BaseException:
        letter = "E"
    # The output: the statements before the last top-level assert, then its subject.
    try:
        tree = ast.parse(test)
        asserts = [k for k, s in enumerate(tree.body) if isinstance(s, ast.Assert)]
    except BaseException:
        asserts = []
    if not asserts:
        output = letter
    else:
        k = asserts[-1]
        g = dict(base)
        try:
            pre = ast.Module(body=tree.body[:k], type_ignores=[])
            expr = ast.Expression(body=subject(tree.body[k]))
            value = timed(lambda: (exec(compile(pre, "test.py", "exec"), g),
                                   eval(compile(expr, "test.py", "eval"), g))[1])
            output = "V:" + repr(value)
        except Tick:
            output = "T"
        except BaseException as e:
            output = "E:" + type(e).__name__
    print(json.dumps([i, letter, output]), file=out, flush=True)
'''.replace("MEMORY", str(MEMORY)).replace("PER_TEST_S", str(PER_TEST_S))


def extract_code(text):
    """`verify::extract_code`: the last fenced Python (or unmarked) block, an
    unclosed last one counting; else the whole text, trimmed."""
    last, open_block = None, None
    for line in text.splitlines():
        fence = line.strip()
        if open_block is None:
            if fence.startswith("```"):
                lang = (fence[3:].split() or [""])[0].lower()
                open_block = (lang in ("", "python", "py", "python3"), [])
        else:
            if fence.startswith("```") and set(fence) == {"`"}:
                if open_block[0]:
                    last = open_block[1]
                open_block = None
            else:
                open_block[1].append(line)
    if open_block is not None and open_block[0] and any(l.strip() for l in open_block[1]):
        last = open_block[1]
    if last is None:
        return text.strip()
    return "\n".join(last).strip("\n")


def with_prelude(prelude, code):
    """`verify::with_prelude`."""
    if not prelude:
        return code
    return f"{prelude.rstrip()}\n{code}\n"


def run_program(program, tests):
    """[(letter, output)] for each test, restarting the child past a test
    that hangs or kills it."""
    results = [None] * len(tests)
    start = 0
    while start < len(tests):
        with tempfile.TemporaryDirectory() as tmp:
            child = subprocess.Popen(
                [sys.executable, "-I", "-c", HARNESS], cwd=tmp, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env={"PATH": "/usr/bin:/bin", "HOME": tmp})
            child.stdin.write(json.dumps([program, tests, start]))
            child.stdin.close()
            sel = selectors.DefaultSelector()
            sel.register(child.stdout, selectors.EVENT_READ)
            # Program definition plus the first test, then one test at a time.
            deadline = time.monotonic() + 2 * PER_TEST_S + 3
            hung = False
            while start < len(tests):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    hung = True
                    break
                line = child.stdout.readline()
                if not line:
                    break  # the child died
                i, letter, output = json.loads(line)
                results[i] = (letter, output)
                start = i + 1
                deadline = time.monotonic() + 2 * PER_TEST_S + 1
            if start < len(tests):
                # The child died or hung on test `start`: it counts as that
                # test's outcome, and the rest run in a fresh child.
                results[start] = ("T", "T") if hung else ("E", "E:died")
                start += 1
            child.kill()
            child.wait()
            sel.close()
    return results


def classes(outputs_per_candidate, n_tests):
    """Per test, a letter per candidate: equal letters, equal outputs."""
    out = []
    for t in range(n_tests):
        names, row = {}, []
        for outs in outputs_per_candidate:
            names.setdefault(outs[t], chr(ord("a") + len(names)))
            row.append(names[outs[t]])
        out.append("".join(row))
    return out


def self_test():
    """The harness reads programs as the sandbox does (P, F, E, T; a program
    that asserts at import is F on every test, one that kills its process
    E on that test only) and groups equal outputs."""
    program = "def f(x):\n    return x + 1\n"
    tests = ["assert f(1) == 2", "assert f(1) == 3", "assert g(1) == 2",
             "import os\nos._exit(3)\nassert f(1) == 2", "assert f(2) == 3",
             "while True:\n    pass\nassert f(1) == 2", "assert not f(-1)"]
    got = run_program(program, tests)
    assert [l for l, _ in got] == ["P", "F", "E", "E", "P", "T", "P"], got
    assert got[0][1] == got[1][1] == "V:2" and got[2][1] == "E:NameError", got
    assert got[6][1] == "V:0", got
    assert [l for l, _ in run_program("assert False\n", tests[:2])] == ["F", "F"]
    # A test that outlives the alarm (here by ignoring it) is T; the rest run on.
    deaf = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    assert [l for l, _ in run_program(program, [deaf, tests[0]])] == ["T", "P"]
    # 2x agrees with x + 1 at 1, not at 2.
    other = run_program("def f(x):\n    return 2 * x\n", [tests[0], tests[4]])
    assert classes([[got[0][1], got[4][1]], [o for _, o in other]], 2) == ["aa", "ab"]
    assert extract_code("Here:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```") == "y = 2"
    print("coderm60_exec self-test: ok")


def main():
    if "--self-test" in sys.argv:
        self_test()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", default=str(ROOT / "runs/coderm60"))
    ap.add_argument("--tasks", default=str(ROOT.parent / "shared/data/HumanEval.jsonl.gz"))
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args()
    records = pathlib.Path(a.records)
    problems = [json.loads(l) for l in gzip.open(a.tasks, "rt")]
    runs = {}
    for line in (records / "run.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["strategy"] == STRATEGY:
            runs[r["task"]] = r
    out_path = records / "exec.jsonl"
    done = set()
    if out_path.exists():
        done = {json.loads(l)["task"] for l in out_path.read_text().splitlines() if l.strip()}
    todo = [i for i in sorted(runs) if i not in done][: a.limit]
    for i in todo:
        started = time.monotonic()
        p, g = problems[i], runs[i]["generated_tests"]
        tests = g["tests"]
        canonical = run_program(p["prompt"] + p["canonical_solution"], tests)
        per_candidate = [run_program(with_prelude(p["prompt"], extract_code(c)), tests)
                         for c in g["candidates"]]
        line = {
            "task": i,
            "canonical": "".join(l for l, _ in canonical),
            "outputs": classes([[o for _, o in r] for r in per_candidate], len(tests)),
            "rows": ["".join(l for l, _ in r) for r in per_candidate],
            "seconds": round(time.monotonic() - started, 2),
        }
        with open(out_path, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"task {i}: canonical {line['canonical']} ({line['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
