"""Summarises bench/run overlap --autotune JSON lines: per file and compute ratio, auto / best fixed,
the paired ratio, the tuned plan, the same plan's fixed time, the noise floor (the settled tuner
measured twice per round, where the bench records it) and re-tunes.
usage: python3 summarize.py FILE..."""
import json
import sys

print("| file | ratio | auto / best | paired | tuned plan | auto / fixed at that plan | noise floor | retunes | settled at | auto / 25 MiB | auto / 64 MiB |")
print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for f in sys.argv[1:]:
    rows = [json.loads(l) for l in open(f)]
    for ratio in sorted({r["compute_ratio"] for r in rows}):
        rs = [r for r in rows if r["compute_ratio"] == ratio]
        fixed = [r for r in rs if r["variant"] == "fixed"]
        a = [r for r in rs if r["variant"] == "autotuned"][-1]
        best = min(fixed, key=lambda r: r["iteration_s"])
        same = [r for r in fixed if r["threshold_bytes"] == a["threshold_bytes"] and r.get("hybrid_switch_bytes", 0) == a.get("hybrid_switch_bytes", 0)]
        f25 = min((r for r in fixed if r["threshold_bytes"] == 25 << 20), key=lambda r: r["iteration_s"])
        f64 = min((r for r in fixed if r["threshold_bytes"] == 64 << 20), key=lambda r: r["iteration_s"])
        th = a["threshold_bytes"]
        plan = ("%d KiB" % (th >> 10)) if th < (1 << 20) else ("%d MiB" % (th >> 20))
        if a.get("first_bucket_bytes"):
            plan += " (first %d KiB)" % (a["first_bucket_bytes"] >> 10)
        print("| %s | %.1f | %.3f | %s | %s | %s | %s | %d | %d | %.3f | %.3f |" % (
            f.rsplit("/", 1)[-1].replace(".jsonl", ""), ratio, a["iteration_s"] / best["iteration_s"],
            "%.3f" % a["paired_ratio_vs_best"] if "paired_ratio_vs_best" in a else "—", plan,
            "%.3f" % (a["iteration_s"] / same[0]["iteration_s"]) if same else "—",
            "%.3f" % a["repeat_ratio"] if "repeat_ratio" in a else "—", a["retunes"], a["settled_at"],
            a["iteration_s"] / f25["iteration_s"], a["iteration_s"] / f64["iteration_s"]))
