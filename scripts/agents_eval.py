#!/usr/bin/env python3
"""Agents on a real model: the OpenAI Agents SDK (`openai-agents`), unmodified,
against an OpenAI-compatible server (`tern serve`, or a native llama-server),
on questions the model can only answer through its function tools.

The tools return values no model can know (a made-up price list and made-up
exchange rates), so a right answer means the agent called the right tools,
received their results and used them. Each question's expected number is
computed from the same tables; an answer is right when its text holds that
number (to the cent, or 0.1% for large values).

Each run writes one JSONL record per question: the question, the tool calls
made (name, arguments, result), the final answer, the expected value, right
or wrong, and, for a wrong answer, where it failed:
  - `server-parsing`: the final text holds a whole call to a declared tool
    that the server returned as text instead of a tool call;
  - `cut-call`: the final text holds a call the model did not finish (cut by
    max_tokens, e.g. a number whose digits ran on);
  - `no-tool-call`: the model answered without calling a tool it needed;
  - `model-answer`: tools were called, but the answer is not the number
    (wrong arguments, wrong arithmetic, or the result not used);
  - `max-turns`: the model kept calling tools after their results came
    back, until the SDK's turn limit;
  - `error`: the run raised otherwise (the message is recorded).

Usage (the server is started and stopped by the script):
  python3 scripts/agents_eval.py --server tern --model qwen2.5-coder-1.5b-instruct \\
      --out records/agents58/qwen2.5-coder-1.5b-instruct.tern.jsonl
  python3 scripts/agents_eval.py --server llama --llama-server /work/llama.cpp/build/bin/llama-server \\
      --model qwen2.5-coder-1.5b-instruct --out records/agents58/qwen2.5-coder-1.5b-instruct.llama-server.jsonl
Add `--limit N` for the first N questions. `--protocol v2` runs the second
question set, its tools and instructions (records/agents58v2/PROTOCOL.md,
fixed before its runs); the default, v1, is the first set as it was run. `scripts/agents_table.py` turns the
records into the table in records/agents58/TABLE.md. `--log PATH` also keeps
each chat request's exchange (JSONL, one line per request: the question, the
turn, the message that was new in the request, the reply's message and finish
reason, and the token counts), where a wrong answer's cause is read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GGUF = {
    "qwen2.5-coder-0.5b-instruct": ROOT / "models/cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b-instruct": ROOT / "models/cache/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "smollm2-135m-instruct": ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
}

# Made-up tables: the model cannot know these values.
PRICES = {
    "widget": 37.25,
    "gadget": 18.40,
    "sprocket": 4.75,
    "gizmo": 129.99,
    "doohickey": 2.35,
    "flange": 11.60,
}
RATES = {("USD", "EUR"): 0.8731, ("USD", "GBP"): 0.7412, ("USD", "JPY"): 151.37,
         ("USD", "CHF"): 0.8864}  # CHF: v2 only
# v2's tables (records/agents58v2/PROTOCOL.md).
STOCK = {"widget": 86, "gadget": 40, "sprocket": 214, "gizmo": 7, "doohickey": 530, "flange": 63}
SHIPPING = {"canada": 14.85, "mexico": 9.40, "germany": 21.30, "japan": 27.65}

# (question, expected number)
# The two-step questions name their steps: asked plainly ("How much do 12
# widgets cost?"), the 1.5B writes the lookup nested inside the arithmetic
# call (`{"name": "multiply", "arguments": {"a": 12, "b": lookup_price("widgets")}}`),
# which no tool API can run.
QUESTIONS: list[tuple[str, float]] = [
    ("What is the price of one sprocket?", PRICES["sprocket"]),
    ("How much does a gizmo cost?", PRICES["gizmo"]),
    ("Look up the price of a widget, then tell me what 12 widgets cost.", 12 * PRICES["widget"]),
    ("Look up the price of a flange, then tell me what 7 flanges cost altogether.", 7 * PRICES["flange"]),
    ("Look up the prices of a widget and of a gadget, then add them.", PRICES["widget"] + PRICES["gadget"]),
    ("Look up the prices of a gadget and a doohickey, then give me the total for one of each.",
     PRICES["gadget"] + PRICES["doohickey"]),
    ("What is today's exchange rate from USD to EUR?", RATES[("USD", "EUR")]),
    ("Get the USD to EUR exchange rate, then tell me how many euros I get for 100 US dollars.",
     100 * RATES[("USD", "EUR")]),
    ("Get the USD to JPY exchange rate, then convert 250 US dollars to yen.", 250 * RATES[("USD", "JPY")]),
    ("Look up the price of a gizmo, then tell me what 3 gizmos cost.", 3 * PRICES["gizmo"]),
    ("Look up the price of a doohickey, then tell me the price of 5 doohickeys.", 5 * PRICES["doohickey"]),
    ("Look up the price of a gizmo (in USD) and the USD to GBP rate, then give the gizmo's price in pounds.",
     PRICES["gizmo"] * RATES[("USD", "GBP")]),
]

INSTRUCTIONS = (
    "You are a shop assistant with tools. You do not know any price or exchange rate: get "
    "each one with lookup_price or exchange_rate before you use it. Do arithmetic with "
    "multiply and add, on the numbers the tools returned. Call one tool per reply; its "
    "arguments must be plain values you already have, never another tool call. When you have "
    "the result, answer in one short sentence that states the number."
)


# v2: written as a customer asks (no steps named), fixed before any run; see
# records/agents58v2/PROTOCOL.md for the mix and the shortest solutions.
QUESTIONS_V2: list[tuple[str, float]] = [
    ("How many sprockets are in stock right now?", STOCK["sprocket"]),
    ("How much is shipping to Canada?", SHIPPING["canada"]),
    ("What is the current exchange rate from US dollars to Swiss francs?", RATES[("USD", "CHF")]),
    ("What do 8 flanges cost?", 8 * PRICES["flange"]),
    ("How many euros would I get for 40 US dollars?", 40 * RATES[("USD", "EUR")]),
    ("I want to buy 4 gizmos. What is the total?", 4 * PRICES["gizmo"]),
    ("If I buy 15 widgets, how many widgets will be left in stock?", STOCK["widget"] - 15),
    ("How much does a gadget cost in euros?", PRICES["gadget"] * RATES[("USD", "EUR")]),
    ("What would one widget cost me with shipping to Mexico?", PRICES["widget"] + SHIPPING["mexico"]),
    ("How much do a gizmo and a doohickey cost together?", PRICES["gizmo"] + PRICES["doohickey"]),
    ("What is the total value of all the sprockets in stock?", STOCK["sprocket"] * PRICES["sprocket"]),
    ("What would 6 doohickeys cost including shipping to Canada?", 6 * PRICES["doohickey"] + SHIPPING["canada"]),
]

INSTRUCTIONS_V2 = (
    "You are a helpful assistant for a shop. You do not know the shop's prices, stock levels, "
    "shipping costs or exchange rates: get every such value by calling a tool, and never guess "
    "one. Call one tool at a time and wait for its result. Use the values the tools return, and "
    "do every calculation with the arithmetic tools. Once you have the value that answers the "
    "question, stop calling tools and answer in one short sentence that states it."
)


@dataclass(frozen=True)
class Protocol:
    """One fixed question set with the tools and instructions its agent gets."""

    questions: list[tuple[str, float]]
    instructions: str
    tools: tuple[str, ...]
    max_turns: int


PROTOCOLS = {
    "v1": Protocol(QUESTIONS, INSTRUCTIONS, ("lookup_price", "exchange_rate", "multiply", "add"), 6),
    "v2": Protocol(QUESTIONS_V2, INSTRUCTIONS_V2,
                   ("lookup_price", "stock_level", "shipping_cost", "exchange_rate", "multiply", "add",
                    "subtract"), 8),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(kind: str, model: str, llama_bin: str | None, log: Path, tern_bin: str | None = None):
    """Starts the server on a free port; yields its base URL."""
    port = free_port()
    gguf = GGUF[model]
    if kind == "tern":
        cmd = [tern_bin or str(ROOT / "target/release/tern"), "serve", "--model", str(gguf),
               "--host", "127.0.0.1", "--port", str(port), "--api-key", "k"]
    else:
        cmd = [llama_bin, "-m", str(gguf), "--jinja", "--host", "127.0.0.1", "--port", str(port),
               "--api-key", "k", "-c", "8192", "-t", "2"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx2 as httpx

        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                sys.exit(f"server exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                sys.exit("server not healthy")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def numbers(text: str) -> list[float]:
    out = []
    for m in re.findall(r"-?\d[\d,]*(?:\.\d+)?", text or ""):
        with contextlib.suppress(ValueError):
            out.append(float(m.replace(",", "")))
    return out


def is_right(answer: str, expected: float) -> bool:
    tol = max(0.006, abs(expected) * 0.001)
    return any(abs(n - expected) <= tol for n in numbers(answer))


# Every tool either protocol declares: a call to any of them left as text
# is a call the server should have taken.
TOOL_NAMES = ("lookup_price", "stock_level", "shipping_cost", "exchange_rate", "multiply", "add", "subtract")


def classify(rec: dict) -> str | None:
    """Where a wrong answer failed (None for a right one); see the module doc."""
    if rec["right"]:
        return None
    error = rec.get("error") or ""
    if error.startswith("MaxTurnsExceeded"):
        return "max-turns"
    if error:
        return "error"
    text = rec.get("answer") or ""
    if re.search(r'"name"\s*:\s*"(%s)"' % "|".join(TOOL_NAMES), text):
        # A whole call to a declared tool left as text is the server's
        # failure; a call cut off (by max_tokens) is the model's.
        # Any whole call among the objects in the text (one or several, with
        # braces doubled as some templates show them) counts.
        dec = json.JSONDecoder()
        for norm in (text, text.replace("{{", "{").replace("}}", "}")):
            i = norm.find("{")
            while i != -1:
                try:
                    body, end = dec.raw_decode(norm, i)
                except ValueError:
                    i = norm.find("{", i + 1)
                    continue
                if isinstance(body, dict) and body.get("name") in TOOL_NAMES:
                    return "server-parsing"
                i = norm.find("{", end)
        return "cut-call"
    if not rec["tool_calls"]:
        return "no-tool-call"
    return "model-answer"


def make_tools(calls: list[dict]) -> dict:
    """Every function tool either protocol declares, by name; each call it
    runs is appended to `calls` (name, arguments, result)."""
    from agents import function_tool

    @function_tool
    def lookup_price(item: str) -> str:
        """The price in US dollars of one unit of an item from the shop's catalog."""
        key = item.strip().lower().rstrip("s")
        result = f"{PRICES[key]:.2f}" if key in PRICES else f"unknown item: {item}"
        calls.append({"name": "lookup_price", "arguments": {"item": item}, "result": result})
        return result

    @function_tool
    def exchange_rate(from_currency: str, to_currency: str) -> str:
        """Today's exchange rate: units of to_currency for one unit of from_currency (ISO codes)."""
        rate = RATES.get((from_currency.strip().upper(), to_currency.strip().upper()))
        result = f"{rate}" if rate is not None else "no rate for that pair"
        calls.append({"name": "exchange_rate", "arguments": {"from_currency": from_currency,
                      "to_currency": to_currency}, "result": result})
        return result

    @function_tool
    def stock_level(item: str) -> str:
        """Units of an item in the shop's warehouse now."""
        key = item.strip().lower().rstrip("s")
        result = f"{STOCK[key]}" if key in STOCK else f"unknown item: {item}"
        calls.append({"name": "stock_level", "arguments": {"item": item}, "result": result})
        return result

    @function_tool
    def shipping_cost(country: str) -> str:
        """The flat shipping fee in US dollars for one order to a country."""
        key = country.strip().lower()
        result = f"{SHIPPING[key]:.2f}" if key in SHIPPING else f"no shipping to {country}"
        calls.append({"name": "shipping_cost", "arguments": {"country": country}, "result": result})
        return result

    @function_tool
    def multiply(a: float, b: float) -> str:
        """Multiplies two numbers."""
        result = f"{round(a * b, 4)}"
        calls.append({"name": "multiply", "arguments": {"a": a, "b": b}, "result": result})
        return result

    @function_tool
    def add(a: float, b: float) -> str:
        """Adds two numbers."""
        result = f"{round(a + b, 4)}"
        calls.append({"name": "add", "arguments": {"a": a, "b": b}, "result": result})
        return result

    @function_tool
    def subtract(a: float, b: float) -> str:
        """Subtracts b from a."""
        result = f"{round(a - b, 4)}"
        calls.append({"name": "subtract", "arguments": {"a": a, "b": b}, "result": result})
        return result

    return {t.name: t for t in (lookup_price, stock_level, shipping_cost, exchange_rate, multiply, add,
                                subtract)}


async def ask(question: str, url: str, model_id: str, max_turns: int, protocol: Protocol, log=None) -> dict:
    import httpx2 as httpx
    import openai
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner

    calls: list[dict] = []
    exchanges: list[dict] = []

    async def keep(response) -> None:
        """One chat exchange, compactly: what was new in the request and the reply."""
        await response.aread()
        try:
            req = json.loads(response.request.content or b"null") or {}
            body = response.json()
        except ValueError:
            return
        choice = (body.get("choices") or [{}])[0]
        exchanges.append({
            "question": question,
            "turn": len(exchanges),
            "new_message": (req.get("messages") or [None])[-1],
            "reply": choice.get("message"),
            "finish_reason": choice.get("finish_reason"),
            "usage": body.get("usage"),
            "error": body.get("error"),
        })

    every = make_tools(calls)
    http = httpx.AsyncClient(timeout=600, event_hooks={"response": [keep]} if log else {})
    client = openai.AsyncOpenAI(api_key="k", base_url=f"{url}/v1", max_retries=0, timeout=600, http_client=http)
    agent = Agent(
        name="shop",
        instructions=protocol.instructions,
        tools=[every[name] for name in protocol.tools],
        model=OpenAIChatCompletionsModel(model=model_id, openai_client=client),
        # One call per turn: a model that writes two calls at once makes the
        # second (multiply) with a guessed price before the first returns.
        model_settings=ModelSettings(temperature=0, max_tokens=300, parallel_tool_calls=False),
    )
    started = time.monotonic()
    record: dict = {"question": question}
    try:
        result = await Runner.run(agent, question, max_turns=max_turns)
        record["answer"] = str(result.final_output)
    except Exception as e:  # noqa: BLE001 - a failed run is a record, not a crash
        record["answer"] = None
        record["error"] = f"{type(e).__name__}: {e}"[:500]
    await client.close()
    await http.aclose()
    if log:
        for e in exchanges:
            log.write(json.dumps(e) + "\n")
        log.flush()
    record["tool_calls"] = calls
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


def structured(url: str, model_id: str) -> dict:
    """One structured-output request through the SDK's `parse` helper."""
    import openai
    from pydantic import BaseModel

    class Order(BaseModel):
        item: str
        quantity: int
        express: bool

    client = openai.OpenAI(api_key="k", base_url=f"{url}/v1", max_retries=0, timeout=600)
    resp = client.chat.completions.parse(
        model=model_id,
        messages=[{"role": "user", "content": "Extract the order: I'd like 3 gizmos, shipped express please."}],
        response_format=Order,
        temperature=0,
        max_tokens=80,
    )
    parsed = resp.choices[0].message.parsed
    return {
        "request": "chat.completions.parse(response_format=Order{item: str, quantity: int, express: bool})",
        "content": resp.choices[0].message.content,
        "parsed": parsed.model_dump() if parsed else None,
        "right": bool(parsed and parsed.quantity == 3 and parsed.express and "gizmo" in parsed.item.lower()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=["tern", "llama"], default="tern")
    ap.add_argument("--model", choices=sorted(GGUF), required=True)
    ap.add_argument("--llama-server", help="path of a native llama-server binary (--server llama)")
    ap.add_argument("--tern", help="path of the tern binary (--server tern; default target/release/tern): "
                    "one built from a known commit, where the shared tree holds others' unfinished work")
    ap.add_argument("--out", required=True, help="JSONL records (one line per question)")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), default="v1",
                    help="question set, tools and instructions (v2: records/agents58v2/PROTOCOL.md)")
    ap.add_argument("--max-turns", type=int, default=None, help="the SDK's turn limit (default: the protocol's)")
    ap.add_argument("--log", help="also write each chat exchange here (JSONL)")
    ap.add_argument("--built-from", help="the commit the server binary was built from, kept in the run record")
    args = ap.parse_args()

    import signal

    from agents import set_tracing_disabled

    # SIGTERM stops the server too (the `finally` below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    set_tracing_disabled(True)  # no trace upload: no account here
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.mkdtemp(prefix="agents-eval-")) / "server.log"
    protocol = PROTOCOLS[args.protocol]
    max_turns = args.max_turns or protocol.max_turns
    qs = protocol.questions[: args.limit] if args.limit else protocol.questions
    started = time.time()
    right = 0
    exchanges = open(args.log, "w") if args.log else None  # noqa: SIM115 - closed below
    with server(args.server, args.model, args.llama_server, log, args.tern) as url, open(out, "w") as f:
        import httpx2 as httpx

        model_id = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"]
        for i, (q, expected) in enumerate(qs):
            rec = asyncio.run(ask(q, url, model_id, max_turns, protocol, exchanges))
            rec.update(index=i, model=args.model, server=args.server, expected=round(expected, 4))
            if args.protocol != "v1":  # v1's records predate the field
                rec["protocol"] = args.protocol
            rec["right"] = bool(rec.get("answer")) and is_right(rec["answer"], expected)
            if not rec["right"]:
                rec["failure"] = classify(rec)
            right += rec["right"]
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(f"[{i}] {'RIGHT' if rec['right'] else 'WRONG'} {rec['seconds']}s {q} -> {rec.get('answer')!r} "
                  f"calls={[(c['name'], c['arguments']) for c in rec['tool_calls']]} {rec.get('error', '')}",
                  flush=True)
        try:
            s = structured(url, model_id)
        except Exception as e:  # noqa: BLE001
            s = {"error": f"{type(e).__name__}: {e}"[:500], "right": False}
        s.update(model=args.model, server=args.server)
        out.with_suffix(".structured.json").write_text(json.dumps(s, indent=1) + "\n")
        print("structured:", s, flush=True)
    if exchanges:
        exchanges.close()
    if args.protocol != "v1":  # v1's runs predate the run record
        run_record(out, args, right, len(qs), started)
    print(f"{right}/{len(qs)} right")


def run_record(out: Path, args, right: int, total: int, started: float) -> None:
    """`OUT.run.json`: which binary served the run, when, and on how loaded a machine."""
    import hashlib
    import os

    binary = Path(args.tern or ROOT / "target/release/tern") if args.server == "tern" else Path(args.llama_server)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    out.with_suffix(".run.json").write_text(json.dumps({
        "protocol": args.protocol, "model": args.model, "server": args.server,
        "binary": str(binary), "binary_sha256": digest, "built_from": args.built_from,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_after": os.getloadavg()[0], "right": right, "questions": total,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
