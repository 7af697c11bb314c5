#!/bin/bash
# Issue 25's before and after: step 1 of learner-ab-f32's config under the
# learner as it was before the issue (commit 9ea5834, the f32 learner, its
# only one) and today's two learners, three interleaved rounds at two
# threads, other jobs paused. OLD and NEW are the two builds' binaries:
#   git worktree add ../old 9ea5834 && (cd ../old && cargo build --release --bin tern)
#   OLD=../old/target/release/tern NEW=target/release/tern PAUSE="pids" run.sh
set -u
cd "$(dirname "$0")/../../.."
OLD=${OLD:?the pre-issue build} NEW=${NEW:-target/release/tern}
OUT=${OUT:-runs/before-after} REC=${REC:-docs/records/learner-before-after-2026-12-05}
mkdir -p "$OUT" "$REC"
PIDS=${PAUSE:-}
if [ -n "$PIDS" ]; then
  echo "pause $(date -u +%FT%TZ) $PIDS" >> "$REC/pause.txt"
  kill -STOP $PIDS
  trap 'kill -CONT $PIDS; echo "resume $(date -u +%FT%TZ)" >> "$REC/pause.txt"' EXIT
fi
CFG=docs/records/learner-ab-f32/config.toml
for r in 1 2 3; do
  for l in old f32 gguf; do
    d=$OUT/r$r-$l; rm -rf "$d"
    if [ $l = old ]; then
      args=()
      bin=$OLD
    else
      args=(--learner-weights $l --recompute false)
      bin=$NEW
    fi
    /usr/bin/time -v -o "$REC/r$r-$l.time.txt" "$bin" train --config $CFG --steps 1 --threads 2 \
      --micro-batch 8 "${args[@]}" --out "$d" > "$OUT/r$r-$l.log" 2>&1
    cp "$d/metrics.jsonl" "$REC/r$r-$l.metrics.jsonl"
  done
done
