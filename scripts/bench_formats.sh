#!/usr/bin/env bash
# Speed per weight format against llama.cpp: SmolLM2-135M requantized by
# `tern quantize` to q4_0, q4_k_m, q6_k and q8_0, then Gemma 3 270M Q4_K_M,
# each measured by `tern bench --backends llama-cpp,tern` (backends
# interleaved per repetition, each in its own process, medians of 3).
# Usage: scripts/bench_formats.sh OUT_DIR   (writes one JSON per model there)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/bench_formats.sh OUT_DIR}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tern=./target/release/tern
models=()
for t in q4_0 q4_k_m q6_k q8_0; do
  $tern quantize --model models/cache/SmolLM2-135M-Instruct.Q4_1.gguf --out "$tmp/smollm2-$t.gguf" --type $t
  models+=("$tmp/smollm2-$t.gguf")
done
models+=(models/cache/gemma-3-270m-q4_k_m.gguf)
for m in "${models[@]}"; do
  $tern bench --model "$m" --threads 2 --reps 3 --backends llama-cpp,tern --depths 0 --json \
    > "$out/$(basename "$m" .gguf).json"
done
