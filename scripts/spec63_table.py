"""The table of docs/BENCHMARKS.md's speculative decoding section (issue 63),
from the records scripts/spec63.py writes in records/spec63/: per model
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
        if "draft_model" in rec or "kv_policy" in rec:
            continue  # three-arm records: draft_rows; under a policy: kv_rows
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


def _arm(runs, spec):
    """The runs of one arm, their median speed and summed draft statistics."""
    mine = [r for r in runs if r["speculative"] == spec]
    tps = statistics.median(r["decode_tokens_per_s"] for r in mine)
    drafted = sum((r["stats"] or {}).get("drafted", 0) for r in mine)
    accepted = sum((r["stats"] or {}).get("accepted", 0) for r in mine)
    forwards = sum(r["completion_tokens"] - 1 for r in mine) - accepted
    tokens = sum(r["completion_tokens"] - 1 for r in mine)
    return mine, tps, drafted, accepted, (tokens / forwards if forwards else 0.0)


def draft_rows(records_dir):
    """One row per (model, workload) of the three-arm records (plain, prompt
    lookup, draft model): median speeds, the draft arm's speedup over plain
    and over prompt lookup, its acceptance and target tokens per forward."""
    out = []
    for path in sorted(pathlib.Path(records_dir).glob("*.json")):
        rec = json.loads(path.read_text())
        if "draft_model" not in rec:
            continue
        for name, w in rec["workloads"].items():
            runs = w["runs"]
            off, off_tps, *_ = _arm(runs, "off")
            ng, ng_tps, ng_d, ng_a, _ = _arm(runs, "ngram")
            dr, dr_tps, dr_d, dr_a, per_fwd = _arm(runs, "draft")
            out.append([
                rec["model"].removesuffix(".gguf"),
                rec["draft_model"].removesuffix(".gguf"),
                rec.get("build", ""),
                name,
                f"{len(off)} + {len(ng)} + {len(dr)}",
                f'{statistics.median(r["completion_tokens"] for r in runs):g}',
                f"{off_tps:.2f}",
                f"{ng_tps:.2f} ({ng_tps / off_tps:.2f}x)",
                f"{dr_tps:.2f}",
                f"{dr_tps / off_tps:.2f}x",
                f"{dr_tps / ng_tps:.2f}x",
                f"{dr_a} / {dr_d} ({100 * dr_a / dr_d:.0f}%)" if dr_d else "0 / 0",
                f"{per_fwd:.2f}",
                "yes" if w["identical_tokens"] else "NO",
            ])
    return out


DRAFT_HEADER = ["target", "draft model", "build", "workload", "runs (off + ngram + draft)",
                "tokens (median)", "plain tok/s (median)", "ngram tok/s (median)",
                "draft tok/s (median)", "draft vs plain", "draft vs ngram",
                "draft tokens accepted", "target tokens per decode forward (draft)",
                "same tokens"]


KV_HEADER = ["model", "kv policy", "build", "workload", "runs (off + ngram)",
             "tokens (median)", "plain tok/s (median)", "ngram tok/s (median)", "speedup",
             "draft tokens accepted", "tokens per decode forward",
             "entries kept at the end / tokens read", "same tokens"]


def kv_rows(records_dir):
    """One row per (model, policy, workload) of the records run under a KV
    policy (scripts/spec63.py --kv-policy): both arms decode under it, plain
    decoding under it the reference; the entries a layer kept at the end
    against the tokens read show the policy was at work."""
    out = []
    for path in sorted(pathlib.Path(records_dir).glob("*.json")):
        rec = json.loads(path.read_text())
        if "kv_policy" not in rec:
            continue
        for name, w in rec["workloads"].items():
            runs = w["runs"]
            off, off_tps, *_ = _arm(runs, "off")
            on, on_tps, drafted, accepted, per_fwd = _arm(runs, "ngram")
            kept = sorted({
                f'{(r.get("kv") or {}).get("kv_entries_final")} / '
                f'{r["prompt_tokens"] + r["completion_tokens"] - 1}'
                for r in runs
            })
            out.append([
                rec["model"].removesuffix(".gguf"),
                f"`{rec['kv_policy']}`",
                rec.get("build", ""),
                name,
                f"{len(off)} + {len(on)}",
                f'{statistics.median(r["completion_tokens"] for r in runs):g}',
                f"{off_tps:.2f}",
                f"{on_tps:.2f}",
                f"{on_tps / off_tps:.2f}x",
                f"{accepted} / {drafted} ({100 * accepted / drafted:.0f}%)" if drafted else "0 / 0",
                f"{per_fwd:.2f}",
                ", ".join(kept),
                "yes" if w["identical_tokens"] else "NO",
            ])
    return out
