#!/usr/bin/env python3
"""Summarises scripts/fleet_check.sh's records: for each run, whether every
step equals the co-located run's (rewards, rollout tokens, loss, gradient
norm, rho), its rollout tokens per second, and where its groups went.
Writes DIR/summary.json and prints it."""

import json
import sys
from pathlib import Path

KEYS = ("reward_mean", "rollout_tokens", "learner_tokens", "loss", "grad_norm", "rho")


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    rec = Path(sys.argv[1])
    co = load(rec / "co-located.metrics.jsonl")
    out = {}
    for name in ("co-located", "two-workers", "one-worker", "killed"):
        path = rec / f"{name}.metrics.jsonl"
        if not path.exists():
            continue
        ms = load(path)
        rollout_s = sum(m["rollout_tokens"] / m["tokens_per_s"] for m in ms if m["tokens_per_s"] > 0)
        requests = {}
        for m in ms:
            for w in (m.get("fleet") or {}).get("workers", []):
                requests.setdefault(w["url"], []).append(w["requests"])
        out[name] = {
            "steps": len(ms),
            "steps_equal_to_co_located": sum(
                1 for a, b in zip(co, ms) if all(a.get(k) == b.get(k) for k in KEYS)
            ),
            "rollout_tokens": sum(m["rollout_tokens"] for m in ms),
            "rollout_tokens_per_s": round(sum(m["rollout_tokens"] for m in ms) / rollout_s, 1),
            "step_seconds": [round(m["seconds"], 1) for m in ms],
            "retried": sum((m.get("fleet") or {}).get("retried", 0) for m in ms),
            "requests_per_step_by_worker": requests,
        }
    (rec / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
