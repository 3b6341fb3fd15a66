#!/usr/bin/env python3
"""Draws bench/run JSON lines as PNG plots for docs/.

  python3 bench/plot.py table RESULTS.jsonl...
      a markdown table per (layout, ranks, wire): variant, threshold, collectives, median/p10/p90,
      and gflow's ratio to the hand-written bucketed MPI at the same threshold.
  python3 bench/plot.py sparse RESULTS.jsonl...
      a markdown table per (layout, ranks, transport): dense / TopK / GTopK / CSC rows.
  python3 bench/plot.py kernels RESULTS.jsonl... [-o docs/kernels.png]
      a markdown table per layout of the host kernels against the same-run copy (and a bar chart
      of their bandwidth relative to the copy with -o).
  python3 bench/plot.py sweep RESULTS.jsonl... -o docs/exchange_threshold_sweep.png
      median time against fusion threshold, one line per (layout, ranks) for gflow and the
      hand-written bucketed MPI, with per-tensor and whole-pool baselines as dashed levels.
Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import sys
from collections import defaultdict


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    return rows


def sweep(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)
    for r in rows:
        groups[(r["layout"], r["ranks"], r["wire"])].append(r)
    keys = sorted(groups)
    ncols = 2 if len(keys) > 1 else 1
    nrows = (len(keys) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.4 * nrows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        rs = groups[key]
        for variant, style in (("gflow", "o-"), ("mpi_bucketed", "s--")):
            pts = sorted((r["threshold_bytes"], r["median_s"], r["p10_s"], r["p90_s"]) for r in rs if r["variant"] == variant)
            if not pts:
                continue
            x = [p[0] for p in pts]
            y = [p[1] * 1e3 for p in pts]
            lo = [(p[1] - p[2]) * 1e3 for p in pts]
            hi = [(p[3] - p[1]) * 1e3 for p in pts]
            ax.errorbar(x, y, yerr=[lo, hi], fmt=style, capsize=2, label=variant)
        for variant, color in (("mpi_per_tensor", "tab:red"), ("mpi_whole", "tab:gray")):
            for r in rs:
                if r["variant"] == variant:
                    ax.axhline(r["median_s"] * 1e3, color=color, ls=":", label=f"{variant} (median)")
                    break
        ax.set_xscale("log", base=2)
        ax.set_xlabel("fusion threshold (bytes on the wire)")
        ax.set_ylabel("ms per iteration (median, bars p10-p90)")
        ax.set_title(f"{key[0]}, {key[1]} ranks, {key[2]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)


def table(rows):
    groups = defaultdict(list)
    for r in rows:
        groups[(r["layout"], r["ranks"], r["wire"])].append(r)
    for key in sorted(groups):
        rs = groups[key]
        bucketed = {r["threshold_bytes"]: r["median_s"] for r in rs if r["variant"] == "mpi_bucketed"}
        print(f"\n**{key[0]}, {key[1]} ranks, {key[2]} wire**\n")
        print("| variant | threshold (B) | collectives | median (ms) | p10 (ms) | p90 (ms) | gflow / bucketed |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rs:
            ratio = ""
            if r["variant"].startswith("gflow") and r["threshold_bytes"] in bucketed:
                ratio = f"{r['median_s'] / bucketed[r['threshold_bytes']]:.3f}"
            print(f"| {r['variant']} | {r['threshold_bytes']} | {r.get('collectives', '')} | {r['median_s'] * 1e3:.2f} | "
                  f"{r['p10_s'] * 1e3:.2f} | {r['p90_s'] * 1e3:.2f} | {ratio} |")


def sparse_table(rows):
    groups = defaultdict(list)
    for r in rows:
        if r.get("suite") == "sparse":
            groups[(r["layout"], r["ranks"], r.get("transport", "mpi"))].append(r)
    for key in sorted(groups):
        rs = groups[key]
        dense = next((r["median_s"] for r in rs if r["variant"] == "dense"), None)
        print(f"\n**{key[0]}, {key[1]} ranks ({key[2]})**\n")
        print("| variant | density | median (ms) | p10–p90 (ms) | select (ms) | comm, derived (ms) | bytes/rank | vs dense |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rs:
            d = "1 (dense)" if r["variant"] == "dense" else f"{r['density']:g}"
            vs = f"{r['median_s'] / dense:.3f}" if dense else ""
            print(f"| {r['variant']} | {d} | {r['median_s'] * 1e3:.1f} | {r['p10_s'] * 1e3:.1f}–{r['p90_s'] * 1e3:.1f} | "
                  f"{r['select_s'] * 1e3:.1f} | {r['comm_s'] * 1e3:.1f} | {r['bytes_per_rank']:,} | {vs} |")


def kernels_table(rows, out=None):
    groups = defaultdict(list)
    for r in rows:
        if r.get("suite") == "kernels":
            groups[(r["layout"], r["elements"])].append(r)
    for key in sorted(groups):
        print(f"\n**{key[0]} ({key[1]:,} elements)**\n")
        print("| kernel | median (ms) | min–max (ms) | GB/s | vs copy bandwidth | x copy time |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in groups[key]:
            print(f"| {r['kernel']} | {r['median_s'] * 1e3:.2f} | {r['min_s'] * 1e3:.2f}–{r['max_s'] * 1e3:.2f} | {r['gbps']:.2f} | "
                  f"{r['vs_copy_bw']:.2f} | {r['x_copy_time']:.2f} |")
    if not out:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = sorted(groups)
    fig, axes = plt.subplots(1, len(keys), figsize=(7 * len(keys), 5.5), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        rs = groups[key]
        names = [r["kernel"] for r in rs]
        vals = [r["vs_copy_bw"] for r in rs]
        colors = ["tab:gray" if n == "copy" else ("tab:orange" if "reference" in n else "tab:blue") for n in names]
        ax.barh(range(len(rs)), vals, color=colors)
        ax.set_yticks(range(len(rs)))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0.5, color="tab:red", ls="--", label="target for memory-bound kernels (0.5)")
        ax.set_xlabel("bandwidth / same-run copy bandwidth (bytes read + written)")
        ax.set_title(f"host kernels, {key[0]} ({key[1] / 1e6:.1f} M elements)")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["sweep", "table", "sparse", "kernels"])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    rows = load(a.inputs)
    if not rows:
        sys.exit("plot.py: no JSON rows in the inputs")
    if a.kind == "table":
        table(rows)
    elif a.kind == "sparse":
        sparse_table(rows)
    elif a.kind == "kernels":
        kernels_table(rows, a.output)
    else:
        if not a.output:
            sys.exit("plot.py sweep: pass -o FILE.png")
        sweep(rows, a.output)


if __name__ == "__main__":
    main()
