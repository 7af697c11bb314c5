#!/bin/bash
# Sparsity-aware deployment (docs/SPARSE_RL.md): export each trained run to
# q8_0 and score it greedily on held-out tasks served with a full cache and
# with the rollouts' KV policy. Usage: scripts/sparse_deploy_eval.sh RUN...
# (run directories under runs/sparse/); writes runs/sparse/deploy.jsonl.
set -euo pipefail
TERN=${TERN:-./target/release/tern}
TASK=${TASK:-arithmetic:count=200,seed=99,ops=add+sub+word}
POLICY=${POLICY:-rkv:budget=32,window=8,every=8}
OUT=runs/sparse/deploy.jsonl
for run in "$@"; do
  if [ "$run" = base ]; then
    model=smollm2-135m-instruct
  else
    model=runs/sparse/$run.q8_0.gguf
    [ -f "$model" ] || "$TERN" export --checkpoint "runs/sparse/$run" --out "$model" --quant q8_0 --no-check
  fi
  for policy in full "$POLICY"; do
    acc=$("$TERN" eval --model "$model" --task "$TASK" --limit 200 --strategy single \
      --max-tokens 32 --kv-policy "$policy" --threads 1 --json | python3 -c \
      'import json,sys; r=json.load(sys.stdin); print(json.dumps(r))')
    echo "{\"run\":\"$run\",\"policy\":\"$policy\",\"result\":$acc}" >> "$OUT"
  done
done
