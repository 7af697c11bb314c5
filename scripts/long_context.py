#!/usr/bin/env python3
"""Peak memory of `tern serve` answering one long conversation (issue 58).

Starts `target/release/tern serve` on MODEL with `--kv-dtype DTYPE`, sends one
chat request whose conversation is about 16k tokens (the GPL, twice, then
part of it again, as three user turns), waits for 16 new tokens, and records
the server's peak resident memory (VmHWM of its process), the request's
times and the KV bytes it held. One JSON line per run is appended to
--out; `scripts/long_context.py --table FILE` prints the Markdown table
docs/MODELS.md shows.

  scripts/long_context.py --model qwen2.5-coder-1.5b-instruct --kv-dtype f16 \\
      --out records/models58/long-context.jsonl
"""
import argparse
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
GPL = ROOT.parent / "shared/reference/smollm2/gpl-3.txt"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_peak(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def conversation():
    gpl = GPL.read_text(encoding="utf-8")
    return [
        {"role": "system", "content": "You are a careful reader of licenses."},
        {"role": "user", "content": "Read this license.\n\n" + gpl},
        {"role": "assistant", "content": "I have read it."},
        {"role": "user", "content": "Here it is again, check it is the same.\n\n" + gpl},
        {"role": "assistant", "content": "It is the same text."},
        {"role": "user", "content": gpl[: len(gpl) // 6] + "\n\nIn one sentence: what is this license about?"},
    ]


def run(args):
    port = free_port()
    log = open(f"/tmp/long-context-{port}.log", "w")
    cmd = [str(ROOT / "target/release/tern"), "serve", "--model", args.model,
           "--kv-dtype", args.kv_dtype, "--port", str(port), "--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"tern serve did not start: see {log.name}")
                time.sleep(0.5)
        idle = rss_peak(proc.pid)
        started = time.time()
        body = post(f"http://127.0.0.1:{port}/v1/chat/completions", {
            "model": args.model, "messages": conversation(), "max_tokens": 16,
            "temperature": 0}, timeout=7200)
        seconds = time.time() - started
        record = {
            "model": args.model, "kv_dtype": args.kv_dtype, "threads": args.threads,
            "prompt_tokens": body["usage"]["prompt_tokens"],
            "completion_tokens": body["usage"]["completion_tokens"],
            "seconds": round(seconds, 1),
            "peak_rss_bytes": rss_peak(proc.pid), "rss_after_load_bytes": idle,
            "kv_bytes": body.get("tern", {}).get("kv_bytes"),
            "answer": body["choices"][0]["message"]["content"],
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["scripts/long_context.py", "--model", args.model,
                                 "--kv-dtype", args.kv_dtype, "--threads", str(args.threads)]),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record))


def table(path):
    print("| model | KV storage | prompt tokens | peak RSS of `tern serve` | RSS after load | KV held | wall (prefill + 16 tokens) |")
    print("|---|---|---|---|---|---|---|")
    for line in open(path):
        r = json.loads(line)
        kv = f"{r['kv_bytes'] / 2**20:.0f} MiB" if r.get("kv_bytes") else "-"
        print(f"| {r['model']} | {r['kv_dtype']} | {r['prompt_tokens']:,} | "
              f"{r['peak_rss_bytes'] / 2**30:.2f} GiB | {r['rss_after_load_bytes'] / 2**30:.2f} GiB | "
              f"{kv} | {r['seconds']:.0f} s |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--kv-dtype", default="f16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "records/models58/long-context.jsonl"))
    p.add_argument("--table", metavar="FILE", help="print the table of FILE and exit")
    args = p.parse_args()
    if args.table:
        table(args.table)
        return
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run(args)


if __name__ == "__main__":
    sys.exit(main())
