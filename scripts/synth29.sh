#!/bin/bash
# Issue 29's loop, one stage per call, each resumable and each leaving its
# records in records/synth29/ or records/ (small JSONL; the model
# files stay in runs/synth29/):
#   scripts/synth29.sh data        training data: N=8 candidates per story task of
#                                  the training seed (1), K syntheses, correct ones kept
#   scripts/synth29.sh train       LoRA SFT of the synthesizer on that data
#   scripts/synth29.sh export      merge it into a q8_0 GGUF
#   scripts/synth29.sh serve       serve it as --synthesizer-model and ask one
#                                  best-of-8 synthesize request (server and CLI)
#   scripts/synth29.sh eval-story  held-out stories (seed 98, never trained on):
#                                  single, majority@8, synthesize@8 untrained and trained,
#                                  over the same candidates in one run
#   scripts/synth29.sh eval-gsm8k  the same on all of GSM8K test
#   scripts/synth29.sh adaptive    adaptive width and length by difficulty bucket
#                                  (arithmetic difficulty 1..4) against best-of-8 and
#                                  fixed-length greedy
#   scripts/synth29.sh adaptive-sweep  adaptive width's stopping confidence at 0.8
#                                  and 0.9 over the adaptive stage's samples
#   scripts/synth29.sh all         every stage, with each stage's wall time (the
#                                  longest, eval-gsm8k, last)
# The first recipe, bare answers mixed in, as a second synthesizer `mixed`
# (its own stages, so that the loop's wall time above stays one synthesizer's):
#   scripts/synth29.sh data-again  sample again the data stage's tasks runs/ lacks
#                                  and check them against the committed data-kept.jsonl
#   scripts/synth29.sh train-mixed LoRA SFT on every kept task: worked targets, and
#                                  "The answer is X." where no synthesis was right
#   scripts/synth29.sh export-mixed  merge it into runs/synth29/synth-mixed.gguf
#   scripts/synth29.sh eval-story-mixed  add synthesize@8:with=mixed to the held-out
#                                  stories' records (the other strategies' records stay)
# Once synth-mixed.gguf exists, eval-story and eval-gsm8k evaluate it too.
# Sizes come from the environment so that a tiny run checks the plumbing:
#   DATA_TASKS (800), K (4), SFT_STEPS (100), STORY_TASKS (300), GSM8K_TASKS (1319),
#   ADAPTIVE_TASKS (400), THREADS (2), TERN (./target/release/tern), OUT (runs/synth29),
#   REC (records/synth29), EVAL (records/synth29), PORT (18129, serve).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TERN:-./target/release/tern}
TH=${THREADS:-2}
OUT=${OUT:-runs/synth29}
REC=${REC:-records/synth29}
EVAL=${EVAL:-records/synth29}
mkdir -p "$OUT" "$REC" "$EVAL"
TRAIN_TASKS="story:count=2000,seed=1,steps=1,cot=0"
# Held out from the whole training pool (train_seed/train_count): the
# records of 2026-12-05/06 used the plain seed-98 spec, 6 of whose 300
# stories are among the 800 training stories (13 among the pool's 2000).
STORY_HELD_OUT="story:count=300,seed=98,steps=1,cot=0,train_seed=1,train_count=2000"
STRATEGIES="single,majority@8,synthesize@8,synthesize@8:with=trained"
MIXED="$OUT/synth-mixed.gguf"

timed() { # stage command...
  # Wall time per stage in wall.jsonl. A stage killed with its session (a
  # machine reclaims its jobs) leaves wall-open-STAGE.json, its last
  # heartbeat; the stage's next call files that as an interrupted part, so a
  # stage resumed over several sessions still sums to its whole time (to
  # within 5 s). Per stage, so that a stage run beside another (serve beside
  # a running eval) does not file the other's live heartbeat.
  local s=$1; shift
  local open="$REC/wall-open-$s.json"
  # wall-open.json: the one heartbeat file of calls before 2026-12-05.
  if [ -f "$REC/wall-open.json" ] && grep -q "\"stage\":\"$s\"" "$REC/wall-open.json"; then
    mv "$REC/wall-open.json" "$open"
  fi
  if [ -f "$open" ]; then
    cat "$open" >> "$REC/wall.jsonl"
    rm "$open"
  fi
  local t0; t0=$(date +%s)
  echo "$(date -u +%FT%TZ) $s: $*" >> "$REC/commands.txt"
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    sleep 5
    echo "{\"stage\":\"$s\",\"seconds\":$(($(date +%s) - t0)),\"threads\":$TH,\"interrupted\":true}" \
      > "$open"
  done
  wait "$pid"
  rm -f "$open"
  echo "{\"stage\":\"$s\",\"seconds\":$(($(date +%s) - t0)),\"threads\":$TH,\"finished\":\"$(date -u +%FT%TZ)\"}" >> "$REC/wall.jsonl"
}

SYNTH_DATA=("$T" synth-data --task "$TRAIN_TASKS" --limit "${DATA_TASKS:-800}" --n 8 --k "${K:-4}"
  --keep disagree --threads "$TH" --json --out "$OUT/data.jsonl")

data() {
  # 800 tasks: on the first 100 (a pilot, 2026-12-04, records/synth29)
  # the 135M model's candidates were right 9.1% of the time, every task was
  # kept (its 8 candidates disagreed), and 16 of 100 got a right synthesis
  # among K=4 (a synthesis is right 4.5% of the time), so 800 tasks give
  # about 130 SFT targets. More tasks rather than a larger K: the same cost
  # buys more distinct questions.
  timed data "${SYNTH_DATA[@]}" >> "$REC/data-summary.jsonl"
  # The whole data set's record, also when the stage was resumed (each
  # summary line above counts only its own call's tasks): every task done, and each kept
  # example's sampling outcome without its prompt text (tasks not kept had
  # their majority right and no disagreement).
  cp "$OUT/data.jsonl.sources" "$REC/data-sources.txt"
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    e = json.loads(l); e["has_target"] = "target" in e
    e.pop("question"); e.pop("target", None); print(json.dumps(e))' "$OUT/data.jsonl" > "$REC/data-kept.jsonl"
}

data_again() {
  # The data stage's examples sampled again where runs/ lacks them (a fresh
  # machine; or, on 2026-12-05, only the 178 tasks with a target re-sampled,
  # data-regen.json): the tasks data.jsonl holds stay, every other task of the
  # data stage is sampled again by its own command, and the whole file is
  # compared with the committed data-kept.jsonl, task by task and field by
  # field (data-again.json). Sampling is seeded per task, so they should be
  # equal. A task cut off mid-line by a lost session is sampled again.
  touch "$OUT/data.jsonl"
  python3 -c 'import json,sys
seen, keep = set(), []
for l in open(sys.argv[1]):
    try:
        e = json.loads(l)
    except ValueError:
        continue
    if e["source"] not in seen:
        seen.add(e["source"]); keep.append(l if l.endswith("\n") else l + "\n")
open(sys.argv[1], "w").writelines(keep)
open(sys.argv[1] + ".sources", "w").writelines(f"{s}\n" for s in sorted(seen))' "$OUT/data.jsonl"
  timed data-again "${SYNTH_DATA[@]}" >> "$REC/data-again-summary.jsonl"
  python3 - "$OUT/data.jsonl" "$REC/data-kept.jsonl" "${SYNTH_DATA[*]}" > "$REC/data-again.json" <<'PY'
import json, sys
def kept(e):
    e = dict(e); e["has_target"] = "target" in e
    e.pop("question"); e.pop("target", None); return e
now = {e["source"]: kept(e) for e in map(json.loads, open(sys.argv[1]))}
rec = {e["source"]: e for e in map(json.loads, open(sys.argv[2]))}
same = sorted(s for s in rec if now.get(s) == rec[s])
print(json.dumps({
    "what": "the data stage's kept tasks rebuilt in runs/synth29/data.jsonl (those missing sampled again) "
            "and compared with the committed data-kept.jsonl, every field but the prompt text",
    "command": sys.argv[3].replace(sys.argv[3].split()[0], "tern", 1),
    "tasks_on_record": len(rec), "tasks_now": len(now),
    "identical": len(same),
    "differing_or_missing": sorted(set(rec) - set(same)),
    "not_on_record": sorted(set(now) - set(rec)),
}, indent=1))
PY
  python3 -c 'import json,sys; r = json.load(open(sys.argv[1]))
same, rec, now = r["identical"], r["tasks_on_record"], r["tasks_now"]
sys.exit(0 if same == rec == now else f"data-again: {same} of {rec} tasks as on record, {now} now ({sys.argv[1]})")' \
    "$REC/data-again.json"
}

train() {
  # data.jsonl's lines come in the order its tasks finished (--parallel), and
  # SFT draws its prompts by position in the file: sorted by task number, the
  # same data trains the same model.
  python3 -c 'import json,sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
sys.stdout.writelines(sorted(lines, key=lambda l: json.loads(l)["source"]))' \
    "$OUT/data.jsonl" > "$OUT/sft-data.jsonl"
  local name=${1:-sft} bare=${2:-false} stage=${3:-train} about
  if [ "$bare" = true ]; then
    about="imitating the kept
# correct syntheses, and \"The answer is X.\" (the gold answer) on the kept
# tasks without one: the first recipe (mixed)."
  else
    about="imitating the kept
# correct syntheses; tasks without one are left out."
  fi
  cat > "$OUT/$name.toml" <<EOF
# The synthesizer's SFT (issue 29): LoRA on the synthesis prompts of
# $OUT/sft-data.jsonl (data.jsonl by task number), $about
model = "smollm2-135m-instruct"
task = "$OUT/sft-data.jsonl"
algorithm = "sft"
sft_bare_answers = $bare
lora_rank = 8
lora_alpha = 16
lora_targets = "all"
lr = 2e-4
prompts_per_step = 4
max_new_tokens = 256
steps = ${SFT_STEPS:-100}
seed = 1
memory_cap = "4GiB"
checkpoint_every = 10
EOF
  cp "$OUT/$name.toml" "$REC/$name.toml"
  if ls -d "$OUT/$name"/step-* > /dev/null 2>&1; then
    timed "$stage" "$T" train --resume "$OUT/$name" --threads "$TH"
  else
    timed "$stage" "$T" train --config "$OUT/$name.toml" --threads "$TH" --out "$OUT/$name"
  fi
  cp "$OUT/$name/metrics.jsonl" "$REC/$name-metrics.jsonl"
}

export_model() { # [checkpoint gguf stage]
  local ck=${1:-sft} gguf=${2:-synth.gguf} stage=${3:-export}
  timed "$stage" "$T" export --checkpoint "$OUT/$ck" --out "$OUT/$gguf" --threads "$TH" \
    > "$REC/$stage-log.txt" 2>&1
}

serve_check() {
  # The loop's last step as a user takes it: the trained synthesizer loaded
  # beside the model by `tern serve --synthesizer-model`, one best-of-8
  # request that names it (GSM8K test's first question), and the same through
  # `tern bon`. The responses are the records (serve-response.json,
  # bon-response.json): which model synthesized, the candidates' answers and
  # the synthesis.
  local port=${PORT:-18129} q
  q=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["question"])' \
    ../shared/data/gsm8k_test.jsonl)
  "$T" serve --port "$port" --threads "$TH" --synthesizer-model "$OUT/synth.gguf" \
    > "$OUT/serve.log" 2>&1 &
  local pid=$!
  local up=0
  for _ in $(seq 300); do
    if curl -sf "http://127.0.0.1:$port/v1/models" > "$REC/serve-models.json"; then up=1; break; fi
    kill -0 "$pid" 2> /dev/null || break
    sleep 1
  done
  if [ "$up" != 1 ]; then
    kill "$pid" 2> /dev/null || true
    echo "tern serve did not come up; its log: $OUT/serve.log" >&2
    return 1
  fi
  python3 - "$port" "$q" > "$REC/serve-response.json" <<'PY' || { kill "$pid"; return 1; }
import json, sys, urllib.request
port, q = sys.argv[1], sys.argv[2]
body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": q}],
        "best_of": 8, "aggregate": "synthesize", "synthesizer_model": "synth",
        "temperature": 0.7, "seed": 1, "max_tokens": 256}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                             data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
print(json.dumps({"request": body, "response": json.load(urllib.request.urlopen(req, timeout=1800))}, indent=1))
PY
  kill "$pid"
  wait "$pid" 2> /dev/null || true
  local bon=(bon --prompt "$q" -n 8 --temperature 0.7 --seed 1 --max-tokens 256
    --aggregate synthesize --synthesizer-model "$OUT/synth.gguf" --threads "$TH" --json)
  "$T" "${bon[@]}" | python3 -c 'import json,sys
print(json.dumps({"command": ["tern"] + sys.argv[1:], "response": json.load(sys.stdin)}, indent=1))' \
    "${bon[@]}" > "$REC/bon-response.json"
}

compare() { # stage task limit records
  # With the mixed synthesizer exported, it is a fifth strategy over the same
  # candidates, and the call's wall time is filed as STAGE+mixed.
  local strategies=$STRATEGIES stage=$1 syn=(--synthesizer "trained=$OUT/synth.gguf")
  if [ -f "$MIXED" ]; then
    strategies+=",synthesize@8:with=mixed"
    syn+=(--synthesizer "mixed=$MIXED")
    stage+="+mixed"
  fi
  timed "$stage" "$T" eval --task "$2" --limit "$3" --strategy "$strategies" \
    "${syn[@]}" --threads "$TH" --parallel 4 --records "$4" --json > "$EVAL/$stage.json"
}

adaptive() {
  timed adaptive "$T" eval --task "arithmetic:count=${ADAPTIVE_TASKS:-400},seed=29,difficulty=1+2+3+4,ops=add+sub+word" \
    --limit "${ADAPTIVE_TASKS:-400}" --strategy "majority@8,adaptive@8,adaptive@8:wave=1,single,length@auto" \
    --threads "$TH" --parallel 4 --records "$EVAL/adaptive.jsonl" --json > "$EVAL/adaptive.json"
  "$T" eval --task "arithmetic:count=${ADAPTIVE_TASKS:-400},seed=29,difficulty=1+2+3+4,ops=add+sub+word" \
    --limit "${ADAPTIVE_TASKS:-400}" --strategy "majority@8,adaptive@8,adaptive@8:wave=1,single,length@auto" \
    --records "$EVAL/adaptive.jsonl" --report --by-difficulty > "$EVAL/adaptive-by-difficulty.txt"
  "$T" eval --task "arithmetic:count=${ADAPTIVE_TASKS:-400},seed=29,difficulty=1+2+3+4,ops=add+sub+word" \
    --limit "${ADAPTIVE_TASKS:-400}" --strategy "majority@8,adaptive@8,adaptive@8:wave=1,single,length@auto" \
    --records "$EVAL/adaptive.jsonl" --report --by-difficulty --json > "$EVAL/adaptive-by-difficulty.json"
}

adaptive_sweep() {
  # Adaptive width's stopping confidence swept over the adaptive stage's own
  # samples (same tasks and seeds, so majority@8's records are reused and
  # each task's 8 candidates are sampled again to the same tokens): with no
  # rival answer 2 agreeing samples stop it at 0.8 and 3 at 0.9, where the
  # default 0.95 needs 4.
  local task="arithmetic:count=${ADAPTIVE_TASKS:-400},seed=29,difficulty=1+2+3+4,ops=add+sub+word"
  local sweep="majority@8,adaptive@8:confidence=0.8,adaptive@8:wave=1:confidence=0.8,adaptive@8:confidence=0.9,adaptive@8:wave=1:confidence=0.9"
  timed adaptive-sweep "$T" eval --task "$task" --limit "${ADAPTIVE_TASKS:-400}" --strategy "$sweep" \
    --threads "$TH" --parallel 4 --records "$EVAL/adaptive.jsonl" --json > "$EVAL/adaptive-sweep.json"
  "$T" eval --task "$task" --limit "${ADAPTIVE_TASKS:-400}" --strategy "$sweep" \
    --records "$EVAL/adaptive.jsonl" --report --by-difficulty > "$EVAL/adaptive-sweep-by-difficulty.txt"
  "$T" eval --task "$task" --limit "${ADAPTIVE_TASKS:-400}" --strategy "$sweep" \
    --records "$EVAL/adaptive.jsonl" --report --by-difficulty --json > "$EVAL/adaptive-sweep-by-difficulty.json"
}

case "${1:-}" in
  data) data ;;
  train) train ;;
  export) export_model ;;
  serve) timed serve serve_check ;;
  data-again) data_again ;;
  train-mixed) train sft-mixed true train-mixed ;;
  export-mixed) export_model sft-mixed synth-mixed.gguf export-mixed ;;
  eval-story-mixed)
    [ -f "$MIXED" ] || { echo "no $MIXED: run train-mixed and export-mixed first" >&2; exit 1; }
    compare eval-story "$STORY_HELD_OUT" "${STORY_TASKS:-300}" "$EVAL/story.jsonl" ;;
  eval-story) compare eval-story "$STORY_HELD_OUT" "${STORY_TASKS:-300}" "$EVAL/story.jsonl" ;;
  eval-gsm8k) compare eval-gsm8k ../shared/data/gsm8k_test.jsonl "${GSM8K_TASKS:-1319}" "$EVAL/gsm8k.jsonl" ;;
  adaptive) adaptive ;;
  adaptive-sweep) adaptive_sweep ;;
  all)
    data; train; export_model
    timed serve serve_check
    compare eval-story "$STORY_HELD_OUT" "${STORY_TASKS:-300}" "$EVAL/story.jsonl"
    adaptive
    adaptive_sweep
    compare eval-gsm8k ../shared/data/gsm8k_test.jsonl "${GSM8K_TASKS:-1319}" "$EVAL/gsm8k.jsonl" ;;
  *) sed -n '2,35p' "$0"; exit 2 ;;
esac
