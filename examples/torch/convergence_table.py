#!/usr/bin/env python3
"""Summary of the libtorch CNN's multi-seed convergence study (examples/torch/convergence.sh).

Reads DIR/runs.csv (or the CSV file given): one row per epoch of every run, its first two columns
the run's composition (<name>[_<suffix>]) and seed, then the trainer's --csv columns, as
examples/torch/convergence.sh writes it. Prints per composition the final test accuracy's mean and sample standard deviation over the seeds, and its difference to dense two
ways: unpaired (mean - mean_dense, uncertainty sqrt(sd^2/n + sd_dense^2/n)) and paired by seed
(the same seed gives every composition the same initial weights and shuffles; uncertainty: the
standard deviation of the per-seed differences / sqrt(n)). The verdict uses the paired numbers:
  met        the difference minus its uncertainty stays above -target (within the target
             including the noise), or the difference is positive and larger than its uncertainty;
  not met    the difference plus its uncertainty is below -target;
  undecided  otherwise (the noise is larger than what separates the two).
Draws mean +- sd per epoch and the differences with their targets to -o PNG.

  python3 examples/torch/convergence_table.py docs/results/torch -o docs/convergence_torch.png
"""
import argparse
import csv
import math
import os
import statistics

TARGETS = {"torch_fp16": 0.2, "torch_csc": 0.5, "torch_topk": 1.0, "torch_gtopk": 1.0, "torch_oktopk": 1.0}
ORDER = ["torch_dense", "torch_fp16", "torch_csc", "torch_topk", "torch_gtopk", "torch_oktopk", "torch_funneled"]


def load(d):
    path = os.path.join(d, "runs.csv") if os.path.isdir(d) else d
    per_run = {}  # (composition, seed) -> its rows, epoch by epoch
    with open(path) as f:
        for r in csv.DictReader(f):
            per_run.setdefault((r["composition"], int(r["seed"])), []).append(r)
    runs = {}
    for (name, seed), rows in per_run.items():
        runs.setdefault(name, {})[seed] = [float(r["test_acc"]) for r in rows]
        BYTES.setdefault(name, {})[seed] = float(rows[-1]["bytes_per_iter"])
    return runs


BYTES = {}  # name -> {seed: bytes per iteration per rank in the run's last epoch}


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", help="a results folder (its runs.csv) or a runs CSV file")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    runs = load(a.dir)
    names = [n for n in ORDER if n in runs] + sorted(n for n in runs if n not in ORDER)
    dense = runs.get("torch_dense", {})
    epochs = max((len(v) for r in runs.values() for v in r.values()), default=0)
    print(f"| composition | seeds | KiB/iter/rank (last epoch) | final test acc (mean ± sd) | diff to dense, unpaired | diff to dense, paired by seed | target | verdict |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    diffs = {}
    for n in names:
        finals = {s: v[-1] for s, v in runs[n].items() if len(v) == epochs}
        xs = list(finals.values())
        kib = statistics.mean(BYTES[n][s] for s in finals) / 1024
        line = f"| {n} | {len(xs)} ({', '.join(str(s) for s in sorted(finals))}) | {kib:.1f} | {statistics.mean(xs):.2f} ± {sd(xs):.2f} |"
        if n == "torch_dense" or not dense:
            print(line + " | | | |")
            continue
        dfin = {s: v[-1] for s, v in dense.items() if len(v) == epochs}
        dx = list(dfin.values())
        un = statistics.mean(xs) - statistics.mean(dx)
        un_u = math.sqrt(sd(xs) ** 2 / len(xs) + sd(dx) ** 2 / len(dx)) if len(xs) > 1 and len(dx) > 1 else float("nan")
        common = sorted(set(finals) & set(dfin))
        pd = [finals[s] - dfin[s] for s in common]
        p = statistics.mean(pd) if pd else float("nan")
        p_u = sd(pd) / math.sqrt(len(pd)) if len(pd) > 1 else float("nan")
        t = TARGETS.get(n)
        verdict = ""
        if t is not None and not math.isnan(p_u):
            if p - p_u >= -t or (p > 0 and p > p_u):
                verdict = "met"
            elif p + p_u < -t:
                verdict = "not met"
            else:
                verdict = "undecided (noise > margin)"
        diffs[n] = (p, p_u, t)
        tt = f"≥ -{t}" if t is not None else "(= dense math)"
        print(line + f" {un:+.2f} ± {un_u:.2f} | {p:+.2f} ± {p_u:.2f} (n={len(pd)}) | {tt} | {verdict} |")
    if a.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for n in names:
            curves = [v for v in runs[n].values() if len(v) == epochs]
            if not curves:
                continue
            m = [statistics.mean(c[e] for c in curves) for e in range(epochs)]
            s = [sd([c[e] for c in curves]) if len(curves) > 1 else 0 for e in range(epochs)]
            ax1.errorbar(range(1, epochs + 1), m, yerr=s, capsize=3, marker="o", label=f"{n} (n={len(curves)})")
        ax1.set_xticks(range(1, epochs + 1))
        same_seeds = "torch_funneled" in runs and "torch_dense" in runs and set(runs["torch_funneled"]) == set(runs["torch_dense"])
        ax1.set_xlabel("epoch (dense is under funneled: the same curve)" if same_seeds else "epoch")
        ax1.set_ylabel("test accuracy (%), mean ± sd over seeds")
        ax1.set_title("libtorch CNN, Fashion-MNIST, 4 ranks")
        ax1.grid(alpha=0.3)
        ax1.legend(fontsize=8)
        ks = list(diffs)
        ax2.errorbar(range(len(ks)), [diffs[k][0] for k in ks], yerr=[diffs[k][1] for k in ks], fmt="o", capsize=4, color="C3",
                     label="final acc - dense (paired by seed), ± 1 standard error")
        for i, k in enumerate(ks):
            if diffs[k][2] is not None:
                ax2.hlines(-diffs[k][2], i - 0.3, i + 0.3, colors="k", linestyles="--")
        ax2.axhline(0, color="grey", lw=0.8)
        ax2.set_xticks(range(len(ks)))
        ax2.set_xticklabels([k.replace("torch_", "") for k in ks])
        ax2.set_ylabel("difference to dense fp32 (points); dashes: target")
        ax2.set_title("difference to dense against seed noise")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.out, dpi=110)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
