"""bench/plot.py shard: Sharding<ReduceScatter> against the allreduce (docs/BENCHMARKS.md section 7a).

Reads exchange --shard rows (gflow, gflow_shard, gflow_shard_gather; a "network" and "repeat" field
per row, as docs/results/sharding_*.jsonl holds them) and overlap --shard rows (each strategy with
and without "+shard"). Prints the two tables and, with -o, draws them side by side.
"""
from collections import defaultdict

from plot_common import hidden_fractions


def shard_report(rows, out=None):
    import statistics
    runs = defaultdict(dict)  # (network, layout, ranks, repeat) -> variant -> median_s
    for r in rows:
        if r.get("suite") == "exchange" and r.get("variant") in ("gflow", "gflow_shard", "gflow_shard_gather"):
            key = (r.get("network", "?"), r["layout"], r["ranks"], r.get("wire", "fp32"), r.get("repeat", r.get("_file")))
            runs[key][r["variant"]] = r["median_s"]
    ratios = defaultdict(lambda: defaultdict(list))  # (network, layout, ranks, wire) -> variant -> [ratio per run]
    if runs:
        print("| network | layout | ranks | wire | run | gflow ms | shard ms (/ gflow) | shard + gather ms (/ gflow) |")
        print("|---|---|---:|---|---:|---:|---:|---:|")
        for key in sorted(runs, key=str):
            v = runs[key]
            if "gflow" not in v:
                continue
            g = v["gflow"]
            cells = []
            for name in ("gflow_shard", "gflow_shard_gather"):
                if name in v:
                    ratios[key[:4]][name].append(v[name] / g)
                    cells.append(f"{1e3 * v[name]:.1f} ({v[name] / g:.3f})")
                else:
                    cells.append("-")
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {1e3 * g:.1f} | {cells[0]} | {cells[1]} |")
    hidden = hidden_fractions(rows, "+shard")  # (layout, ranks, strategy, sharded) -> [hidden fraction per run]
    pairs = sorted(k for k in hidden if not k[3] and (k[0], k[1], k[2], True) in hidden)
    if pairs:
        print()
        print("| layout | ranks | strategy | hidden, allreduce | hidden, reduce-scatter | runs |")
        print("|---|---:|---|---:|---:|---:|")
        for k in pairs:
            a, b = hidden[k], hidden[(k[0], k[1], k[2], True)]
            print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(", ".join(f"{100 * x:.0f}%" for x in xs) for xs in (a, b)) + f" | {len(a)} |")
    if not out:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    groups = sorted(ratios)
    for i, grp in enumerate(groups):
        for j, (name, label) in enumerate((("gflow_shard", "reduce-scatter"), ("gflow_shard_gather", "reduce-scatter + gather_shards"))):
            xs = ratios[grp][name]
            if not xs:
                continue
            x = i + (j - 0.5) * 0.4
            ax1.bar(x, statistics.median(xs), 0.38, color=f"C{j}", label=label if i == 0 else None)
            ax1.plot([x] * len(xs), xs, "k.", ms=5)
    for y, style, text in ((0.5, ":", "ring theory, reduce-scatter"), (1.0, "--", "the allreduce")):
        ax1.axhline(y, color="gray", ls=style, lw=1)
        ax1.text(len(groups) - 0.5, y, text, fontsize=7, va="bottom", ha="right", color="gray")
    ax1.set_xticks(range(len(groups)))
    ax1.set_xticklabels([f"{g[0]}\n{g[1]}, {g[2]} ranks, {g[3]}" for g in groups], fontsize=7)
    ax1.set_ylabel("time / allreduce time (same run)")
    ax1.set_title("Sharding<ReduceScatter>: the exchange (bars: median; dots: runs)", fontsize=9)
    ax1.legend(fontsize=7)
    if pairs:
        xs = range(len(pairs))
        for off, sharded, label in ((-0.2, False, "allreduce"), (0.2, True, "reduce-scatter")):
            vals = [hidden[(k[0], k[1], k[2], sharded)] for k in pairs]
            med = [100 * statistics.median(v) for v in vals]
            ax2.bar([x + off for x in xs], med, 0.4, label=label)
            for x, v in zip(xs, vals):
                ax2.plot([x + off] * len(v), [100 * y for y in v], "k.", ms=5)
        ax2.set_xticks(list(xs))
        ax2.set_xticklabels([f"{k[2]}\n{k[0]}, {k[1]} ranks" for k in pairs], fontsize=8)
        ax2.set_ylabel("exchange hidden behind backward (%)")
        ax2.set_title("Overlap: hidden fraction (backward = 1.5 x the allreduce)", fontsize=9)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"\nwrote {out}")


TOPOLOGIES = (("Ring", "gflow", "gflow_shard"), ("Hierarchical<2>", "gflow_hierarchical2", "gflow_shard_hierarchical2"),
              ("Hybrid<1 MiB, 2>", "gflow_hybrid1M_2", "gflow_shard_hybrid1M_2"))


def shard_topology_report(rows, out=None):
    """exchange --shard --topology all rows with "network" and "run" fields (and, where Open MPI's
    reduce-scatter algorithm was forced, "reduce_scatter_algorithm"): each topology's sharded exchange
    against its own allreduce, per network and run (docs/BENCHMARKS.md section 7a)."""
    runs = defaultdict(dict)  # (network, algorithm, run) -> variant -> median_s
    for r in rows:
        if r.get("suite") == "exchange":
            key = (r.get("network", "?"), r.get("reduce_scatter_algorithm", "default"), r.get("run", 0))
            runs[key][r["variant"]] = r["median_s"]
    print("| network | reduce-scatter | run | " + " | ".join(f"{t} allreduce ms | shard ms (/ allreduce)" for t, _, _ in TOPOLOGIES) + " |")
    print("|---|---|---:|" + "---:|---:|" * len(TOPOLOGIES))
    bars = []  # (label, [ratio per topology])
    for key in sorted(runs, key=str):
        v = runs[key]
        cells, rs = [], []
        for _, plain, shard in TOPOLOGIES:
            if plain in v and shard in v:
                cells += [f"{1e3 * v[plain]:.1f}", f"{1e3 * v[shard]:.1f} ({v[shard] / v[plain]:.3f})"]
                rs.append(v[shard] / v[plain])
            else:
                cells += ["-", "-"]
                rs.append(float("nan"))
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
        bars.append((f"{key[0]}\nreduce-scatter {key[1]}, run {key[2]}", rs))
    if not out or not bars:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4.2))
    w = 0.8 / len(TOPOLOGIES)
    for j, (name, _, _) in enumerate(TOPOLOGIES):
        ax.bar([i + (j - 1) * w for i in range(len(bars))], [b[1][j] for b in bars], w, label=name, color=f"C{j}")
    for y, style, text in ((0.5, ":", "half the allreduce (ring theory)"), (1.0, "--", "its own allreduce")):
        ax.axhline(y, color="gray", ls=style, lw=1)
        ax.text(len(bars) - 0.5, y, text, fontsize=7, va="bottom", ha="right", color="gray")
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)
    ax.set_ylabel("sharded exchange / its topology's allreduce")
    ax.set_title("Sharding<ReduceScatter> by topology: ResNet-50, 4 ranks, emulated networks (flat: 1 Gbit/s; two: 10 Gbit/s in groups of 2, 1 between)",
                 fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"\nwrote {out}")
