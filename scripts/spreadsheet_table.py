"""The spreadsheet family's score table (docs/SPREADSHEET.md): soft and hard
scores of one `tern eval --task spreadsheet:... --records FILE` run, overall
after each round and per operation kind after the first round (the
single-round score) and after the last, from its
records (one JSON line per task, solve/src/eval/spreadsheet.rs)."""
import json

HEADER = ["run", "scope", "tasks", "rounds", "soft", "hard"]


def after(record, round_):
    """(soft, hard) of a record after `round_` rounds; a task solved early
    keeps its score."""
    rounds = record["rounds"]
    r = rounds[min(round_, len(rounds)) - 1]
    return r["passed"] / r["total"], r["passed"] == r["total"]


def rows(name, path):
    recs = [json.loads(line) for line in open(path) if line.strip()]
    recs.sort(key=lambda r: r["task"])
    most = max(len(r["rounds"]) for r in recs)
    out = []

    def row(scope, rs, k):
        soft = sum(after(r, k)[0] for r in rs) / len(rs)
        hard = sum(after(r, k)[1] for r in rs)
        out.append([name, scope, str(len(rs)), str(k), f"{soft:.3f}",
                    f"{hard}/{len(rs)}"])

    for k in range(1, most + 1):
        row("all", recs, k)
    kinds = sorted({r["kind"] for r in recs})
    # Per kind after round 1 (the single-round score) and after the last.
    for k in sorted({1, most}):
        for kind in kinds:
            row(kind, [r for r in recs if r["kind"] == kind], k)
    return out


REFERENCE_HEADER = ["split", "kind", "tasks", "test cases passed", "tasks passing all"]


def reference_rows(split, path):
    """Per-kind pass counts of one `--strategy reference` run: every task's
    reference program through the judge (one round per record)."""
    recs = [json.loads(line) for line in open(path) if line.strip()]
    out = []

    def row(scope, rs):
        passed = sum(r["rounds"][0]["passed"] for r in rs)
        total = sum(r["rounds"][0]["total"] for r in rs)
        hard = sum(r["rounds"][0]["passed"] == r["rounds"][0]["total"] for r in rs)
        out.append([split, scope, str(len(rs)), f"{passed}/{total}",
                    f"{hard}/{len(rs)}"])

    row("all", recs)
    for kind in sorted({r["kind"] for r in recs}):
        row(kind, [r for r in recs if r["kind"] == kind])
    return out


BEST_OF_HEADER = ["run", "strategy", "scope", "tasks", "soft", "hard",
                  "candidates passing any case", "candidates with an answer"]


def best_of_rows(name, path):
    """Soft and hard scores of the candidate each best-of-N choice takes
    (agree@N by agreement of outputs, oracle@N by the reference comparison)
    in one `--strategy agree@N,oracle@N` run, overall and per kind, with
    how many of all the candidates passed any test case and how many
    produced an answer range on any (solve/src/eval/spreadsheet_best.rs)."""
    recs = [json.loads(line) for line in open(path) if line.strip()]
    recs.sort(key=lambda r: r["task"])
    n = max(len(r["candidates"]) for r in recs)
    out = []
    scopes = [("all", recs)] + [
        (kind, [r for r in recs if r["kind"] == kind])
        for kind in sorted({r["kind"] for r in recs})]
    for strategy, key in ((f"agree@{n}", "agree"), (f"oracle@{n}", "oracle")):
        for scope, rs in scopes:
            chosen = [r["candidates"][r[key]] for r in rs]
            soft = sum(c["passed"] / c["total"] for c in chosen) / len(rs)
            hard = sum(c["passed"] == c["total"] for c in chosen)
            every = [c for r in rs for c in r["candidates"]]
            passing = sum(c["passed"] > 0 for c in every)
            answered = sum(c["answered"] > 0 for c in every)
            out.append([name, strategy, scope, str(len(rs)), f"{soft:.3f}",
                        f"{hard}/{len(rs)}", f"{passing}/{len(every)}",
                        f"{answered}/{len(every)}"])
    return out


BEST_OF_ROUNDS_HEADER = ["run", "strategy", "scope", "tasks", "after round",
                         "soft", "hard", "candidates that wrote again"]


def candidate_after(c, k):
    """(passed, total) of a candidate after `k` rounds: its earlier rounds,
    then its last program (solve/src/eval/spreadsheet_best.rs)."""
    earlier = c.get("earlier", [])
    r = earlier[k - 1] if k <= len(earlier) else c
    return r["passed"], r["total"]


def choice_after(record, k, key):
    """The candidate `key` (agree or oracle) chose after `k` rounds."""
    by_round = record.get("by_round", [])
    return by_round[k - 1][key] if k <= len(by_round) else record[key]


def best_of_round_rows(name, path):
    """Best-of-N with rounds (`--strategy agree@N,oracle@N,rounds@R`): each
    choice's soft and hard scores after every round over all tasks, and per
    kind after the last, with how many candidates wrote a program again
    after a crash, a timeout or a missing answer."""
    recs = [json.loads(line) for line in open(path) if line.strip()]
    recs.sort(key=lambda r: r["task"])
    n = max(len(r["candidates"]) for r in recs)
    most = max([len(r.get("by_round", [])) for r in recs] + [1])
    out = []

    def row(strategy, key, scope, rs, k):
        scores = [candidate_after(r["candidates"][choice_after(r, k, key)], k) for r in rs]
        soft = sum(p / t for p, t in scores) / len(rs)
        hard = sum(p == t for p, t in scores)
        every = [c for r in rs for c in r["candidates"]]
        # Candidates that wrote a k-th program (round 1: none wrote again).
        again = sum(len(c.get("earlier", [])) + 1 >= k for c in every) if k > 1 else 0
        out.append([name, strategy, scope, str(len(rs)), str(k), f"{soft:.3f}",
                    f"{hard}/{len(rs)}", f"{again}/{len(every)}"])

    kinds = sorted({r["kind"] for r in recs})
    for strategy, key in ((f"agree@{n}", "agree"), (f"oracle@{n}", "oracle")):
        for k in range(1, most + 1):
            row(strategy, key, "all", recs, k)
        for kind in kinds:
            row(strategy, key, kind, [r for r in recs if r["kind"] == kind], most)
    return out
