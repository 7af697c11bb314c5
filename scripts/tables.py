"""Regenerates the result tables of docs/TRAINING.md, docs/SPARSE_RL.md,
docs/REASONING.md, docs/KV.md and docs/MODELS.md from their records (records/<run>/, records/*.jsonl).

Each generated table sits between `<!-- table:NAME:start -->` and
`<!-- table:NAME:end -->` in its doc; only the text between a pair is ever
rewritten, so hand-written prose around a table (or a neighbouring section)
cannot be lost the way scripts/gsm8k_progress.py once lost the HumanEval
section. A number in a table comes from a record or, where a run predates
records, from a constant named UNRECORDED_* that the doc flags as
"Record missing".

Usage:
  python3 scripts/tables.py              rewrite every region
  python3 scripts/tables.py --check      exit 1 if a region differs from its records, or
                                         a doc holds a table outside the regions (other
                                         than a declared reference table: fields, flags)
  python3 scripts/tables.py --self-test  check the region rewriter on a temporary doc
  python3 scripts/tables.py --pair A B
      two sets of per-task outcomes compared task by task: the difference, its
      95% interval, the discordant tasks and McNemar's p, as the prose quotes
      them. A or B is an issue-28 export, RUN:MODE (records/sparse28-RUN,
      MODE full|policy|r56|r28), or an eval records file and one of its
      strategies, FILE.jsonl:STRATEGY (records/gsm8k-bon8.jsonl:majority@8)
"""
import json
import math
import pathlib
import re
import sys
import tempfile

# The per-topic table scripts beside this one (kv_table.py, ...) import as modules.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RECORDS = ROOT / "records"
EVAL = ROOT / "records"

MARKER = re.compile(r"^<!-- table:([a-z0-9-]+):(start|end) -->$", re.M)
GIB = 1024 ** 3
MIB = 1024 ** 2


class RegionError(Exception):
    """A doc's markers are missing, unpaired or name no known table."""


# ---------------------------------------------------------------- regions

def regions(text):
    """Returns {name: (body_start, body_end)} for each marked region, the
    offsets of the text strictly between the start line and the end line."""
    found, open_name, open_at = {}, None, None
    for m in MARKER.finditer(text):
        name, kind = m.group(1), m.group(2)
        if kind == "start":
            if open_name is not None:
                raise RegionError(f"table:{name} starts inside table:{open_name}")
            if name in found:
                raise RegionError(f"table:{name} is marked twice")
            open_name, open_at = name, m.end() + 1  # past the marker's newline
        else:
            if open_name != name:
                raise RegionError(f"table:{name} ends without its start")
            found[name] = (open_at, m.start())
            open_name = None
    if open_name is not None:
        raise RegionError(f"table:{open_name} has no end marker")
    return found


def rewrite(text, bodies):
    """Replaces the body of each region named in `bodies` and nothing else;
    every byte outside those bodies is kept as it was."""
    spans = regions(text)
    missing = sorted(set(bodies) - set(spans))
    if missing:
        raise RegionError("no markers for " + ", ".join(f"table:{n}" for n in missing))
    out, at = [], 0
    for name, (start, end) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        if name in bodies:
            body = bodies[name]
            if not body.endswith("\n"):
                body += "\n"
            out += [text[at:start], body]
            at = end
    out.append(text[at:])
    return "".join(out)


# ---------------------------------------------------------------- reading records

def jsonl(path):
    """The records of a JSONL file, blank lines skipped."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_records(path):
    """`tern eval --records` lines keyed by (strategy, task); a later line for
    the same key replaces an earlier one, as `tern eval` reads them."""
    return {(r["strategy"], r["task"]): r for r in jsonl(path)}


def eval_rows(path, strategies):
    """One row per strategy over the tasks every strategy has a record for,
    computed as `tern eval --report` does (solve/src/eval/report.rs), so the
    table needs no build of the binary."""
    recs = eval_records(path)
    tasks = sorted({t for (_, t) in recs if all((s, t) in recs for s in strategies)})
    n = len(tasks)
    if n == 0:
        # A run just started: no task has every record yet.
        return {s: {"tasks": 0, "correct": 0, "records": []} for s in strategies}
    rows, first_right = {}, None
    for s in strategies:
        rs = [recs[(s, t)] for t in tasks]
        width = int(m.group(1)) if (m := re.match(r"adaptive@(\d+)", s)) else None
        right = {r["task"] for r in rs if r["ok"]}
        row = {
            "tasks": n,
            "correct": len(right),
            "tokens_per_task": sum(r["tokens"] for r in rs) / n,
            "samples_per_task": sum(r["candidates"] for r in rs) / n,
            "width_stops": sum(1 for r in rs if width and r["candidates"] < width),
            "seconds": sum(r["seconds"] for r in rs),
            "no_answer": sum(1 for r in rs if r["answer"] is None),
            "records": rs,
        }
        if first_right is None:
            first_right = right
        else:
            row["wins"] = len(right - first_right)
            row["losses"] = len(first_right - right)
        rows[s] = row
    return rows


def log_field(log, pattern):
    """The first group of `pattern` in a run's log; a missing field is an error,
    not a blank cell."""
    m = re.search(pattern, log)
    if not m:
        raise ValueError(f"log has no match for {pattern!r}")
    return m.group(1)


def time_v(log):
    """(peak RSS in kB, wall seconds) from `/usr/bin/time -v` lines in a log."""
    kb = int(log_field(log, r"Maximum resident set size \(kbytes\): (\d+)"))
    parts = [float(p) for p in log_field(log, r"Elapsed \(wall clock\) time \([^)]*\): ([\d:.]+)").split(":")]
    secs = 0.0
    for p in parts:
        secs = secs * 60 + p
    return kb, secs


def arg(args, flag):
    """The value after `flag` in a recorded command line."""
    return log_field(args, re.escape(flag) + r" (\S+)")


def run(name):
    """(metrics, log text, args text) of records/<name>/; absent files are empty."""
    d = RECORDS / name
    read = lambda f: (d / f).read_text() if (d / f).exists() else ""
    return jsonl(d / "metrics.jsonl") if (d / "metrics.jsonl").exists() else [], read("log.txt"), read("args.txt")


def table(header, rows):
    """A Markdown table."""
    line = lambda cells: "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
    lines = [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]
    return "\n".join(lines) + "\n"


def pct(k, n):
    return f"{k}/{n} ({100 * k / n:.1f}%)"


def mib(b):
    return f"{b / MIB:.0f} MiB"


# ---------------------------------------------------------------- docs/TRAINING.md

def grpo_arith_column(name, beside):
    """One 50-step grpo-arith run's figures from records/<name>/. The
    peak is the trainer's own lifetime figure (each step's `peak_rss_bytes`):
    the trainer resets the kernel's high-water mark at each phase, so
    `/usr/bin/time -v` reports only the last phase's."""
    m, log, args = run(name)
    ev = json.loads((RECORDS / name / "eval.json").read_text())
    assert len(m) == 50, "the table quotes steps 1-10 and 41-50 of a 50-step run"
    _, wall = time_v(log)
    peak = max(x["peak_rss_bytes"] for x in m)
    cap = log_field(log, r"cap ([\d.]+ [MG]iB)")
    recompute = "recompute on" in log
    chosen = "" if "--recompute" in args else " (the planner's choice)"
    micros = sorted({x["micro_batch"] for x in m if "micro_batch" in x})
    replanned = f"; re-planned per step: {micros[0]}-{micros[-1]}" if len(micros) > 1 else ""
    threads = arg(args, "--threads") if "--threads" in args else "2"
    wall = round(wall)
    mean = lambda xs: sum(x["reward_mean"] for x in xs) / len(xs)
    learner = sum(x["learner_tokens"] for x in m) / sum(x["learner_seconds"] for x in m)
    resident = log_field(log, r"loaded: resident ([\d.]+ [MG]iB)")
    micro = log_field(log, r"micro-batch (\d+)")
    return [
        cap.replace(".0 ", " "),
        resident,
        f"micro-batch {micro}{', blocks recomputed' if recompute else ', activations kept'}{chosen}{replanned}",
        f"**{peak / MIB:.1f} MiB = {peak / 1e6:.1f} MB**",
        f"{100 * ev['before']:.0f}% -> **{100 * ev['after']:.0f}%**",
        f"{mean(m[:10]):.3f} -> {mean(m[40:]):.3f}",
        f"{wall // 60} min {wall % 60} s ({threads} thread{'s' if threads != '1' else ''}, {beside} beside it)",
        f"{learner:.1f}",
    ]


# The rows of grpo_arith_column, in its order.
GRPO_ARITH_LABELS = ["cap", "resident after loading both models", "plan", "peak RSS",
                     "held-out greedy accuracy before -> after", "mean reward, steps 1-10 -> 41-50",
                     "wall time, 50 steps", "learner tokens/s (`learner_tokens / learner_seconds`)"]


def training_grpo_arith():
    """The f32 learner's grpo-arith run, seed 1 (the section's example run)."""
    col = grpo_arith_column("grpo-arith-seeds/f32-s1", "two Sparse-RL arms")
    return table(["", "value"], [[lab, c] for lab, c in zip(GRPO_ARITH_LABELS, col)])


def training_learner_seeds():
    """Held-out accuracy of the f32 and the quantized learner over seeds 1-3
    (grpo-arith, 50 steps, one build, one thread each): per seed, the mean,
    and the late reward, from records/grpo-arith-seeds/<learner>-s<seed>/."""
    rows, per_learner = [], []
    for w, label in (("f32", "f32 learner, `--memory-cap 2GiB`"),
                     ("gguf", "quantized learner, `--memory-cap 600MiB`")):
        accs, late, peaks, speed = [], [], [], []
        per_learner.append(accs)
        for seed in (1, 2, 3):
            d = RECORDS / "grpo-arith-seeds" / f"{w}-s{seed}"
            ev = json.loads((d / "eval.json").read_text()) if (d / "eval.json").exists() else {}
            if ev.get("after") is None:
                accs.append(None)
                continue
            m = jsonl(d / "metrics.jsonl")
            accs.append(100 * ev["after"])
            late.append(sum(x["reward_mean"] for x in m[40:]) / len(m[40:]))
            peaks.append(max(x["peak_rss_bytes"] for x in m))
            speed.append(sum(x["learner_tokens"] for x in m) / sum(x["learner_seconds"] for x in m))
        done = [a for a in accs if a is not None]
        rows.append([label] + [f"{a:.0f}%" if a is not None else "running" for a in accs] + [
            f"{sum(done) / len(done):.1f}%" if done else "-",
            " / ".join(f"{r:.3f}" for r in late) or "-",
            f"{max(peaks) / MIB:.0f} MiB" if peaks else "-",
            " / ".join(f"{v:.1f}" for v in speed) or "-"])
    # Seed by seed (the same tasks and first rollouts), with a t interval
    # over the seeds both learners finished.
    diffs = [q - f for f, q in zip(*per_learner) if f is not None and q is not None]
    cells = [f"{q - f:+.0f}" if f is not None and q is not None else "-" for f, q in zip(*per_learner)]
    summary = f"{t_interval(diffs)} (95% t interval over seeds)" if len(diffs) >= 2 else "-"
    rows.append(["quantized - f32, points"] + cells + [summary, "-", "-", "-"])
    return table(["learner", "held-out after, seed 1", "seed 2", "seed 3", "mean",
                  "mean reward, steps 41-50 (per seed)", "largest peak RSS", "learner tokens/s (per seed)"], rows)


def training_export_eval():
    """The f32 run's export (q8_0) scored as served, beside the base model
    and the trainer's own evaluation (records/grpo-arith-seeds/f32-s1)."""
    d = RECORDS / "grpo-arith-seeds" / "f32-s1"
    rows = []
    for name, label in (("base", "SmolLM2-135M-Instruct Q4_1 (base)"), ("q8_0", "trained, exported q8_0")):
        r = json.loads((d / f"export-eval-{name}.json").read_text())["rows"][0]
        rows.append([label, f"{100 * r['accuracy']:.1f}%", f"{r['tokens_per_task']:.1f}"])
    ev = json.loads((d / "eval.json").read_text())
    rows.append(["trained, base + adapters (trainer's own evaluation)", f"{100 * ev['after']:.1f}%", "-"])
    return table(["model", "accuracy", "tokens per answer"], rows)


def training_learner_vs_f32():
    """The quantized learner's 50-step runs (under 600 and 570 MiB) beside
    the f32 learner's run of the same config and seed."""
    cols = [grpo_arith_column("grpo-arith-seeds/f32-s1", "two Sparse-RL arms"),
            grpo_arith_column("grpo-arith-gguf", "dry runs"),
            grpo_arith_column("grpo-arith-570", "two Sparse-RL arms")]
    rows = [[lab, *cells] for lab, *cells in zip(GRPO_ARITH_LABELS, *cols)]
    return table(["", "f32 learner (2026-12-05)", "quantized learner (2026-12-03)",
                  "quantized learner, 570 MiB (2026-12-05)"], rows)


def training_learner_ab():
    """Step 1 of the same config under the three learners."""
    runs = [("learner-ab-f32", "`--learner-weights f32`"),
            ("learner-ab-gguf", "`--learner-weights gguf --recompute false`"),
            ("learner-ab-gguf-recompute", "`--learner-weights gguf --recompute true`")]
    rows, base = [], None
    for name, label in runs:
        s = run(name)[0][0]
        assert s["step"] == 1
        tps = s["learner_tokens"] / s["learner_seconds"]
        speed = f"{tps:.1f}" if base is None else f"{tps:.1f} ({tps / base:.2f}x)"
        base = base or tps
        rss = s["peak_rss_bytes"]
        rss = f"{rss / GIB:.1f} GiB" if rss >= GIB else mib(rss)
        rows.append([label, speed, rss, f"{s['loss']:.6f}, {s['grad_norm']:.6f}"])
    return table(["learner", "learner tokens/s", "peak RSS", "loss, grad norm"], rows)


AB_LEARNERS = [("f32-false", "`--learner-weights f32`"),
               ("gguf-false", "`--learner-weights gguf --recompute false`"),
               ("gguf-true", "`--learner-weights gguf --recompute true`")]


def ab_rounds(name):
    """A learner A/B's records: `step(run)` (its one step's metrics),
    `tps(step)` (learner tokens/s) and each learner's median over rounds 1-3."""
    d = RECORDS / name
    step = lambda f: jsonl(d / f"{f}.metrics.jsonl")[0]
    tps = lambda s: s["learner_tokens"] / s["learner_seconds"]
    med = {k: sorted(tps(step(f"r{r}-{k}")) for r in (1, 2, 3))[1] for k, _ in AB_LEARNERS}
    return step, tps, med


def training_learner_ab_rounds():
    """The three learners over three interleaved rounds at one thread, and
    one round at two threads (records/learner-ab-2026-12-04/)."""
    step, tps, med = ab_rounds("learner-ab-2026-12-04")
    rows = []
    for key, label in AB_LEARNERS:
        rounds = [tps(step(f"r{r}-{key}")) for r in (1, 2, 3)]
        t2 = tps(step(f"t2-{key}"))
        t2f = tps(step("t2-f32-false"))
        ratio = lambda x, b: "" if key == "f32-false" else f" ({x / b:.2f}x)"
        rss = step(f"r1-{key}")["peak_rss_bytes"]
        rss = f"{rss / GIB:.1f} GiB" if rss >= GIB else mib(rss)
        rows.append([label, ", ".join(f"{x:.1f}" for x in rounds),
                     f"**{med[key]:.1f}**{ratio(med[key], med['f32-false'])}",
                     f"{t2:.1f}{ratio(t2, t2f)}", rss])
    return table(["learner", "tokens/s, rounds 1-3 (1 thread)", "median",
                  "2 threads (one round)", "peak RSS"], rows)


def training_learner_ab_vm2():
    """The same three learners, three interleaved rounds at one thread, on
    the second VM (records/learner-ab-2026-12-04-vm2/)."""
    step, tps, med = ab_rounds("learner-ab-2026-12-04-vm2")
    rows = []
    for key, label in AB_LEARNERS:
        rounds = [tps(step(f"r{r}-{key}")) for r in (1, 2, 3)]
        ratio = "" if key == "f32-false" else f" ({med[key] / med['f32-false']:.2f}x)"
        peak = step(f"r1-{key}")["learner_peak_bytes"]
        peak = f"{peak / GIB:.1f} GiB" if peak >= GIB else mib(peak)
        rows.append([label, ", ".join(f"{x:.1f}" for x in rounds),
                     f"**{med[key]:.1f}**{ratio}", peak])
    return table(["learner", "tokens/s, rounds 1-3 (1 thread)", "median",
                  "learner peak RSS"], rows)

def training_learner_ab_2t():
    """The f32 and the quantized learner (activations kept) at two threads,
    three interleaved rounds, on the second VM
    (records/learner-ab-2t-2026-12-05/)."""
    d = RECORDS / "learner-ab-2t-2026-12-05"
    tps = lambda f: (lambda s: s["learner_tokens"] / s["learner_seconds"])(jsonl(d / f"{f}.metrics.jsonl")[0])
    rounds = {key: [tps(f"r{r}-{key}") for r in (1, 2, 3)] for key, _ in AB_LEARNERS[:2]}
    med = {key: sorted(v)[1] for key, v in rounds.items()}
    rows = []
    for key, label in AB_LEARNERS[:2]:
        ratio = "" if key == "f32-false" else f" ({med[key] / med['f32-false']:.2f}x)"
        rows.append([label, ", ".join(f"{x:.1f}" for x in rounds[key]), f"**{med[key]:.1f}**{ratio}"])
    return table(["learner", "tokens/s, rounds 1-3 (2 threads)", "median"], rows)


def training_learner_before_after():
    """Issue 25's before and after: the learner of the build before the issue
    (9ea5834, f32, its only one) against today's two, three interleaved
    rounds at two threads (records/learner-before-after-2026-12-05/).
    The old build logs no `learner_seconds`, so every row times the step
    outside its rollouts: `seconds - rollout_tokens / tokens_per_s`."""
    d = RECORDS / "learner-before-after-2026-12-05"
    step = lambda f: jsonl(d / f"{f}.metrics.jsonl")[0]
    tps = lambda s: s["learner_tokens"] / (s["seconds"] - s["rollout_tokens"] / s["tokens_per_s"])
    runs = [("old", "before: 9ea5834 (f32, the only learner)"),
            ("f32", "today: `--learner-weights f32`"),
            ("gguf", "today: `--learner-weights gguf --recompute false`")]
    rounds = {k: [tps(step(f"r{r}-{k}")) for r in (1, 2, 3)] for k, _ in runs}
    med = {k: sorted(v)[1] for k, v in rounds.items()}
    rows = []
    for k, label in runs:
        s = step(f"r1-{k}")
        ratio = "" if k == "old" else f" ({med[k] / med['old']:.2f}x)"
        rss = s["peak_rss_bytes"]
        rss = f"{rss / GIB:.1f} GiB" if rss >= GIB else mib(rss)
        rows.append([label, ", ".join(f"{x:.1f}" for x in rounds[k]), f"**{med[k]:.1f}**{ratio}",
                     rss, f"{s['loss']:.6f}, {s['grad_norm']:.6f}"])
    return table(["learner", "tokens/s, rounds 1-3 (2 threads)", "median", "peak RSS",
                  "loss, grad norm"], rows)


def training_planner_calibration():
    """The planner's learner estimate against the learner phase's own
    measured peak (records/planner-calibration/)."""
    d = RECORDS / "planner-calibration"
    runs = [("old-ab-recompute", "grpo-arith, micro 8, recompute", "before"),
            ("old-ab-stored", "grpo-arith, micro 8, kept", "before"),
            ("old-story-plan", "story, micro 12 (the planner's choice), recompute", "before"),
            ("old-story-rc4", "story, micro 4, recompute", "before"),
            ("old-story-st1", "story, micro 1, kept", "before"),
            ("new-ab-recompute", "grpo-arith, micro 8, recompute", "after"),
            ("new-story-plan", "story, micro 7 (the planner's choice), recompute", "after"),
            ("new-sft-stored", "SFT word problems, micro 8, kept", "after"),
            ("new-sft-recompute", "SFT word problems, micro 8, recompute", "after")]
    rows = []
    for name, label, when in runs:
        f = d / f"{name}.metrics.jsonl"
        if not f.exists():
            continue
        for s in jsonl(f):
            est, peak = s["peak_estimate_bytes"], s["learner_peak_bytes"]
            rows.append([label, when, str(s["step"]), mib(est), mib(peak),
                         f"{100 * (est - peak) / peak:+.0f}%"])
    return table(["run", "planner", "step", "estimate", "measured learner peak", "error"], rows)


def training_llama32_1b_shape():
    """One LoRA step of each algorithm on a random Llama-3.2-1B-shaped model."""
    steps = {r["algorithm"]: r["metrics"] for r in jsonl(RECORDS / "llama32-1b-shape/steps.jsonl")}
    size = lambda b: f"{b / GIB:.2f} GiB" if b >= GIB else mib(b)
    g, s = steps["grpo"], steps["sft"]
    assert g["groups_with_signal"] == 0, "the row's text says no group reached the learner"
    return table(["step", "what ran", "wall", "peak RSS"], [
        ["GRPO (2 prompts x 4, 16 new tokens)",
         f"{g['rollout_tokens']} rollout tokens; random weights earn no reward, so no group reached the learner",
         f"{g['seconds']:.1f} s", size(g["peak_rss_bytes"])],
        ["SFT (2 prompts)",
         f"the learner's forward and backward over {s['learner_tokens']} answer tokens",
         f"{s['seconds']:.1f} s", f"{size(s['peak_rss_bytes'])} (estimate {size(s['peak_estimate_bytes'])})"],
    ])


TRAIN58 = RECORDS / "train58"


def train58_load(name):
    """The 1-minute load average recorded when stage `name` last started
    (records/train58/load.txt, written by scripts/train58.sh)."""
    loads = {}
    for line in (TRAIN58 / "load.txt").read_text().splitlines():
        parts = line.split()
        loads[parts[0]] = parts[2]
    return loads[name]


def training_qwen_runs():
    """Issue 58's LoRA SFT and GRPO runs on Qwen2.5-Coder-0.5B-Instruct,
    step by step: the planner's estimate of each phase beside its measured
    peak, and the learner's speed (records/train58/{sft,grpo})."""
    rows = []
    for name in ["sft", "grpo"]:
        load = train58_load(name)
        for s in jsonl(TRAIN58 / name / "metrics.jsonl"):
            plan = f"micro-batch {s['micro_batch']}, {'recompute' if s['recompute'] else 'activations kept'}"
            if s["rollout_tokens"]:
                est, peak = s["rollout_estimate_bytes"], s["rollout_peak_bytes"]
                rollout = f"{mib(est)} / {mib(peak)} ({100 * (est - peak) / peak:+.0f}%)"
                rtoks = f"{s['rollout_tokens']}, {s['tokens_per_s']:.1f}/s, reward {s['reward_mean']:.2f}"
            else:
                rollout, rtoks = "-", "-"
            est, peak = s["peak_estimate_bytes"], s["learner_peak_bytes"]
            if s["learner_tokens"]:
                learner = f"{mib(est)} / {mib(peak)} ({100 * (est - peak) / peak:+.0f}%)"
                speed = f"{s['learner_tokens']} in {s['learner_seconds']:.1f} s = {s['learner_tokens'] / s['learner_seconds']:.1f}"
            else:
                learner, speed = "-", "no group with a signal"
            rows.append([name.upper(), str(s["step"]), rtoks, rollout, plan, learner, speed,
                         mib(s["peak_rss_bytes"]), load])
    return table(["run", "step", "rollout tokens, tokens/s, mean reward", "rollout phase: estimate / measured",
                  "learner plan", "learner phase: estimate / measured", "scored tokens, learner tokens/s",
                  "process peak", "load at start"], rows)


def training_qwen_peft():
    """One LoRA SFT step of 4 x 256 tokens (r 16, all seven projections, 2
    threads): transformers + peft on the GGUF dequantized to f32 beside
    Tern's trainer under two caps (records/train58/)."""
    peft = jsonl(TRAIN58 / "peft.jsonl")
    head, steps = peft[0], [p for p in peft if "step" in p]
    summary = next(p for p in peft if "summary" in p)
    rows = [[f"transformers {head['transformers']} + peft {head['peft']} (torch {head['torch']}), f32",
             ", ".join(f"{p['tokens_per_s']:.1f}" for p in steps),
             f"{steps[0]['loss']:.4f}",
             f"{summary['peak_rss_bytes'] / GIB:.2f} GiB (after loading {head['rss_after_load_bytes'] / GIB:.2f} GiB)",
             "-", train58_load("peft")]]
    for cap in ["2GiB", "6GiB"]:
        d = TRAIN58 / f"step-{cap}"
        if not d.exists():
            continue
        ms = jsonl(d / "metrics.jsonl")
        plan = ", ".join(sorted({f"micro-batch {m['micro_batch']}, {'recompute' if m['recompute'] else 'activations kept'}" for m in ms}))
        fed = sum(len(r["ids"]) for r in json.loads((TRAIN58 / "ids.json").read_text()))
        rows.append([f"Tern, `--memory-cap {cap.replace('GiB', ' GiB')}`",
                     ", ".join(f"{fed / m['learner_seconds']:.1f}" for m in ms),
                     f"{ms[0]['loss']:.4f}",
                     f"{max(m['peak_rss_bytes'] for m in ms) / GIB:.2f} GiB (learner phase {max(m['learner_peak_bytes'] for m in ms) / GIB:.2f} GiB)",
                     f"{plan}; estimate {max(m['peak_estimate_bytes'] for m in ms) / GIB:.2f} GiB",
                     train58_load(f"step-{cap}")])
    return table(["trainer", "tokens/s, steps 1 and 2 (1,024 tokens a step)", "loss, step 1",
                  "peak RSS", "planner", "load at start"], rows)


# ---------------------------------------------------------------- docs/SPARSE_RL.md

# The cap tables' peak RSS is the trainer's own (`peak_rss_bytes`, the whole
# run): `tern train` resets the kernel's high-water mark per phase, so the
# `time -v` in each record's log.txt shows only the last phase's.
def cap_cells(base, d, log, args):
    """A cap run's "sequences at once" and "rollout tokens/s" cells, each
    against the first policy's (`base`, None for the first); returns the new
    base and the two cells."""
    at_once = int(log_field(log, r"\((\d+) sequences at once\)"))
    total = int(arg(args, "--group-size")) * int(arg(args, "--prompts-per-step"))
    tps = d["tokens_per_s"]
    if base is None:
        return (at_once, tps), f"**{at_once} of {total}**", f"{tps:.1f}"
    return (base, f"**{at_once} of {total}** ({at_once / base[0]:.1f}x)",
            f"{tps:.1f} ({tps / base[1]:.2f}x)")


def sparse_cap_600mib():
    """Dry runs and one real step per rollout policy under a 600 MiB cap."""
    rows, base = [], None
    for policy in ["full", "rkv"]:
        dm, dlog, dargs = run(f"cap600-dryrun-{policy}")
        sm, slog, _ = run(f"cap600-step-{policy}")
        d, s = dm[0], sm[0]
        base, seqs, speed = cap_cells(base, d, dlog, dargs)
        rows.append([f"`{arg(dargs, '--rollout-kv-policy')}`", seqs, f"{d['rollout_tokens']:,}", speed,
                     mib(d["peak_rss_bytes"]),
                     f"{s['learner_tokens']:,} ({s['groups_with_signal']} groups with signal)",
                     mib(s["peak_rss_bytes"])])
    return table(["rollout policy", "sequences decoding at once", "rollout tokens", "rollout tokens/s",
                  "peak RSS, dry run", "real step: learner tokens", "real step: peak RSS"], rows)


def sparse_cap_f32():
    """The f32 learner's dry runs under a 3.5 GiB cap, full against rkv:32
    (records/cap3.5g-f32-*/, scripts/sparse_rerun.sh memory)."""
    runs = {p: run(f"cap3.5g-f32-{p}") for p in ["full", "rkv"]}
    if not all(m for (m, _, _) in runs.values()):
        return "Not run yet: `scripts/sparse_rerun.sh memory` writes records/cap3.5g-f32-{full,rkv}/.\n"
    rows, base = [], None
    for policy, (m, log, args) in runs.items():
        d = m[0]
        kv = log_field(log, r"rollout KV ([\d.]+ [KMG]iB)")
        binds = log_field(log, r"the cap binds on ([^)]+)\)")
        base, seqs, speed = cap_cells(base, d, log, args)
        rows.append([f"`{arg(args, '--rollout-kv-policy')}`", kv, binds, seqs,
                     f"{d['kv_bytes_peak'] / 1e6:,.0f} MB", f"{d['kv_bytes_full'] / 1e6:,.0f} MB",
                     f"{d['rollout_tokens']:,}", speed, mib(d["peak_rss_bytes"])])
    return table(["rollout policy", "rollout KV planned", "the cap binds on", "sequences decoding at once",
                  "KV held at peak (sum over sequences)", "what full caches would hold",
                  "rollout tokens", "rollout tokens/s", "peak RSS"], rows)


def sparse_data_selection():
    """Difficulty-targeted selection + replay against uniform on a 24- and a
    100-task pool (records/data-pool*/, scripts/sparse_rerun.sh data):
    the first step whose trailing 5-step mean reward reaches each threshold."""
    rows = []
    for n in (24, 100):
        for key, label in (("uniform", "uniform"), ("difficulty", "difficulty + replay")):
            d = RECORDS / f"data-pool{n}-{key}"
            ev = json.loads((d / "eval.json").read_text()) if (d / "eval.json").exists() else {}
            if ev.get("after") is None:
                rows.append([f"{n} tasks", label, "not finished"] + ["-"] * 6)
                continue
            ms = jsonl(d / "metrics.jsonl")
            r = [m["reward_mean"] for m in ms]
            trail = [sum(r[max(0, i - 4):i + 1]) / len(r[max(0, i - 4):i + 1]) for i in range(len(r))]
            first = lambda t: next((str(ms[i]["step"]) for i, x in enumerate(trail) if x >= t), "never")
            late = [m["reward_mean"] for m in ms if 21 <= m["step"] <= 30]
            rows.append([f"{n} tasks", label, *(first(t) for t in (0.1, 0.2, 0.3, 0.4)),
                         f"{sum(late) / len(late):.3f}" if late else "-",
                         str(sum(m["groups_with_signal"] for m in ms)),
                         f"{100 * ev['before']:.0f}% -> {100 * ev['after']:.0f}%"])
    return table(["pool", "data", ">= 0.1", ">= 0.2", ">= 0.3", ">= 0.4", "reward steps 21-30",
                  "groups with signal", "held-out before -> after"], rows)


# ---------------------------------------------------------------- docs/REASONING.md

def reasoning_arith_bon8():
    """All 200 generated arithmetic tasks, five strategies in one run."""
    labels = {"majority@8": "majority@8", "adaptive@8": "adaptive@8 (waves of 2)",
              "adaptive@8:wave=1": "adaptive@8:wave=1 (one at a time, DESIGN section 5)",
              "synthesize@8": "synthesize@8", "single": "single (greedy)"}
    rows = eval_rows(EVAL / "arith-bon8.jsonl", list(labels))
    out = []
    for s, r in rows.items():
        out.append([labels[s], pct(r["correct"], r["tasks"]), f"{r['tokens_per_task']:.1f}",
                    f"{r['samples_per_task']:.2f}", str(r["width_stops"]) if s.startswith("adaptive") else "-",
                    f"{r['wins']} / {r['losses']}" if "wins" in r else "-"])
    return table(["strategy", "accuracy", "tokens/task", "samples/task", "width-stop",
                  "vs majority@8 (wins / losses)"], out)


GSM8K_TOTAL = 1319  # problems in GSM8K's test set; the run covers all of them when done


def reasoning_gsm8k_bon8():
    """The whole-GSM8K best-of-8 run (resumable; says how far it got)."""
    strategies = ["majority@8", "adaptive@8", "synthesize@8"]
    rows = eval_rows(EVAL / "gsm8k-bon8.jsonl", strategies)
    n = rows["majority@8"]["tasks"]
    if n == GSM8K_TOTAL:
        head = f"The whole test set, all {GSM8K_TOTAL} problems"
    else:
        head = f"Progress so far: {n} of {GSM8K_TOTAL} problems"
    t = table(["strategy", "accuracy", "tokens/task", "samples/task"],
              [[s, pct(r["correct"], n), f"{r['tokens_per_task']:.1f}", f"{r['samples_per_task']:.2f}"]
               for s, r in rows.items()])
    syn, ada = rows["synthesize@8"], rows["adaptive@8"]
    same = "the same as" if ada["correct"] == rows["majority@8"]["correct"] else "different from"
    if ada["width_stops"]:
        adaptive = (f"Adaptive width stopped early\non only {ada['width_stops']} problem(s) (the first "
                    f"samples agreed; accuracy\n{same} majority@8's): this model's GSM8K answers rarely "
                    "agree enough for the Beta rule")
    else:
        adaptive = ("Adaptive width never stopped\nearly: this model's GSM8K answers never agreed "
                    "enough for the Beta rule")
    return (f"{head}\n(temperature 0.7, top-p 0.95, seed 42 + 1000 x task):\n\n{t}\n"
            f"{'The' if n == GSM8K_TOTAL else 'So far the'} synthesizer is right where majority is "
            f"wrong on {syn['wins']} problem(s)\nand wrong where majority is right on {syn['losses']}. "
            f"{adaptive} (on the\ngenerated arithmetic set above, where the model is often right, it "
            f"saves\nsamples).\n")


def reasoning_gsm8k_single():
    """The whole GSM8K test set, one greedy sample (resumable; says how far it got)."""
    rows = eval_rows(EVAL / "gsm8k-single.jsonl", ["single"])
    r = rows["single"]
    n = r["tasks"]
    head = (f"All {GSM8K_TOTAL} problems" if n == GSM8K_TOTAL
            else f"Progress so far: {n} of {GSM8K_TOTAL} problems")
    t = table(["strategy", "accuracy", "tokens/task", "no answer found", "hit the 256-token limit"],
              [["single (greedy)", pct(r["correct"], n),
                f"{r['tokens_per_task']:.1f}", str(r["no_answer"]),
                str(sum(1 for x in r["records"] if x["tokens"] >= 256))]])
    return f"{head}:\n\n{t}"


def reasoning_humaneval():
    """HumanEval, all 164 problems: greedy against reward@4."""
    rows = eval_rows(EVAL / "humaneval-reward4.jsonl", ["single", "reward@4"])
    labels = {"single": "single (greedy)", "reward@4": "reward@4 (T = 0.7)"}

    def passed(r):
        m = re.fullmatch(r"(\d+)/(\d+) tests", r["answer"])
        return int(m.group(1)) / int(m.group(2))

    out = [[labels[s], pct(r["correct"], r["tasks"]),
            f"{100 * sum(passed(x) for x in r['records']) / r['tasks']:.1f}%",
            f"{r['tokens_per_task']:.1f}", f"{r['seconds']:.0f}"] for s, r in rows.items()]
    t = table(["strategy", "solved", "test cases passed (mean per task)", "tokens/task", "seconds"], out)
    r4 = rows["reward@4"]
    return (f"{t}\nreward@4 solves {r4['wins']} tasks greedy does not and misses {r4['losses']} "
            "that greedy solves.\n")



# ---------------------------------------------------------------- issue 60 (docs/REASONING.md)

def _coderm60(rows_of, header_of):
    """One table of issue 60's HumanEval study from records/coderm60/
    (scripts/coderm60_table.py; records/coderm60/PROTOCOL.md)."""
    import coderm60_table as c
    return table(getattr(c, header_of), getattr(c, rows_of)(c.load()))


def coderm60_arms():
    """Accuracy of every arm over the tasks with every record."""
    return _coderm60("arms_rows", "ARMS_HEADER")


def coderm60_curve():
    """Accuracy against K by the policy's own pass rate."""
    return _coderm60("curve_rows", "CURVE_HEADER")


def coderm60_dynamic():
    """Dynamic against fixed allocation at the same total tests."""
    return _coderm60("dynamic_rows", "DYNAMIC_HEADER")


def coderm60_paired():
    """Paired comparisons of reward@32 with other arms."""
    return _coderm60("paired_rows", "PAIRED_HEADER")


def coderm60_quality():
    """Share of generated tests the canonical solution passes."""
    return _coderm60("quality_rows", "QUALITY_HEADER")


def coderm60_throughput():
    """Tests written and executed per second, generation vs sandbox."""
    return _coderm60("throughput_rows", "THROUGHPUT_HEADER")



# ---------------------------------------------------------------- issue 29 (docs/REASONING.md)

SYNTH29_REC = RECORDS / "synth29"
SYNTH29_EVAL = EVAL / "synth29"
# `mixed` (the first recipe rebuilt: bare answers mixed in) is evaluated
# once it is exported; a table shows it when its records are there.
SYNTH29_STRATEGIES = ["single", "majority@8", "synthesize@8", "synthesize@8:with=trained",
                      "synthesize@8:with=mixed"]
SYNTH29_TRAINED = ["synthesize@8:with=trained", "synthesize@8:with=mixed"]
SYNTH29_LABELS = {"single": "single (greedy)", "majority@8": "majority@8",
                  "synthesize@8": "synthesize@8, untrained synthesizer",
                  "synthesize@8:with=trained": "synthesize@8, trained on worked syntheses only",
                  "synthesize@8:with=mixed": "synthesize@8, trained on worked syntheses + bare answers (mixed)"}


def not_run(stage, what):
    return f"Not run yet: `scripts/synth29.sh {stage}` writes {what}.\n"


def synth29_data(rec=None):
    """The synthesizer's training data: every task processed (data-sources.txt)
    and each kept example's sampling outcome (data-kept.jsonl)."""
    rec = rec or SYNTH29_REC
    src = rec / "data-sources.txt"
    if not src.exists():
        return not_run("data", "records/synth29/data-sources.txt and data-kept.jsonl")
    tasks = {int(l) for l in src.read_text().split()}
    kept = jsonl(rec / "data-kept.jsonl")
    n = len(tasks)
    # A task not kept had its majority right and no disagreement.
    majority_right = n - len(kept) + sum(e["majority_right"] for e in kept)
    some_right = n - len(kept) + sum(e["candidates_right"] > 0 for e in kept)
    target = sum(e["has_target"] for e in kept)
    k = sum(e["k"] for e in kept)
    rows = [
        ["training tasks (story seed 1) sampled, 8 candidates each", str(n)],
        ["majority of the 8 right", pct(majority_right, n)],
        ["some candidate right", pct(some_right, n)],
        ["kept: candidates disagree or majority wrong", pct(len(kept), n)],
        ["syntheses of kept tasks right", pct(sum(e["syntheses_right"] for e in kept), k) if k else "-"],
        ["SFT examples (kept tasks with a right synthesis as target)", str(target)],
        ["kept tasks whose majority was wrong, with a target", str(sum(e["has_target"] and not e["majority_right"] for e in kept))],
    ]
    again = rec / "data-again.json"
    if again.exists():
        a = json.loads(again.read_text())
        rows.append(["kept tasks sampled again (`data-again`), identical to the record",
                     f"{a['identical']} of {a['tasks_on_record']}"])
    for name, what in [("sft", "worked syntheses only"), ("sft-mixed", "mixed: + bare answers")]:
        sft = rec / f"{name}-metrics.jsonl"
        if not sft.exists():
            continue
        losses = [m["loss"] for m in jsonl(sft) if isinstance(m.get("loss"), (int, float))]
        if len(losses) >= 2:
            w = min(10, len(losses) // 2)
            rows.append([f"SFT loss ({what}), mean of steps 1-{w} -> last {w} ({len(losses)} steps)",
                         f"{sum(losses[:w]) / w:.3f} -> {sum(losses[-w:]) / w:.3f}"])
    first = rec / "first" / "sft-metrics.jsonl"
    if (rec / "sft-mixed-metrics.jsonl").exists() and first.exists():
        # The mixed recipe is the first synthesizer's: same data, config and
        # seed, so the same losses step by step if the run is deterministic.
        mixed = [m["loss"] for m in jsonl(rec / "sft-mixed-metrics.jsonl")]
        old = [m["loss"] for m in jsonl(first)]
        same = sum(1 for x, y in zip(mixed, old) if x == y)
        rows.append(["mixed SFT steps whose loss equals the first synthesizer's exactly",
                     f"{same} of {min(len(mixed), len(old))}"])
    return table(["synthesis training data", ""], rows)


def synth29_compare(records, total, stage, head=None, labels=None):
    """single, majority@8 and the synthesizers over the same candidates,
    each against majority@8 task by task, and each trained one against the
    untrained one. A strategy with no record yet is left out; one with some
    narrows the table to the tasks every strategy has finished."""
    if not records.exists() or not records.read_text().strip():
        return not_run(stage, f"records/synth29/{records.name}")
    labels = {**SYNTH29_LABELS, **(labels or {})}
    present = {s for (s, _) in eval_records(records)}
    strategies = [s for s in SYNTH29_STRATEGIES if s in present]
    rows = eval_rows(records, strategies)
    n = rows["single"]["tasks"]
    if n == 0:
        return not_run(stage, f"records/synth29/{records.name}")
    ok = {s: [r["ok"] for r in rows[s]["records"]] for s in strategies}

    def versus(a, b):
        wins = sum(1 for x, y in zip(ok[a], ok[b]) if x and not y)
        losses = sum(1 for x, y in zip(ok[a], ok[b]) if y and not x)
        return f"{wins} / {losses}", f"{mcnemar_p(wins, losses):.3g}"

    out = []
    for s in strategies:
        r = rows[s]
        lo, hi = wilson(r["correct"], n)
        vs = versus(s, "majority@8") if s != "majority@8" else ("-", "-")
        out.append([labels[s], f"{pct(r['correct'], n)} [{lo:.1f}, {hi:.1f}]",
                    f"{r['tokens_per_task']:.1f}", vs[0], vs[1]])
    if head is None:
        head = f"All {n} tasks" if n == total else f"Progress so far: {n} of {total} tasks"
    else:
        head = head.format(n=n, total=total)
    tail = ""
    for s in [s for s in SYNTH29_TRAINED if s in strategies]:
        tw = versus(s, "synthesize@8")
        tail += f"\n{labels[s]} against the untrained synthesizer: {tw[0]} (wins / losses), McNemar p = {tw[1]}.\n"
    best_of = sum(1 for s in strategies if s != "single")
    return (f"{head} (temperature 0.7, top-p 0.95, seed 42 + 1000 x task; the {best_of} best-of-8 "
            f"strategies share each task's 8 candidates):\n\n"
            + table(["strategy", "accuracy [95% CI]", "tokens/task", "vs majority@8: wins / losses",
                     "McNemar p"], out)
            + tail)


def synth29_story(ev=None):
    return synth29_compare((ev or SYNTH29_EVAL) / "story.jsonl", 300, "eval-story")


def synth29_story_split(ev=None):
    """The held-out stories split where a choice touched them: the first
    synthesizer's finished stories (on which the bare-answer recipe was
    adopted) and the rest, which no choice saw. Each strategy against
    majority@8 on each part, and the three synthesizers' McNemar p on all
    of them with Bonferroni's correction for three comparisons."""
    ev = ev or SYNTH29_EVAL
    path, first_path = ev / "story.jsonl", ev / "story-first-partial.jsonl"
    if not path.exists() or not first_path.exists():
        return not_run("eval-story", "records/synth29/story.jsonl")
    recs = eval_records(path)
    chosen_on = {r["task"] for r in jsonl(first_path) if r["strategy"] == "synthesize@8:with=trained"}
    strategies = [s for s in SYNTH29_STRATEGIES if any(k[0] == s for k in recs)]
    tasks = sorted(t for (s, t) in recs if s == "single" and all((x, t) in recs for x in strategies))
    parts = [[t for t in tasks if t in chosen_on], [t for t in tasks if t not in chosen_on], tasks]

    def cell(s, part):
        right = sum(recs[(s, t)]["ok"] for t in part)
        if s == "majority@8":
            return f"{right}/{len(part)}"
        w = sum(1 for t in part if recs[(s, t)]["ok"] and not recs[("majority@8", t)]["ok"])
        l = sum(1 for t in part if recs[("majority@8", t)]["ok"] and not recs[(s, t)]["ok"])
        return f"{right}/{len(part)} ({w} / {l}, p = {mcnemar_p(w, l):.2g})"

    rows = [[SYNTH29_LABELS[s]] + [cell(s, part) for part in parts] for s in strategies]
    synths = [s for s in strategies if s.startswith("synthesize")]
    corrected = []
    for s in synths:
        w = sum(1 for t in tasks if recs[(s, t)]["ok"] and not recs[("majority@8", t)]["ok"])
        l = sum(1 for t in tasks if recs[("majority@8", t)]["ok"] and not recs[(s, t)]["ok"])
        corrected.append(f"{SYNTH29_LABELS[s]} {min(1.0, len(synths) * mcnemar_p(w, l)):.2g}")
    return (table(["strategy", f"first {len(parts[0])} stories: right (wins / losses vs majority@8, p)",
                   f"other {len(parts[1])}", f"all {len(parts[2])}"], rows)
            + f"\nMcNemar p against majority@8 on all {len(tasks)} stories, Bonferroni-corrected for "
            + f"the {len(synths)} synthesizers: " + "; ".join(corrected) + ".\n")


def synth29_gsm8k(ev=None):
    return synth29_compare((ev or SYNTH29_EVAL) / "gsm8k.jsonl", GSM8K_TOTAL, "eval-gsm8k")


def synth29_adaptive(ev=None):
    """Adaptive width (against majority@8) and adaptive length (against
    single, the fixed-length greedy answer) by generator difficulty."""
    path = (ev or SYNTH29_EVAL) / "adaptive-by-difficulty.json"
    if not path.exists() or not path.read_text().strip():
        return not_run("adaptive", "records/synth29/adaptive-by-difficulty.json")
    # `--report --json` prints the whole run's report, then the buckets.
    levels = jsonl(path)[-1]["by_difficulty"]
    buckets = [(str(l["difficulty"]), {r["strategy"]: r for r in l["rows"]}) for l in levels]
    # All buckets together, summed from theirs.
    total = {}
    for _, rows in buckets:
        for s, r in rows.items():
            t = total.setdefault(s, {"tasks": 0, "correct": 0, "tokens": 0, "candidates": 0.0})
            t["tasks"] += r["tasks"]
            t["correct"] += r["correct"]
            t["tokens"] += r["tokens"]
            t["candidates"] += r["candidates_per_task"] * r["tasks"]
    for t in total.values():
        t["tokens_per_task"] = t["tokens"] / t["tasks"]
        t["candidates_per_task"] = t["candidates"] / t["tasks"]
    out, pays = [], []

    def cell(r, base, saved, label, d):
        dacc = 100 * (r["correct"] - base["correct"]) / r["tasks"]
        ok = saved >= 30 and abs(dacc) <= 1
        if ok:
            pays.append(f"{label} at difficulty {d}")
        return f"{100 * r['correct'] / r['tasks']:.1f} ({dacc:+.1f})", f"{saved:.0f}%{' **pays**' if ok else ''}"

    for d, rows in buckets + [("all", total)]:
        maj, single = rows["majority@8"], rows["single"]
        line = [d, str(maj["tasks"]), f"{100 * maj['correct'] / maj['tasks']:.1f}"]
        for s in ["adaptive@8", "adaptive@8:wave=1"]:
            r = rows[s]
            saved = 100 * (1 - r["candidates_per_task"] / maj["candidates_per_task"])
            line += cell(r, maj, saved, s, d)
        line += [f"{100 * single['correct'] / single['tasks']:.1f}", f"{single['tokens_per_task']:.1f}"]
        r = rows["length@auto"]
        saved = 100 * (1 - r["tokens_per_task"] / single["tokens_per_task"]) if single["tokens_per_task"] else 0.0
        line += cell(r, single, saved, "length@auto", d)
        out.append(line)
    verdict = ("Buckets where a method saves at least 30% within 1 point of accuracy: "
               + (", ".join(pays) if pays else "none") + ".\n")
    return table(["difficulty", "tasks", "majority@8 acc %", "adaptive@8 acc % (change)", "samples saved",
                  "adaptive@8:wave=1 acc % (change)", "samples saved", "single acc %", "single tokens/task",
                  "length@auto acc % (change)", "tokens saved"], out) + "\n" + verdict


def synth29_first(rec=None, ev=None):
    """The first trained synthesizer (SFT on 178 worked and 622 bare-answer
    targets), lost with its machine mid-evaluation: its SFT and the held-out
    stories it had finished (records/synth29/first/,
    records/synth29/story-first-partial.jsonl)."""
    first = (rec or SYNTH29_REC) / "first"
    if not (first / "sft-metrics.jsonl").exists():
        return "No first synthesizer on record.\n"
    metrics = jsonl(first / "sft-metrics.jsonl")
    losses = [m["loss"] for m in metrics]
    w = min(10, len(losses) // 2)
    train = sum(r["seconds"] for r in jsonl(first / "wall.jsonl") if r["stage"] == "train")
    srv = json.loads((first / "serve-response.json").read_text())["response"]["tern"]
    out = (f"SFT: {len(losses)} steps in {train // 3600} h {train % 3600 // 60:02d} min, loss (mean of "
           f"steps 1-{w} -> last {w}) {sum(losses[:w]) / w:.3f} -> {sum(losses[-w:]) / w:.3f}; "
           f"served, it answered {srv['answer']!s} to GSM8K test's first question (gold 18) "
           f"with a bare answer line.\n\n")
    return out + synth29_compare((ev or SYNTH29_EVAL) / "story-first-partial.jsonl", 300, "eval-story",
                                 head="The first {n} of the {total} held-out stories, all it finished",
                                 labels={"synthesize@8:with=trained":
                                         "synthesize@8, first trained synthesizer (worked + bare answers)"})


def synth29_adaptive_sweep(ev=None):
    """Adaptive width at stopping confidences 0.8 and 0.9 (waves of 2 and 1)
    against majority@8 over the same samples, by generator difficulty."""
    path = (ev or SYNTH29_EVAL) / "adaptive-sweep-by-difficulty.json"
    if not path.exists() or not path.read_text().strip():
        return not_run("adaptive-sweep", "records/synth29/adaptive-sweep-by-difficulty.json")
    levels = jsonl(path)[-1]["by_difficulty"]
    widths = [r["strategy"] for r in levels[0]["rows"] if r["strategy"] != "majority@8"]
    buckets = [(str(l["difficulty"]), {r["strategy"]: r for r in l["rows"]}) for l in levels]
    total = {}
    for _, rows in buckets:
        for st, r in rows.items():
            t = total.setdefault(st, {"tasks": 0, "correct": 0, "candidates": 0.0})
            t["tasks"] += r["tasks"]
            t["correct"] += r["correct"]
            t["candidates"] += r["candidates_per_task"] * r["tasks"]
    for t in total.values():
        t["candidates_per_task"] = t["candidates"] / t["tasks"]
    out, pays = [], []
    for d, rows in buckets + [("all", total)]:
        maj = rows["majority@8"]
        line = [d, str(maj["tasks"]), f"{100 * maj['correct'] / maj['tasks']:.1f}"]
        for st in widths:
            r = rows[st]
            saved = 100 * (1 - r["candidates_per_task"] / maj["candidates_per_task"])
            dacc = 100 * (r["correct"] - maj["correct"]) / r["tasks"]
            ok = saved >= 30 and abs(dacc) <= 1
            if ok and d != "all":
                pays.append(f"{st} at difficulty {d}")
            line.append(f"{saved:.0f}%, {dacc:+.1f}{' **pays**' if ok else ''}")
        out.append(line)
    verdict = ("Buckets where one saves at least 30% of the samples within 1 point of accuracy: "
               + (", ".join(pays) if pays else "none") + ".\n")
    return table(["difficulty", "tasks", "majority@8 acc %"]
                 + [f"{st}: samples saved, acc change" for st in widths], out) + "\n" + verdict


def synth29_wall(rec=None):
    """Each stage's wall time from wall.jsonl (interrupted parts included)."""
    path = (rec or SYNTH29_REC) / "wall.jsonl"
    if not path.exists():
        return not_run("all", "records/synth29/wall.jsonl")
    stages = {}
    for w in jsonl(path):
        s = stages.setdefault(w["stage"], {"seconds": 0, "calls": 0, "interrupted": 0, "threads": []})
        if w["threads"] not in s["threads"]:
            s["threads"].append(w["threads"])
        s["seconds"] += w["seconds"]
        s["calls"] += 1
        s["interrupted"] += bool(w.get("interrupted"))
    hm = lambda sec: f"{sec // 3600} h {sec % 3600 // 60:02d} min"
    # The mixed synthesizer's stages (data-again, train-mixed, export-mixed,
    # STAGE+mixed) are a second synthesizer's cost: apart from the loop's total.
    mixed = lambda s: s in ("data-again", "train-mixed", "export-mixed") or s.endswith("+mixed")
    rows = []
    for part, label in [(False, "total (the loop, one synthesizer)"), (True, "total (the mixed synthesizer)")]:
        mine = {s: v for s, v in stages.items() if mixed(s) == part}
        if not mine:
            continue
        rows += [[s, hm(v["seconds"]), str(v["calls"]), str(v["interrupted"]), ", ".join(map(str, v["threads"]))]
                 for s, v in mine.items()]
        rows.append([label, hm(sum(v["seconds"] for v in mine.values())), "", "", ""])
    out = table(["stage", "wall time", "calls", "of them interrupted (resumed later)", "threads"], rows)
    served = (rec or SYNTH29_REC) / "serve-response.json"
    if served.exists():
        # The serve stage's check: the trained synthesizer answering through
        # the server and the CLI (GSM8K test's first question, gold 18).
        srv = json.loads(served.read_text())["response"]["tern"]
        cli = json.loads(((rec or SYNTH29_REC) / "bon-response.json").read_text())["response"]
        out += (f"\nServed (`serve`): `tern serve --synthesizer-model` loaded it as "
                f"`{srv['synthesizer_model']}`; a best-of-{srv['best_of']} `aggregate: synthesize` request "
                f"naming it answered {srv['answer']!s} to GSM8K test's first question (gold 18), "
                f"and `tern bon --synthesizer-model` answered {cli['answer']!s} "
                f"(`serve-response.json`, `bon-response.json`).\n")
    return out


# ---------------------------------------------------------------- docs/KV.md

def wilson(k, n, z=1.96):
    """The 95% Wilson score interval of k successes in n, in percent."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return 100 * max(0.0, c - h), 100 * min(1.0, c + h)


KV_GSM8K = EVAL / "rkv-gsm8k-2026-12-03"


def kv_gsm8k_rkv():
    """Greedy GSM8K CoT to 512 tokens under R-KV, SnapKV and StreamingLLM at
    budgets 64/128/256 against the full cache, on the problems every run
    answered: accuracy, and how often each run's final answer equals the full
    cache's (the model is right ~2% of the time, so agreement is the finer
    measure of what compression changes)."""
    runs = [("full", "-", KV_GSM8K / "full.jsonl")]
    for budget in (256, 128, 64):
        for pol in ("rkv", "snapkv", "streaming"):
            path = KV_GSM8K / f"{pol}-budget-{budget}.jsonl"
            if path.exists():
                runs.append((pol, str(budget), path))
    recs = [eval_records(p) for (_, _, p) in runs]
    tasks = sorted(set.intersection(*[{t for (_, t) in r} for r in recs]))
    n = len(tasks)
    full = recs[0]
    out = []
    for (pol, budget, _), r in zip(runs, recs):
        right = sum(1 for t in tasks if r[("single", t)]["ok"])
        lo, hi = wilson(right, n)
        agree = sum(1 for t in tasks if r[("single", t)]["answer"] == full[("single", t)]["answer"])
        same_len = sum(1 for t in tasks if r[("single", t)]["tokens"] == full[("single", t)]["tokens"])
        tokens = sum(r[("single", t)]["tokens"] for t in tasks) / n
        over = sum(1 for t in tasks if r[("single", t)]["tokens"] >= 512)
        out.append([pol, budget, f"{pct(right, n)} [{lo:.1f}, {hi:.1f}]",
                    "-" if pol == "full" else pct(agree, n),
                    "-" if pol == "full" else str(same_len),
                    f"{tokens:.1f}", str(over)])
    return table(["policy", "budget", "right [95% CI]", "same answer as full",
                  "same length as full", "tokens/answer", "hit 512"], out)


KV_EVAL = EVAL / "kv-2026-12-03"


def kv_eval_cells(path):
    """{(policy as printed, budget): cell} from the Markdown tables `tern
    kv-eval --tasks ppl` printed into a kept output file (`| policy |
    budget 128 | budget 512 |` and the rows under it)."""
    cells, budgets = {}, None
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            budgets = None
            continue
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if parts[0] == "policy":
            budgets = [int(c.split()[-1]) for c in parts[1:]]
        elif budgets and not set(parts[0]) <= {"-"}:
            for b, c in zip(budgets, parts[1:]):
                cells[(parts[0], b)] = c
    return cells


def kv_adakv_keydiff():
    """Ada-KV and KeyDiff against SnapKV's defaults, one window of
    gpl-3.txt at ctx 2048 (records/kv-2026-12-03/reference-settings.txt)."""
    cells = kv_eval_cells(KV_EVAL / "reference-settings.txt")
    rows = [("`snapkv` (defaults)", "snapkv:"),
            ("`adakv` (inner snapkv defaults, floor 0.2)", "adakv:"),
            ("`keydiff`", "keydiff:")]
    return table(["policy", "budget 128", "budget 512"],
                 [[label] + [cells[(spec, b)] for b in (128, 512)] for label, spec in rows])


def kv_reference_settings():
    """SnapKV's and H2O's defaults against their papers' settings, one window
    of gpl-3.txt at ctx 2048; in bold the better of each pair per budget
    (records/kv-2026-12-03/reference-settings.txt)."""
    cells = kv_eval_cells(KV_EVAL / "reference-settings.txt")
    pairs = [
        [("SnapKV, Tern's defaults (window 8, kernel 7, max)", {128: "snapkv:", 512: "snapkv:"}),
         ("SnapKV, reference (window 32, kernel 5, avg)",
          {b: "snapkv:window=32,kernel=5,pool=avg" for b in (128, 512)})],
        [("H2O, `recent = 32` (old default)", {128: "h2o:", 512: "h2o:"}),
         ("H2O, `recent = budget / 2` (reference)", {128: "h2o:recent=64", 512: "h2o:recent=256"})],
    ]
    rows = []
    for pair in pairs:
        got = [[cells[(spec[b], b)] for b in (128, 512)] for _, spec in pair]
        for col in range(2):
            best = min(range(len(pair)), key=lambda i: float(got[i][col].split()[0]))
            got[best][col] = f"**{got[best][col]}**"
        rows += [[label] + g for (label, _), g in zip(pair, got)]
    return table(["policy", "budget 128", "budget 512"], rows)


def kv_dtype_perplexity():
    """Perplexity of SmolLM2 on gpl-3.txt at ctx 512 by KV storage type,
    Tern and the in-process llama.cpp
    (records/kv-dtype-2026-12-03/perplexity-gpl3-ctx512.jsonl)."""
    recs = jsonl(EVAL / "kv-dtype-2026-12-03" / "perplexity-gpl3-ctx512.jsonl")
    by = {(r["backend"], r["kv_dtype"]): r for r in recs}
    base = by[("tern", "f16")]["perplexity"]
    rows = []
    for dt in ("f16", "q8_0", "q4_0"):
        t, l = by.get(("tern", dt)), by.get(("llama-cpp", dt))
        change = "" if dt == "f16" else f" ({100 * (t['perplexity'] / base - 1):+.2g}%)"
        rows.append([dt, f"{t['perplexity']!r}{change}", repr(l["perplexity"]) if l else "",
                     f"{t['kv_bytes'] / 1e6:.1f} MB"])
    return table(["storage", "Tern", "llama.cpp (in process)", "KV peak per window"], rows)


def kv_gemma3_perplexity():
    """Gemma 3 270M on gpl-3.txt at ctx 512, each policy at budget 256
    (records/gemma3-270m-kv.jsonl)."""
    recs = jsonl(EVAL / "gemma3-270m-kv.jsonl")
    full = next(r for r in recs if r["kv_policy"] == "full")["perplexity"]
    return table(["policy", "perplexity", "ratio to full", "KV held (MB)"],
                 [[f"`{r['kv_policy']}`", f"{r['perplexity']:.3f}", f"{r['perplexity'] / full:.3f}x",
                   f"{r['kv_bytes'] / 1e6:.1f} of {r['kv_bytes_full'] / 1e6:.1f}"] for r in recs])


def kv_texts():
    """Perplexity over six texts at 25% and 50% kept
    (records/kv-texts-2026-12-03/records.jsonl, scripts/kv_texts_table.py)."""
    import kv_texts_table
    return kv_texts_table.render(jsonl(EVAL / "kv-texts-2026-12-03" / "records.jsonl"))


RULER = EVAL / "ruler-2026-12-03"


def kv_ruler():
    """The RULER grid and the query-agnostic run, one table pair per model,
    length, storage type and query mode (scripts/kv_table.py)."""
    import kv_table
    paths = sorted(str(p) for p in (RULER / "grid").glob("*.jsonl"))
    paths += sorted(str(p) for p in (RULER / "agnostic").glob("*.jsonl"))
    return kv_table.doc_tables(paths) + "\n"


def kv_capacity():
    """SmolLM2's conversations per GiB at 8k by admission, joined with its
    RULER averages at 4k (scripts/kv_capacity_table.py)."""
    import kv_capacity_table as k
    cap = k.jsonl([EVAL / "kv-capacity-2026-12-03" / "capacity-8k-1gib.jsonl"])
    ruler = k.ruler_averages(sorted((RULER / "grid").glob("*.jsonl")), 4096)
    return k.render(cap, ruler, 5.0, 4096)


# ---------------------------------------------------------------- docs/SCALING.md

FLEET_RUNS = [("co-located", "co-located"), ("two-workers", "two workers"), ("one-worker", "one worker"),
              ("killed", "two, one killed after step 1")]


def scaling_fleet():
    """scripts/fleet_check.sh's four runs (records/fleet-2026-12-04/
    summary.json, written by scripts/fleet_summary.py): steps equal to the
    co-located run's, rollout speed, and the groups each worker sampled per
    step (runs of equal steps collapsed)."""
    summary = json.loads((RECORDS / "fleet-2026-12-04" / "summary.json").read_text())
    rows = []
    for key, label in FLEET_RUNS:
        r = summary[key]
        by = [v for _, v in sorted(r["requests_per_step_by_worker"].items())]
        spans = []
        for step in zip(*by):
            cell = " + ".join(str(n) for n in step)
            if not spans or spans[-1] != cell:
                spans.append(cell)
        rows.append([label, f"{r['steps_equal_to_co_located']} of {r['steps']}",
                     f"{r['rollout_tokens_per_s']:.1f}", ", then ".join(spans) or "-"])
    return table(["Run", "Steps equal to co-located", "Rollout tokens/s", "Groups per step by worker"], rows)


# ---------------------------------------------------------------- docs/SECURITY.md

def security_attacks():
    """The attacks CI runs, from tests/security/attacks/*.py's headers."""
    import security_table
    return security_table.attack_table()



# ---------------------------------------------------------------- issue 28's ablation

# Arms of docs/sparse/story.toml's ablation: (label, record prefix, seeds planned).
SPARSE28_ARMS = [
    ("dense", "dense", 3),
    ("dense + numerics correction (10 steps)", "numerics", 1),
    ("sparse-rl, rkv:budget=104 (light)", "sparserl-r104", 1),
    ("sparse, no correction, rkv:budget=56 (~50%)", "none-r56", 3),
    ("sparse-rl, rkv:budget=56 (~50%)", "sparserl-r56", 3),
    ("sparse-rl + sparse-replay, rkv:budget=56 (~50%)", "replay-r56", 3),
    ("sparse-rl, advantages over kept rollouts, rkv:budget=56 (~50%)", "kept-r56", 1),
    ("sparse, no correction, KL clamped (low_var_kl), rkv:budget=56 (~50%)", "none-lvkl-r56", 1),
    ("dense, paper's bookkeeping (low_var_kl, mean per response)", "paper-dense", 1),
    ("sparse-rl, paper's bookkeeping, rkv:budget=56 (~50%)", "paper-sparserl-r56", 1),
    ("sparse, no correction, rkv:budget=28 (~25%)", "none-r28", 1),
    ("sparse-rl, rkv:budget=28 (~25%)", "sparserl-r28", 1),
    ("sparse-rl + sparse-replay, rkv:budget=28 (~25%)", "replay-r28", 1),
    ("sparse-rl, snapkv:budget=56 (~50%)", "sparserl-s56", 1),
    ("sparse-rl, snapkv:budget=28 (~25%)", "sparserl-s28", 1),
]


def sparse28_finished(prefix):
    """{seed: (metrics, eval)} of the arm's runs whose held-out scoring is in."""
    out = {}
    for d in sorted(RECORDS.glob(f"sparse28-{prefix}-s*")):
        if not re.fullmatch(rf"sparse28-{re.escape(prefix)}-s\d+", d.name):
            continue  # another run sharing the prefix (sparse28-numerics-check-s2)
        ev_path, m_path = d / "eval.json", d / "metrics.jsonl"
        if not (ev_path.exists() and m_path.exists()):
            continue
        ev = json.loads(ev_path.read_text())
        if "after" not in ev:
            continue
        out[int(d.name.rsplit("-s", 1)[1])] = (jsonl(m_path), ev)
    return out


def scored_tokens(m):
    """Tokens a step's correction judged: its rho histogram's count (the
    learner's tokens plus those of the rollouts it vetoed, which
    `learner_tokens` leaves out), or the learner's tokens without one."""
    hist = (m.get("rho") or {}).get("hist")
    return sum(hist) if hist else m["learner_tokens"]


def held_out(runs, key):
    """Per-seed accuracies (percent) under `key` and the pooled Wilson interval."""
    accs, k, n = [], 0, 0
    for _, (_, ev) in sorted(runs.items()):
        if ev.get(key) is None:
            return None
        accs.append(100 * ev[key])
        k += round(ev[key] * ev["tasks"])
        n += ev["tasks"]
    lo, hi = wilson(k, n)
    return f"{' / '.join(f'{a:.1f}' for a in accs)} [{lo:.1f}, {hi:.1f}]"


def sparse28_arms():
    """One row per arm, over its finished seeds: held-out accuracy before and
    after (greedy, full cache and under the rollout policy; pooled 95% Wilson
    interval), reward early and late, rejected tokens, KV kept, speed."""
    rows = []
    for label, prefix, planned in SPARSE28_ARMS:
        runs = sparse28_finished(prefix)
        if not runs:
            rows.append([label, f"0/{planned}"] + ["not finished"] + ["-"] * 9)
            continue
        steps = [m for (ms, _) in runs.values() for m in ms]
        first = [m["reward_mean"] for (ms, _) in runs.values() for m in ms[:10]]
        last = [m["reward_mean"] for (ms, _) in runs.values() for m in ms[-10:]]
        # Answer tokens per rollout (4 prompts x 8 rollouts a step).
        len_first = [m["rollout_tokens"] / 32 for (ms, _) in runs.values() for m in ms[:10]]
        len_last = [m["rollout_tokens"] / 32 for (ms, _) in runs.values() for m in ms[-10:]]
        rejected = sum((m.get("rho") or {}).get("rejected_tokens", 0) for m in steps)
        learner = sum(m["learner_tokens"] for m in steps)
        scored = sum(scored_tokens(m) for m in steps)
        peak = sum(m["kv_bytes_peak"] for m in steps)
        full = sum(m["kv_bytes_full"] for m in steps)
        tps = sum(m["tokens_per_s"] for m in steps) / len(steps)
        per_hour = 3600 * len(steps) / sum(m["seconds"] for m in steps)
        before = sorted({round(100 * ev["before"], 1) for (_, ev) in runs.values()})
        rows.append([
            label, f"{len(runs)}/{planned}",
            held_out(runs, "after") or "-",
            held_out(runs, "after_policy") or "-",
            " / ".join(f"{b:.1f}" for b in before),
            f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f}",
            f"{sum(len_first) / len(len_first):.0f} -> {sum(len_last) / len(len_last):.0f}",
            f"{100 * rejected / scored:.1f}%" if scored else "-",
            f"{100 * peak / full:.0f}%" if full else "-",
            # Per rollout (32 a step), in MiB: its peak KV, and what it saved
            # against a full cache.
            f"{peak / (32 * len(steps)) / 2**20:.2f} ({(full - peak) / (32 * len(steps)) / 2**20:.2f})"
            if full else "-",
            f"{tps:.0f}", f"{per_hour:.0f}",
        ])
    return table(["arm", "seeds", "held-out after, full cache (per seed) [95% CI]",
                  "held-out after, rollout policy", "before", "reward (first 10 -> last 10 steps)",
                  "answer tokens (first 10 -> last 10)",
                  "rejected tokens (of those scored)", "KV kept (peak / full)",
                  "KV per rollout, MiB (saved)", "rollout tok/s", "steps/hour"], rows)



T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}  # two-sided 95% Student t quantiles by df


def t_interval(diffs):
    """`mean [lo, hi]` of two or more differences, with the 95% Student t
    interval of their mean."""
    mean = sum(diffs) / len(diffs)
    sd = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5
    h = T95[len(diffs) - 1] * sd / len(diffs) ** 0.5
    return f"{mean:+.1f} [{mean - h:+.1f}, {mean + h:+.1f}]"


def sparse28_seeds():
    """Seed by seed: each budget-56 arm's held-out accuracy (full cache)
    against dense's of the same seed, and the mean difference with a t
    interval over seeds, which counts the seed-to-seed spread the pooled
    Wilson intervals of the arms table leave out."""
    rows = []
    for label, prefix, _ in SPARSE28_ARMS:
        if not prefix.endswith("-r56") or prefix == "kept-r56":
            continue
        dense = sparse28_finished(dense_of(prefix))
        runs = sparse28_finished(prefix)
        diffs, cells = [], []
        for seed in (1, 2, 3):
            if seed in runs and seed in dense and runs[seed][1].get("after") is not None:
                a, b = 100 * runs[seed][1]["after"], 100 * dense[seed][1]["after"]
                diffs.append(a - b)
                cells.append(f"{a:.1f} vs {b:.1f} ({a - b:+.1f})")
            else:
                cells.append("-")
        if len(diffs) >= 2:
            summary = t_interval(diffs)
        elif diffs:
            summary = f"{diffs[0]:+.1f} (one seed)"
        else:
            summary = "-"
        rows.append([label] + cells + [summary])
    return table(["arm", "seed 1: arm vs dense (difference)", "seed 2", "seed 3",
                  "mean difference over seeds [95% t interval]"], rows)


def sparse28_stability():
    """Gradient norms (before the trainer clips them to 1.0) of every
    finished arm, pooled over its seeds: how often a step's gradient blew up."""
    rows = []
    for label, prefix, _ in SPARSE28_ARMS:
        runs = sparse28_finished(prefix)
        if not runs:
            continue
        per_seed = []
        for seed, (ms, _) in sorted(runs.items()):
            g = [m["grad_norm"] for m in ms if m.get("learner_tokens")]
            per_seed.append((seed, g))
        g = sorted(x for _, gs in per_seed for x in gs)
        epochs = [e for (ms, _) in runs.values() for m in ms for e in m.get("epochs") or []]
        kl = max((e["kl_ref"] for e in epochs if e.get("kl_ref") is not None), default=None)
        ratio = max((e["ratio"]["max"] for e in epochs if e.get("ratio")), default=None)
        rows.append([label, str(len(per_seed)), str(len(g)), f"{g[len(g) // 2]:.2f}",
                     " / ".join(f"{max(gs):.2f}" for _, gs in per_seed),
                     " / ".join(str(sum(x > 2 for x in gs)) for _, gs in per_seed),
                     " / ".join(str(sum(x > 10 for x in gs)) for _, gs in per_seed),
                     f"{kl:.3g}" if kl is not None else "-",
                     f"{ratio:.3g}" if ratio is not None else "-"])
    return table(["arm", "seeds", "steps that trained", "median gradient norm",
                  "largest (per seed)", "steps above 2 (per seed)", "steps above 10 (per seed)",
                  "largest KL to the reference (a step's mean per token)",
                  "largest ratio pi_theta / pi_old (any epoch)"], rows)


def export_score(d, name):
    """(correct, tasks) of an arm's export scored by `tern eval` under `name`
    (scripts/sparse28_export_eval.sh), or None."""
    path = d / f"export-eval-{name}.json"
    text = path.read_text() if path.exists() else ""
    if not text.strip():
        return None  # not scored, or still being scored
    row = json.loads(text)["rows"][0]
    return row["correct"], row["tasks"], row["tokens"]


def sparse28_exports():
    """Each finished arm's export (q8_0 GGUF) scored on the held-out set with
    a full cache and under its rollout policy (dense: under budgets 56 and
    28), pooled over seeds with the 95% Wilson interval; the untrained model
    scored the same way first."""
    def cell(scores):
        if not scores or any(s is None for s in scores):
            return "-"
        k, n = sum(s[0] for s in scores), sum(s[1] for s in scores)
        lo, hi = wilson(k, n)
        return f"{100 * k / n:.1f} [{lo:.1f}, {hi:.1f}]"

    def tokens(scores):
        if not scores or any(s is None for s in scores):
            return "-"
        return f"{sum(s[2] for s in scores) / sum(s[1] for s in scores):.0f}"
    rows = []
    base = RECORDS / "sparse28-base-eval"
    if export_score(base, "full"):
        rows.append(["untrained model (no export)", "-", cell([export_score(base, "full")]),
                     tokens([export_score(base, "full")]), "-", "-", "-"])
    for label, prefix, _ in SPARSE28_ARMS:
        dirs = [d for d in sorted(RECORDS.glob(f"sparse28-{prefix}-s*"))
                if export_score(d, "full")]
        if not dirs:
            continue
        names = ["policy", "r56", "r28"]
        cells = [cell([export_score(d, n) for d in dirs]) for n in names]
        full = [export_score(d, "full") for d in dirs]
        rows.append([label, str(len(dirs)), cell(full), tokens(full)] + cells)
    return table(["arm", "seeds", "export, full cache [95% CI]",
                  "answer tokens (full cache, greedy)", "export, rollout policy",
                  "export, rkv:budget=56", "export, rkv:budget=28"], rows)


def export_tasks(d, name):
    """{task: ok} of an arm's export scored under `name`, or None."""
    path = d / f"export-eval-{name}.jsonl"
    if not path.exists() or not path.read_text().strip():
        return None
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    return {r["task"]: r["ok"] for r in rows}


def export_answers(d, name):
    """{task: reference answer} of an arm's export scored under `name`: two
    records pair task by task only if they scored the same held-out set
    (the set changed once the held-out stories left the training pool)."""
    path = d / f"export-eval-{name}.jsonl"
    if not path.exists():
        return None
    return {r["task"]: r.get("want") for r in jsonl(path)}


def mcnemar_p(b, c):
    """Exact two-sided McNemar p-value for b and c discordant pairs."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(pairs):
    """Accuracy difference (percent points) of paired outcomes [(a_ok, b_ok)]
    with its 95% interval, a-only / b-only wins and McNemar's p."""
    n = len(pairs)
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if y and not x)
    d = (b - c) / n
    h = 1.96 * max(0.0, (b + c) / n - d * d) ** 0.5 / n ** 0.5
    return f"{100 * d:+.1f} [{100 * (d - h):+.1f}, {100 * (d + h):+.1f}]", f"{b} / {c}", f"{mcnemar_p(b, c):.3g}"


def dense_of(prefix):
    """The dense arm an arm is compared with: the one run with the same
    GRPO bookkeeping (the paper's for the `paper-` arms)."""
    return "paper-dense" if prefix.startswith("paper-") else "dense"


def sparse28_paired():
    """Each sparse arm's export against dense's, task by task on the same
    held-out set and seed (pooled over the seeds both arms finished): with a
    full cache, and served under the arm's budget (dense's export scored
    under rkv 56 and 28); the difference in points with its paired 95%
    interval, tasks only the arm / only dense got right, McNemar's p."""
    rows = []
    for label, prefix, _ in SPARSE28_ARMS:
        base = dense_of(prefix)
        if prefix in ("dense", "numerics") or prefix == base:
            continue
        dense = {int(d.name.rsplit("-s", 1)[1]): d for d in sorted(RECORDS.glob(f"sparse28-{base}-s*"))
                 if re.fullmatch(rf"sparse28-{re.escape(base)}-s\d+", d.name)}
        budget = {"r56": "r56", "r28": "r28"}.get(prefix.rsplit("-", 1)[1])
        for mode, mine, theirs in (("full cache", "full", "full"),
                                   ("served under its policy", "policy", budget)):
            if theirs is None:
                continue
            pairs, seeds = [], []
            for d in sorted(RECORDS.glob(f"sparse28-{prefix}-s*")):
                seed = int(d.name.rsplit("-s", 1)[1])
                a = export_tasks(d, mine)
                b = export_tasks(dense[seed], theirs) if seed in dense else None
                if (a is None or b is None or set(a) != set(b)
                        or export_answers(d, mine) != export_answers(dense[seed], theirs)):
                    continue
                seeds.append(str(seed))
                pairs += [(a[t], b[t]) for t in sorted(a)]
            if pairs:
                rows.append([label, mode, ", ".join(seeds), str(len(pairs)), *paired(pairs)])
    if not rows:
        rows.append(["no sparse arm and dense have exports of the same seed yet", "-", "-", "-", "-", "-", "-"])
    return table(["arm", "scored", "seeds", "tasks", "arm - dense, points [95% CI]",
                  "only arm / only dense right", "McNemar p"], rows)


def ranks(v):
    """Ranks of `v` (ties share their mean rank)."""
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


# Timings and memory figures differ from run to run (the planner's estimate
# too: the correction's own buffers); the numerics run alone logs its ratio.
def sparse28_budget_kept():
    """What each compressed run's budget kept: the rollouts' summed peak KV
    over what full caches would hold, over the run and over its first and
    last 10 steps, beside the run's held-out accuracy; then Spearman's
    correlation of KV kept with held-out accuracy over the runs, which says
    whether the runs that did well did so by escaping their budget."""
    rows, points = [], []
    for label, prefix, _ in SPARSE28_ARMS:
        if prefix in ("dense", "numerics", "paper-dense"):
            continue
        for seed, (ms, ev) in sorted(sparse28_finished(prefix).items()):
            def kept(steps):
                return sum(m["kv_bytes_peak"] for m in steps) / sum(m["kv_bytes_full"] for m in steps)
            run = kept(ms)
            points.append((prefix, run, ev["after"]))
            rows.append([label, str(seed), f"{100 * run:.0f}%", f"{100 * kept(ms[:10]):.0f}%",
                         f"{100 * kept(ms[-10:]):.0f}%",
                         f"{sum(m['rollout_tokens'] for m in ms[-10:]) / 320:.0f}",
                         f"{100 * ev['after']:.1f}",
                         f"{100 * ev['after_policy']:.1f}" if ev.get("after_policy") is not None else "-"])

    def spearman(sel):
        return pearson(ranks([k for _, k, _ in sel]), ranks([a for _, _, a in sel]))
    r56 = [p for p in points if p[0].endswith("-r56")]
    return (table(["arm", "seed", "KV kept over the run", "first 10 steps", "last 10 steps",
                   "answer tokens per rollout, last 10 steps", "held-out after, full cache",
                   "under its policy"], rows)
            + f"\nSpearman's correlation of KV kept over the run with held-out accuracy (full cache): "
            + f"{spearman(r56):+.2f} over the {len(r56)} rkv:budget=56 runs, "
            + f"{spearman(points):+.2f} over all {len(points)} compressed runs.\n")


# Held-out stories of the plain seed-99 spec (what every sparse28 run was
# scored on) that are also in the training pool (story seed 1, 2000 tasks);
# solve/src/tasks/held_out.rs asserts these indices.
SPARSE28_IN_POOL = {0, 37, 50, 58, 67, 132, 145, 149, 174}


def sparse28_overlap():
    """The budget-56 arms' exports against dense's, task by task pooled over
    seeds 2 and 3, on all 200 held-out stories and on the 191 that are not
    in the training pool."""
    rows = []
    for label, prefix, _ in SPARSE28_ARMS:
        if prefix not in ("none-r56", "sparserl-r56", "replay-r56"):
            continue
        for mode, mine, theirs in (("full cache", "full", "full"), ("served under its policy", "policy", "r56")):
            pairs = []
            for seed in (2, 3):
                a = export_tasks(RECORDS / f"sparse28-{prefix}-s{seed}", mine)
                b = export_tasks(RECORDS / f"sparse28-dense-s{seed}", theirs)
                if (a is None or b is None or set(a) != set(b)
                        or export_answers(RECORDS / f"sparse28-{prefix}-s{seed}", mine)
                        != export_answers(RECORDS / f"sparse28-dense-s{seed}", theirs)):
                    continue
                pairs += [(t, a[t], b[t]) for t in sorted(a)]
            if not pairs:
                continue
            every = paired([(x, y) for _, x, y in pairs])
            outside = paired([(x, y) for t, x, y in pairs if t not in SPARSE28_IN_POOL])
            rows.append([label, mode, f"{every[0]} (p = {every[2]})", f"{outside[0]} (p = {outside[2]})"])
    return table(["arm", "scored", "arm - dense, all 200 stories x 2 seeds",
                  f"the {200 - len(SPARSE28_IN_POOL)} outside the training pool x 2 seeds"], rows)


UNCOMPARED = {"seconds", "learner_seconds", "tokens_per_s", "peak_rss_bytes", "rollout_peak_bytes",
              "learner_peak_bytes", "peak_estimate_bytes", "rho", "ratio", "epochs"}


def against_dense_s2(name, with_rho, metrics="metrics.jsonl"):
    """A short run's steps against dense seed 2's, field by field (timings
    and memory aside): is it the same arithmetic?"""
    d = RECORDS / name
    if not (d / metrics).exists():
        return f"Not run yet: records/{name}/{metrics}.\n"
    dense = {m["step"]: m for m in run("sparse28-dense-s2")[0]}
    rows = []
    for m in jsonl(d / metrics):
        base = dense[m["step"]]
        keys = (set(m) | set(base)) - UNCOMPARED
        diff = sorted(k for k in keys if m.get(k) != base.get(k))
        row = [str(m["step"]), str(m["rollout_tokens"]), str(m["groups_with_signal"]),
               f"{m['loss']:.6f}", f"{m['grad_norm']:.6f}",
               "yes" if not diff else "no: " + ", ".join(diff)]
        if with_rho:
            rho = m.get("rho")
            row += [f"{rho['min_rho']} / {rho['mean_rho']} / {rho['max_rho']}" if rho else "- (no group trained)",
                    str(rho["rejected_tokens"]) if rho else "-"]
        rows.append(row)
    head = ["step", "rollout tokens", "groups trained", "loss", "grad norm",
            "every other logged number but timings and memory equal to dense's"]
    return table(head + (["rho min / mean / max", "tokens truncated"] if with_rho else []), rows)


def sparse28_numerics_check():
    """Dense + numerics correction (seed 2, its first steps) against dense
    seed 2 on the same build and machine, step by step."""
    return against_dense_s2("sparse28-numerics-check-s2", True)


def sparse28_build_check():
    """Dense seed 2's first steps on each later build (`metrics-<commit>.jsonl`)."""
    name = "sparse28-build-check-2026-12-04"
    parts = []
    for f in sorted((RECORDS / name).glob("metrics-*.jsonl")):
        commit = f.stem.split("-", 1)[1]
        parts.append(f"Build {commit}:\n\n" + against_dense_s2(name, False, f.name))
    return "\n".join(parts) if parts else f"Not run yet: records/{name}/metrics-<commit>.jsonl.\n"


def sparse28_masking_steps():
    """Step-level reading of the masking question for every finished
    sparse-rl run (per-rollout records or not): across the steps that
    scored rollouts, Spearman's correlation between the step's mean answer
    length and the share of its generated tokens the correction discarded,
    and the same with the step number partialled out (answers shorten and
    the mismatch changes as training goes on, so time alone could tie them)."""
    rows = []
    for label, prefix, _ in SPARSE28_ARMS:
        if not prefix.startswith(("sparserl", "kept")):
            continue
        for seed, (ms, _) in sorted(sparse28_finished(prefix).items()):
            pts = [(m["step"], m["rollout_tokens"] / 32, m["rho"]["rejected_tokens"] / m["rollout_tokens"])
                   for m in ms if m.get("rho") and m["rollout_tokens"] and m["learner_tokens"]]
            if len(pts) < 10:
                continue
            t, x, y = (ranks([p[i] for p in pts]) for i in range(3))
            rxy, rxt, ryt = pearson(x, y), pearson(x, t), pearson(y, t)
            partial = (rxy - rxt * ryt) / ((1 - rxt ** 2) * (1 - ryt ** 2)) ** 0.5
            share = sum(m["rho"]["rejected_tokens"] for m in ms if m.get("rho")) / sum(m["rollout_tokens"] for m in ms)
            # Two-sided p of the partial correlation (Fisher's z, one
            # variable controlled).
            z = math.atanh(partial) * (len(pts) - 4) ** 0.5
            p = math.erfc(abs(z) / 2 ** 0.5)
            rows.append([label, str(seed), str(len(pts)), f"{100 * share:.1f}%",
                         f"{rxy:+.2f}", f"{partial:+.2f} (p = {p:.1g})"])
    if not rows:
        rows.append(["no finished sparse-rl run", "-", "-", "-", "-", "-"])
    return table(["arm", "seed", "steps that scored", "generated tokens discarded",
                  "Spearman (answer length, share discarded)", "same, step number partialled out"], rows)


MASKING_BUCKETS = [(1, 32), (33, 64), (65, 128), (129, 10**9)]


def sparse28_kept():
    """Build 3's question, advantages over all G rollouts or over the ones
    the correction kept: sparse-rl at rkv:budget=56, seed 1, each way (the
    same tasks and seed; the two runs part at the first vetoed rollout).
    Held-out scores, the exports task by task (kept minus all), and what the
    choice touches: vetoed rollouts, rejected tokens, gradient norms."""
    arms = [RECORDS / "sparse28-sparserl-r56-s1", RECORDS / "sparse28-kept-r56-s1"]
    runs, missing = [], []
    for d in arms:
        ev = json.loads((d / "eval.json").read_text()) if (d / "eval.json").exists() else {}
        if "after" not in ev or not (d / "metrics.jsonl").exists():
            missing.append(f"`records/{d.name}/`")
        else:
            runs.append((jsonl(d / "metrics.jsonl"), ev))
    if missing:
        return "Not finished yet: " + ", ".join(missing) + ".\n"

    def ci(x, n):
        k = round(x * n)
        lo, hi = wilson(k, n)
        return f"{100 * x:.1f} [{lo:.1f}, {hi:.1f}]"

    rows = []
    for key, what in (("after", "held-out after, full cache [95% CI]"),
                      ("after_policy", "held-out after, under rkv:budget=56")):
        rows.append([what] + [ci(ev[key], ev["tasks"]) for _, ev in runs] + ["-"])
    for name, what in (("full", "export, full cache"), ("policy", "export, under rkv:budget=56")):
        scores = [export_score(d, name) for d in arms]
        tasks = [export_tasks(d, name) for d in arms]
        cells = [ci(s[0] / s[1], s[1]) if s else "-" for s in scores]
        diff = "-"
        if tasks[0] and tasks[1] and set(tasks[0]) == set(tasks[1]):
            d, wins, p = paired([(tasks[1][t], tasks[0][t]) for t in sorted(tasks[0])])
            diff = f"{d} (only kept / only all: {wins}, McNemar p = {p})"
        rows.append([what] + cells + [diff])
    stats = []
    for ms, _ in runs:
        rho = [m.get("rho") or {} for m in ms]
        vetoed = sum(r.get("rejected_rollouts", 0) for r in rho)
        veto_steps = sum(1 for r in rho if r.get("rejected_rollouts"))
        rejected = sum(r.get("rejected_tokens", 0) for r in rho)
        scored = sum(scored_tokens(m) for m in ms)
        g = sorted(m["grad_norm"] for m in ms if m.get("learner_tokens"))

        def early_late(f, digits):
            return f"{sum(map(f, ms[:10])) / 10:.{digits}f} -> {sum(map(f, ms[-10:])) / 10:.{digits}f}"
        stats.append([early_late(lambda m: m["reward_mean"], 3),
                      early_late(lambda m: m["rollout_tokens"] / 32, 0),
                      f"{vetoed} ({veto_steps} of {len(ms)} steps)",
                      f"{100 * rejected / scored:.1f}%" if scored else "-",
                      f"{g[len(g) // 2]:.2f} / {g[-1]:.2f}"])
    for i, what in enumerate(("reward, first 10 -> last 10 steps",
                              "answer tokens per rollout, first 10 -> last 10 steps",
                              "rollouts vetoed (steps with a veto)",
                              "rejected tokens (of those scored)", "gradient norm, median / largest")):
        rows.append([what, stats[0][i], stats[1][i], "-"])
    return table(["seed 1, rkv:budget=56, sparse-rl", "advantages over all G (the default)",
                  "over the kept rollouts (`--advantages kept`)", "kept - all, task by task"], rows)


def sparse28_masking():
    """Whether long answers are masked more: every scored rollout of the
    sparse arms' finished runs that log per-rollout ratios (`rho.rollouts`),
    pooled over seeds, by answer length: the share of its tokens outside
    Sparse-RL's band and the share of rollouts vetoed, whichever correction
    the arm ran; for all rollouts, then for those better and worse than
    their group (advantage above and below 0), with their mean length."""
    def cell(sel):
        n = len(sel)
        if not n:
            return "-"
        toks = sum(t for t, _, _, _ in sel)
        out = sum(o for _, o, _, _ in sel)
        vet = sum(1 for _, _, v, _ in sel if v)
        return f"{n}: {100 * out / max(toks, 1):.1f}% / {100 * vet / n:.0f}%"

    rows = []
    for label, prefix, _ in SPARSE28_ARMS:
        # The sparse-replay learner scores each rollout under its sampler's
        # own attention: its ratios are exactly 1, nothing to split.
        if not prefix.startswith(("sparserl", "none", "kept")):
            continue
        per = [m["rho"]["rollouts"] for (ms, _) in sparse28_finished(prefix).values()
               for m in ms if (m.get("rho") or {}).get("rollouts")]
        if not per:
            continue
        roll = [(t, o, v, a) for r in per
                for t, o, v, a in zip(r["tokens"], r["outside"], r["vetoed"], r["advantage"])]
        for which, sel in (("all", roll), ("advantage > 0", [r for r in roll if r[3] > 0]),
                           ("advantage < 0", [r for r in roll if r[3] < 0])):
            if not sel:
                continue
            mean = sum(r[0] for r in sel) / len(sel)
            rows.append([label, which, cell(sel), f"{mean:.0f}"]
                        + [cell([r for r in sel if lo <= r[0] <= hi]) for lo, hi in MASKING_BUCKETS])
    if not rows:
        rows.append(["no finished run logs per-rollout ratios yet"] + ["-"] * 7)
    return table(["arm", "rollouts", "all lengths", "mean answer tokens",
                  "1-32 tokens", "33-64", "65-128", "129+"], rows)


# ---------------------------------------------------------------- models (issue 58)

MODELS58 = RECORDS / "models58"


def models58_bench():
    """`tern bench --json` on each real model (records/models58/bench-*.json):
    Tern's own kernels beside the in-process llama.cpp (AVX2, the exactness
    reference, not the speed anchor)."""
    rows = []
    for path in sorted(MODELS58.glob("bench-*.json")):
        j = json.loads(path.read_text())
        by = {r["backend"]: r for r in j["rows"]}
        t, l = by.get("tern"), by.get("llama-cpp")
        cells = [path.stem[len("bench-"):], j["threads"]]
        for key in ("pp_tokens_per_s", "tg_tokens_per_s"):
            cells.append(f"{t[key]:.1f}" if t else "-")
            cells.append(f"{l[key]:.1f}" if l else "-")
        cells.append(f"{j['floor_tokens_per_s']:.1f}")
        cells.append(f"{t['peak_rss_bytes'] / MIB:.0f} MiB" if t else "-")
        rows.append(cells)
    if not rows:
        rows.append(["no record yet"] + ["-"] * 7)
    return table(["model", "threads", f"pp512 Tern", "pp512 llama.cpp (in process)",
                  "tg128 Tern", "tg128 llama.cpp (in process)", "decode floor (bandwidth)",
                  "peak RSS (Tern)"], rows)


def models58_long_context():
    """`tern serve` answering one ~16k-token conversation
    (records/models58/long-context.jsonl, scripts/long_context.py)."""
    rows = []
    path = MODELS58 / "long-context.jsonl"
    for r in (jsonl(path) if path.exists() else []):
        kv = f"{r['kv_bytes'] / MIB:.0f} MiB" if r.get("kv_bytes") else "-"
        rows.append([r["model"], r["kv_dtype"], f"{r['prompt_tokens']:,}",
                     f"{r['peak_rss_bytes'] / GIB:.2f} GiB", f"{r['rss_after_load_bytes'] / GIB:.2f} GiB",
                     kv, f"{r['seconds']:.0f} s"])
    if not rows:
        rows.append(["no record yet"] + ["-"] * 6)
    return table(["model", "KV storage", "prompt tokens", "peak RSS of `tern serve`",
                  "RSS after load", "KV held", "wall (prefill + 16 tokens)"], rows)


def models58_agents():
    """openai-agents on the Qwen2.5-Coder models, Tern beside native
    llama-server: every run of protocol v1 (records/agents58/) and of v2
    (records/agents58v2/, fixed in its PROTOCOL.md before its runs), one
    row per run, from the records scripts/agents_table.py reads."""
    import agents_table
    rows = []
    for d in (EVAL / "agents58", EVAL / "agents58v2"):
        # Wall seconds stay in each TABLE.md: the runs shared a loaded machine.
        rows += [r[:-1] for r in agents_table.summary_rows(d)]
    if not rows:
        rows.append(["no record yet"] + ["-"] * 5)
    return table(["protocol", "model", "server", "right", "wrong, by failure kind", "tool calls made"], rows)


# ---------------------------------------------------------------- docs/BENCHMARKS.md

CRITERION = re.compile(r"(?m)^(\S[^\n]*?)/([a-z_]+)/?\s*time:\s*\[\S+ \S+ ([\d.]+) (\S+)")
US = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}


def criterion_medians(text):
    """{(benchmark, variant): median in µs} of criterion's output kept in a
    record, in its order (`q4_0 8x576 * 1536x576/repack/ time: [lo median
    hi]`, on one line or two)."""
    return {(m.group(1), m.group(2)): float(m.group(3)) * US[m.group(4)]
            for m in CRITERION.finditer(text)}


def shape(bench):
    """`q4_1 8x576 * 1536x576` -> (format, `8 x [1536, 576]`)."""
    fmt, acts, _, weight = bench.split()
    rows = acts.split("x")[0]
    out_, in_ = weight.split("x")
    return fmt, f"{rows} x [{out_}, {in_}]"


def us(v):
    return f"{v:.1f} µs"


def bench_q4_0_tiles():
    """The Q4_0 kernel in llama.cpp's repacked order (tiled from 4 rows)
    against the plain order (records/quant-kernels-q4_0-tiles-2026-12-03.txt)."""
    med = criterion_medians((EVAL / "quant-kernels-q4_0-tiles-2026-12-03.txt").read_text())
    rows = []
    for (bench, kind), v in med.items():
        if kind == "repack":
            plain = med[(bench, "vec_dot")]
            rows.append([shape(bench)[1], us(v), us(plain), f"{v / plain:.2f}"])
    return table(["activation rows x weight [out, in]", "repacked order (tiled from 4 rows)",
                  "plain order", "ratio"], rows)


def bench_quant_formats():
    """Tern's kernel per weight format against candle's QMatMul (Q4_0: its
    repacked order against its plain one), records/quant-kernels-2026-12-03.txt."""
    med = criterion_medians((EVAL / "quant-kernels-2026-12-03.txt").read_text())
    rows = []
    for (bench, kind), v in med.items():
        fmt, sh = shape(bench)
        if kind == "repack":
            other = med[(bench, "vec_dot")]
            rows.append([fmt, sh, f"repacked order {us(v)}", f"plain order {us(other)}", f"{v / other:.2f}"])
        elif kind == "tern":
            other = med[(bench, "candle")]
            rows.append([fmt, sh, us(v), f"candle QMatMul {us(other)}", f"{v / other:.2f}"])
    return table(["format", "activation rows x weight [out, in]", "Tern", "other", "Tern / other"], rows)


def bench_quant_iq4():
    """IQ4_NL and IQ4_XS beside the 4-bit formats of the same shapes, one run
    (records/quant-kernels-iq4-2026-12-03.txt)."""
    med = criterion_medians((EVAL / "quant-kernels-iq4-2026-12-03.txt").read_text())
    rows = []
    for (bench, kind), v in med.items():
        fmt, sh = shape(bench)
        if fmt not in ("iq4_nl", "iq4_xs"):
            continue
        rest = bench.split(" ", 1)[1]
        if fmt == "iq4_nl":
            other, what = med[(f"q4_0 {rest}", "repack")], "q4_0 repacked"
        else:
            other, what = med[(f"q4_k {rest}", "tern")], "q4_k (Tern)"
        rows.append([fmt, sh, us(v), f"{what} {us(other)}", f"{v / other:.2f}"])
    return table(["format", "activation rows x weight [out, in]", "Tern", "other (same run)",
                  "Tern / other"], rows)


FORMAT_RUNS = [("smollm2-q4_0", "SmolLM2-135M, q4_0 (requantized)"),
               ("smollm2-q4_k_m", "SmolLM2-135M, q4_k_m (requantized)"),
               ("smollm2-q6_k", "SmolLM2-135M, q6_k (requantized)"),
               ("smollm2-q8_0", "SmolLM2-135M, q8_0 (requantized)"),
               ("gemma-3-270m-q4_k_m", "Gemma 3 270M, Q4_K_M (as shipped)")]


def bench_weight_formats():
    """`tern bench --backends llama-cpp,candle --depths 0` per weight format
    (records/bench-2026-12-03-tiles/*.json), Tern over the in-process
    llama.cpp in one interleaved run per model; RSS in MB (10^6 bytes)."""
    rows = []
    for stem, label in FORMAT_RUNS:
        j = json.loads((EVAL / "bench-2026-12-03-tiles" / f"{stem}.json").read_text())
        by = {r["backend"]: r for r in j["rows"]}
        l, t = by["llama-cpp"], by.get("tern") or by["candle"]
        rows.append([label, f"{l['pp_tokens_per_s']:.1f}", f"{t['pp_tokens_per_s']:.1f}",
                     f"{t['pp_tokens_per_s'] / l['pp_tokens_per_s']:.2f}x",
                     f"{l['tg_tokens_per_s']:.1f}", f"{t['tg_tokens_per_s']:.1f}",
                     f"{t['tg_tokens_per_s'] / l['tg_tokens_per_s']:.2f}x",
                     f"{int(l['peak_rss_bytes'] / 1e6)} / {int(t['peak_rss_bytes'] / 1e6)}"])
    return table(["model, weights", "llama.cpp pp512", "Tern pp512", "pp ratio", "llama.cpp tg128",
                  "Tern tg128", "tg ratio", "RSS MB"], rows)


def ms(v):
    return f"{v / 1e3:.1f} ms"


def bench_judge():
    """One judged test against a bare interpreter start
    (records/bench/judge-2026-12-02.txt, criterion's medians)."""
    med = criterion_medians((ROOT / "records" / "bench" / "judge-2026-12-02.txt").read_text())
    return table(["case", "median per test"],
                 [["sandboxed test (`judge_one_test/sandboxed`)", ms(med[("judge_one_test", "sandboxed")])],
                  ["bare `python3 -I -S -c pass` (`judge_one_test/bare_python`)",
                   ms(med[("judge_one_test", "bare_python")])]])


JUDGE_BUILDS = [("old", "one sandbox per test (3f42d56)"), ("new", "two sandboxes per test (8572710)")]


def bench_judge_interleaved():
    """Old and new judge benches interleaved round by round
    (records/bench/judge-2026-12-06-interleaved.txt)."""
    text = (ROOT / "records" / "bench" / "judge-2026-12-06-interleaved.txt").read_text()
    rounds = {}
    for part in re.split(r"(?m)^== ", text)[1:]:
        m = re.match(r"round (\d+) (\w+)", part)
        rounds[(int(m.group(1)), m.group(2))] = {k[1]: v for k, v in criterion_medians(part).items()}
    rows = []
    for key, label in JUDGE_BUILDS:
        r1, r2 = rounds[(1, key)], rounds[(2, key)]
        rows.append([label, ms(r1["sandboxed"]), ms(r2["sandboxed"]),
                     f"{r1['bare_python'] / 1e3:.1f} / {ms(r2['bare_python'])}"])
    return table(["judge", "sandboxed test, round 1", "round 2",
                  "bare `python3 -I -S -c pass`, rounds 1 / 2"], rows)


def bench_kv_dtype_depth():
    """Decode at depth 4096 by KV storage type, one interleaved `tern bench`
    run (records/kv-dtype-2026-12-03/bench-depth4096.json)."""
    j = json.loads((EVAL / "kv-dtype-2026-12-03" / "bench-depth4096.json").read_text())
    by = {r["kv_dtype"]: r for r in j["rows"]}
    base = by["f32"]["tg_tokens_per_s"]
    labels = [("f32", "f32 (Tern's storage before)"), ("f16", "f16 (the default now)"), ("q8_0", "q8_0")]
    return table(["storage", f"tg{j['n_gen']} at depth {by['f32']['depth']} (tokens/s)", "vs f32",
                  "KV bytes held"],
                 [[label, f"{by[d]['tg_tokens_per_s']:.1f}", f"{by[d]['tg_tokens_per_s'] / base:.2f}x",
                   f"{by[d]['kv_bytes'] / 1e6:.1f} MB"] for d, label in labels])


def per_token(v):
    """A per-token time in µs at the precision it carries."""
    if v >= 1000:
        return f"{v:,.0f} µs"
    return f"{v:.1f} µs" if v >= 1 else f"{v:.2f} µs"


def bench_constraint():
    """The structured-output constraint's cost per token
    (records/constraint-2026-12-03/bench.json, medians)."""
    j = json.loads((EVAL / "constraint-2026-12-03" / "bench.json").read_text())["median_us_per_token"]
    return table(["per token", "full mask", "check the drawn token"],
                 [["JSON prefix checker (before)", per_token(j["json_prefix_full_mask"]),
                   per_token(j["json_prefix_check_drawn"])],
                  ["llguidance (after)", per_token(j["llguidance_full_mask"]),
                   per_token(j["llguidance_check_drawn"])]])


def spec63_bench():
    """Greedy decode with and without prompt-lookup speculative decoding on
    the Qwen2.5-Coder models, code editing and chat (records/spec63/,
    scripts/spec63.py; scripts/spec63_table.py)."""
    import spec63_table
    return table(spec63_table.HEADER, spec63_table.rows(RECORDS / "spec63"))


def spec63_kv():
    """docs/BENCHMARKS.md: prompt-lookup speculation under a KV policy on the
    Qwen2.5-Coder 1.5B, plain decoding under the same policy the reference
    (the spec63 records with a `kv_policy`; scripts/spec63.py --kv-policy)."""
    import spec63_table
    return table(spec63_table.KV_HEADER, spec63_table.kv_rows(RECORDS / "spec63"))


def spec63_draft():
    """Greedy decode plain, with prompt lookup and with a draft model (the
    0.5B drafting for the 1.5B), code editing and chat (the spec63 records
    with a `draft_model`; scripts/spec63.py --draft-model)."""
    import spec63_table
    return table(spec63_table.DRAFT_HEADER, spec63_table.draft_rows(RECORDS / "spec63"))


def spreadsheet_heldout():
    """Qwen2.5-Coder-0.5B- and 1.5B-Instruct, greedy, on the held-out
    spreadsheet split. Prompt 1 (the first runs): single-round on 20 tasks,
    3 rounds on the first 6. Prompt 2 (SpreadsheetBench's instruction type,
    tracebacks with the program's lines, "pandas is not installed"): 3
    rounds on the first 16, whose
    round 1 is the single-round score; prompt 3 (prompt 2 without the
    pandas sentence) on the first 4, then on all 40 held-out tasks (the
    1.5B's run in progress: its finished tasks so far)
    (records/spreadsheet/, scripts/spreadsheet_table.py)."""
    import spreadsheet_table
    runs = [("0.5B greedy, prompt 1", "heldout_0.5b_greedy.jsonl"),
            ("0.5B greedy, prompt 1, rounds@3", "heldout_0.5b_rounds3.jsonl"),
            ("1.5B greedy, prompt 2, rounds@3", "heldout_1.5b_rounds3.jsonl"),
            ("0.5B greedy, prompt 2, rounds@3", "heldout_0.5b_rounds3_prompt2.jsonl"),
            ("0.5B greedy, prompt 3, rounds@3", "heldout_0.5b_rounds3_prompt3.jsonl"),
            ("0.5B greedy, prompt 3, rounds@3, all 40", "heldout_0.5b_rounds3_full.jsonl"),
            ("1.5B greedy, prompt 3, rounds@3, all 40",
             "heldout_1.5b_rounds3_full.jsonl")]
    return table(spreadsheet_table.HEADER, [
        row for name, f in runs
        for row in spreadsheet_table.rows(name, RECORDS / "spreadsheet" / f)])


def spreadsheet_references():
    """Every task's reference program through the judge, as a candidate's
    runs (`tern eval --strategy reference`), on the training split and the
    held-out split (records/spreadsheet/references_*.jsonl)."""
    import spreadsheet_table
    runs = [("train (count=300, seed=1)", "references_train.jsonl"),
            ("held-out (count=40, seed=1001)", "references_heldout.jsonl")]
    return table(spreadsheet_table.REFERENCE_HEADER, [
        row for name, f in runs
        for row in spreadsheet_table.reference_rows(name, RECORDS / "spreadsheet" / f)])


def spreadsheet_best_of():
    """Best-of-8 on the first held-out spreadsheet tasks: the candidate
    chosen by agreement of outputs and the oracle's, over the same 8
    programs per task (records/spreadsheet/heldout_*_bo8.jsonl,
    `tern eval --strategy agree@8,oracle@8`)."""
    import spreadsheet_table
    runs = [("0.5B, T 0.7, first 8", "heldout_0.5b_bo8.jsonl"),
            ("1.5B, T 0.7, first 4", "heldout_1.5b_bo8.jsonl")]
    return table(spreadsheet_table.BEST_OF_HEADER, [
        row for name, f in runs
        for row in spreadsheet_table.best_of_rows(name, RECORDS / "spreadsheet" / f)])


def spreadsheet_best_of_rounds():
    """Best-of-8 with three rounds on the whole held-out split (the
    protocol in records/spreadsheet/README.md): agreement's and the
    oracle's choice after each round, over the same candidates
    (records/spreadsheet/heldout_*_bo8_rounds3.jsonl)."""
    import spreadsheet_table
    runs = [("0.5B, of 40 (running: tasks finished so far)", "heldout_0.5b_bo8_rounds3.jsonl")]
    return table(spreadsheet_table.BEST_OF_ROUNDS_HEADER, [
        row for name, f in runs
        for row in spreadsheet_table.best_of_round_rows(name, RECORDS / "spreadsheet" / f)])


# ---------------------------------------------------------------- native llama.cpp (issue 59)

NATIVE59 = RECORDS / "native59"


def native59_bench():
    """`scripts/native_compare.py` records (records/native59/*.json): Tern
    beside llama.cpp's own llama-bench built with GGML_NATIVE=ON (the speed
    anchor) and the in-process llama.cpp (AVX2, the exactness reference), one
    interleaved run per record; ratios are Tern over native."""
    rows = []
    for path in sorted(NATIVE59.glob("*.json")):
        j = json.loads(path.read_text())
        floor = j.get("floor_tokens_per_s")
        for depth in sorted({r["depth"] for r in j["rows"]}):
            at = [r for r in j["rows"] if r["depth"] == depth]
            native = next((r for r in at if r["backend"] == "llama-native"), None)
            inproc = next((r for r in at if r["backend"] == "llama-cpp"), None)
            for t in (r for r in at if r["backend"] == "tern"):
                def ratio(key):
                    if not native or not t.get(key) or not native.get(key):
                        return "-"
                    return f"{t[key] / native[key]:.2f}x"

                def speed(r, key):
                    return f"{r[key]:.1f}" if r and r.get(key) else "-"
                policy = t["kv_policy"].split(",")[0]
                rows.append([
                    j["label"], f"{depth:,}", f"{policy}/{t['kv_dtype']}",
                    speed(t, "pp_tokens_per_s"), speed(native, "pp_tokens_per_s"), ratio("pp_tokens_per_s"),
                    speed(t, "tg_tokens_per_s"), speed(native, "tg_tokens_per_s"), ratio("tg_tokens_per_s"),
                    f"{100 * t['tg_tokens_per_s'] / floor:.0f}% / {100 * native['tg_tokens_per_s'] / floor:.0f}%"
                    if floor and native else "-",
                    f"{speed(inproc, 'pp_tokens_per_s')} / {speed(inproc, 'tg_tokens_per_s')}",
                    f"{j['load_before']:.1f}-{j['load_after']:.1f}",
                ])
    if not rows:
        rows.append(["no record yet"] + ["-"] * 11)
    return table(["model", "depth", "Tern cache", "pp512 Tern", "pp512 native", "pp ratio",
                  "tg128 Tern", "tg128 native", "tg ratio", "decode of floor (Tern / native)",
                  "in-process llama.cpp pp / tg", "load"], rows)


LOAD59 = RECORDS / "load59"


def load59_servers():
    """`scripts/load_native.py` records (records/load59/*.json): load.py's
    burst and 1/N scaling against `tern serve` and native llama-server, one
    server after the other on the same model."""
    rows = []
    for path in sorted(LOAD59.glob("*.json")):
        j = json.loads(path.read_text())
        r = j["load"]
        b, s = r["burst"], r["scaling"]
        conc = next(k for k in s if k.startswith("tokens_per_s_") and k != "tokens_per_s_1")
        rows.append([
            pathlib.Path(r["model"]).name,
            j["server"], f"{b['completed']}/{b['requests']}", f"{b['tokens_per_s']:.1f}",
            f"{b['ttft_median_s']:.2f} / {b['ttft_max_s']:.2f}",
            f"{s['tokens_per_s_1']:.1f}", f"{s[conc]:.1f} ({conc.rsplit('_', 1)[1]})",
            f"{s['ratio']:.2f}x", str(r["errors"]),
            f"{j['load_before']:.1f}-{j['load_after']:.1f}",
        ])
    if not rows:
        rows.append(["no record yet"] + ["-"] * 9)
    return table(["model", "server", "burst done", "burst tok/s", "TTFT median / max s",
                  "1 stream tok/s", "N streams tok/s", "N / 1", "errors", "load"], rows)


TABLES = {
    "TRAINING.md": {
        "training-grpo-arith": training_grpo_arith,
        "training-learner-vs-f32": training_learner_vs_f32,
        "training-learner-seeds": training_learner_seeds,
        "training-export-eval": training_export_eval,
        "training-learner-ab": training_learner_ab,
        "training-learner-ab-rounds": training_learner_ab_rounds,
        "training-learner-ab-vm2": training_learner_ab_vm2,
        "training-learner-ab-2t": training_learner_ab_2t,
        "training-learner-before-after": training_learner_before_after,
        "training-planner-calibration": training_planner_calibration,
        "training-llama32-1b-shape": training_llama32_1b_shape,
        "training-qwen-runs": training_qwen_runs,
        "training-qwen-peft": training_qwen_peft,
    },
    "SPARSE_RL.md": {
        "sparse-cap-600mib": sparse_cap_600mib,
        "sparse-cap-f32": sparse_cap_f32,
        "sparse-data-selection": sparse_data_selection,
        "sparse28-arms": sparse28_arms,
        "sparse28-exports": sparse28_exports,
        "sparse28-kept": sparse28_kept,
        "sparse28-masking": sparse28_masking,
        "sparse28-masking-steps": sparse28_masking_steps,
        "sparse28-paired": sparse28_paired,
        "sparse28-seeds": sparse28_seeds,
        "sparse28-budget-kept": sparse28_budget_kept,
        "sparse28-overlap": sparse28_overlap,
        "sparse28-stability": sparse28_stability,
        "sparse28-numerics-check": sparse28_numerics_check,
        "sparse28-build-check": sparse28_build_check,
    },
    "REASONING.md": {
        "reasoning-arith-bon8": reasoning_arith_bon8,
        "reasoning-gsm8k-bon8": reasoning_gsm8k_bon8,
        "reasoning-gsm8k-single": reasoning_gsm8k_single,
        "reasoning-humaneval": reasoning_humaneval,
        "coderm60-arms": coderm60_arms,
        "coderm60-curve": coderm60_curve,
        "coderm60-dynamic": coderm60_dynamic,
        "coderm60-paired": coderm60_paired,
        "coderm60-quality": coderm60_quality,
        "coderm60-throughput": coderm60_throughput,
        "synth29-data": synth29_data,
        "synth29-story": synth29_story,
        "synth29-story-split": synth29_story_split,
        "synth29-gsm8k": synth29_gsm8k,
        "synth29-adaptive": synth29_adaptive,
        "synth29-wall": synth29_wall,
        "synth29-first": synth29_first,
        "synth29-adaptive-sweep": synth29_adaptive_sweep,
    },
    "KV.md": {
        "kv-dtype-perplexity": kv_dtype_perplexity,
        "kv-adakv-keydiff": kv_adakv_keydiff,
        "kv-reference-settings": kv_reference_settings,
        "kv-texts": kv_texts,
        "kv-gemma3-perplexity": kv_gemma3_perplexity,
        "kv-capacity": kv_capacity,
        "kv-ruler": kv_ruler,
        "kv-gsm8k-rkv": kv_gsm8k_rkv,
    },
    "SECURITY.md": {
        "security-attacks": security_attacks,
    },
    "SCALING.md": {
        "scaling-fleet": scaling_fleet,
    },
    "BENCHMARKS.md": {
        "native59-bench": native59_bench,
        "load59-servers": load59_servers,
        "bench-judge-interleaved": bench_judge_interleaved,
        "bench-kv-dtype-depth": bench_kv_dtype_depth,
        "bench-constraint": bench_constraint,
        "spec63-bench": spec63_bench,
        "spec63-draft": spec63_draft,
        "spec63-kv": spec63_kv,
    },
    "BENCHMARKS_HISTORY.md": {
        "bench-q4-0-tiles": bench_q4_0_tiles,
        "bench-quant-formats": bench_quant_formats,
        "bench-quant-iq4": bench_quant_iq4,
        "bench-judge": bench_judge,
    },
    "SPREADSHEET.md": {
        "spreadsheet-heldout": spreadsheet_heldout,
        "spreadsheet-references": spreadsheet_references,
        "spreadsheet-best-of": spreadsheet_best_of,
        "spreadsheet-best-of-rounds": spreadsheet_best_of_rounds,
    },
    "MODELS.md": {
        "models58-bench": models58_bench,
        "models58-long-context": models58_long_context,
        "models58-agents": models58_agents,
    },
}


# ---------------------------------------------------------------- driver

REFERENCE = re.compile(r"^<!-- reference table: .+ -->$")
SEPARATOR = re.compile(r"^\s*\|(\s*:?-+:?\s*\|)+\s*$")
# What a measured figure looks like in a cell: a ratio, a share, a time or
# a rate. A reference table (fields, flags, limits, what a test asserts)
# has none.
MEASURED = re.compile(r"\d(\.\d+)?x\b|\d%|\d(\.\d+)?\s*(ms|us|µs|ns)\b|tok(en)?s?/s")


def loose_tables(text):
    """(line, why) of each Markdown table outside every generated region and
    outside code fences that is not a declared reference table (the line
    before it `<!-- reference table: WHAT IT LISTS -->`), and of each
    declared reference table holding a measured figure. Every other table
    of a doc is written by this script from records."""
    lines = text.splitlines()
    inside, fence, found = None, False, []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            inside = m.group(1) if m.group(2) == "start" else None
        elif line.lstrip().startswith("```"):
            fence = not fence
        elif (inside is None and not fence and line.lstrip().startswith("|")
              and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1])):
            end = i
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            if i > 0 and REFERENCE.match(lines[i - 1].strip()):
                measured = [c for row in lines[i + 2:end] for c in row.split("|") if MEASURED.search(c)]
                if measured:
                    found.append((i + 1, f"a reference table with measured figures ({measured[0].strip()})"))
            else:
                found.append((i + 1, "not written from records"))
            i = end
            continue
        i += 1
    return found


def loose_tables_in_docs():
    """`docs/X.md:LINE: why` for every loose table of docs/*.md."""
    return [f"docs/{p.name}:{line}: {why}" for p in sorted(DOCS.glob("*.md"))
            for line, why in loose_tables(p.read_text())]


def regenerate(check):
    """Rewrites (or with `check`, compares) every doc's regions; returns the
    names of the regions that differed."""
    differs = []
    for doc, gens in TABLES.items():
        path = DOCS / doc
        text = path.read_text()
        unknown = sorted(set(regions(text)) - set(gens))
        if unknown:
            raise RegionError(f"{doc}: no generator for " + ", ".join(f"table:{n}" for n in unknown))
        spans = regions(text)
        bodies = {}
        for name, gen in gens.items():
            body = gen()
            bodies[name] = body
            if name in spans and text[slice(*spans[name])] != body:
                differs.append(f"{doc}: table:{name}")
        new = rewrite(text, bodies)
        if not check and new != text:
            path.write_text(new)
    return differs


def self_test():
    """A doc with two regions and a neighbouring section: rewriting one region
    leaves the other region and the neighbour byte for byte as they were."""
    doc = ("# Doc\n\nIntro.\n\n<!-- table:a:start -->\n| old a |\n<!-- table:a:end -->\n"
           "Note right under a.\n\n## Neighbour\n\nKeep me, | pipes | and all.\n\n"
           "<!-- table:b:start -->\n| old b |\n|---|\n<!-- table:b:end -->\n\nTail without newline")
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "doc.md"
        p.write_text(doc)
        p.write_text(rewrite(p.read_text(), {"a": "| new a |\n|---|\n| 1 |"}))
        got = p.read_text()
    head, rest = got.split("<!-- table:a:end -->\n", 1)
    assert head.endswith("<!-- table:a:start -->\n| new a |\n|---|\n| 1 |\n"), head
    assert rest == doc.split("<!-- table:a:end -->\n", 1)[1], "text after region a changed"
    assert got.startswith("# Doc\n\nIntro.\n\n<!-- table:a:start -->\n")
    assert rewrite(got, {"a": "| new a |\n|---|\n| 1 |"}) == got, "rewriting is not idempotent"
    assert rewrite(got, {}) == got
    for bad in ["<!-- table:a:start -->\nx\n", "x\n<!-- table:a:end -->\n",
                "<!-- table:a:start -->\n<!-- table:b:start -->\n<!-- table:b:end -->\n<!-- table:a:end -->\n"]:
        try:
            rewrite(bad, {"a": "y"})
        except RegionError:
            continue
        raise AssertionError(f"accepted bad markers: {bad!r}")
    try:
        rewrite(doc, {"c": "z"})
        raise AssertionError("rewrote a region that has no markers")
    except RegionError:
        pass
    loose = ("| a | b |\n|---|---|\n| 1 | 2 |\n\n<!-- table:a:start -->\n| c |\n|---|\n<!-- table:a:end -->\n"
             "```\n| in | fence |\n|---|---|\n```\n<!-- reference table: flags -->\n| flag | default |\n"
             "|---|---|\n| `--x` | 4 MiB, 127.0.0.1 |\n<!-- reference table: flags -->\n| case | time |\n"
             "|---|---|\n| one | 3.5 ms |\nNot | a table.\n")
    got = loose_tables(loose)
    assert [line for line, _ in got] == [1, 18], got
    assert "measured" in got[1][1], got
    print("self-test passed")


def pair_exports(a, b):
    """Prints two arms' exports compared task by task on their shared tasks."""
    got, wants = [], []
    for spec in (a, b):
        run, _, mode = spec.partition(":")
        if run.endswith(".jsonl"):
            path = pathlib.Path(run)
            rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
            tasks = {r["task"]: r["ok"] for r in rows if not mode or r.get("strategy") == mode}
            if not tasks:
                print(f"no records of strategy {mode or '(any)'} in {run}", file=sys.stderr)
                return 1
        else:
            tasks = export_tasks(RECORDS / f"sparse28-{run}", mode or "full")
            if tasks is None:
                print(f"no export records: records/sparse28-{run}/export-eval-{mode or 'full'}.jsonl",
                      file=sys.stderr)
                return 1
        got.append(tasks)
        path = (pathlib.Path(run) if run.endswith(".jsonl")
                else RECORDS / f"sparse28-{run}" / f"export-eval-{mode or 'full'}.jsonl")
        wants.append({r["task"]: r.get("want") for r in jsonl(path)})
    keys = sorted(set(got[0]) & set(got[1]))
    if any(wants[0].get(k) != wants[1].get(k) for k in keys):
        print("the two records scored different tasks under the same numbers (another held-out set)",
              file=sys.stderr)
        return 1
    if not keys:
        print("the two records share no task", file=sys.stderr)
        return 1
    diff, wins, p = paired([(got[0][k], got[1][k]) for k in keys])
    print(f"{a} - {b}: {diff} points over {len(keys)} tasks; only first / only second right {wins}; McNemar p {p}")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        self_test()
        return 0
    if len(argv) == 3 and argv[0] == "--pair":
        return pair_exports(argv[1], argv[2])
    if argv not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    check = argv == ["--check"]
    differs = regenerate(check)
    for d in differs:
        print(("differs from its records: " if check else "rewrote: ") + d)
    loose = loose_tables_in_docs()
    for t in loose:
        print("table outside the generated regions: " + t)
    return 1 if check and (differs or loose) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
