#!/usr/bin/env python3
"""The perplexity-across-texts table from the JSONL records of
`tern kv-eval --tasks ppl --files ... --kept ... --out FILE`. docs/KV.md's
region `table:kv-texts` is this table over the committed records, written
by `python3 scripts/tables.py` (which imports this file); this script prints
it for any records.

Usage: python3 scripts/kv_texts_table.py RECORDS.jsonl

Spread is over texts: the population standard deviation (std) and the range
(min-max) of the ratio to full perplexity.
"""

import json
import math
import sys
from pathlib import Path

def stats(xs):
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return mean, std, min(xs), max(xs)


def ordered(values):
    """Unique values in first-seen order."""
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def render(records):
    texts = ordered(r["text"] for r in records)
    policies = ordered(r["name"] for r in records)
    kepts = sorted(set(r["kept"] for r in records))
    full = {r["text"]: r["full_ppl"] for r in records}
    cell = {(r["name"], r["kept"], r["text"]): r for r in records}
    first = records[0]
    dtypes = ", ".join(sorted(set(r["kv_dtype"] for r in records)))

    out = [
        f"Model `{first['model']}`, context {first['ctx']}, {first['windows']} window(s) per text "
        f"({first['scored_tokens']} scored tokens), KV cache stored as {dtypes}. "
        "Cells: perplexity with the policy over perplexity with the full cache "
        "(lower is better; 1.000x is lossless). Spread over the "
        f"{len(texts)} texts: population standard deviation (std) and range (min-max).",
        "",
        "| | " + " | ".join(texts) + " |",
        "|---|" + "---|" * len(texts),
        "| full-cache perplexity | " + " | ".join(f"{full[t]:.3f}" for t in texts) + " |",
        "",
        "| policy | kept | " + " | ".join(texts) + " | mean | std | min-max |",
        "|---|---|" + "---|" * (len(texts) + 3),
    ]
    means = {}
    incomplete = []
    for p in policies:
        for k in kepts:
            rows = [cell.get((p, k, t)) for t in texts]
            if all(r is None for r in rows):
                continue
            budget = next(r for r in rows if r is not None)["budget"]
            cells = " | ".join("-" if r is None else f"{r['ratio']:.3f}x" for r in rows)
            if any(r is None for r in rows):
                done = sum(r is not None for r in rows)
                incomplete.append(f"{p} at {k}% ({done} of {len(texts)} texts)")
                out.append(f"| {p} | {k}% ({budget}) | {cells} | - | - | - |")
                continue
            mean, std, lo, hi = stats([r["ratio"] for r in rows])
            means[(p, k)] = (mean, std, lo, hi)
            out.append(
                f"| {p} | {k}% ({budget}) | {cells} | **{mean:.3f}x** | {std:.3f} | {lo:.3f}-{hi:.3f} |"
            )
    out.append("")
    if incomplete:
        out.append(
            "Not measured on every text (no mean or spread given): "
            + "; ".join(incomplete)
            + ". A dash is a text not yet run."
        )
        out.append("")
    for k in kepts:
        ranked = sorted((p for p in policies if (p, k) in means), key=lambda p: means[(p, k)][0])
        if not ranked:
            continue
        best = ranked[0]
        mean, std, lo, hi = means[(best, k)]
        others = ", ".join(
            f"{p} {means[(p, k)][0]:.3f}x ± {means[(p, k)][1]:.3f}" for p in ranked[1:]
        )
        line = (
            f"- Kept {k}%, among the policies measured on all texts: best mean ratio "
            f"**{best}** {mean:.3f}x ± {std:.3f} (range {lo:.3f}-{hi:.3f})"
        )
        out.append(line + (f"; then {others}." if others else "."))
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    records_path = Path(sys.argv[1])
    records = [json.loads(l) for l in records_path.read_text().splitlines() if l.strip()]
    if not records:
        sys.exit(f"{records_path}: no records")
    print(render(records), end="")


if __name__ == "__main__":
    main()
