#!/usr/bin/env python3
"""Check that every relative link in the repository's Markdown files points
at a file or folder that exists.

Why: records moved between folders (issue 64) and prose links into them by
relative path; a moved file must not leave a dead link behind.

Usage: python3 scripts/check_links.py   (exit 1 and a list when any is dead)
"""
import pathlib
import re
import subprocess
import sys

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"],
                           cwd=root, capture_output=True, text=True, check=True).stdout.split()
    dead = []
    for f in files:
        path = root / f
        if not path.exists():
            continue
        in_code = False
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                target = target.split("#", 1)[0]
                if not target:
                    continue
                if not (path.parent / target).exists():
                    dead.append(f"{f}:{n}: {target}")
    for d in dead:
        print(d)
    print(f"{len(dead)} dead relative link(s) in {len(files)} Markdown files")
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main())
