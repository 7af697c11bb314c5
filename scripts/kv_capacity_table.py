#!/usr/bin/env python3
"""Conversations per GiB by admission, joined with RULER scores.

Reads the records of `scripts/capacity.py --out` (one per setting: policy
spec, storage type, removed %, conversations the server admitted under its
`--kv-memory`, KV reserved per conversation) and of `tern kv-eval --tasks
ruler --out` (one per task, sample, policy, removed %, storage type, model),
and writes one row per setting with the conversations admitted, the factor
over the full cache in today's default storage (f16) and in f32, and the
RULER average of the same model, policy, fraction and storage type (average
over tasks of each task's mean score, as the leaderboard table), then the
setting with the most conversations whose RULER average stays within
`--tolerance` points of the full f16 cache. RULER records of other models
are left out: the capacity records are one model's (`--model`, SmolLM2 by
default; records from before capacity.py wrote `model` do not say).
docs/KV.md's region `table:kv-capacity` is this over the committed records,
written by `python3 scripts/tables.py` (which imports this file).

    python3 scripts/kv_capacity_table.py \\
        --capacity records/kv-capacity-2026-12-03/capacity-8k-1gib.jsonl \\
        --ruler records/ruler-2026-12-03/grid/*.jsonl
"""

import argparse
import json
import sys
from collections import defaultdict

from kv_table import unique

MODEL = "smollm2-135m-instruct"


def jsonl(paths):
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        sys.exit(f"error: {path}:{n}: not JSON ({e})")


def ruler_averages(paths, length, model=MODEL):
    """{(name, removed, dtype): (average, tasks, samples per task)} of
    `model`'s records at `length`."""
    cells = defaultdict(lambda: defaultdict(list))
    for r in unique([r for r in jsonl(paths) if r.get("suite") == "ruler"]):
        if r["length"] == length and r.get("model") == model:
            cells[(r["name"], r["removed"], r.get("kv_dtype", "f32"))][r["task"]].append(r["score"])
    out = {}
    for key, tasks in cells.items():
        means = [sum(v) / len(v) for v in tasks.values()]
        out[key] = (sum(means) / len(means), frozenset(tasks), min(len(v) for v in tasks.values()))
    return out


def render(cap, ruler, tolerance, length, model=MODEL):
    rows = [r for r in cap if r.get("model") in (None, model)]
    if not rows:
        sys.exit("error: no capacity records")
    base = next((r for r in rows if r["policy"] == "full" and r["kv_dtype"] == "f32"), None)
    base16 = next((r for r in rows if r["policy"] == "full" and r["kv_dtype"] == "f16"), None)
    if base is None or base16 is None:
        sys.exit("error: the capacity records lack a full-cache baseline (full@f32 and full@f16)")
    full16 = ruler.get(("full", 0, "f16"))
    r0 = rows[0]
    lines = [
        f"`{model}` under `tern serve --kv-memory {r0['kv_memory']}`, {r0['requests']} concurrent "
        f"streaming chats of ~{r0['prompt_tokens']} prompt tokens (+ chat template) and max_tokens "
        f"{r0['max_tokens']}; \"admitted\" is the most requests running at once while others waited "
        "for KV room (`>=`: none had to wait). The factors are against the full cache in f16 (the "
        "default storage) and in f32 (the storage before 2026-12-03). RULER: the average at "
        f"{length} tokens of the same model, policy, fraction removed and storage type "
        "(`-`: not measured).",
        "",
        "| policy | removed | storage | KV reserved per conversation | admitted | x full f16 (count) "
        "| x full f16 (bytes) | x full f32 (count) | x full f32 (bytes) | RULER avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    best = None
    for r in rows:
        name = r["policy"].split(":", 1)[0]
        removed = r.get("removed") or 0
        per = r.get("reserved_per_request")
        admitted = ("" if r["limited_by_kv"] else ">=") + str(r["admitted"])
        avg = ruler.get((name, removed, r["kv_dtype"]))
        # Averages over different task sets do not compare: a setting is
        # judged only on the tasks the full f16 baseline was measured on.
        if avg and full16 and avg[1] != full16[1]:
            avg_s = f"({avg[0]:.1f} over {len(avg[1])} of {len(full16[1])} tasks)"
            avg = None
        else:
            avg_s = f"{avg[0]:.1f}" if avg else "-"
        per_s = f"{per / 2**20:.1f} MiB" if per else "-"
        cells = []
        for b in (base16, base):
            cells.append(f"{r['admitted'] / b['admitted']:.1f}x" if b["admitted"] else "-")
            cells.append(f"{b['reserved_per_request'] / per:.1f}x" if per else "-")
        lines.append(f"| {r['policy']} | {removed}% | {r['kv_dtype']} | {per_s} | {admitted} | "
                     + " | ".join(cells) + f" | {avg_s} |")
        if avg and full16 and avg[0] >= full16[0] - tolerance and r["limited_by_kv"]:
            if best is None or r["admitted"] > best[0]["admitted"]:
                best = (r, avg)
    lines.append("")
    if full16 is None:
        lines.append("No RULER record of the full f16 cache at this length: no setting can be chosen.")
    elif best is None:
        lines.append(f"No setting keeps its RULER average within {tolerance:g} points of full f16 "
                     f"({full16[0]:.1f}).")
    else:
        r, avg = best
        lines.append(
            f"Most conversations with the RULER average within {tolerance:g} points of full f16 "
            f"({full16[0]:.1f}): **{r['policy']} on {r['kv_dtype']}**, {r['admitted']} conversations "
            f"(RULER {avg[0]:.1f}): **{r['admitted'] / base16['admitted']:.1f}x** the full f16 cache's "
            f"{base16['admitted']} by count ({base16['reserved_per_request'] / r['reserved_per_request']:.1f}x "
            f"by KV reserved per conversation), {r['admitted'] / base['admitted']:.1f}x the full f32 "
            f"cache's {base['admitted']} ({base['reserved_per_request'] / r['reserved_per_request']:.1f}x)."
        )
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", nargs="+", required=True, help="capacity.py --out records")
    p.add_argument("--ruler", nargs="+", required=True, help="kv-eval --tasks ruler --out records")
    p.add_argument("--model", default=MODEL, help="the model the capacity records measured")
    p.add_argument("--length", type=int, default=4096, help="RULER length to join with")
    p.add_argument("--tolerance", type=float, default=5.0, help="RULER points below full f16 allowed")
    a = p.parse_args()
    print(render(jsonl(a.capacity), ruler_averages(a.ruler, a.length, a.model), a.tolerance, a.length,
                 a.model), end="")


if __name__ == "__main__":
    main()
