#!/usr/bin/env python3
"""Issue 63: greedy decode speed with and without prompt-lookup speculative
decoding (`tern generate --speculative ngram`), on a code-editing workload
(rewrite a given ~40-line function with one change: the answer repeats the
prompt) and a plain chat workload (no repetition).

Runs are interleaved (off, ngram, off, ngram, ...) so that load from other
processes on a shared machine falls on both modes alike; the table reports
medians. Every pair's greedy tokens are compared: speculation must not
change them. Writes records/spec63/<model-stem>.json; the table in
docs/BENCHMARKS.md comes from these records (scripts/spec63_table.py via
scripts/tables.py).

With --draft-model DRAFT.gguf a third arm runs draft-model speculation
(`--speculative draft --draft-model DRAFT.gguf`) beside plain and prompt
lookup, interleaved off, ngram, draft, ...; its record is
<model-stem>-draft.json (table spec63-draft).

With --kv-policy SPEC every arm decodes under that KV policy
(`--kv-policy SPEC`), plain decoding under it being the reference the
speculative arm must match; its record is <model-stem>-kv-<policy>.json
(table spec63-kv).

Usage: python3 scripts/spec63.py MODEL.gguf [--reps 3] [--binary target/release/tern]
       [--workloads code-edit,chat] [--build TEXT] [--label NAME]
       [--draft-model DRAFT.gguf] [--kv-policy SPEC]
"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "records" / "spec63"

FUNCTION = '''def summarize_orders(records, min_total=0.0):
    """Groups orders by customer and returns per-customer statistics."""
    by_customer = {}
    for record in records:
        customer = record["customer"]
        total = 0.0
        for line in record["lines"]:
            price = line["price"]
            quantity = line["quantity"]
            discount = line.get("discount", 0.0)
            total += price * quantity * (1.0 - discount)
        if total < min_total:
            continue
        entry = by_customer.setdefault(customer, {
            "orders": 0,
            "revenue": 0.0,
            "largest": 0.0,
            "items": 0,
        })
        entry["orders"] += 1
        entry["revenue"] += total
        entry["largest"] = max(entry["largest"], total)
        for line in record["lines"]:
            entry["items"] += line["quantity"]
    summary = []
    for customer, entry in sorted(by_customer.items()):
        average = entry["revenue"] / entry["orders"]
        summary.append({
            "customer": customer,
            "orders": entry["orders"],
            "revenue": round(entry["revenue"], 2),
            "average": round(average, 2),
            "largest": round(entry["largest"], 2),
            "items": entry["items"],
        })
    summary.sort(key=lambda row: row["revenue"], reverse=True)
    return summary
'''

WORKLOADS = {
    "code-edit": {
        "prompt": "Rewrite this Python function with one change: rename the "
                  "parameter `records` to `orders` everywhere. Reply with the "
                  "complete function only, in a code block.\n\n```python\n"
                  + FUNCTION + "```",
        "max_tokens": 480,
    },
    "chat": {
        "prompt": "Write a short story, about 150 words, about a lighthouse "
                  "keeper who finds a message in a bottle.",
        "max_tokens": 200,
    },
}


def run(binary, model, workload, spec, draft_model=None, kv_policy=None):
    w = WORKLOADS[workload]
    cmd = [str(binary), "generate", "-m", str(model), "--chat", "-p", w["prompt"],
           "--temperature", "0", "--max-tokens", str(w["max_tokens"]),
           "--speculative", spec, "--json"]
    if spec == "draft":
        cmd += ["--draft-model", str(draft_model)]
    if kv_policy:
        cmd += ["--kv-policy", kv_policy]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "speculative": spec,
        "prompt_tokens": d["prompt_tokens"],
        "completion_tokens": d["completion_tokens"],
        "finish_reason": d["finish_reason"],
        "decode_tokens_per_s": d["decode_tokens_per_s"],
        "decode_seconds": d["decode_seconds"],
        "prefill_seconds": d["prefill_seconds"],
        "stats": d.get("speculative"),
        "kv": {k: d.get(k) for k in ("kv_policy", "kv_bytes", "kv_bytes_final",
                                      "kv_entries_final")},
        "token_ids": d["token_ids"],
        "loadavg_1m": os.getloadavg()[0],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--binary", default=str(ROOT / "target/release/tern"))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--build", default="",
                    help="which Tern the binary is (a commit, and what it adds), recorded as is")
    ap.add_argument("--label", default="",
                    help="appended to the record's file name, to keep a second build's runs apart")
    ap.add_argument("--draft-model", default=None,
                    help="adds a draft-model arm (--speculative draft) with this draft model")
    ap.add_argument("--kv-policy", default=None,
                    help="runs every arm under this KV policy spec (record <stem>-kv-<policy>.json)")
    a = ap.parse_args()
    model = pathlib.Path(a.model)
    modes = ("off", "ngram", "draft") if a.draft_model else ("off", "ngram")
    label = a.label or ("draft" if a.draft_model else "")
    if a.kv_policy and not a.label:
        label = "kv-" + a.kv_policy.split(":")[0]
    record = {
        "issue": 63,
        "model": model.name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, shared with other engineers' builds and tests",
        "mode": "tern generate --chat --temperature 0 (greedy), one request",
        "order": "interleaved: " + ", ".join(modes) + ", ...",
        "build": a.build,
        "workloads": {},
    }
    if a.draft_model:
        record["draft_model"] = pathlib.Path(a.draft_model).name
    if a.kv_policy:
        record["kv_policy"] = a.kv_policy
    for name in a.workloads.split(","):
        runs = []
        for rep in range(a.reps):
            for spec in modes:
                r = run(a.binary, model, name, spec, a.draft_model, a.kv_policy)
                r["rep"] = rep
                runs.append(r)
                print(f"{model.name} {name} rep {rep} {spec}: "
                      f"{r['completion_tokens']} tokens, {r['decode_tokens_per_s']:.2f} tok/s, "
                      f"{r['stats']}", flush=True)
        base = runs[0]["token_ids"]
        identical = all(r["token_ids"] == base for r in runs)
        for r in runs[1:]:
            del r["token_ids"]
        record["workloads"][name] = {
            "prompt": WORKLOADS[name]["prompt"],
            "max_tokens": WORKLOADS[name]["max_tokens"],
            "identical_tokens": identical,
            "runs": runs,
        }
        off = statistics.median(r["decode_tokens_per_s"] for r in runs if r["speculative"] == "off")
        for spec in modes[1:]:
            on = statistics.median(r["decode_tokens_per_s"] for r in runs if r["speculative"] == spec)
            print(f"{name} {spec}: median {off:.2f} -> {on:.2f} tok/s ({on / off:.2f}x), "
                  f"identical={identical}")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / (model.stem + (f"-{label}" if label else "") + ".json")
    if path.exists():
        # Workloads measured by an earlier invocation are kept.
        old = json.loads(path.read_text())
        for name, w in old.get("workloads", {}).items():
            record["workloads"].setdefault(name, w)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
