"""Rewrites the GSM8K best-of-8 progress table in docs/REASONING.md from the
records of the resumable run (docs/eval/gsm8k-bon8.jsonl).

Usage: python3 scripts/gsm8k_progress.py [DATE]   (DATE names the session)
"""
import datetime
import json
import pathlib
import sys

root = str(pathlib.Path(__file__).resolve().parent.parent) + '/'
recs = [json.loads(l) for l in open(root + 'docs/eval/gsm8k-bon8.jsonl') if l.strip()]
by = {}
for r in recs:
    by.setdefault(r['strategy'], {})[r['task']] = r
strategies = ['majority@8', 'adaptive@8', 'synthesize@8']
done = sorted(set.intersection(*(set(by[s]) for s in strategies)))
n = len(done)
final = n == 1319
rows = []
for s in strategies:
    rs = [by[s][t] for t in done]
    ok = sum(r['ok'] for r in rs)
    tok = sum(r['tokens'] for r in rs) / n
    smp = sum(r['candidates'] for r in rs) / n
    rows.append(f"| {s} | {ok}/{n} ({100*ok/n:.1f}%) | {tok:.1f} | {smp:.2f} |")
wins = sum(by['synthesize@8'][t]['ok'] and not by['majority@8'][t]['ok'] for t in done)
losses = sum(not by['synthesize@8'][t]['ok'] and by['majority@8'][t]['ok'] for t in done)
early = sum(by['adaptive@8'][t]['stopped_early'] for t in done)
date = sys.argv[1] if len(sys.argv) > 1 else datetime.date.today().isoformat()
head = ("The whole test set, all 1319 problems" if final else
        f"Progress at the end of {date}'s session: the first {n} of 1319 problems"
        if done == list(range(n)) else
        f"Progress at the end of {date}'s session: {n} of 1319 problems (the first "
        f"{next(i for i in range(n + 1) if i not in done)} and a few tasks in flight past them)")
adaptive = ("Adaptive width never stops\nearly here: on GSM8K this model's answers never agreed enough for the Beta\n"
            "rule to call a majority settled before the 8th sample, so adaptive@8 equals\nmajority@8"
            if early == 0 else
            f"Adaptive width stopped early on {early} problem(s)")
text = f"""{head}
(temperature 0.7, top-p 0.95, seed 42 + 1000 x task):

| strategy | accuracy | tokens/task | samples/task |
|---|---|---|---|
{chr(10).join(rows)}

{'The' if final else 'So far the'} synthesizer is right where majority is wrong on {wins} problem(s)
and wrong where majority is right on {losses}. {adaptive} (on the
generated arithmetic set above, where the model is often right, it saves
samples). The single-sample row above is over the whole set (36/1319).

"""
p = root + 'docs/REASONING.md'
doc = open(p).read()
start = doc.index('Progress at the end of') if 'Progress at the end of' in doc else doc.index('The whole test set, all 1319 problems')
end = doc.index('### Arithmetic, 50 generated tasks (adaptive length added)')
doc = doc[:start] + text + doc[end:]
open(p, 'w').write(doc)
print(text)
