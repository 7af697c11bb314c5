#!/bin/bash
# Uninterrupted vs killed-and-resumed GRPO on the real model.
set -e
cd "$(dirname "$0")/.."
ARGS="--task arithmetic:count=200,seed=1,ops=add+sub+word --steps 6 --prompts-per-step 2 --group-size 8 --max-new-tokens 24 --temperature 0.8 --lr 4e-4 --checkpoint-every 3 --seed 5 --memory-cap 2GiB"
rm -rf runs/resume-a runs/resume-b
target/release/tern train $ARGS --out runs/resume-a > /tmp/resume-a.log 2>&1
target/release/tern train $ARGS --out runs/resume-b > /tmp/resume-b.log 2>&1 &
PID=$!
lines() { cat runs/resume-b/metrics.jsonl 2>/dev/null | wc -l; }
while [ "$(lines)" -lt 4 ]; do sleep 1; done
kill -9 $PID; wait $PID 2>/dev/null || true
echo "killed after $(wc -l < runs/resume-b/metrics.jsonl) metric lines; latest: $(cat runs/resume-b/latest)"
target/release/tern train --resume runs/resume-b > /tmp/resume-b2.log 2>&1
python3 - <<'PY'
import json
a=[json.loads(l) for l in open('runs/resume-a/metrics.jsonl')]
b=[json.loads(l) for l in open('runs/resume-b/metrics.jsonl')]
keys=['reward_mean','loss','grad_norm','learner_tokens','rollout_tokens','groups_with_signal','kv_bytes_peak']
for x,y in zip(a,b):
    print(x['step'], 'equal' if all(x[k]==y[k] for k in keys) else 'DIFFERENT', x['reward_mean'], y['reward_mean'], x['loss'], y['loss'], x['grad_norm'], y['grad_norm'])
print(len(a), len(b))
PY
