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
        finally:
            browser.close()

    one = lambda s: " ".join(str(s).split())  # noqa: E731
    check_best_of(best_of)
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
    if not held < full:
        raise Fail(f"a 32-token budget should hold less than a full cache: held={held} full={full}")
    return (f"reply {one(reply)[:60]!r}..., {tps} tok/s, {one(info['kvText'])}, {info['spec']}; "
            f"{best_of['bestOf']}")


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
