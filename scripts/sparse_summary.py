#!/usr/bin/env python3
"""Tables for docs/SPARSE_RL.md from the runs under runs/sparse/.

Usage: python3 scripts/sparse_summary.py [RUN ...]
Per run: reward over the first and last 10 steps, held-out accuracy before
and after (greedy, full cache), KV held during rollouts against full, and the
correction statistics summed or averaged over steps; then the deployment
table from runs/sparse/deploy.jsonl and the steps to reward thresholds.
"""
import json
import os
import sys

ROOT = "runs/sparse"


def load(run):
    path = os.path.join(ROOT, run, "metrics.jsonl")
    rows = [json.loads(l) for l in open(path) if l.strip()]
    ev = os.path.join(ROOT, run, "eval.json")
    ev = json.load(open(ev)) if os.path.exists(ev) else {}
    return rows, ev


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def stability(runs):
    print("| run | reward steps 1-10 | reward last 10 | held-out before -> after | KV held / full | rejected rollouts | rejected tokens (of learner tokens) | mean rho | min rho | KL(old‖sparse) | s/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        rows, ev = load(run)
        r = [x["reward_mean"] for x in rows]
        kv = sum(x["kv_bytes_peak"] for x in rows) / max(1, sum(x["kv_bytes_full"] for x in rows))
        rho = [x["rho"] for x in rows if x.get("rho")]
        ltok = sum(x["learner_tokens"] for x in rows)
        if rho:
            rej_r = sum(x["rejected_rollouts"] for x in rho)
            rej_t = sum(x["rejected_tokens"] for x in rho)
            cols = [str(rej_r), f"{rej_t} ({ltok})", f"{mean(x['mean_rho'] for x in rho):.3f}",
                    f"{min(x['min_rho'] for x in rho):.2g}", f"{mean(x['kl_old_sparse'] for x in rho):.4f}"]
        else:
            cols = ["-"] * 5
        b, a = ev.get("before"), ev.get("after")
        held = f"{100*b:.0f}% -> {100*a:.0f}%" if b is not None and a is not None else "-"
        print(f"| {run} | {mean(r[:10]):.3f} | {mean(r[-10:]):.3f} | {held} | {kv:.2f} | "
              + " | ".join(cols) + f" | {mean(x['seconds'] for x in rows):.0f} |")


def deployment():
    path = os.path.join(ROOT, "deploy.jsonl")
    if not os.path.exists(path):
        return
    acc = {}
    for l in open(path):
        r = json.loads(l)
        acc.setdefault(r["run"], {})[r["policy"]] = r["result"]["rows"][0]
    print()
    print("| model | full cache | compressed | loss under compression |")
    print("|---|---|---|---|")
    for run, by in acc.items():
        pol = [p for p in by if p != "full"]
        if "full" not in by or not pol:
            continue
        f, s = by["full"]["accuracy"], by[pol[0]]["accuracy"]
        n = by["full"]["tasks"]
        print(f"| {run} | {100*f:.1f}% | {100*s:.1f}% | {100*(f-s):+.1f} points (n={n}) |")


def thresholds(runs, levels=(0.4, 0.5, 0.6)):
    print()
    print("| run | " + " | ".join(f"first step with 5-step mean reward >= {t}" for t in levels) + " |")
    print("|---|" + "---|" * len(levels))
    for run in runs:
        rows, _ = load(run)
        r = [x["reward_mean"] for x in rows]
        cells = []
        for t in levels:
            hit = next((i + 1 for i in range(len(r)) if i >= 4 and mean(r[i - 4:i + 1]) >= t), None)
            cells.append(str(hit) if hit else f"not in {len(r)}")
        print(f"| {run} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    runs = sys.argv[1:] or sorted(d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)))
    stability(runs)
    deployment()
    thresholds(runs)
