#!/bin/bash
# Issue 30's fleet check on the real model (docs/SCALING.md): the same GRPO +
# LoRA run (docs/train/grpo-fleet.toml) co-located, with its rollouts on two
# `tern serve` workers, on one worker, and on two with one killed (SIGKILL)
# once the first step is written. Every process runs one thread. Records:
# each run's metrics.jsonl and log, and summary.json (scripts/fleet_summary.py).
#   scripts/fleet_check.sh            (TERN=path picks the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TERN:-./target/release/tern}
CFG=docs/train/grpo-fleet.toml
OUT=runs/fleet
REC=${REC:-records/fleet-$(date -u +%F)}
P1=${P1:-18081}
P2=${P2:-18082}
rm -rf "$OUT"
mkdir -p "$OUT" "$REC"
PIDS=()
trap 'kill ${PIDS[@]} 2>/dev/null || true' EXIT
worker() {
  "$T" serve --port "$1" --lora-dir "$OUT" --threads 1 > "$OUT/worker-$1.log" 2>&1 &
  PIDS+=($!)
  until curl -sf "http://127.0.0.1:$1/health" > /dev/null; do sleep 0.5; done
}
train() { # name, extra flags...
  local name=$1
  shift
  echo "== $name: tern train --config $CFG --threads 1 $*" | tee "$REC/$name.log"
  /usr/bin/time -f "wall %e s, peak RSS %M KiB" "$T" train --config "$CFG" --threads 1 \
    --out "$OUT/$name" "$@" >> "$REC/$name.log" 2>&1
  cp "$OUT/$name/metrics.jsonl" "$REC/$name.metrics.jsonl"
}
worker "$P1"
worker "$P2"
W1=http://127.0.0.1:$P1
W2=http://127.0.0.1:$P2
train co-located
train two-workers --rollout-endpoints "$W1,$W2"
train one-worker --rollout-endpoints "$W1"
# A worker killed mid-run: SIGKILL to the second once step 1 is written.
(
  until [ -s "$OUT/killed/metrics.jsonl" ]; do sleep 0.2; done
  kill -9 "${PIDS[1]}"
  echo "killed worker $W2 (pid ${PIDS[1]}) after step 1" >> "$REC/killed.note"
) &
train killed --rollout-endpoints "$W1,$W2"
python3 scripts/fleet_summary.py "$REC"
