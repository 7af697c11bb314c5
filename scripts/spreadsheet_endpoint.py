#!/usr/bin/env python3
"""Issue 61 at the endpoint, on a real model: a client sends three order
workbooks of its own to `tern serve --allow-code-execution` (the `spreadsheet`
extension on /v1/chat/completions), with best-of-N and rounds, and checks the
chosen program's output workbooks itself against the answers only it knows.

    python3 scripts/spreadsheet_endpoint.py --binary target/release/tern \
        --model models/cache/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --out records/spreadsheet/endpoint/1.5b.json

Writes one JSON record: the request's settings, the server's report (each
candidate's program, rounds, answers, agreement; the output workbooks are
replaced by the client's cell-by-cell check of them) and the wall seconds.
Needs python3-openpyxl; HTTP is the standard library's urllib.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import openpyxl

INSTRUCTION = (
    "In the Orders sheet, fill Total (column D) with Qty times Price for every "
    "order row, and write the sum of all totals in D6."
)
POSITION = "'Orders'!D2:D6"
# Three workbooks that share the layout, not the values: (item, qty, price).
BOOKS = [
    [("bolts", 2, 3.5), ("nuts", 10, 0.25), ("washers", 4, 1.5), ("screws", 7, 0.4)],
    [("hinges", 3, 12.0), ("latches", 1, 8.5), ("hooks", 6, 2.25), ("pins", 20, 0.1)],
    [("rivets", 50, 0.05), ("clips", 8, 0.75), ("brackets", 2, 14.0), ("rods", 5, 3.2)],
]


def workbook(rows) -> bytes:
    """An order sheet: Item, Qty, Price, Total (empty), the sum row empty."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Orders"
    sheet.append(["Item", "Qty", "Price", "Total"])
    for item, qty, price in rows:
        sheet.append([item, qty, price, None])
    sheet.append(["All orders", None, None, None])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def expected(rows) -> list[float]:
    """What D2:D6 should hold: each order's total, then their sum."""
    totals = [qty * price for _, qty, price in rows]
    return totals + [sum(totals)]


def check(output_b64: str | None, rows) -> dict:
    """The client's own check of one output workbook's answer range."""
    if output_b64 is None:
        return {"ok": False, "why": "no output workbook"}
    book = openpyxl.load_workbook(io.BytesIO(base64.b64decode(output_b64)), data_only=False)
    if "Orders" not in book.sheetnames:
        return {"ok": False, "why": "no Orders sheet"}
    sheet = book["Orders"]
    got = [sheet.cell(row=r, column=4).value for r in range(2, 7)]
    want = expected(rows)
    same = [isinstance(g, (int, float)) and abs(g - w) <= 1e-6 * max(1.0, abs(w)) for g, w in zip(got, want)]
    return {"ok": all(same), "got": got, "want": want}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="target/release/tern")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--best-of", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="tern-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [a.binary, "serve", "--model", a.model, "--host", "127.0.0.1", "--port", str(port),
         "--allow-code-execution"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                print(f"tern serve exited ({proc.returncode}); log: {log.name}", file=sys.stderr)
                return 1
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                print(f"tern serve not healthy after 300 s; log: {log.name}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        settings = {
            "instruction": INSTRUCTION,
            "answer_position": POSITION,
            "instruction_type": "cell",
            "best_of": a.best_of,
            "rounds": a.rounds,
            "max_tokens": a.max_tokens,
            "temperature": 0.7,
            "seed": a.seed,
        }
        body = {
            "model": Path(a.model).stem,
            "messages": [{"role": "user", "content": INSTRUCTION}],
            "max_tokens": a.max_tokens,
            "temperature": 0.7,
            "seed": a.seed,
            "best_of": a.best_of,
            "spreadsheet": {
                "workbooks": [base64.b64encode(workbook(rows)).decode() for rows in BOOKS],
                "answer_position": POSITION,
                "instruction_type": "cell",
                "rounds": a.rounds,
            },
        }
        start = time.monotonic()
        status, out = post(f"{base}/v1/chat/completions", body, timeout=3600)
        secs = time.monotonic() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    record = {"model": Path(a.model).name, "settings": settings, "status": status, "secs": round(secs, 1)}
    if status != 200:
        record["error"] = out
    else:
        tern = out["tern"]
        outputs = tern["spreadsheet"].pop("outputs")
        tern["client_check"] = [
            check(o.get("workbook"), rows) for o, rows in zip(outputs, BOOKS)
        ]
        tern["output_errors"] = [o.get("error") for o in outputs]
        record["reply"] = out["choices"][0]["message"]["content"]
        record["tern"] = tern
        record["usage"] = out.get("usage")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    if status == 200:
        checks = record["tern"]["client_check"]
        print(f"{record['model']}: chosen #{record['tern']['chosen'] + 1}, "
              f"{sum(c['ok'] for c in checks)} of {len(checks)} workbooks right by the client's check "
              f"({secs:.0f} s)")
    else:
        print(f"{record['model']}: HTTP {status}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
