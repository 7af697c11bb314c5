#!/usr/bin/env bash
# Issue 58, "Training": LoRA SFT and GRPO on Qwen2.5-Coder-0.5B-Instruct
# (Q4_K_M) under --memory-cap, the export through llama.cpp, and the 4 x 256
# LoRA step beside transformers + peft. Writes small records to
# records/train58/ (checkpoints and GGUFs stay under $RUNS).
#
#   scripts/train58.sh sft|grpo|export|data|step|peft|all
#
# Heavy stages run one at a time; each records the 1-minute load average
# before it starts (load.txt), as timings are valid only on a quiet machine.
# TERN: the binary (copy it first so a rebuild cannot change it mid-run);
# PY: a Python with torch, transformers, peft and gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
TERN=${TERN:-target/release/tern}
PY=${PY:-python3}
MODEL=qwen2.5-coder-0.5b-instruct
GGUF=models/cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
REC=records/train58
RUNS=${RUNS:-runs/train58}
mkdir -p "$REC" "$RUNS"

load() { echo "$1 $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$REC/load.txt"; }

# A run's small records: metrics, held-out scores, the command and its log.
keep() { # RUN_DIR NAME
  mkdir -p "$REC/$2"
  cp "$1/metrics.jsonl" "$REC/$2/"
  [ -f "$1/eval.json" ] && cp "$1/eval.json" "$REC/$2/"
  cp "$1.log.txt" "$REC/$2/log.txt"
  cp "$1.args.txt" "$REC/$2/args.txt"
}

train() { # NAME ARGS...
  local name=$1; shift
  rm -rf "${RUNS:?}/$name"
  echo "tern train --model $MODEL --threads 2 --out $RUNS/$name $*" > "$RUNS/$name.args.txt"
  load "$name"
  /usr/bin/time -v "$TERN" train --model "$MODEL" --threads 2 --out "$RUNS/$name" "$@" \
    > "$RUNS/$name.log.txt" 2>&1
  keep "$RUNS/$name" "$name"
}

# SFT: arithmetic answered as "The answer is X." in the Qwen chat format.
sft() {
  train sft --algorithm sft --task arithmetic:count=200,seed=1,ops=add+sub+word \
    --eval-task arithmetic:count=20,seed=99,ops=add+sub+word,train_seed=1,train_count=200 \
    --steps 6 --prompts-per-step 4 --lr 1e-3 --checkpoint-every 6 --memory-cap 2GiB
}

# GRPO: two prompts x four rollouts a step, rewarded by the verified answer.
grpo() {
  train grpo --algorithm grpo --task arithmetic:count=200,seed=2,ops=add+sub+mul+word,difficulty=2 \
    --steps 4 --prompts-per-step 4 --group-size 4 --max-new-tokens 64 --temperature 1.0 \
    --lr 1e-4 --checkpoint-every 4 --memory-cap 2GiB
}

# The export at q8_0, then greedy chat answers from Tern and from the
# in-process llama.cpp on the same file, compared byte for byte.
export_check() {
  local out="$REC/export.txt" prompts=(
    "Leo has 9 marbles and gives away 4. How many marbles does Leo have left?"
    "What is 17 + 25?"
    "Write a Python function that returns the square of a number."
  )
  : > "$out"
  for run in sft grpo; do
    load "export-$run"
    "$TERN" export --checkpoint "$RUNS/$run" --out "$RUNS/$run/model-q8_0.gguf" --quant q8_0 \
      --threads 2 >> "$out" 2>&1
    for p in "${prompts[@]}"; do
      for backend in tern llama-cpp; do
        "$TERN" generate --model "$RUNS/$run/model-q8_0.gguf" --backend "$backend" --chat -p "$p" \
          --temperature 0 -n 48 --threads 2 > "$RUNS/$run/gen-$backend.txt" 2>/dev/null
      done
      if cmp -s "$RUNS/$run/gen-tern.txt" "$RUNS/$run/gen-llama-cpp.txt"; then same=same; else same=DIFFERENT; fi
      printf '%s | %s | %s\n  tern:      %s\n  llama.cpp: %s\n' "$run" "$same" "$p" \
        "$(tr '\n' ' ' < "$RUNS/$run/gen-tern.txt")" "$(tr '\n' ' ' < "$RUNS/$run/gen-llama-cpp.txt")" >> "$out"
    done
  done
  for p in "${prompts[@]:0:2}"; do
    "$TERN" generate --model "$GGUF" --chat -p "$p" --temperature 0 -n 48 --threads 2 \
      > "$RUNS/base-gen.txt" 2>/dev/null
    printf 'base | %s\n  tern:      %s\n' "$p" "$(tr '\n' ' ' < "$RUNS/base-gen.txt")" >> "$out"
  done
}

# Tern's LoRA step on the comparison's four 256-token sequences: r = 16
# (alpha 32) on all seven projections, one step of all four (seed 6 picks
# each of the four tasks once in steps 1 and 2), two threads.
data() { python3 scripts/peft_compare_data.py "$TERN" "$MODEL" "$REC"; }

step() {
  for cap in 2GiB 6GiB; do
    train "step-$cap" --algorithm sft --task "$REC/tasks.jsonl" --steps 2 --prompts-per-step 4 \
      --lora-rank 16 --lora-alpha 32 --lora-targets all --seed 6 --checkpoint-every 100 \
      --memory-cap "$cap"
  done
}

# transformers + peft on the same ids, two threads.
peft() {
  load peft
  /usr/bin/time -v "$PY" scripts/peft_compare.py "$GGUF" "$REC/ids.json" --steps 2 --threads 2 \
    > "$REC/peft.jsonl" 2> "$RUNS/peft.log"
  grep -E "Maximum resident|Elapsed" "$RUNS/peft.log" > "$REC/peft-time.txt"
}

case "${1:-all}" in
  sft) sft ;;
  grpo) grpo ;;
  export) export_check ;;
  data) data ;;
  step) step ;;
  peft) peft ;;
  all) sft; grpo; export_check; data; step; peft ;;
  *) echo "usage: $0 sft|grpo|export|data|step|peft|all" >&2; exit 2 ;;
esac
