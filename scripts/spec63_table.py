"""The table of docs/BENCHMARKS.md's speculative decoding section (issue 63),
from the records scripts/spec63.py writes in docs/records/spec63/: per model
and workload, the median greedy decode speed without and with prompt lookup,
the speedup, the share of draft tokens accepted, tokens emitted per forward,
and whether every run gave the same tokens."""
import json
import pathlib
import statistics


def rows(records_dir):
    """One table row per (model, workload) in `records_dir`'s records."""
    out = []
    for path in sorted(pathlib.Path(records_dir).glob("*.json")):
        rec = json.loads(path.read_text())
        for name, w in rec["workloads"].items():
            runs = w["runs"]
            off = [r for r in runs if r["speculative"] == "off"]
            on = [r for r in runs if r["speculative"] == "ngram"]
            off_tps = statistics.median(r["decode_tokens_per_s"] for r in off)
            on_tps = statistics.median(r["decode_tokens_per_s"] for r in on)
            drafted = sum(r["stats"]["drafted"] for r in on)
            accepted = sum(r["stats"]["accepted"] for r in on)
            steps = sum(r["stats"]["verify_steps"] for r in on)
            tokens = sum(r["completion_tokens"] for r in on)
            # Decode forwards: every token after the first needs one, less
            # those emitted as accepted draft tokens.
            forwards = sum(r["completion_tokens"] - 1 for r in on) - accepted
            out.append([
                rec["model"].removesuffix(".gguf"),
                # The first records (no `build` field) ran the binary built
                # at commit 5390cf2, before drafting paused after misses.
                rec.get("build") or "5390cf2",
                name,
                f"{len(off)} + {len(on)}",
                f'{statistics.median(r["completion_tokens"] for r in runs):g}',
                f"{off_tps:.2f}",
                f"{on_tps:.2f}",
                f"{on_tps / off_tps:.2f}x",
                f"{accepted} / {drafted} ({100 * accepted / drafted:.0f}%)" if drafted else "0 / 0",
                f"{(tokens - len(on)) / forwards:.2f}" if forwards else "-",
                f"{steps}",
                "yes" if w["identical_tokens"] else "NO",
            ])
    return out


HEADER = ["model", "build", "workload", "runs (off + ngram)", "tokens (median)",
          "plain tok/s (median)", "ngram tok/s (median)", "speedup",
          "draft tokens accepted", "tokens per decode forward", "verifying forwards",
          "same tokens"]
