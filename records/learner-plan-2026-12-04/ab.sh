#!/bin/bash
# A/B of the learner's plan, CPU seconds per run (user + sys, /usr/bin/time):
# the start plan's choice (micro-batch 7, recompute) against each step's own
# plan, same step (seed 1's first), interleaved, three rounds.
cd "$(dirname "$0")/../../.."; mkdir -p runs/plan-ab
for round in 1 2 3; do
  for arm in auto old; do
    extra=""; [ $arm = old ] && extra="--recompute true --micro-batch 7"
    rm -rf runs/plan-ab/ab2-$arm-$round
    /usr/bin/time -f "%U %S %e" -o runs/plan-ab/ab2-$arm-$round.time ${TERN:-./target/release/tern} train \
      --config docs/records/learner-plan-2026-12-04/config.toml --threads 1 --seed 1 \
      --rollout-kv-policy rkv:budget=56,window=8,every=8 --correction sparse-rl --steps 1 $extra \
      --out runs/plan-ab/ab2-$arm-$round > runs/plan-ab/ab2-$arm-$round.txt 2>&1
  done
done
