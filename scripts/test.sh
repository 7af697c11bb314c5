#!/usr/bin/env bash
# Tern's test command: installs what a fresh machine lacks, fetches the real
# model, then runs the whole suite (`cargo test --release`). CI calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

# 1. System packages: a C toolchain for -sys crates, Python with pip for `tern pull`.
missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v unzip >/dev/null 2>&1 || true
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
command -v cargo >/dev/null 2>&1 || { echo "error: cargo not found: install Rust with rustup" >&2; exit 1; }

# 2. Build once in release (tests on the real model need optimised code).
say "building (release, -C target-cpu=native)"
cargo build --release --locked

# 3. The real model, verified by sha256 (idempotent).
say "fetching the model"
./target/release/tern pull

# 4. Style gates, then the suite.
say "cargo fmt --check / clippy"
cargo fmt --all -- --check
cargo clippy --release --locked --workspace --all-targets -- -D warnings

say "cargo test --release"
cargo test --release --locked --workspace
