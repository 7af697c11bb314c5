#!/bin/bash
# Reruns, with records, the two 2026-11-30 measurements of docs/SPARSE_RL.md
# that the issue-28 ablation does not replace (their run directories were not
# kept). Each run resumes from its latest checkpoint and leaves its metrics,
# held-out scores, config, command and `time -v` log in records/<run>/:
#   scripts/sparse_rerun.sh memory  the f32 learner's dry runs under a 3.5 GiB cap,
#                                   256 rollouts of up to 256 tokens, full vs rkv:32
#   scripts/sparse_rerun.sh data    difficulty-targeted selection + replay against
#                                   uniform on a 24- and a 100-task pool, 30 steps
# TERN=path picks the binary (a run must finish on the build it started with).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TERN:-./target/release/tern}
CFG=docs/sparse/base.toml

one() { # name args...
  local name=$1; shift
  local out=runs/sparse-rerun/$name rec=records/$name
  # Done: a dry run's metrics are in, or a training run's held-out score after.
  if [ -f "$rec/metrics.jsonl" ] && { grep -q '"after": [0-9]' "$rec/eval.json" 2>/dev/null ||
    grep -q -- --dry-run "$rec/args.txt"; }; then
    return 0
  fi
  mkdir -p "$rec" runs/sparse-rerun
  if ls -d "$out"/step-* > /dev/null 2>&1; then
    echo "tern train --resume $out --threads 1" >> "$rec/args.txt"
    /usr/bin/time -v "$T" train --resume "$out" --threads 1 >> "$rec/log.txt" 2>&1
  else
    rm -rf "$out"
    echo "tern train --config $CFG --threads 1 $* --out $out" > "$rec/args.txt"
    cp "$CFG" "$rec/config.toml"
    /usr/bin/time -v "$T" train --config "$CFG" --threads 1 "$@" --out "$out" > "$rec/log.txt" 2>&1
  fi
  cp "$out/metrics.jsonl" "$rec/"
  if [ -f "$out/eval.json" ]; then cp "$out/eval.json" "$rec/"; fi
}

memory() {
  for p in full rkv:budget=32,window=8,every=8; do
    one "cap3.5g-f32-${p%%:*}" --learner-weights f32 --memory-cap 3.5GiB --max-new-tokens 256 \
      --group-size 16 --prompts-per-step 16 --rollout-kv-policy "$p" --dry-run
  done
}

data() {
  # The held-out set skips the pool's tasks (train_seed/train_count); the
  # records of 2026-12-05 predate that and scored the plain seed-98 spec,
  # which shares 15 of its 100 tasks with the 100-task pool (none with the
  # 24-task one).
  for n in 24 100; do
    local pool=(--task "arithmetic:count=$n,seed=5,difficulty=1+2,ops=add+sub+word"
      --eval-task "arithmetic:count=100,seed=98,difficulty=1+2,ops=add+sub+word,train_seed=5,train_count=$n")
    one "data-pool$n-uniform" "${pool[@]}" --selection uniform
    one "data-pool$n-difficulty" "${pool[@]}" --selection difficulty --replay-share 0.5
  done
}

case "${1:-}" in
  memory) memory ;;
  data) data ;;
  all) memory; data ;;
  *) sed -n '2,11p' "$0"; exit 2 ;;
esac
