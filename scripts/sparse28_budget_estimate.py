#!/usr/bin/env python3
"""Estimate the share of KV a fixed rkv budget would keep in issue 28's runs.

Reads the committed per-step metrics of finished arms (mean sequence length
per rollout = kv_bytes_full / rollouts / KV bytes per token) and, for each
candidate budget, prints the share min(len, budget + every/2) / len over the
first and last 10 steps and over the run. Rough (it uses each step's mean
length, not each rollout's); budget 104's estimate is checked against that
arm's measured kv_bytes_peak / kv_bytes_full.

    python3 scripts/sparse28_budget_estimate.py [budget ...]
"""
import json
import statistics
import sys
from pathlib import Path

RECORDS = Path(__file__).resolve().parent.parent / "records"
ROLLOUTS = 32  # 4 prompts x 8 rollouts (docs/sparse/story.toml)
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2  # SmolLM2-135M: layers x (K,V) x kv heads x dim x f16
EVERY = 8


def main():
    budgets = [int(b) for b in sys.argv[1:]] or [104, 64, 32]
    for arm in ["dense-s1", "sparserl-r104-s1"]:
        rows = [json.loads(l) for l in open(RECORDS / f"sparse28-{arm}" / "metrics.jsonl")]
        lens = [r["kv_bytes_full"] / ROLLOUTS / KV_BYTES_PER_TOKEN for r in rows]
        print(f"{arm}: mean sequence length first 10 steps {statistics.mean(lens[:10]):.0f}, "
              f"last 10 {statistics.mean(lens[-10:]):.0f}")
        peak = sum(r["kv_bytes_peak"] for r in rows)
        full = sum(r["kv_bytes_full"] for r in rows)
        print(f"  measured peak / full over the run: {peak / full:.2f}")
        for b in budgets:
            kept = [min(l, b + EVERY / 2) / l for l in lens]
            total = sum(min(l, b + EVERY / 2) for l in lens) / sum(lens)
            print(f"  budget {b}: est. kept first 10 {statistics.mean(kept[:10]):.2f}, "
                  f"last 10 {statistics.mean(kept[-10:]):.2f}, run {total:.2f}")


if __name__ == "__main__":
    main()
