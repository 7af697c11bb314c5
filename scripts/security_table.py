#!/usr/bin/env python3
"""The attack table of docs/SECURITY.md from the headers of
tests/security/attacks/*.py, so the page lists exactly the attacks CI runs.
The doc's region `table:security-attacks` is written by
`python3 scripts/tables.py` (which imports this file); this script prints
the table. Usage: scripts/security_table.py"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MUST = {"refused": "fail", "bounded": "stay within the output caps"}


def header(text, key):
    m = re.search(rf"^# {key}: (.*)$", text, re.M)
    return m.group(1).strip() if m else ""


def attack_table():
    """One row per attack file: its name, what it tries, what must happen."""
    rows = ["| attack | tries to | must |", "|---|---|---|"]
    for path in sorted((ROOT / "tests/security/attacks").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        must = MUST[header(text, "expect")]
        check = header(text, "host-check")
        if check:
            must += "; " + check.replace("{", "").replace("}", "").lower()
        rows.append(f"| `{path.stem}` | {header(text, 'attack')} | {must} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(attack_table(), end="")
