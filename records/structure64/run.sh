#!/bin/bash
# Interleaved load.py: old (before issue 64) and new binaries, SmolLM2, 2 rounds.
# BEFORE: a build of 8ee5f71 (the tree before issue 64); after: target/release/tern of this tree.
BEFORE=${BEFORE:?set BEFORE to a tern binary built from 8ee5f71}
cd "$(dirname "$0")/../.."
M=models/cache/SmolLM2-135M-Instruct.Q4_1.gguf
for round in 1 2; do
  for which in before after; do
    if [ $which = before ]; then B="$BEFORE"; else B=target/release/tern; fi
    $B serve -m $M --port 8097 > records/structure64/server-$which-$round.log 2>&1 &
    pid=$!
    for i in $(seq 1 60); do curl -s http://127.0.0.1:8097/health | grep -q ok && break; sleep 1; done
    timeout 400 python3 scripts/load.py --url http://127.0.0.1:8097 --json > records/structure64/$which-$round.json 2>records/structure64/$which-$round.err
    kill $pid; wait $pid 2>/dev/null
  done
done
