#!/usr/bin/env bash
# Tern's test command: installs what a fresh machine lacks, fetches the real
# model, then runs the whole suite (`cargo test --release`). CI calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase says when it began (seconds since the start), so a slow CI run's
# log shows which phase took the time.
say() { printf '\n== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# 1. System packages: a C toolchain for -sys crates, cmake and libclang for
#    llama.cpp (the `llama-cpp` backend, built by default), Python with pip for
#    `tern pull` and the API suite, Chromium for the chat-page test, a font for
#    `tern plot`, bubblewrap for the code judge's sandbox, nginx and Redis
#    for the load-balancer and shared-store tests.
missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
# (bindgen wants libclang.so itself: libclang-cpp, which some images carry
# without it, matches a looser glob but does not do.)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang.so* >/dev/null 2>&1 || missing+=(libclang-dev)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# The code judge runs every candidate program inside bubblewrap (docs/SECURITY.md).
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# `tern plot` draws its labels with DejaVu Sans.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
# nginx in front of several `tern serve` replicas (tests/openai/test_nginx.py).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
# Redis as the replicas' shared Responses store (tests/openai/test_state_store.py).
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The spreadsheet judge's candidates use Debian's openpyxl, which the sandbox
# shows read-only under /usr/lib (solve/src/verify/harness/workbook.py).
[ -f /usr/lib/python3/dist-packages/openpyxl/__init__.py ] || missing+=(python3-openpyxl)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v unzip >/dev/null 2>&1 || true
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
command -v cargo >/dev/null 2>&1 || { echo "error: cargo not found: install Rust with rustup" >&2; exit 1; }

# 2. Build once in release (tests on the real model need optimised code).
say "building (release, -C target-cpu=x86-64-v3: AVX2 kernels, see .cargo/config.toml)"
cargo build --release --locked

# 3. The real model, verified by sha256 (idempotent).
say "fetching the model and the test vocabularies"
./target/release/tern pull smollm2-135m-instruct
# Gemma 3 270M: its SentencePiece vocabulary for the tokenizer checks (tests/spm.rs).
./target/release/tern pull gemma3-270m
# The Qwen2.5-Coder models, checked bit for bit against llama.cpp (tests/qwen.rs).
./target/release/tern pull qwen2.5-coder-0.5b-instruct
./target/release/tern pull qwen2.5-coder-1.5b-instruct
# Real Qwen and Llama 3 vocabularies for the tokenizer checks (tests/vocab.rs).
python3 scripts/fetch_vocab.py

# 4. Style gates, then the suite.
say "docs' tables against their records (scripts/tables.py)"
python3 scripts/tables.py --self-test
# Issue 60's HumanEval scripts: the choice rules mirrored from Rust, the offline harness.
python3 scripts/coderm60_table.py --self-test
python3 scripts/coderm60_exec.py --self-test
python3 scripts/tables.py --check
say "cargo fmt --check / clippy"
cargo fmt --all -- --check
cargo clippy --release --locked --workspace --all-targets -- -D warnings

say "cargo test --release"
cargo test --release --locked --workspace

# 5. The OpenAI-compatible server, driven by the official `openai` SDK.
say "OpenAI API suite (pytest tests/openai)"
# (openai-agents: a real agent framework as a client, tests/openai/test_agents.py;
# openpyxl: the client's own workbooks in tests/openai/test_spreadsheet.py)
if ! python3 -c 'import openai, pytest, agents, openpyxl' >/dev/null 2>&1; then
  # (a distribution's externally managed Python refuses the plain install)
  python3 -m pip install --quiet openai pytest openai-agents openpyxl \
    || python3 -m pip install --quiet --break-system-packages openai pytest openai-agents openpyxl
fi
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider tests/openai

# 6. Anthropic's Messages API (`/v1/messages`), driven by the official
#    `anthropic` SDK.
say "Anthropic API suite (pytest tests/anthropic)"
if ! python3 -c 'import anthropic' >/dev/null 2>&1; then
  python3 -m pip install --quiet anthropic \
    || python3 -m pip install --quiet --break-system-packages anthropic
fi
PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider tests/anthropic

# 7. The chat page (`GET /`) in headless Chromium: Debian's `chromium` (step 1),
#    driven by Playwright pointed at /usr/bin/chromium (never `playwright install`).
say "chat page UI test (scripts/ui_test.py)"
if ! python3 -c 'import playwright.sync_api' >/dev/null 2>&1; then
  python3 -m pip install --quiet playwright || python3 -m pip install --quiet --break-system-packages playwright
fi
python3 scripts/ui_test.py --check
say "done"
