#!/bin/bash
# The deployment question of issue 28: an arm's trained model exported to a
# GGUF (`tern export`, q8_0 by default) and scored by `tern eval` on the same
# held-out set as its eval.json (story seed 99, 200 tasks, greedy), with a
# full cache and under the arm's rollout policy. Records land beside the
# arm's other records: export-eval-full.{json,jsonl} and
# export-eval-policy.{json,jsonl}; the GGUF stays in runs/ (not committed).
# A dense arm has no rollout policy: its export is scored under the sparse
# arms' operating points instead (export-eval-r56, export-eval-r28), which
# asks whether training under the policy helps a model that is served under it.
#   scripts/sparse28_export_eval.sh ARM        (e.g. sparserl-r104-s1)
#   scripts/sparse28_export_eval.sh base       (the untrained model, full cache)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TERN:-./target/release/tern}
# The held-out set of docs/sparse/story.toml, outside its training pool
# (story:count=2000,seed=1,steps=1,cot=0). The arms recorded before the
# held-out set named that pool were scored on the plain spec
# (story:count=200,seed=99,steps=1,cot=0, 9 of whose stories are in the
# pool): score one of those again with TASK set to that.
TASK=${TASK:-"story:count=200,seed=99,steps=1,cot=0,train_seed=1,train_count=2000"}
arm=$1
score() { # model policy name dir
  $T eval --model "$1" --task "$TASK" --strategy single --limit 200 --threads 1 \
    --kv-policy "$2" --records "$4/export-eval-$3.jsonl" --json > "$4/export-eval-$3.json"
}
if [ "$arm" = base ]; then
  rec=records/sparse28-base-eval; mkdir -p $rec
  echo "scripts/sparse28_export_eval.sh base" > $rec/args.txt
  score smollm2-135m-instruct full full $rec
  exit
fi
out=runs/sparse28/$arm; rec=records/sparse28-$arm
policy=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('policy') or '')" $rec/eval.json)
[ -s $out/export.gguf ] || $T export --checkpoint $out --out $out/export.gguf --threads 1 > $rec/export-log.txt 2>&1
score $out/export.gguf full full $rec
if [ -n "$policy" ]; then
  score $out/export.gguf "$policy" policy $rec
elif [[ $arm == r62-* ]]; then
  # Issue 62's five-seed rerun (records/sparse62/PROTOCOL.md): dense's
  # export under the sparse arms' relative budget.
  score $out/export.gguf "rkv:budget=50%,min_budget=32,window=8,every=8" p50 $rec
else
  score $out/export.gguf "rkv:budget=56,window=8,every=8" r56 $rec
  score $out/export.gguf "rkv:budget=28,window=8,every=8" r28 $rec
fi
