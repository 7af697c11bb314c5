"""The GSM8K split of issue 62's synthesizer study (records/synth62/PROTOCOL.md).

GSM8K test's 1,319 problems, file order, numbered 0..1318. Problems 0-39
were looked at before this study (the audit's greedy trial of the 0.5B), so
they are left out. The other 1,279 are shuffled with Python's
`random.Random(62)`; the first 400 of the shuffle are the synthesizer's
training problems, the next 200 the held-out problems. A problem whose
question text also occurs among the training problems is dropped from the
held-out set (GSM8K repeats a few questions), so the two share no question
by construction; the script checks that and exits non-zero otherwise.

Writes records/synth62/split.json (the indices; committed) and, for the
runs, runs/synth62/gsm8k-train.jsonl and runs/synth62/gsm8k-heldout.jsonl
(the problems' own lines, in split order; not committed, regenerated from
../shared/data by this script).

Usage: python3 scripts/synth62_split.py
"""
import json
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT.parent / "shared/data/gsm8k_test.jsonl"
SEEN = 40
TRAIN, HELDOUT = 400, 200


def main():
    lines = [l for l in SOURCE.read_text().splitlines() if l.strip()]
    if len(lines) != 1319:
        sys.exit(f"{SOURCE}: expected 1319 problems, found {len(lines)}")
    order = list(range(SEEN, len(lines)))
    random.Random(62).shuffle(order)
    train = order[:TRAIN]
    question = lambda i: " ".join(json.loads(lines[i])["question"].split())
    seen = {question(i) for i in train}
    candidates = order[TRAIN:TRAIN + HELDOUT]
    heldout = [i for i in candidates if question(i) not in seen]
    dropped = [i for i in candidates if question(i) in seen]
    if set(train) & set(heldout) or {question(i) for i in heldout} & seen:
        sys.exit("the split overlaps")
    if any(i < SEEN for i in train + heldout):
        sys.exit("the split uses a problem looked at before")
    rec = ROOT / "records/synth62"
    rec.mkdir(parents=True, exist_ok=True)
    (rec / "split.json").write_text(json.dumps({
        "source": "../shared/data/gsm8k_test.jsonl (file order, 0-based)",
        "rule": "indices 40..1318 shuffled by random.Random(62): first 400 train, "
                "next 200 held out, minus any whose question text is a training question's",
        "train": train, "heldout": heldout, "heldout_dropped_as_duplicates": dropped,
    }, indent=1) + "\n")
    runs = ROOT / "runs/synth62"
    runs.mkdir(parents=True, exist_ok=True)
    for name, idx in (("gsm8k-train.jsonl", train), ("gsm8k-heldout.jsonl", heldout)):
        (runs / name).write_text("".join(lines[i] + "\n" for i in idx))
    print(f"train {len(train)}, held out {len(heldout)} (dropped {len(dropped)} duplicates)")


if __name__ == "__main__":
    main()
