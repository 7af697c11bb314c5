#!/usr/bin/env python3
"""Task-by-task comparison of two `tern eval` runs from their stderr logs
(lines `STRATEGY task I/N: ok|no (got X, want Y)`): where each is right and
the other wrong. Usage: scripts/eval_compare.py A.log B.log"""
import re
import sys

LINE = re.compile(r"^(\S+)\s+task\s+(\d+)/\d+: (ok|no)\s+\(got (.*), want (.*)\)$")


def read(path):
    out = {}
    label = None
    for line in open(path, encoding="utf-8"):
        m = LINE.match(line.strip())
        if m:
            label = m.group(1)
            out[int(m.group(2))] = (m.group(3) == "ok", m.group(4))
    return label, out


def main():
    (la, a), (lb, b) = read(sys.argv[1]), read(sys.argv[2])
    common = sorted(set(a) & set(b))
    both = sum(a[i][0] and b[i][0] for i in common)
    only_a = [i for i in common if a[i][0] and not b[i][0]]
    only_b = [i for i in common if b[i][0] and not a[i][0]]
    print(f"{len(common)} tasks in both: {la} {sum(a[i][0] for i in common)} right, "
          f"{lb} {sum(b[i][0] for i in common)} right; both right {both}; "
          f"only {la} {len(only_a)}; only {lb} {len(only_b)}")
    print(f"only {la}: tasks {only_a}")
    print(f"only {lb}: tasks {only_b}")


if __name__ == "__main__":
    main()
