#!/usr/bin/env python3
"""How many concurrent long conversations one KV budget admits, per KV policy.

For each policy (default `full` and `snapkv:budget=256`) this script starts its
own `tern serve` with the same `--kv-memory` (default 1GiB), sends `--requests`
(default 64) concurrent streaming chat requests at once, each with a distinct
prompt of about `--prompt-tokens` (default 2000) tokens and max_tokens 64,
then polls `/metrics` and records the peak of `tern_requests_running`
(admitted) and `tern_requests_waiting` while requests wait. Admission is
decided by KV reservation as requests arrive, so there is no need to wait for
64 prefills of 2k tokens: polling stops once every request is counted as
running or waiting (or after `--observe` seconds, default 30; the engine
updates these gauges after each forward step, which can take seconds), then
every connection is closed (the server cancels them) and the server is
stopped (SIGTERM, SIGKILL after 10 s).

`--max-running` and `--max-queue` are set above `--requests`, so KV memory is
the only limit. If nothing waited, the policy admitted every request sent
and the figure is a lower bound (marked `>=`; send more with `--requests`).

A setting is a policy spec, optionally with a cache storage type after `@`
(`snapkv:budget=256@q8_0`; the server's `--kv-dtype`, f16 by default). A
policy named without a budget (`snapkv@q4_0`) is run once per `--removed`
percentage, with the budget that removes that share of the prompt's entries
(ceil(prompt tokens x (100 - removed) / 100), as `tern kv-eval --tasks ruler`
sizes it).

Usage (from the repository root, after `cargo build --release`):

    python3 scripts/capacity.py [--kv-memory 1GiB] [--policy full --policy snapkv:budget=256] [--json]
    python3 scripts/capacity.py --prompt-tokens 8000 --requests 200 --removed 75,90 \
        --policy full@f32 --policy full@f16 --policy snapkv@q8_0 --out records.jsonl

Needs the `openai` package (for its HTTP client, httpx or httpx2). Takes about
a minute on 2 cores; everything it starts is on 127.0.0.1 and is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:  # openai < 3 depends on httpx; later versions on its fork httpx2.
    import httpx
except ImportError:  # pragma: no cover
    import httpx2 as httpx  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BINARY = ROOT / "target" / "release" / "tern"
DEFAULT_MODEL = "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"

WORDS = (
    "river stone lantern harbor meadow copper violet thunder orchard falcon ember quiet "
    "silver garden winter compass marble willow canyon harvest beacon feather glacier "
    "saddle timber crystal shadow pepper island candle mirror velvet tunnel ribbon "
    "morning anchor basket circle dragon engine forest gentle hollow jungle kettle "
    "ladder mountain needle ocean pocket rabbit signal travel valley window yellow"
).split()


# --- the prompt ----------------------------------------------------------------------


def count_tokens(binary: Path, model: str, text: str) -> int:
    """Tokens of `text` by the model's own tokenizer (`tern tokenize --json`)."""
    out = subprocess.run(
        [str(binary), "tokenize", "--model", model, "--json", "--no-parse-special"],
        input=text, capture_output=True, text=True, cwd=ROOT, check=True, timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["count"]


def filler(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    sentences, words = [], 0
    while words < n_words:
        k = rng.randint(6, 12)
        s = " ".join(rng.choice(WORDS) for _ in range(k))
        sentences.append(s.capitalize() + ".")
        words += k
    return " ".join(sentences)


def build_prompts(binary: Path, model: str, count: int, target: int) -> tuple[list[str], int]:
    """`count` distinct prompts of about `target` tokens each (and the measured size of one)."""
    n_words = target
    for _ in range(4):  # converge words-per-token on the real tokenizer
        tokens = count_tokens(binary, model, filler(n_words, 0))
        if abs(tokens - target) <= target * 0.02:
            break
        n_words = max(1, round(n_words * target / tokens))
    prompts = [
        f"Conversation {i}. Summarise these notes in one line. " + filler(n_words, i + 1)
        for i in range(count)
    ]
    return prompts, count_tokens(binary, model, prompts[0])


# --- the server ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`tern serve` on 127.0.0.1 with a KV policy; a context manager."""

    def __init__(self, args, policy: str, dtype: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            str(args.binary), "serve",
            "--model", args.model,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--kv-memory", args.kv_memory,
            "--kv-policy", policy,
            "--kv-dtype", dtype,
            "--max-running", str(args.requests * 2),
            "--max-queue", str(args.requests * 2),
            "--max-connections", str(args.requests * 2 + 16),
        ]
        self.log = tempfile.NamedTemporaryFile(prefix="tern-capacity-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tern serve exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tern serve not healthy after 120 s: {self.tail()}")
            time.sleep(0.25)

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-2000:]


def metrics(url: str) -> dict[str, float]:
    """The server's gauges; empty when it is too busy to answer in time (a
    few hundred 8k-token requests arriving at once keep 2 cores busy)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.TransportError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)$", line)
        if m and not line.startswith("#"):
            out[m.group(1)] = float(m.group(2))
    return out


# --- one measurement -------------------------------------------------------------------


async def hold_stream(client, model: str, prompt: str, max_tokens: int, opened: list) -> None:
    """Opens one streaming chat and reads it until cancelled."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "stream": True,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        opened.append(r.status_code)
        async for _ in r.aiter_lines():
            pass


async def measure(url: str, prompts: list[str], args) -> dict:
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0, read=None), limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        opened: list[int] = []
        tasks = [asyncio.create_task(hold_stream(client, model, p, args.max_tokens, opened)) for p in prompts]
        peak = {"running": 0, "waiting": 0, "reserved": 0.0}
        peak_while_waiting = None
        start = time.monotonic()
        samples = settled = 0
        last: dict[str, float] = {}
        # The engine publishes its gauges after each forward step, and a step
        # that prefills a chunk of a 2k-token prompt can take seconds on a busy
        # machine: poll until every request is seen running or waiting on a few
        # consecutive samples (nothing finishes that fast), or until --observe.
        while time.monotonic() - start < args.observe and settled < 3:
            await asyncio.sleep(0.2)
            m = await asyncio.to_thread(metrics, url)
            if not m:
                continue
            last = m
            samples += 1
            running, waiting = int(m.get("tern_requests_running", 0)), int(m.get("tern_requests_waiting", 0))
            settled = settled + 1 if running + waiting >= len(prompts) else 0
            if running > peak["running"]:
                peak = {"running": running, "waiting": waiting, "reserved": m.get("tern_kv_reserved_bytes", 0)}
            if waiting > 0 and (peak_while_waiting is None or running > peak_while_waiting["running"]):
                peak_while_waiting = {"running": running, "waiting": waiting,
                                      "reserved": m.get("tern_kv_reserved_bytes", 0)}
        kv_memory = last.get("tern_kv_memory_bytes", 0)
        for t in tasks:
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [d for d in done if isinstance(d, Exception) and not isinstance(d, asyncio.CancelledError)]
    statuses = sorted(set(opened))
    limited = peak_while_waiting is not None
    best = peak_while_waiting if limited else peak
    return {
        "admitted": best["running"],
        "waiting": best["waiting"],
        "limited_by_kv": limited,
        "kv_reserved_bytes": int(best["reserved"]),
        "kv_memory_bytes": int(kv_memory),
        "reserved_per_request": int(best["reserved"] / best["running"]) if best["running"] else None,
        "http_statuses": statuses,
        "client_errors": len(failed),
        "metric_samples": samples,
        "observed_s": round(time.monotonic() - start, 1),
    }


async def settle(url: str, timeout: float = 15.0) -> int:
    """Waits for the server to notice the hang-ups; returns tern_requests_running left."""
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.to_thread(metrics, url) or {"tern_requests_running": 1}
        if m.get("tern_requests_running", 0) == 0 and m.get("tern_requests_waiting", 0) == 0:
            return 0
        if time.monotonic() > deadline:
            return int(m.get("tern_requests_running", 0))
        await asyncio.sleep(0.2)


def settings(args, prompt_tokens: int) -> list[tuple[str, str, int | None]]:
    """(policy spec, storage type, removed %) for every setting asked for."""
    out = []
    for item in args.policy:
        spec, _, dtype = item.partition("@")
        dtype = dtype or "f16"
        name = spec.split(":", 1)[0]
        if name == "full" or "budget=" in spec or not args.removed:
            out.append((spec, dtype, None))
            continue
        for removed in args.removed:
            budget = -(-prompt_tokens * (100 - removed) // 100)
            sep = "," if ":" in spec else ":"
            out.append((f"{spec}{sep}budget={budget}", dtype, removed))
    return out


def run(args) -> dict:
    t0 = time.monotonic()
    prompts, prompt_tokens = build_prompts(args.binary, args.model, args.requests, args.prompt_tokens)
    rows = []
    out = open(args.out, "a") if args.out else None
    for policy, dtype, removed in settings(args, prompt_tokens):
        with Server(args, policy, dtype) as server:
            row = asyncio.run(measure(server.url, prompts, args))
            row["left_running_after_cancel"] = asyncio.run(settle(server.url))
        row.update(model=args.model, policy=policy, kv_dtype=dtype, removed=removed, kv_memory=args.kv_memory,
                   prompt_tokens=prompt_tokens, max_tokens=args.max_tokens, requests=args.requests)
        per = row["reserved_per_request"]
        row["conversations_per_gib"] = round(2**30 / per, 2) if per else None
        rows.append(row)
        print(f"{policy}@{dtype}: admitted {row['admitted']} ({'KV-limited' if row['limited_by_kv'] else 'not limited'})",
              file=sys.stderr, flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    if out:
        out.close()
    base_row = next((r for r in rows if r["policy"] == "full" and r["kv_dtype"] == "f32"),
                    next((r for r in rows if r["policy"] == "full"), rows[0]))
    base = base_row["admitted"]
    for r in rows:
        r["ratio_vs_full"] = round(r["admitted"] / base, 2) if base else None
    return {
        "requests": args.requests,
        "prompt_tokens": prompt_tokens,
        "max_tokens": args.max_tokens,
        "seconds": round(time.monotonic() - t0, 1),
        "policies": rows,
    }


def print_table(r: dict) -> None:
    observed = ", ".join(f"{p['observed_s']:.0f}" for p in r["policies"])
    print(f"{r['requests']} concurrent streaming chats, prompt ~{r['prompt_tokens']} tokens "
          f"(+ chat template), max_tokens {r['max_tokens']}, observed {observed} s")
    print()
    print(f"{'policy':<32} {'dtype':>5} {'kv_memory':>9} {'admitted':>9} {'waiting':>8} {'MiB/request':>12} {'ratio':>6}")
    for p in r["policies"]:
        admitted = ("" if p["limited_by_kv"] else ">=") + str(p["admitted"])
        per = p["reserved_per_request"]
        per_s = f"{per / 2**20:.1f}" if per else "-"
        print(f"{p['policy']:<32} {p['kv_dtype']:>5} {p['kv_memory']:>9} {admitted:>9} {p['waiting']:>8} {per_s:>12} "
              f"{p['ratio_vs_full']:>5}x")
    notes = [p for p in r["policies"] if p["client_errors"] or p["http_statuses"] not in ([], [200])]
    for p in notes:
        print(f"note: {p['policy']}: HTTP statuses {p['http_statuses']}, client errors {p['client_errors']}")
    stuck = [p for p in r["policies"] if p["left_running_after_cancel"]]
    for p in stuck:
        print(f"warning: {p['policy']}: {p['left_running_after_cancel']} requests still running after cancel")
    print(f"\n({r['seconds']:.0f} s in all)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", type=Path, default=DEFAULT_BINARY, help="the tern binary")
    p.add_argument("--model", default=DEFAULT_MODEL, help="GGUF path (relative to the repo root) or name")
    p.add_argument("--kv-memory", default="1GiB", help="--kv-memory of every server")
    p.add_argument("--policy", action="append", help="KV policy spec (repeatable; default full and snapkv:budget=256)")
    p.add_argument("--requests", type=int, default=64, help="concurrent requests sent")
    p.add_argument("--prompt-tokens", type=int, default=2000, help="prompt size of each request")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--observe", type=float, default=30.0,
                   help="most seconds to poll /metrics per policy (it stops once every request is accounted for)")
    p.add_argument("--removed", type=lambda v: [int(x) for x in v.split(",")], default=[],
                   help="percentages of the prompt's entries removed, for policies named without a budget (e.g. 75,90)")
    p.add_argument("--out", help="append one JSON record per setting to this file as each finishes")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args()
    args.policy = args.policy or ["full", "snapkv:budget=256"]
    if not args.binary.exists():
        sys.exit(f"error: {args.binary} is missing: run `cargo build --release`")
    if not (ROOT / args.model).exists() and "/" in args.model:
        subprocess.run([str(args.binary), "pull"], cwd=ROOT, check=True)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
