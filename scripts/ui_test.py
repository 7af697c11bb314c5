#!/usr/bin/env python3
"""Headless browser test of the chat page that `tern serve` serves at `GET /`.

Starts `target/release/tern serve` on a free port with the real model, opens the
page in Debian's headless Chromium (driven by Playwright, which is pointed at
/usr/bin/chromium: no browser is ever downloaded) with
`?prompt=...&autosend=1&policy=streaming&budget=32&max_tokens=64`, waits for the
streamed reply to finish and checks what a person would see:

  * an assistant message with non-empty text,
  * the KV stats showing bytes held and bytes a full cache would hold,
  * a tokens/s figure above zero,
  * no error banner and no JavaScript error.

Then it opens the page again with best-of-3 (majority vote) and reasoning
effort `low` set from the query string, and checks that the whole reply
arrives with the notes under it: the candidates' answers and the one chosen,
and each candidate's reasoning cap (128 tokens for `low`).

Then structured output and tools, each set from the query string:

  * `?schema=` (an object with an enum field and an integer, no other keys):
    the reply is shown as a pretty-printed JSON block that parses and matches
    the schema;
  * a schema the server cannot enforce: its 400 is shown in the error banner
    with the server's message and the parameter it names;
  * `?tools=` with `tool_choice=required`: the reply is a tool-call card
    naming the function with its arguments; typing a result into the card
    and sending it back (tool choice set to `none` in the settings) sends the
    assistant's call and a `role: tool` message with the call's id, and a
    further text reply arrives with no error.

Usage:
  python3 scripts/ui_test.py --check                        # assertions only
  python3 scripts/ui_test.py --screenshot docs/img/chat.png # assertions + 1280x800 PNG
  python3 scripts/ui_test.py --url http://127.0.0.1:8080 --check   # against a running server

Exits 0 on success; otherwise prints one line `ui_test: FAIL: <reason>` and
exits 1. The whole run is bounded by --timeout seconds (default 120). The
server it started is always stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "target" / "release" / "tern"
MODEL = ROOT / "models" / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUERY = {
    "prompt": "Write a haiku about the sea",
    "autosend": "1",
    "policy": "streaming",
    "budget": "32",
    "kv_dtype": "q8_0",
    "max_tokens": "64",
}
BEST_OF_QUERY = {
    "prompt": "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "autosend": "1",
    "policy": "full",
    "best_of": "3",
    "aggregate": "majority",
    "effort": "low",
    "max_tokens": "176",
    "seed": "5",
}
# Settings a previous visit saved in the browser would carry over: each
# visit below sets the ones that matter.
PLAIN = {"autosend": "1", "policy": "full", "kv_dtype": "", "best_of": "1", "effort": "off"}
SCHEMA = {
    "type": "object",
    "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}, "apples": {"type": "integer"}},
    "required": ["color", "apples"],
    "additionalProperties": False,
}
SCHEMA_QUERY = {
    **PLAIN,
    "prompt": "What colour is the sky, and how many apples are in a bag of 4 apples? Answer in JSON.",
    "schema": json.dumps(SCHEMA),
    "max_tokens": "60",
    "seed": "3",
}
BAD_SCHEMA_QUERY = {**PLAIN, "prompt": "hi", "schema": json.dumps({"type": "strin"}), "max_tokens": "5"}
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}]
TOOLS_QUERY = {
    **PLAIN,
    "prompt": "What is the weather in Paris right now?",
    "format": "off",
    "tools": json.dumps(TOOLS),
    "tool_choice": "required",
    "max_tokens": "120",
    "seed": "2",
}
TOOL_RESULT = '{"temperature": 18, "sky": "clear"}'
IDLE_WITH_REPLY = "() => document.body.dataset.state === 'idle' && !!document.querySelector('.msg.assistant')"


class Fail(Exception):
    """A check failed; the message is the one-line reason."""


class Timeout(Fail):
    pass


def find_chromium(given: str | None) -> str:
    for cand in [given, os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")]:
        if cand and Path(cand).exists():
            return cand
    raise Fail("chromium not found: apt-get install -y chromium")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line(path: Path) -> str:
    try:
        lines = [l.strip() for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class Server:
    """`tern serve` on a free port, logging to a temporary file."""

    def __init__(self, deadline: float) -> None:
        if not BINARY.exists():
            raise Fail(f"{BINARY.relative_to(ROOT)} is missing: run cargo build --release")
        if not MODEL.exists():
            raise Fail(f"{MODEL.relative_to(ROOT)} is missing: run target/release/tern pull")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="tern-ui-test-", suffix=".log")[1])
        cmd = [str(BINARY), "serve", "--model", str(MODEL), "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.wait_healthy(deadline)

    def wait_healthy(self, deadline: float) -> None:
        while True:
            if self.proc.poll() is not None:
                raise Fail(f"tern serve exited with {self.proc.returncode}: {last_line(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise Timeout(f"tern serve did not answer /health with 200 in time: {last_line(self.log)}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        try:
            self.log.unlink()
        except OSError:
            pass


def run_browser(base: str, chromium: str, deadline: float, screenshot: Path | None, theme: str) -> str:
    try:
        from playwright.sync_api import Error as PwError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise Fail("python package playwright is missing: python3 -m pip install playwright (never `playwright install`)")

    def left_ms() -> float:
        left = deadline - time.monotonic()
        if left <= 1:
            raise Timeout("ran out of the time budget (--timeout) before the page finished")
        return left * 1000

    url = base + "/?" + urllib.parse.urlencode(QUERY, quote_via=urllib.parse.quote)
    js_errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            timeout=min(left_ms(), 60_000),
        )
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=theme, device_scale_factor=1)
            page = ctx.new_page()
            page.on("pageerror", lambda e: js_errors.append(str(e)))
            try:
                page.goto(url, wait_until="load", timeout=min(left_ms(), 30_000))
            except PwError as e:
                raise Fail(f"could not open the page: {str(e).splitlines()[0]}")
            try:
                page.wait_for_function(
                    "() => document.body.dataset.state === 'idle' && !!document.querySelector('.msg.assistant')",
                    timeout=left_ms(),
                    polling=100,
                )
            except PwError as e:
                msg = str(e).splitlines()[0]
                try:
                    state = page.evaluate("() => document.body && document.body.dataset.state")
                    err = page.evaluate("() => { const e = document.getElementById('error-text'); return e ? e.innerText : ''; }")
                except PwError:
                    state, err = "?", ""
                raise Timeout(f"reply did not finish (page state {state!r}{', error: ' + err.strip() if err else ''}): {msg}")

            info = page.evaluate(
                """() => {
                  const a = [...document.querySelectorAll('.msg.assistant')].pop();
                  const kv = document.getElementById('kv');
                  const err = document.getElementById('error');
                  return {
                    reply: a ? a.querySelector('.body').innerText : '',
                    done: !!(a && a.classList.contains('done')),
                    finish: a ? (a.dataset.finish || '') : '',
                    kvText: document.getElementById('kv-text').innerText,
                    held: kv.dataset.held || '', full: kv.dataset.full || '',
                    tps: document.getElementById('tps').innerText,
                    error: err.classList.contains('show') ? document.getElementById('error-text').innerText : '',
                    spec: document.getElementById('kv-spec').innerText,
                  };
                }"""
            )
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=False, animations="disabled", timeout=min(left_ms(), 30_000))
            best_of = best_of_visit(page, base, left_ms)
            requests: list[dict] = []
            page.on("request", lambda r: record_chat_request(r, requests))
            schema = schema_visit(page, base, left_ms)
            bad_schema = bad_schema_visit(page, base, left_ms)
            tools = tools_visit(page, base, left_ms, requests)
        finally:
            browser.close()

    one = lambda s: " ".join(str(s).split())  # noqa: E731
    check_best_of(best_of)
    check_schema(schema)
    check_bad_schema(bad_schema)
    check_tools(tools)
    if info["error"]:
        raise Fail(f"the page shows an error: {one(info['error'])}")
    if js_errors:
        raise Fail(f"JavaScript error on the page: {one(js_errors[0])}")
    reply = info["reply"].strip()
    if not reply or not info["done"]:
        raise Fail(f"no complete assistant reply (text {reply!r}, finish {info['finish']!r})")
    try:
        held, full = float(info["held"]), float(info["full"])
    except ValueError:
        raise Fail(f"KV stats show no held/full values: {one(info['kvText'])!r}")
    if not (held > 0 and full > 0 and held <= full) or "held" not in info["kvText"] or "full" not in info["kvText"]:
        raise Fail(f"KV stats look wrong: held={info['held']} full={info['full']} text={one(info['kvText'])!r}")
    try:
        tps = float(info["tps"])
    except ValueError:
        raise Fail(f"tokens/s is not a number: {info['tps']!r}")
    if not tps > 0:
        raise Fail(f"tokens/s is not above zero: {tps}")
    if not info["spec"].startswith("streaming:budget=32"):
        raise Fail(f"the server reports KV policy {info['spec']!r}, expected streaming:budget=32...")
    if not info["spec"].endswith("· q8_0"):
        raise Fail(f"the server reports storage {info['spec']!r}, expected the q8_0 the page asked for")
    if not held < full:
        raise Fail(f"a 32-token budget should hold less than a full cache: held={held} full={full}")
    return (f"reply {one(reply)[:60]!r}..., {tps} tok/s, {one(info['kvText'])}, {info['spec']}; "
            f"{best_of['bestOf']}; JSON {one(schema['json'])}; 400 banner {one(bad_schema['error'])[:80]!r}; "
            f"tool card {tools['card']['name']}({one(tools['card']['args'])}) -> {one(tools['reply'])[:50]!r}...")


def best_of_visit(page, base: str, left_ms) -> dict:
    """Opens the page with best-of-3 and effort `low`, waits for the reply,
    and returns what it shows."""
    from playwright.sync_api import Error as PwError

    url = base + "/?" + urllib.parse.urlencode(BEST_OF_QUERY, quote_via=urllib.parse.quote)
    try:
        page.goto(url, wait_until="load", timeout=min(left_ms(), 30_000))
        page.wait_for_function(
            "() => document.body.dataset.state === 'idle' && !!document.querySelector('.msg.assistant')",
            timeout=left_ms(),
            polling=100,
        )
    except PwError as e:
        raise Timeout(f"the best-of reply did not finish: {str(e).splitlines()[0]}")
    return page.evaluate(
        """() => {
          const a = [...document.querySelectorAll('.msg.assistant')].pop();
          const note = (cls) => { const n = a && a.querySelector('.note.' + cls); return n ? n.innerText : ''; };
          const err = document.getElementById('error');
          return {
            reply: a ? a.querySelector('.body').innerText : '',
            done: !!(a && a.classList.contains('done')),
            bestOf: note('best-of'),
            reasoning: note('reasoning'),
            error: err.classList.contains('show') ? document.getElementById('error-text').innerText : '',
          };
        }"""
    )


def check_best_of(info: dict) -> None:
    """What a person sees after a best-of-3 request with effort `low`."""
    one = lambda s: " ".join(str(s).split())  # noqa: E731
    if info["error"]:
        raise Fail(f"the best-of request shows an error: {one(info['error'])}")
    if not info["reply"].strip() or not info["done"]:
        raise Fail(f"no complete best-of reply (text {info['reply']!r})")
    if not info["bestOf"].startswith("Best of 3 (majority): answers "):
        raise Fail(f"the best-of note is missing or wrong: {one(info['bestOf'])!r}")
    if "cap of 128 tokens" not in info["reasoning"]:
        raise Fail(f"the candidates' reasoning note is missing or wrong: {one(info['reasoning'])!r}")


def record_chat_request(request, out: list[dict]) -> None:
    """Keeps the JSON body of each chat completion the page sends."""
    if request.method == "POST" and request.url.endswith("/v1/chat/completions"):
        try:
            out.append(json.loads(request.post_data or "null"))
        except ValueError:
            out.append({"unparsed": request.post_data})


def open_and_wait(page, base: str, query: dict, left_ms, what: str) -> None:
    """Opens the page with `query` and waits until its autosent request is done."""
    from playwright.sync_api import Error as PwError

    url = base + "/?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    try:
        page.goto(url, wait_until="load", timeout=min(left_ms(), 30_000))
        page.wait_for_function(IDLE_WITH_REPLY, timeout=left_ms(), polling=100)
    except PwError as e:
        raise Timeout(f"the {what} reply did not finish: {str(e).splitlines()[0]}")


# What the last assistant message shows, and the banner.
LAST_REPLY_JS = """() => {
  const a = [...document.querySelectorAll('.msg.assistant')].pop();
  const err = document.getElementById('error');
  const body = a ? a.querySelector('.body') : null;
  const pre = body ? body.querySelector('pre.json') : null;
  return {
    replies: document.querySelectorAll('.msg.assistant').length,
    reply: body && !body.hidden ? body.innerText : '',
    json: pre ? pre.innerText : '',
    monospace: pre ? getComputedStyle(pre).fontFamily : '',
    done: !!(a && a.classList.contains('done')),
    failed: !!(a && a.classList.contains('failed')),
    finish: a ? (a.dataset.finish || '') : '',
    cards: a ? [...a.querySelectorAll('.tool-call')].map((c) => ({
      name: c.querySelector('.fn').innerText, id: c.dataset.id, args: c.querySelector('pre.args').innerText,
    })) : [],
    error: err.classList.contains('show') ? document.getElementById('error-text').innerText : '',
  };
}"""


def schema_visit(page, base: str, left_ms) -> dict:
    """Opens the page with `?schema=` and returns what the reply shows."""
    open_and_wait(page, base, SCHEMA_QUERY, left_ms, "JSON schema")
    return page.evaluate(LAST_REPLY_JS)


def check_schema(info: dict) -> None:
    """The reply is a monospace JSON block that parses and matches SCHEMA."""
    one = lambda s: " ".join(str(s).split())  # noqa: E731
    if info["error"]:
        raise Fail(f"the JSON-schema request shows an error: {one(info['error'])}")
    if not info["done"] or not info["json"]:
        raise Fail(f"the JSON-schema reply is not shown as a JSON block (text {one(info['reply'])!r}, finish {info['finish']!r})")
    if "mono" not in info["monospace"].lower():
        raise Fail(f"the JSON block is not in a monospace font: {info['monospace']!r}")
    if "\n" not in info["json"]:
        raise Fail(f"the JSON block is not pretty-printed: {info['json']!r}")
    try:
        value = json.loads(info["json"])
    except ValueError as e:
        raise Fail(f"the JSON block does not parse ({e}): {one(info['json'])!r}")
    if not isinstance(value, dict) or set(value) != {"color", "apples"}:
        raise Fail(f"the JSON reply does not have exactly the schema's keys: {one(info['json'])!r}")
    if value["color"] not in SCHEMA["properties"]["color"]["enum"]:
        raise Fail(f"the JSON reply's color is outside the enum: {value['color']!r}")
    if not isinstance(value["apples"], int) or isinstance(value["apples"], bool):
        raise Fail(f"the JSON reply's apples is not an integer: {value['apples']!r}")


def bad_schema_visit(page, base: str, left_ms) -> dict:
    """Opens the page with a schema the server refuses."""
    open_and_wait(page, base, BAD_SCHEMA_QUERY, left_ms, "bad-schema")
    return page.evaluate(LAST_REPLY_JS)


def check_bad_schema(info: dict) -> None:
    """The server's 400 is in the banner: its message and the parameter."""
    one = lambda s: " ".join(str(s).split())  # noqa: E731
    err = one(info["error"])
    if not err:
        raise Fail(f"a schema the server refuses shows no error banner (reply {one(info['reply'])!r})")
    if "HTTP 400" not in err or "param: response_format.json_schema.schema" not in err:
        raise Fail(f"the banner does not show the server's 400 naming the schema: {err!r}")
    if not info["failed"]:
        raise Fail("the refused request's reply is not marked failed")


def tools_visit(page, base: str, left_ms, requests: list[dict]) -> dict:
    """Opens the page with a tool and `tool_choice=required`, reads the card,
    types a result, sets tool choice to `none` and sends the result back."""
    from playwright.sync_api import Error as PwError

    open_and_wait(page, base, TOOLS_QUERY, left_ms, "tool-call")
    first = page.evaluate(LAST_REPLY_JS)
    if first["error"] or not first["cards"]:
        return {"first": first}
    sent_before = len(requests)
    try:
        for box in page.locator(".msg.assistant .tool-call textarea.result").all():
            box.fill(TOOL_RESULT, timeout=min(left_ms(), 10_000))
        page.select_option("#tool_choice", "none", timeout=min(left_ms(), 10_000))
        page.click(".msg.assistant .calls .send-results", timeout=min(left_ms(), 10_000))
        page.wait_for_function(
            "() => document.body.dataset.state === 'idle' && document.querySelectorAll('.msg.assistant').length === 2",
            timeout=left_ms(),
            polling=100,
        )
    except PwError as e:
        raise Timeout(f"the reply after the tool result did not finish: {str(e).splitlines()[0]}")
    after = page.evaluate(LAST_REPLY_JS)
    answered = page.evaluate(
        "() => { const b = document.querySelector('.calls'); return !!b && b.classList.contains('answered')"
        " && b.querySelector('textarea.result').readOnly; }"
    )
    return {"first": first, "after": after, "answered": answered, "sent": requests[sent_before:],
            "card": first["cards"][0], "reply": after["reply"] or ", ".join(c["name"] for c in after["cards"])}


def check_tools(info: dict) -> None:
    """A card for the call, and the result sent back yields a further reply."""
    one = lambda s: " ".join(str(s).split())  # noqa: E731
    first = info["first"]
    if first["error"]:
        raise Fail(f"the tool request shows an error: {one(first['error'])}")
    if not first["cards"]:
        raise Fail(f"no tool-call card (reply {one(first['reply'])!r}, finish {first['finish']!r})")
    card = first["cards"][0]
    # (parallel calls may run on to max_tokens: the reason then stays `length`)
    if card["name"] != "get_weather" or first["finish"] not in ("tool_calls", "length"):
        raise Fail(f"the card names {card['name']!r} (finish {first['finish']!r}), expected get_weather")
    try:
        args = json.loads(card["args"])
    except ValueError:
        raise Fail(f"the card's arguments do not parse: {one(card['args'])!r}")
    if not isinstance(args, dict) or "city" not in args:
        raise Fail(f"the card's arguments lack the required city: {one(card['args'])!r}")
    after = info["after"]
    if after["error"]:
        raise Fail(f"sending the tool result back shows an error: {one(after['error'])}")
    if not after["done"] or not (after["reply"].strip() or after["cards"]):
        raise Fail(f"no reply after the tool result (text {one(after['reply'])!r}, finish {after['finish']!r})")
    if not info["answered"]:
        raise Fail("the answered card does not show its result as sent")
    if len(info["sent"]) != 1:
        raise Fail(f"sending the result made {len(info['sent'])} requests, expected 1")
    # The conversation sent next: ..., the assistant's calls, one tool message per call.
    msgs = info["sent"][0].get("messages") or []
    ids = [c["id"] for c in first["cards"]]
    n = len(ids)
    call_turn = msgs[-n - 1] if len(msgs) > n else {}
    sent_ids = [c.get("id") for c in call_turn.get("tool_calls") or []]
    if call_turn.get("role") != "assistant" or sent_ids != ids:
        raise Fail(f"the request after the result does not carry the assistant's calls: {one(json.dumps(msgs))[:200]}")
    want = [{"role": "tool", "tool_call_id": i, "content": TOOL_RESULT} for i in ids]
    if msgs[-n:] != want:
        raise Fail(f"the request after the result does not end with the tool messages: {one(json.dumps(msgs[-n:]))[:200]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="run the assertions (the default when no screenshot is asked)")
    ap.add_argument("--screenshot", metavar="PATH", type=Path, help="also save a 1280x800 PNG of the page")
    ap.add_argument("--url", help="use this running server instead of starting target/release/tern serve")
    ap.add_argument("--chromium", help="Chromium binary (default /usr/bin/chromium)")
    ap.add_argument("--theme", choices=["light", "dark"], default="light", help="prefers-color-scheme of the browser")
    ap.add_argument("--timeout", type=float, default=120.0, help="bound on the whole run, seconds")
    args = ap.parse_args()
    deadline = time.monotonic() + args.timeout

    # A hard backstop: if anything blocks past the budget, fail rather than hang.
    def on_alarm(signum, frame):  # noqa: ARG001
        raise Timeout(f"whole run exceeded {args.timeout:.0f} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.timeout) + 10)
    server = None
    try:
        chromium = find_chromium(args.chromium)
        if args.url:
            base = args.url.rstrip("/")
        else:
            server = Server(deadline)
            base = server.url
        summary = run_browser(base, chromium, deadline, args.screenshot, args.theme)
    except Fail as e:
        print(f"ui_test: FAIL: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # anything unexpected still gets one line
        print(f"ui_test: FAIL: {type(e).__name__}: {' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 1
    finally:
        signal.alarm(0)
        if server is not None:
            server.stop()
    shot = f"; screenshot {args.screenshot}" if args.screenshot else ""
    print(f"ui_test: OK: {summary}{shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
