"""Copies issue 60's live HumanEval records (runs/coderm60/, ignored by git)
into records/coderm60/, the files the tables read and the repo keeps.

Only complete lines are copied (the run appends while this reads). Each
`reward@8:tests=32` record keeps everything the tables and a resumed run
need (the candidates, the kept tests, the pass matrix, the hidden rows,
tokens and seconds) but its writer replies become empty strings, one per
reply: the replies are where the kept tests came from and are about half of
each record, and no table reads their text. The file still loads as `tern
eval --records`, so a later session can resume from a copy of it.

Usage: python3 scripts/coderm60_snapshot.py
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIVE = ROOT / "runs" / "coderm60"
KEPT = ROOT / "records" / "coderm60"


def complete_lines(path):
    """The lines of `path` that end in a newline."""
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def main():
    KEPT.mkdir(parents=True, exist_ok=True)
    out = []
    for line in complete_lines(LIVE / "run.jsonl"):
        r = json.loads(line)
        g = r.get("generated_tests")
        if g is not None:
            g["replies"] = [""] * len(g["replies"])
        out.append(json.dumps(r, separators=(",", ":")))
    (KEPT / "run.jsonl").write_text("".join(l + "\n" for l in out))
    ex = LIVE / "exec.jsonl"
    if ex.exists():
        (KEPT / "exec.jsonl").write_text("".join(l + "\n" for l in complete_lines(ex)))
    print(f"{len(out)} run records copied to {KEPT}")


if __name__ == "__main__":
    main()
