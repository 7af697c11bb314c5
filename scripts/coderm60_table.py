"""Issue 60's HumanEval study, 0.5B arm (records/coderm60/PROTOCOL.md): every
arm and K computed offline from one pass of records.

Reads records/coderm60/run.jsonl (`tern eval` records: `single` and
`reward@8:tests=32`, each of the latter with the 8 candidates, the kept
tests, the pass matrix and the hidden rows) and exec.jsonl
(scripts/coderm60_exec.py: the canonical solution's letters on the kept
tests and the candidates' output classes). scripts/tables.py renders the
tables; `python3 scripts/coderm60_table.py` prints them.

K tests means the first K kept tests (nested prefixes: one set of 32 serves
every K).
"""
import json
import math
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from coderm60_exec import extract_code  # noqa: E402
from tables import wilson  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORDS = ROOT / "records" / "coderm60"
STRATEGY = "reward@8:tests=32"
KS = [1, 2, 4, 8, 16, 32]
DYNAMIC_KS = [2, 4, 8, 16]
CAP = 32
TASKS = 164
GROUPS = [("hard (1-3 of 8 right)", range(1, 4)), ("easy (4-7 of 8)", range(4, 8)),
          ("none (0 of 8)", range(0, 1)), ("all (8 of 8)", range(8, 9))]


# ---------------------------------------------------------------- choices

def reward_choice(matrix, k):
    """`verify::best_by_tests` on the first k columns: most passes, ties to
    the pass pattern most candidates share, then the earliest."""
    patterns = [tuple(ch == "P" for ch in row[:k]) for row in matrix]
    passed = [sum(p) for p in patterns]
    top = max(passed)
    support = [patterns.count(p) for p in patterns]
    best = None
    for i in range(len(matrix)):
        if passed[i] == top and (best is None or support[i] > support[best]):
            best = i
    return best


def majority_choice(outputs, k):
    """Majority by execution output on the first k tests' inputs: the
    largest group of candidates with equal outputs, a tie to the group
    holding the earliest candidate; its earliest candidate."""
    n = len(outputs[0]) if outputs else 0
    if n == 0:
        return 0
    sig = [tuple(outputs[t][c] for t in range(min(k, len(outputs)))) for c in range(n)]
    size = [sig.count(s) for s in sig]
    best = 0
    for c in range(n):
        if size[c] > size[best]:
            best = c
    return best


def random_choice(task, n=8):
    """The protocol's random arm: a fixed seed per task."""
    return random.Random(60_000 + task).randrange(n)


def normalized_program(text):
    """`reasoning::normalized_program`."""
    return "\n".join(l.rstrip() for l in extract_code(text).splitlines()
                     if l.strip() and not l.lstrip().startswith("#"))


def disagreement(candidates):
    """`reasoning::disagreement`: distinct normalized programs."""
    return len({normalized_program(c) for c in candidates})


def allocate(dis, k_avg, cap):
    """`reasoning::allocate`: k_avg x tasks tests, each task 1..cap; each test
    after the first per task goes to the largest (disagreement - 1) /
    (count + 1) below the cap, ties to fewer tests, then the earlier task."""
    w = [float(max(d - 1, 0)) for d in dis]
    counts = [1] * len(dis)
    for _ in range(len(dis), k_avg * len(dis)):
        nxt = max((i for i, c in enumerate(counts) if c < cap),
                  key=lambda i: (w[i] / (counts[i] + 1), -counts[i], -i))
        counts[nxt] += 1
    return counts


# ---------------------------------------------------------------- statistics

# wilson(k, n): tables.py's 95% Wilson interval, in percent.


def mcnemar_p(b, c):
    """Exact two-sided McNemar p (binomial test on b + c discordant tasks)."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def acc(k, n):
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.1f}%, {lo:.1f}-{hi:.1f})" if n else "-"


# ---------------------------------------------------------------- loading

def load(records=RECORDS):
    """Tasks with every record the study needs, as dicts: `greedy` (bool),
    `right` (per candidate), `matrix`, `tests`, `candidates`, `chosen`,
    `canonical`, `outputs`, `rows`, and the timing fields."""
    single, reward, execd = {}, {}, {}
    run = records / "run.jsonl"
    if run.exists():
        for line in run.read_text().splitlines():
            r = json.loads(line)
            if r["strategy"] == "single":
                single[r["task"]] = r
            elif r["strategy"] == STRATEGY:
                reward[r["task"]] = r
    ex = records / "exec.jsonl"
    if ex.exists():
        for line in ex.read_text().splitlines():
            e = json.loads(line)
            execd[e["task"]] = e
    tasks = []
    for i in sorted(set(single) & set(reward) & set(execd)):
        g = reward[i]["generated_tests"]
        tasks.append({
            "task": i,
            "greedy": single[i]["ok"],
            "right": [set(h) == {"P"} for h in g["hidden"]],
            "matrix": g["matrix"],
            "tests": g["tests"],
            # The committed copy keeps each reply as "" (their count).
            "replies": len(g["replies"]),
            "candidates": g["candidates"],
            "chosen": g["chosen"],
            "ok": reward[i]["ok"],
            "canonical": execd[i]["canonical"],
            "outputs": execd[i]["outputs"],
            "rows": execd[i]["rows"],
            "tokens": reward[i]["tokens"],
            "writer_tokens": g["tokens"],
            "generate_seconds": g["generate_seconds"],
            "judge_seconds": g["judge_seconds"],
            "seconds": reward[i]["seconds"],
        })
    return tasks


def check(tasks):
    """The mirror of the choice rule chooses the record's `chosen` at K = 32,
    and the record's `ok` is that candidate's hidden verdict."""
    for t in tasks:
        if reward_choice(t["matrix"], CAP) != t["chosen"]:
            raise ValueError(f"task {t['task']}: the script's reward@32 choice differs from the record's")
        if t["right"][t["chosen"]] != t["ok"]:
            raise ValueError(f"task {t['task']}: `ok` is not the chosen candidate's hidden verdict")


# ---------------------------------------------------------------- tables

def outcomes(tasks):
    """Per arm label, the per-task right/wrong list (in `tasks` order)."""
    out = {"greedy": [t["greedy"] for t in tasks],
           "random candidate (seeded)": [t["right"][random_choice(t["task"])] for t in tasks]}
    for k in KS:
        out[f"majority by output, K={k}"] = [t["right"][majority_choice(t["outputs"], k)] for t in tasks]
    for k in KS:
        out[f"reward, K={k}"] = [t["right"][reward_choice(t["matrix"], k)] for t in tasks]
    out["oracle (pass@8)"] = [any(t["right"]) for t in tasks]
    return out


ARMS_HEADER = ["arm", "right (95% interval)"]


def arms_rows(tasks):
    check(tasks)
    n = len(tasks)
    rows = [["tasks with every record", f"{n} of {TASKS}"]]
    for label, oks in outcomes(tasks).items():
        if label.startswith("majority") and not label.endswith("K=32"):
            continue
        rows.append([label, acc(sum(oks), n)])
        if label.startswith("random"):
            exp = sum(sum(t["right"]) / 8 for t in tasks)
            rows.append(["random candidate (expectation)", f"{exp:.1f}/{n} ({100 * exp / n:.1f}%)" if n else "-"])
    return rows


def group_of(t):
    c = sum(t["right"])
    return next(name for name, r in GROUPS if c in r)


CURVE_HEADER = ["group", "tasks", "random (expectation)"] + [f"reward K={k}" for k in KS] + \
    ["majority by output K=32", "oracle"]


def curve_rows(tasks):
    rows = []
    for name, _ in GROUPS + [("every task", None)]:
        ts = tasks if name == "every task" else [t for t in tasks if group_of(t) == name]
        n = len(ts)
        if n == 0:
            rows.append([name, "0"] + ["-"] * (len(CURVE_HEADER) - 2))
            continue
        pc = lambda k: f"{100 * k / n:.1f}%"
        row = [name, str(n), pc(sum(sum(t["right"]) / 8 for t in ts))]
        row += [pc(sum(t["right"][reward_choice(t["matrix"], k)] for t in ts)) for k in KS]
        row += [pc(sum(t["right"][majority_choice(t["outputs"], CAP)] for t in ts)),
                pc(sum(any(t["right"]) for t in ts))]
        rows.append(row)
    return rows


DYNAMIC_HEADER = ["K (tests per task on average)", "fixed: right", "dynamic: right",
                  "tests spent fixed / dynamic", "dynamic only / fixed only", "McNemar exact p"]


def dynamic_rows(tasks):
    n = len(tasks)
    dis = [disagreement(t["candidates"]) for t in tasks]
    rows = []
    for k in DYNAMIC_KS:
        counts = allocate(dis, k, CAP)
        fixed = [t["right"][reward_choice(t["matrix"], k)] for t in tasks]
        dyn = [t["right"][reward_choice(t["matrix"], c)] for t, c in zip(tasks, counts)]
        spent_f = sum(min(k, len(t["tests"])) for t in tasks)
        spent_d = sum(min(c, len(t["tests"])) for t, c in zip(tasks, counts))
        b = sum(d and not f for f, d in zip(fixed, dyn))
        c = sum(f and not d for f, d in zip(fixed, dyn))
        rows.append([str(k), acc(sum(fixed), n), acc(sum(dyn), n), f"{spent_f} / {spent_d}",
                     f"{b} / {c}", f"{mcnemar_p(b, c):.3f}"])
    return rows


PAIRED_HEADER = ["comparison", "A right", "B right", "A only / B only", "McNemar exact p"]


def paired_rows(tasks):
    o = outcomes(tasks)
    n = len(tasks)
    rows = []
    for a, b in [("reward, K=32", "reward, K=1"), ("reward, K=32", "random candidate (seeded)"),
                 ("reward, K=32", "greedy"), ("reward, K=32", "majority by output, K=32")]:
        x, y = o[a], o[b]
        only_a = sum(p and not q for p, q in zip(x, y))
        only_b = sum(q and not p for p, q in zip(x, y))
        rows.append([f"{a} vs {b}", acc(sum(x), n), acc(sum(y), n), f"{only_a} / {only_b}",
                     f"{mcnemar_p(only_a, only_b):.3f}"])
    return rows


QUALITY_HEADER = ["first K tests", "tests kept", "canonical passes", "per-task mean",
                  "tasks with every test right", "candidate cells agreeing with the sandbox"]


def quality_rows(tasks):
    rows = []
    for k in KS:
        kept = sum(min(k, len(t["tests"])) for t in tasks)
        good = sum(t["canonical"][:k].count("P") for t in tasks)
        with_tests = [t for t in tasks if t["tests"]]
        mean = sum(t["canonical"][:k].count("P") / min(k, len(t["tests"])) for t in with_tests)
        allright = sum(set(t["canonical"][:k]) == {"P"} for t in with_tests)
        cells = sum(len(r[:k]) for t in tasks for r in t["matrix"])
        agree = sum(a == b for t in tasks for r, s in zip(t["matrix"], t["rows"])
                    for a, b in zip(r[:k], s[:k]))
        rows.append([str(k), str(kept), f"{good}/{kept} ({100 * good / kept:.1f}%)" if kept else "-",
                     f"{100 * mean / len(with_tests):.1f}%" if with_tests else "-",
                     f"{allright}/{len(with_tests)}",
                     f"{agree}/{cells} ({100 * agree / cells:.1f}%)" if cells else "-"])
    return rows


THROUGHPUT_HEADER = ["tasks", "writer replies", "tests kept", "writer tokens", "all tokens",
                     "generation s", "sandbox s", "task s", "tokens / generation s",
                     "replies / generation s",
                     "kept tests / generation s", "matrix cells / sandbox s", "sandbox share of task s"]


def throughput_rows(tasks):
    if not tasks:
        return [["0"] + ["-"] * (len(THROUGHPUT_HEADER) - 1)]
    rep = sum(t["replies"] for t in tasks)
    kept = sum(len(t["tests"]) for t in tasks)
    cells = sum(len(r) for t in tasks for r in t["matrix"])
    gen = sum(t["generate_seconds"] for t in tasks)
    jud = sum(t["judge_seconds"] for t in tasks)
    tot = sum(t["seconds"] for t in tasks)
    return [[str(len(tasks)), str(rep), str(kept), str(sum(t["writer_tokens"] for t in tasks)),
             str(sum(t["tokens"] for t in tasks)), f"{gen:.0f}", f"{jud:.0f}", f"{tot:.0f}",
             f"{sum(t['tokens'] for t in tasks) / gen:.1f}", f"{rep / gen:.3f}", f"{kept / gen:.3f}", f"{cells / jud:.2f}" if jud else "-",
             f"{100 * jud / tot:.1f}%"]]


def self_test():
    """The mirrors against the Rust rules' own unit-test cases
    (reasoning::test_budget, verify::best_by_tests) and the protocol's
    majority rule."""
    assert allocate([1, 1, 1, 1], 4, 64) == [4] * 4
    assert allocate([1, 1, 2, 4], 4, 64) == [1, 1, 3, 11]
    assert allocate([1, 2, 3, 4, 5, 6, 7, 8], 4, 64) == [1, 1, 2, 3, 4, 6, 7, 8]
    assert allocate([8, 2, 1], 8, 12) == [12, 11, 1]
    assert allocate([8, 1, 1], 8, 12) == [12, 6, 6]
    assert allocate([8, 1, 3], 4, 4) == [4] * 3
    # Equal quotients: fewer tests first, then the earlier task.
    assert allocate([3, 2, 2], 2, 64) == [3, 2, 1]
    # Most passes; a tie to the pattern most candidates share, then the earliest.
    assert reward_choice(["PF", "FP", "FP"], 2) == 1
    assert reward_choice(["PF", "FP", "PP"], 2) == 2
    assert reward_choice(["PF", "FP", "FF"], 2) == 0
    # Only the first k tests count.
    assert reward_choice(["PF", "FP", "FP"], 1) == 0
    # Majority: the largest output group, its earliest member; a tie to the
    # group of the earliest candidate.
    assert majority_choice(["abb", "abb"], 2) == 1
    assert majority_choice(["abb", "acc"], 1) == 1
    assert majority_choice(["ab", "ab"], 2) == 0
    assert disagreement(["```python\ndef f(x):\n    return x + 1\n```",
                         "Here:\n```python\n# adds one\ndef f(x):  \n\n    return x + 1\n```",
                         "```python\ndef f(x):\n    return 1 + x\n```"]) == 2
    assert mcnemar_p(0, 0) == 1.0 and abs(mcnemar_p(0, 6) - 0.03125) < 1e-12
    print("coderm60_table self-test: ok")


def main():
    if "--self-test" in sys.argv:
        self_test()
        return
    tasks = load()
    for header, rows in [(ARMS_HEADER, arms_rows(tasks)), (CURVE_HEADER, curve_rows(tasks)),
                         (DYNAMIC_HEADER, dynamic_rows(tasks)), (PAIRED_HEADER, paired_rows(tasks)),
                         (QUALITY_HEADER, quality_rows(tasks)),
                         (THROUGHPUT_HEADER, throughput_rows(tasks))]:
        print(" | ".join(header))
        for r in rows:
            print(" | ".join(r))
        print()


if __name__ == "__main__":
    main()
