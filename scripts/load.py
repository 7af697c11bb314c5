#!/usr/bin/env python3
"""Load test for a running `tern serve`: burst correctness and batching speed-up.

What it measures, in one run against one server:

  (a) burst: N (default 32) concurrent streaming chat requests with distinct
      prompts, 64 tokens each (temperature 0.8). Every one must finish without
      an error; the count of errors is reported (the exit status is 1 if any).
  (b) scaling: aggregate generated tokens/s of 1 request alone vs 8 concurrent
      requests (64 tokens each), measured as 1, 8, 1, 8 so that machine drift
      cancels, and the ratio tokens/s(8) / tokens/s(1). Tokens/s is generated
      tokens (from `usage`) over the wall time from sending the requests to the
      last one finishing, so it includes prefill and time to first token.

Requests send Tern's (and vLLM's) `ignore_eos` extension so that each makes
exactly `--tokens` tokens (`--no-ignore-eos` to let the model stop early);
tokens are always counted from the usage the server reports.

Usage (server already running, e.g. `target/release/tern serve --port 8080`):

    python3 scripts/load.py --url http://127.0.0.1:8080 [--api-key KEY] [--json]

Needs only the `openai` package (`python3 -m pip install openai`). Every request
has a timeout and the number of requests is fixed, so the script always ends.
It talks only to the given URL, which must be on this machine (loopback).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import openai

TOPICS = [
    "the sea", "a lighthouse", "mountains", "a small robot", "autumn leaves", "a busy market",
    "the moon", "a train journey", "a library", "honey bees", "a thunderstorm", "a garden",
    "an old clock", "a desert", "a violin", "winter mornings", "a fishing village", "comets",
    "a bakery", "the wind", "a river delta", "a chess game", "volcanoes", "a paper boat",
    "a city at night", "owls", "a snowman", "the first day of school", "a rainforest",
    "a kite", "glaciers", "a street musician", "tides", "a lost key", "fireflies", "a bridge",
]


@dataclass
class Result:
    """One request's outcome."""

    tokens: int = 0
    chunks: int = 0
    ttft_s: float | None = None
    seconds: float = 0.0
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Batch:
    """A group of requests sent together."""

    concurrency: int
    wall_s: float
    results: list[Result] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    @property
    def errors(self) -> int:
        return sum(r.error is not None for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def check_local(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    sys.exit(f"error: --url must point at this machine (localhost / 127.0.0.1 / ::1), got {url}")


async def one_request(client: openai.AsyncOpenAI, model: str, prompt: str, args) -> Result:
    """Streams one chat completion; counts chunks and reads usage from the last one."""
    res = Result()
    start = time.perf_counter()
    extra = {"ignore_eos": True} if args.ignore_eos else None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=args.tokens,
            temperature=args.temperature,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    res.chunks += 1
                    if res.ttft_s is None:
                        res.ttft_s = time.perf_counter() - start
                if choice.finish_reason is not None:
                    res.finish_reason = choice.finish_reason
            if chunk.usage is not None:
                res.tokens = chunk.usage.completion_tokens
        if res.tokens == 0:
            res.tokens = res.chunks  # no usage chunk: fall back to content chunks
        if res.finish_reason is None:
            res.error = "stream ended without a finish_reason"
    except Exception as e:  # noqa: BLE001 - every failure is counted, not raised
        res.error = f"{type(e).__name__}: {e}"
    res.seconds = time.perf_counter() - start
    return res


async def batch(client, model: str, prompts: list[str], args) -> Batch:
    start = time.perf_counter()
    results = await asyncio.gather(*(one_request(client, model, p, args) for p in prompts))
    return Batch(concurrency=len(prompts), wall_s=time.perf_counter() - start, results=list(results))


def prompts(n: int, offset: int) -> list[str]:
    return [
        f"Request {offset + i}: write a few sentences about {TOPICS[(offset + i) % len(TOPICS)]}."
        for i in range(n)
    ]


async def run(args) -> dict:
    client = openai.AsyncOpenAI(
        base_url=args.url.rstrip("/") + "/v1",
        api_key=args.api_key,
        max_retries=0,
        timeout=args.request_timeout,
    )
    try:
        model = args.model or (await client.models.list()).data[0].id
        await batch(client, model, prompts(1, 1000), args)  # warm-up, not counted

        burst = await batch(client, model, prompts(args.burst, 0), args)

        rounds: list[Batch] = []
        for i, conc in enumerate([1, args.concurrency, 1, args.concurrency]):
            rounds.append(await batch(client, model, prompts(conc, 100 + 10 * i), args))
    finally:
        await client.close()

    def rate(conc: int) -> float:
        bs = [b for b in rounds if b.concurrency == conc]
        return sum(b.tokens for b in bs) / sum(b.wall_s for b in bs)

    single, multi = rate(1), rate(args.concurrency)
    ttfts = [r.ttft_s for r in burst.results if r.ttft_s is not None]
    errors = [r.error for r in burst.results + [r for b in rounds for r in b.results] if r.error]
    return {
        "url": args.url,
        "model": model,
        "ignore_eos": args.ignore_eos,
        "max_tokens": args.tokens,
        "burst": {
            "requests": args.burst,
            "completed": sum(r.error is None for r in burst.results),
            "errors": burst.errors,
            "generated_tokens": burst.tokens,
            "full_length": sum(r.tokens == args.tokens for r in burst.results),
            "wall_s": round(burst.wall_s, 3),
            "tokens_per_s": round(burst.tokens_per_s, 1),
            "ttft_median_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "ttft_max_s": round(max(ttfts), 3) if ttfts else None,
        },
        "scaling": {
            "rounds": [
                {
                    "concurrency": b.concurrency,
                    "generated_tokens": b.tokens,
                    "wall_s": round(b.wall_s, 3),
                    "tokens_per_s": round(b.tokens_per_s, 1),
                    "errors": b.errors,
                }
                for b in rounds
            ],
            "tokens_per_s_1": round(single, 1),
            f"tokens_per_s_{args.concurrency}": round(multi, 1),
            "ratio": round(multi / single, 2) if single else None,
        },
        "errors": len(errors),
        "error_samples": errors[:5],
    }


def print_table(r: dict, conc: int) -> None:
    b = r["burst"]
    print(f"server {r['url']}  model {r['model']}  max_tokens {r['max_tokens']}  ignore_eos {r['ignore_eos']}")
    print()
    print(f"(a) burst: {b['requests']} concurrent streaming chats")
    print(f"    completed {b['completed']}/{b['requests']}, errors {b['errors']}, "
          f"full-length {b['full_length']}/{b['requests']}")
    print(f"    {b['generated_tokens']} tokens in {b['wall_s']:.2f} s = {b['tokens_per_s']:.1f} tok/s, "
          f"TTFT median {b['ttft_median_s']} s, max {b['ttft_max_s']} s")
    print()
    print("(b) scaling (interleaved 1, N, 1, N)")
    print(f"    {'concurrency':>11} {'tokens':>7} {'wall s':>8} {'tok/s':>8} {'errors':>6}")
    for row in r["scaling"]["rounds"]:
        print(f"    {row['concurrency']:>11} {row['generated_tokens']:>7} {row['wall_s']:>8.2f} "
              f"{row['tokens_per_s']:>8.1f} {row['errors']:>6}")
    s = r["scaling"]
    print(f"    aggregate tok/s: 1 -> {s['tokens_per_s_1']:.1f}, {conc} -> {s[f'tokens_per_s_{conc}']:.1f}, "
          f"ratio {s['ratio']}x")
    if r["errors"]:
        print(f"\n{r['errors']} request(s) failed, e.g.: {r['error_samples'][0]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (loopback only)")
    p.add_argument("--api-key", default="none", help="API key if the server has one")
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument("--burst", type=int, default=32, help="concurrent requests in (a)")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent requests in (b)")
    p.add_argument("--tokens", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests stop at end-of-sequence (tokens are counted either way)")
    p.add_argument("--request-timeout", type=float, default=180.0, help="seconds per request")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = p.parse_args()
    check_local(args.url)
    try:
        result = asyncio.run(asyncio.wait_for(run(args), args.timeout))
    except asyncio.TimeoutError:
        print(f"error: the run took longer than {args.timeout:.0f} s", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result, args.concurrency)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
