#!/usr/bin/env python3
"""Rewrites the attack table in docs/SECURITY.md (between its
`<!-- attacks:begin -->` and `<!-- attacks:end -->` markers) from the
headers of tests/security/attacks/*.py, so the page lists exactly the
attacks CI runs. Usage: scripts/security_table.py"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/SECURITY.md"
MUST = {"refused": "fail", "bounded": "stay within the output caps"}


def header(text, key):
    m = re.search(rf"^# {key}: (.*)$", text, re.M)
    return m.group(1).strip() if m else ""


def main():
    rows = ["| attack | tries to | must |", "|---|---|---|"]
    for path in sorted((ROOT / "tests/security/attacks").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        must = MUST[header(text, "expect")]
        check = header(text, "host-check")
        if check:
            must += "; " + check.replace("{", "").replace("}", "").lower()
        rows.append(f"| `{path.stem}` | {header(text, 'attack')} | {must} |")
    doc = DOC.read_text(encoding="utf-8")
    begin, end = "<!-- attacks:begin -->", "<!-- attacks:end -->"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(head + begin + "\n" + "\n".join(rows) + "\n" + end + tail, encoding="utf-8")
    print(f"{len(rows) - 2} attacks listed in {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
