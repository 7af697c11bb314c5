"""Rewrites the GSM8K best-of-8 progress table in docs/REASONING.md from the
records of the resumable run (docs/eval/gsm8k-bon8.jsonl), through
`tern eval --report --json` (build the release binary first).

Usage: python3 scripts/gsm8k_progress.py [DATE]   (DATE names the session)
"""
import datetime
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORDS = ROOT / "docs/eval/gsm8k-bon8.jsonl"
STRATEGIES = ["majority@8", "adaptive@8", "synthesize@8"]
TOTAL = 1319

report = subprocess.run(
    [str(ROOT / "target/release/tern"), "eval", "--task", str(ROOT / "../shared/data/gsm8k_test.jsonl"),
     "--strategy", ",".join(STRATEGIES), "--limit", str(TOTAL), "--records", str(RECORDS),
     "--report", "--json"],
    check=True, capture_output=True, text=True,
).stdout
rows = {r["strategy"]: r for r in json.loads(report.splitlines()[-1])["rows"]}
n = rows["majority@8"]["tasks"]

# Which tasks are in: all of the first n, or a few in flight past a gap.
have = {}
for line in RECORDS.read_text().splitlines():
    if line.strip():
        r = json.loads(line)
        have.setdefault(r["task"], set()).add(r["strategy"])
done = {t for t, s in have.items() if s >= set(STRATEGIES)}
prefix = next(i for i in range(TOTAL + 1) if i not in done)

date = sys.argv[1] if len(sys.argv) > 1 else datetime.date.today().isoformat()
if n == TOTAL:
    head = f"The whole test set, all {TOTAL} problems"
elif prefix == n:
    head = f"Progress at the end of {date}'s session: the first {n} of {TOTAL} problems"
else:
    head = (f"Progress at the end of {date}'s session: {n} of {TOTAL} problems (the first "
            f"{prefix} and a few tasks in flight past them)")
table = "\n".join(
    f"| {s} | {r['correct']}/{n} ({100 * r['accuracy']:.1f}%) | {r['tokens_per_task']:.1f} "
    f"| {r['candidates_per_task']:.2f} |"
    for s, r in rows.items())
h = rows["synthesize@8"]["vs_first"]
# Adaptive width's early stops: problems where it used fewer than 8 samples.
early = rows["adaptive@8"]["width_stops"]
same = rows["adaptive@8"]["correct"] == rows["majority@8"]["correct"]
if early == 0:
    adaptive = ("Adaptive width never stops\nearly here: on GSM8K this model's answers never agreed enough for the Beta\n"
                "rule to call a majority settled before the 8th sample, so adaptive@8 equals\nmajority@8")
else:
    adaptive = (f"Adaptive width stopped early\non only {early} problem(s) (the first samples agreed; "
                f"accuracy\n{'the same as' if same else 'different from'} majority@8's): this model's GSM8K answers "
                "rarely agree enough for the Beta rule")
text = f"""{head}
(temperature 0.7, top-p 0.95, seed 42 + 1000 x task):

| strategy | accuracy | tokens/task | samples/task |
|---|---|---|---|
{table}

{'The' if n == TOTAL else 'So far the'} synthesizer is right where majority is wrong on {h['wins']} problem(s)
and wrong where majority is right on {h['losses']}. {adaptive} (on the
generated arithmetic set above, where the model is often right, it saves
samples). The single-sample row above is over the whole set (36/1319).
The run's binary (copied before it started) predates the extraction that
takes a stated calculation's result, so every problem is graded the same way.

"""
doc_path = ROOT / "docs/REASONING.md"
doc = doc_path.read_text()
marker = "Progress at the end of" if "Progress at the end of" in doc else "The whole test set, all"
start = doc.index(marker)
# A hand-written reading of the finished run, if any, follows the table and stays.
tail = "What the whole set says" if "What the whole set says" in doc else "### Arithmetic, 50 generated"
end = doc.index(tail)
doc_path.write_text(doc[:start] + text + doc[end:])
print(text, end="")
