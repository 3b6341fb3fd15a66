#!/usr/bin/env python3
"""Draws bench/run JSON lines as PNG plots for docs/.

  python3 bench/plot.py table RESULTS.jsonl...
      a markdown table per (layout, ranks, wire, run): variant, threshold, collectives,
      median/p10/p90, and gflow's ratio to the hand-written bucketed MPI at the same threshold.
  python3 bench/plot.py sparse RESULTS.jsonl...
      a markdown table per (layout, ranks, transport, run): dense / TopK / GTopK / CSC rows.
  python3 bench/plot.py kernels RESULTS.jsonl... [-o docs/kernels.png]
      a markdown table per layout of the host kernels against the same-run copy (and a bar chart
      of their bandwidth relative to the copy with -o).
  python3 bench/plot.py sweep RESULTS.jsonl... -o docs/exchange_threshold_sweep.png
      median time against fusion threshold, one line per (layout, ranks) for gflow and the
      hand-written bucketed MPI, with per-tensor and whole-pool baselines as dashed levels.
  python3 bench/plot.py trace TRACE.json [--iteration N] -o docs/timeline.png
      one iteration of a Chrome trace written by --trace (gflow::timeline): per rank, the caller
      thread's ready() ticks and finish(), and the issuing thread's buckets with their stages.
  python3 bench/plot.py autotune RESULTS.jsonl... [-o docs/autotune.png]
      overlap --autotune rows: a markdown table of the sweep against the auto-tuned threshold.
  python3 bench/plot.py tuner RESULTS.jsonl...
      overlap --autotune rows, one line per run and compute ratio: auto / best fixed, the paired
      ratio, the tuned plan, auto / the fixed run at that plan, the noise floor, re-tunes, where it
      settled, auto / 25 MiB and auto / 64 MiB (the table of docs/BENCHMARKS.md's auto-tuner section).
  python3 bench/plot.py model RESULTS.jsonl... [-o docs/cost_model.png]
      model rows: the fit, the check against measured exchanges, predictions P = 2 .. 1024,
      and cross-P errors (the fit at one P against the exchanges measured at another).
  python3 bench/plot.py loops RESULTS.jsonl... [-o docs/learn_order.png]
      the training-loop options: overlap --learn-order rows (hidden fraction of each strategy with
      and without learn_order, median and range over the files) and exchange --options rows (each
      option's time over gflow's in the same run).
  python3 bench/plot.py sim RESULTS.jsonl... [-o docs/sim_scale.png]
      bench/simulate.sh rows: simulated / netem (validate) per run, and time against P per layout,
      platform and scheme or topology (log-log panels).
  python3 bench/plot.py shard RESULTS.jsonl... [-o docs/sharding.png]
      exchange --shard and overlap --shard rows: the reduce-scatter (and with gather_shards) over the
      allreduce per network and run, and the hidden fraction with and without sharding.
  python3 bench/plot.py shardtopo RESULTS.jsonl [-o docs/sharding_topologies.png]
      exchange --shard --topology all rows: each topology's sharded exchange against its own allreduce.
Every kind but trace takes --run K: only the rows of run K. The N runs of one configuration are
one file (bench/measure.sh --repeats N), each row beginning {"run":K, ; without --run every run
is read, and the tables above keep the runs apart (one table, or one line, per run).
Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import sys
from collections import defaultdict

from plot_autotune import autotune_table, tuner_runs  # noqa: E402 (the auto-tuner's kinds)
from plot_common import hidden_fractions, load, run_of
from plot_shard import shard_report, shard_topology_report
from plot_sim import sim_report


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


def of_run(key):
    """The ", run K" of a table's heading, for the rows of run K of a file that holds several."""
    return f", run {key[-1]}" if key[-1] else ""


def table(rows):
    groups = defaultdict(list)
    for r in rows:
        groups[(r["layout"], r["ranks"], r["wire"], r.get("run") or 0)].append(r)
    for key in sorted(groups):
        rs = groups[key]
        bucketed = {r["threshold_bytes"]: r["median_s"] for r in rs if r["variant"] == "mpi_bucketed"}
        print(f"\n**{key[0]}, {key[1]} ranks, {key[2]} wire{of_run(key)}**\n")
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
            groups[(r["layout"], r["ranks"], r.get("transport", "mpi"), r.get("run") or 0)].append(r)
    for key in sorted(groups):
        rs = groups[key]
        dense = next((r["median_s"] for r in rs if r["variant"] == "dense"), None)
        print(f"\n**{key[0]}, {key[1]} ranks ({key[2]}){of_run(key)}**\n")
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


def trace_plot(path, iteration, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    its = sorted({e["args"]["iteration"] for e in ev if e.get("cat") == "iteration"})
    if not its:
        sys.exit("plot.py trace: no iteration spans in " + path)
    it = its[min(len(its) - 1, len(its) // 2)] if iteration is None else iteration
    sel = [e for e in ev if e.get("ph") != "M" and e.get("args", {}).get("iteration") == it]
    ranks = sorted({e["pid"] for e in sel})
    t0 = min(e["ts"] for e in sel if e.get("cat") == "iteration")
    colors = {"bucket": "#4c72b0", "cast": "#dd8452", "collective": "#55a868", "widen+average": "#c44e52", "select": "#8172b3"}
    fig, ax = plt.subplots(figsize=(12, 1.1 + 1.0 * len(ranks)))
    yt, yl = [], []
    for k, r in enumerate(ranks):
        base = (len(ranks) - 1 - k) * 3
        mine = [e for e in sel if e["pid"] == r]
        # caller thread: ready ticks, finish span
        ready = [(e["ts"] - t0) / 1e3 for e in mine if e.get("cat") == "ready"]
        ax.vlines(ready, base + 1.55, base + 2.35, color="#333333", linewidth=0.6)
        for e in mine:
            if e.get("cat") == "finish":
                ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (base + 1.5, 0.9), facecolor="#bbbbbb", edgecolor="none")
        # issuing thread: buckets and their stages
        for e in mine:
            c = e.get("cat")
            if e.get("ph") != "X" or c not in colors or e["tid"] == 0 and c != "bucket" and False:
                continue
            if c == "bucket":
                ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (base + 0.1, 1.1), facecolor="none", edgecolor=colors[c], linewidth=0.8)
            else:
                ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (base + 0.25, 0.8), facecolor=colors[c], edgecolor="none")
        yt += [base + 0.65, base + 1.95]
        yl += ["rank %d exchange" % r, "rank %d ready/finish" % r]
    ax.set_yticks(yt)
    ax.set_yticklabels(yl, fontsize=8)
    ax.set_xlabel("ms since the iteration's first ready() (rank clocks aligned at a barrier)")
    from matplotlib.patches import Patch
    handles = [Patch(facecolor=v, label=k) for k, v in colors.items() if k != "bucket" and any(e.get("cat") == k for e in sel)]
    handles.append(Patch(facecolor="none", edgecolor=colors["bucket"], label="bucket"))
    handles.append(Patch(facecolor="#bbbbbb", label="finish()"))
    ax.legend(handles=handles, loc="upper left", fontsize=7, ncol=6)
    ax.set_title("gflow timeline, iteration %d (%s)" % (it, path.split("/")[-1]), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=140)
    print("wrote", out)


def model_report(rows, out=None):
    fits = [r for r in rows if r.get("suite") == "model" and r.get("row") == "fit"]
    checks = [r for r in rows if r.get("suite") == "model" and r.get("row") == "check"]
    preds = [r for r in rows if r.get("suite") == "model" and r.get("row") == "predict"]
    print("| fitted at P | kind | alpha (us) | beta (ns/B) | from (bytes) | alpha (us) | beta (ns/B) | worst fit error over sizes |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in sorted(fits, key=lambda r: (r["ranks"], r["kind"])):
        split = r.get("split_bytes", 0)
        second = ("| %s | %.2f | %.4f " % (("%d KiB" % (split / 1024)) if split < (1 << 20) else ("%d MiB" % (split / (1 << 20))),
                                           r["alpha_large_s"] * 1e6, r["beta_large_s_per_byte"] * 1e9)) if split else "| one regime | | "
        print("| %d | %s | %.2f | %.4f %s| %.0f%% |" % (r["ranks"], r["kind"], r["alpha_s"] * 1e6, r["beta_s_per_byte"] * 1e9, second,
                                                      r["fit_max_error"] * 100))
    print()
    print("| P | exchange | measured (ms) | model, fitted at the same P (ms) | error |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in sorted(checks, key=lambda r: (r["ranks"], r["exchange"])):
        print("| %d | %s | %.2f | %.2f | %+.0f%% |" % (r["ranks"], r["exchange"], r["measured_s"] * 1e3, r["predicted_s"] * 1e3, r["error"] * 100))
    # cross-P: the prediction made from the fit at P0 for the P of a check row
    key = {"dense": "dense_s", "topk_0.010": "topk_0.01_s", "gtopk_0.010": "gtopk_0.01_s", "topk_0.001": "topk_0.001_s",
           "gtopk_0.001": "gtopk_0.001_s", "csc_1pct": "csc_1pct_s"}
    cross = []
    for c in checks:
        for p in preds:
            if p["ranks"] == c["ranks"] and p["fitted_at_ranks"] != c["ranks"] and c["exchange"] in key and p["layout"] == c["layout"]:
                cross.append((p["fitted_at_ranks"], c["ranks"], c["exchange"], c["measured_s"], p[key[c["exchange"]]]))
    if cross:
        print()
        print("| fitted at P | predicted for P | exchange | measured (ms) | predicted (ms) | error |")
        print("| ---: | ---: | --- | ---: | ---: | ---: |")
        for f0, q, name, m, pr in sorted(cross):
            print("| %d | %d | %s | %.2f | %.2f | %+.0f%% |" % (f0, q, name, m * 1e3, pr * 1e3, (pr / m - 1) * 100))
    if out and preds:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.2))
        f0 = max(p["fitted_at_ranks"] for p in preds)
        ps = sorted([p for p in preds if p["fitted_at_ranks"] == f0], key=lambda p: p["ranks"])
        for k, lab in [("dense_s", "dense ring"), ("hierarchical8_s", "Hierarchical<8>"), ("topk_0.01_s", "TopK 1%"), ("gtopk_0.01_s", "GTopK 1%"),
                       ("gtopk_0.001_s", "GTopK 0.1%"), ("csc_1pct_s", "CSC 1%")]:
            ax.plot([p["ranks"] for p in ps], [p[k] * 1e3 for p in ps], marker="o", markersize=3, label=lab)
        for c in checks:
            if c["exchange"] in ("dense", "gtopk_0.010", "topk_0.010", "csc_1pct"):
                ax.plot([c["ranks"]], [c["measured_s"] * 1e3], "kx")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks P")
        ax.set_ylabel("exchange time (ms), modelled")
        ax.set_title("alpha-beta model fitted at P = %d (%s); x: measured" % (f0, ps[0]["layout"]), fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out, dpi=140)
        print("wrote", out)


def loops_report(rows, out=None):
    """Training-loop options: learn_order's recovered overlap, and each option's cost."""
    import statistics
    hidden = hidden_fractions(rows, "+learn")  # (layout, ranks, strategy, learned) -> [hidden fraction per run]
    if hidden:
        print("| layout | ranks | strategy | hidden, reverse layout order | hidden, learn_order | runs |")
        print("|---|---:|---|---:|---:|---:|")
        for (lay, P, strat, learned) in sorted(k for k in hidden if not k[3]):
            a, b = hidden[(lay, P, strat, False)], hidden.get((lay, P, strat, True), [])
            fmt = lambda xs: f"{100 * statistics.median(xs):.0f}% ({100 * min(xs):.0f}–{100 * max(xs):.0f})" if xs else "-"
            print(f"| {lay} | {P} | {strat} | {fmt(a)} | {fmt(b)} | {len(a)} |")
    cost = defaultdict(list)  # (layout, ranks, variant) -> [time / gflow's in the same run]
    base = {}
    for r in rows:
        if r.get("suite") == "exchange" and r.get("variant") == "gflow":
            base[(r["layout"], r["ranks"], run_of(r))] = r["median_s"]
    for r in rows:
        if r.get("suite") == "exchange" and r.get("variant", "").startswith(("gflow_find_unused", "gflow_uneven_inputs", "gflow_learn_order")):
            b = base.get((r["layout"], r["ranks"], run_of(r)))
            if b:
                cost[(r["layout"], r["ranks"], r["variant"])].append(r["median_s"] / b)
    if cost:
        print()
        print("| layout | ranks | option | time / gflow (median, range over runs) | runs |")
        print("|---|---:|---|---:|---:|")
        for k in sorted(cost):
            xs = cost[k]
            print(f"| {k[0]} | {k[1]} | {k[2][6:]} | {statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f}) | {len(xs)} |")
    if out and hidden:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        keys = sorted(k for k in hidden if not k[3])
        fig, ax = plt.subplots(figsize=(10, 4))
        xs = range(len(keys))
        for off, learned, label in ((-0.2, False, "pool in reverse layout order"), (0.2, True, "exchange_options::learn_order")):
            med = [100 * statistics.median(hidden.get((k[0], k[1], k[2], learned), [0])) for k in keys]
            lo = [m - 100 * min(hidden.get((k[0], k[1], k[2], learned), [0])) for m, k in zip(med, keys)]
            hi = [100 * max(hidden.get((k[0], k[1], k[2], learned), [0])) - m for m, k in zip(med, keys)]
            ax.bar([x + off for x in xs], med, 0.4, yerr=[lo, hi], capsize=3, label=label)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{k[2]}\n{k[0]}\n{k[1]} ranks" for k in keys], fontsize=7)
        ax.set_ylabel("exchange hidden behind backward (%)")
        ax.set_title("A tensor ready late: overlap without and with the learned order")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        print(f"\nwrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["sweep", "table", "sparse", "kernels", "trace", "autotune", "tuner", "model", "loops", "shard", "shardtopo", "sim"])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("-o", "--output")
    ap.add_argument("--iteration", type=int)
    ap.add_argument("--run", type=int, help="only the rows of run K (a file of several runs)")
    a = ap.parse_args()
    if a.kind == "trace":
        if not a.output:
            sys.exit("plot.py trace: pass -o FILE.png")
        trace_plot(a.inputs[0], a.iteration, a.output)
        return
    if a.kind == "tuner":
        tuner_runs(a.inputs, a.run)
        return
    rows = load(a.inputs, a.run)
    if not rows:
        sys.exit("plot.py: no JSON rows in the inputs")
    if a.kind == "table":
        table(rows)
    elif a.kind == "sparse":
        sparse_table(rows)
    elif a.kind == "kernels":
        kernels_table(rows, a.output)
    elif a.kind == "autotune":
        autotune_table(rows, a.output)
    elif a.kind == "model":
        model_report(rows, a.output)
    elif a.kind == "loops":
        loops_report(rows, a.output)
    elif a.kind == "shard":
        shard_report(rows, a.output)
    elif a.kind == "shardtopo":
        shard_topology_report(rows, a.output)
    elif a.kind == "sim":
        sim_report(rows, a.output)
    else:
        if not a.output:
            sys.exit("plot.py sweep: pass -o FILE.png")
        sweep(rows, a.output)


if __name__ == "__main__":
    main()
