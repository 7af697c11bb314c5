#!/usr/bin/env python3
"""Whether two `tern eval --records` files agree record by record: the same
verdict, graded answer and token count for every (strategy, task) both hold.
Used to show that a change which must not alter results (the code judge's
sandbox) did not. Usage: scripts/records_compare.py OLD.jsonl NEW.jsonl [STRATEGY]
Exits 1 when any shared record differs."""
import json
import sys


def read(path, strategy):
    out = {}
    for line in open(path, encoding="utf-8"):
        if line.strip():
            r = json.loads(line)
            if strategy is None or r["strategy"] == strategy:
                out[(r["strategy"], r["task"])] = (r["ok"], r["answer"], r["tokens"])
    return out


def main():
    strategy = sys.argv[3] if len(sys.argv) > 3 else None
    old, new = read(sys.argv[1], strategy), read(sys.argv[2], strategy)
    shared = sorted(set(old) & set(new))
    differ = [k for k in shared if old[k] != new[k]]
    for k in differ:
        print(f"{k[0]} task {k[1]}: {old[k]} -> {new[k]}")
    ok_old = sum(old[k][0] for k in shared)
    ok_new = sum(new[k][0] for k in shared)
    print(f"{len(shared)} shared records: {len(differ)} differ; solved {ok_old} before, {ok_new} after")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
