#!/usr/bin/env python3
"""Tern against a native llama.cpp, interleaved, one record per model (issue 59).

For each model, runs `tern bench --backends tern,llama-native,llama-cpp
--reps R --json` (each repetition of each backend in its own process,
interleaved backend by backend; llama-native is llama.cpp's own
llama-bench from `scripts/native_llama.sh`, Release, GGML_NATIVE=ON; the
in-process llama.cpp is the exactness reference and is kept beside it,
labelled) and writes records/native59/<label>.json: the bench's JSON
plus the command, the date, the load average before and after, the CPU's
instruction sets and the native build's BUILD.txt. `scripts/tables.py`
makes docs/BENCHMARKS.md's native table from these records.

  scripts/native_llama.sh      # once
  scripts/native_compare.py qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct
  scripts/native_compare.py --depths 4096 --also-policy snapkv:budget=512 \\
      --label qwen2.5-coder-1.5b-instruct-d4096 qwen2.5-coder-1.5b-instruct

A model is a registry name or a GGUF path; `--label` names the record
(default: the model's name or file stem).
"""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "records/native59"
TERN = ROOT / "target/release/tern"
BUILD = ROOT / "target/llama-native/BUILD.txt"
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile")


def load():
    return float(open("/proc/loadavg").read().split()[0])


def cpu_flags():
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in FLAGS if f in have]
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--depths", default="0")
    p.add_argument("--also-policy", action="append", default=[])
    p.add_argument("--backends", default="tern,llama-native,llama-cpp")
    p.add_argument("--label", help="record name (one model only)")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args()
    if a.label and len(a.models) != 1:
        sys.exit("native_compare.py: --label names one model's record")
    if "llama-native" in a.backends and not BUILD.exists():
        sys.exit("native_compare.py: no native llama.cpp; run scripts/native_llama.sh first")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for model in a.models:
        label = a.label or (pathlib.Path(model).stem if model.endswith(".gguf") else model)
        cmd = [str(TERN), "bench", "-m", model, "--backends", a.backends, "--reps", str(a.reps),
               "--depths", a.depths, "--threads", str(a.threads), "--json"]
        for pol in a.also_policy:
            cmd += ["--also-policy", pol]
        before = load()
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        print(f"{label}: {' '.join(cmd[1:])} (load {before})", file=sys.stderr, flush=True)
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"native_compare.py: {label}: {res.stderr.strip().splitlines()[-1:]}")
        bench = json.loads(res.stdout.strip().splitlines()[-1])
        record = {
            "label": label,
            "model": model,
            "command": "tern " + " ".join(cmd[1:]),
            "started": started,
            "load_before": before,
            "load_after": load(),
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
            "cpu_flags": cpu_flags(),
            "native_build": BUILD.read_text().splitlines() if BUILD.exists() else None,
            **bench,
        }
        (out / f"{label}.json").write_text(json.dumps(record, indent=1) + "\n")
        for r in bench["rows"]:
            pp = r.get("pp_tokens_per_s")
            print(f"  {r['backend']:<13} {r['kv_policy'].split(',')[0]:<8} depth {r['depth']:>5}  "
                  f"pp {pp or 0:7.1f}  tg {r['tg_tokens_per_s']:6.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
