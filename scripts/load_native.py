#!/usr/bin/env python3
"""`scripts/load.py` against `tern serve` and native `llama-server -np N`, one
after the other on the same model, one record per server (issue 59).

For each server in turn: start it on a free loopback port with 2 threads
(Tern: `target/release/tern serve`; llama.cpp: `target/llama-native/bin/
llama-server` from `scripts/native_llama.sh`, Release, GGML_NATIVE=ON, with
`-np N` slots and `-c` = N slots x the per-slot context), wait for
`/v1/models`, run `scripts/load.py --json --burst B --concurrency C`
(streaming chats of 64 tokens with `ignore_eos`: (a) a burst of B at once,
(b) 1, C, 1, C concurrent, aggregate tokens/s), stop the server and write
`records/load59/<label>-<server>.json`: load.py's JSON plus the server's
command line, the date and the load average before and after.

  scripts/native_llama.sh        # once
  scripts/load_native.py qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TERN = ROOT / "target/release/tern"
NATIVE = Path(os.environ.get("TERN_LLAMA_SERVER", ROOT / "target/llama-native/bin/llama-server"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path(name: str) -> Path:
    p = Path(name)
    if p.exists():
        return p
    # `tern pull NAME` fetches it if missing and prints its path last.
    out = subprocess.run([str(TERN), "pull", name], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"error: cannot resolve model {name!r}: {out.stderr.strip()}")
    return ROOT / out.stdout.strip().splitlines()[-1]


def wait_ready(port: int, key: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: the server exited with status {proc.returncode} before it was ready")
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                         headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    proc.kill()
    sys.exit("error: the server was not ready in time")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="registry name or GGUF path")
    p.add_argument("--servers", default="tern,llama-native")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=8, help="llama-server -np")
    p.add_argument("--slot-context", type=int, default=1024, help="llama-server context per slot")
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--label", help="record name (default: the model's file stem)")
    p.add_argument("--out", default=str(ROOT / "records/load59"))
    args = p.parse_args()
    path = model_path(args.model)
    label = args.label or path.stem
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    key = "load59-key"
    for server in args.servers.split(","):
        port = free_port()
        if server == "tern":
            cmd = [str(TERN), "serve", "--model", str(path), "--host", "127.0.0.1",
                   "--port", str(port), "--threads", str(args.threads), "--api-key", key]
        elif server == "llama-native":
            if not NATIVE.exists():
                sys.exit(f"error: {NATIVE} is missing: run scripts/native_llama.sh first")
            cmd = [str(NATIVE), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
                   "-t", str(args.threads), "-np", str(args.slots),
                   "-c", str(args.slots * args.slot_context), "--jinja", "--api-key", key]
        else:
            sys.exit(f"error: unknown server {server!r} (tern, llama-native)")
        load_before = os.getloadavg()[0]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, key, proc)
            run = subprocess.run(
                [sys.executable, str(ROOT / "scripts/load.py"), "--url", f"http://127.0.0.1:{port}",
                 "--api-key", key, "--burst", str(args.burst), "--concurrency",
                 str(args.concurrency), "--json"],
                capture_output=True, text=True)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not run.stdout.strip():
            sys.exit(f"error: load.py printed nothing for {server}: {run.stderr.strip()[-500:]}")
        result = json.loads(run.stdout)
        record = {
            "server": server,
            "command": [c if c != str(path) else path.name for c in cmd],
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "load": result,
        }
        (out / f"{label}-{server}.json").write_text(json.dumps(record, indent=1) + "\n")
        b, s = result["burst"], result["scaling"]
        print(f"{server:13} burst {b['completed']}/{b['requests']} {b['tokens_per_s']} tok/s "
              f"TTFT median {b['ttft_median_s']} s | 1: {s['tokens_per_s_1']} tok/s, "
              f"{args.concurrency}: {s[f'tokens_per_s_{args.concurrency}']} tok/s "
              f"(ratio {s['ratio']}) | errors {result['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
