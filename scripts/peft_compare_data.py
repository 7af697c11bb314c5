#!/usr/bin/env python3
"""Four SFT tasks of exactly 256 tokens each for the LoRA step comparison.

Each task is a question and a worked `target` (the source of a function from
Python's standard library), cut so that Tern's SFT sequence, the Qwen2.5
chat prompt (default system turn, the user's question, the assistant header)
plus the target plus `<|im_end|>`, is exactly 256 tokens. The ids are taken
from `tern tokenize` so both sides of the comparison train on the same ids:
writes `tasks.jsonl` (for `tern train --task`) and `ids.json` (for
scripts/peft_compare.py).

Usage: scripts/peft_compare_data.py TERN MODEL OUT_DIR
"""

import inspect
import json
import subprocess
import sys
import textwrap

SEQ = 256
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
IM_END = 151645
SOURCES = [
    ("json.decoder", "py_scanstring"),
    ("textwrap", "TextWrapper._wrap_chunks"),
    ("shlex", "shlex.read_token"),
    ("difflib", "SequenceMatcher.find_longest_match"),
]


def tokenize(tern, model, text, special):
    args = [tern, "tokenize", "-m", model, "--json", "--threads", "1"]
    if not special:
        args.append("--no-parse-special")
    out = subprocess.run(args, input=text.encode(), capture_output=True, check=True)
    return json.loads(out.stdout)


def source(module, qual):
    obj = __import__(module, fromlist=["_"])
    for part in qual.split("."):
        obj = getattr(obj, part)
    return textwrap.dedent(inspect.getsource(obj))


def main():
    tern, model, out = sys.argv[1:4]
    tasks, ids = [], []
    for module, qual in SOURCES:
        question = f"Write `{qual}` from Python's `{module}` module."
        prompt_text = (
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
            f"{question}<|im_end|>\n<|im_start|>assistant\n"
        )
        prompt = tokenize(tern, model, prompt_text, True)["ids"]
        want = SEQ - len(prompt) - 1
        pieces = tokenize(tern, model, source(module, qual), False)["pieces"]
        # Cut at a token boundary, trimmed as Tern trims a target; a cut can
        # merge differently when re-encoded, so walk down from the longest
        # cut until the trimmed text is exactly `want` tokens.
        for k in range(min(want + 4, len(pieces)), 0, -1):
            target = "".join(pieces[:k]).strip()
            got = tokenize(tern, model, target, False)["ids"]
            if len(got) == want:
                break
        else:
            sys.exit(f"cannot cut {qual} to {want} tokens")
        seq = prompt + got + [IM_END]
        assert len(seq) == SEQ, len(seq)
        tasks.append({"question": question, "answer": "-", "target": target})
        ids.append({"prompt": len(prompt), "ids": seq})
    with open(f"{out}/tasks.jsonl", "w") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    with open(f"{out}/ids.json", "w") as f:
        json.dump(ids, f)
    print(f"wrote {len(tasks)} tasks of {SEQ} tokens to {out}")


if __name__ == "__main__":
    main()
