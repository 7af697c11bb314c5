#!/usr/bin/env python3
"""RULER records (`tern kv-eval --tasks ruler --out FILE`) -> tables and a
plot of score against the fraction of KV removed.

One table per (model, length, kv_dtype): rows are policies, columns the
percentage of the prompt's KV entries removed, cells the average over tasks
of each task's mean score (0-100), as kvpress's leaderboard. A per-task table
follows. docs/KV.md's region `table:kv-ruler` is these tables over the
committed records, written by `python3 scripts/tables.py` (which imports
this file); this script prints them for any records and draws the plot, a
plain SVG (no dependencies beyond python3).

    python3 scripts/kv_table.py records/ruler-2026-12-03/grid/smollm2-4k-f16.jsonl \
        --plot docs/img/ruler-smollm2-4k-f16.svg
"""

import argparse
import json
import sys
from collections import defaultdict

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"error: {path}:{n}: not JSON ({e})")
                if r.get("suite") == "ruler":
                    rows.append(r)
    if not rows:
        sys.exit("error: no ruler records in " + ", ".join(paths))
    return unique(rows)


def unique(rows):
    """Drops repeats of one (model, length, dtype, task, sample, setting):
    two runs that both include the full cache measure its samples twice,
    with the same seed and the same result. Differing repeats are an error."""
    seen = {}
    out = []
    for r in rows:
        key = (r.get("model"), r["length"], r.get("kv_dtype", "f32"), r["task"],
               r["sample"], r["name"], r["removed"], r.get("policy"), r.get("query", "aware"))
        if key in seen:
            if seen[key] != r["score"]:
                sys.exit(f"error: two records of {key} disagree ({seen[key]} vs {r['score']})")
            continue
        seen[key] = r["score"]
        out.append(r)
    return out


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(rows):
    """{(model, length, dtype, query): {(name, removed): {task: [scores]}}} and
    policy order. Records from before `--query-agnostic` existed are query-aware."""
    groups = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    order = []
    for r in rows:
        key = (r.get("model", "?"), r["length"], r.get("kv_dtype", "f32"), r.get("query", "aware"))
        groups[key][(r["name"], r["removed"])][r["task"]].append(r["score"])
        if r["name"] not in order:
            order.append(r["name"])
    order.sort(key=lambda n: n != "full")
    return groups, order


def cell_average(tasks):
    return mean([mean(v) for v in tasks.values()])


def tables(groups, order):
    out = []
    for (model, length, dtype, query), cells in sorted(groups.items()):
        removed = sorted({rm for (_, rm) in cells if rm > 0})
        task_names = []
        for t in cells.values():
            for name in t:
                if name not in task_names:
                    task_names.append(name)
        samples = max(len(v) for t in cells.values() for v in t.values())
        mode = "" if query == "aware" else f", query-{query}"
        out.append(f"**{model}, {length} tokens, KV {dtype}{mode}** "
                   f"(up to {samples} sample(s) per task; average over {', '.join(task_names)})\n")
        out.append("| policy | 0% | " + " | ".join(f"{r}%" for r in removed) + " |")
        out.append("|---|---|" + "---|" * len(removed))
        for name in order:
            if not any(n == name for (n, _) in cells):
                continue
            row = []
            for rm in [0] + removed:
                t = cells.get((name, rm))
                row.append(f"{cell_average(t):.1f}" if t else "-")
            out.append(f"| {name} | " + " | ".join(row) + " |")
        out.append("")
        out.append("| policy | removed | " + " | ".join(task_names) + " |")
        out.append("|---|---|" + "---|" * len(task_names))
        for name in order:
            for rm in [0] + removed:
                t = cells.get((name, rm))
                if not t:
                    continue
                vals = [f"{mean(t[k]):.1f}" if k in t else "-" for k in task_names]
                out.append(f"| {name} | {rm}% | " + " | ".join(vals) + " |")
        out.append("")
    return "\n".join(out)


def doc_tables(paths):
    """The tables of the records in `paths`, as docs/KV.md shows them."""
    groups, order = summarize(load(paths))
    return tables(groups, order)


def plot(groups, order, path):
    """Score vs % removed, one line per policy per (model, length); full as a dashed level."""
    w, h, left, right, top, bottom = 640, 400, 60, 170, 30, 50
    pw, ph = w - left - right, h - top - bottom
    x = lambda v: left + pw * v / 100
    y = lambda v: top + ph * (1 - v / 100)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="DejaVu Sans, sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    for v in range(0, 101, 20):
        svg.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v)}" y2="{y(v)}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 8}" y="{y(v) + 4}" text-anchor="end">{v}</text>')
        svg.append(f'<line x1="{x(v)}" x2="{x(v)}" y1="{top}" y2="{top + ph}" stroke="#eee"/>')
        svg.append(f'<text x="{x(v)}" y="{top + ph + 18}" text-anchor="middle">{v}%</text>')
    svg.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    svg.append(f'<text x="{left + pw / 2}" y="{h - 10}" text-anchor="middle">KV entries of the prompt removed</text>')
    svg.append(f'<text transform="translate(16 {top + ph / 2}) rotate(-90)" text-anchor="middle">RULER score (avg over tasks)</text>')
    titles = [f"{m} {n} tok KV {d}" + ("" if q == "aware" else f" q-{q}") for (m, n, d, q) in sorted(groups)]
    svg.append(f'<text x="{left}" y="{top - 10}">{"; ".join(titles)}</text>')
    legend_y = top + 10
    multi = len(groups) > 1
    i = 0
    for (model, length, dtype, query), cells in sorted(groups.items()):
        dash = "" if not multi else f' stroke-dasharray="{2 + 4 * (i % 2)},2"'
        for name in order:
            pts = sorted((rm, cell_average(t)) for (n, rm), t in cells.items() if n == name)
            if not pts:
                continue
            color = COLORS[order.index(name) % len(COLORS)]
            label = name if not multi else f"{name} {length}"
            if name == "full":
                s = pts[0][1]
                svg.append(f'<line x1="{x(0)}" x2="{x(100)}" y1="{y(s)}" y2="{y(s)}" '
                           f'stroke="{color}" stroke-dasharray="6,4"/>')
            else:
                coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
                svg.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            for a, b in pts:
                svg.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3.5" fill="{color}"/>')
            svg.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 36}" y1="{legend_y}" y2="{legend_y}" '
                       f'stroke="{color}" stroke-width="2"/>')
            svg.append(f'<text x="{left + pw + 42}" y="{legend_y + 4}">{label}</text>')
            legend_y += 18
        i += 1
    svg.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="JSONL files from tern kv-eval --tasks ruler --out")
    ap.add_argument("--plot", help="SVG file to write")
    a = ap.parse_args()
    groups, order = summarize(load(a.records))
    print(tables(groups, order))
    if a.plot:
        plot(groups, order, a.plot)


if __name__ == "__main__":
    main()
