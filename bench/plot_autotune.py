"""The auto-tuner's plots and tables for bench/plot.py (kinds `autotune` and `tuner`): overlap
--autotune rows against the fixed-threshold sweep of the same run. Split from plot.py to keep
every file in bench/ under 450 lines."""
from collections import defaultdict

from plot_common import load, run_of, run_name

def fixed_and_tuned(rs):
    """The fixed-threshold rows of one configuration, its last auto-tuned row and the fastest fixed
    row; None when either kind is missing."""
    fixed = [r for r in rs if r["variant"] == "fixed"]
    auto = [r for r in rs if r["variant"] == "autotuned"]
    if not fixed or not auto:
        return None
    return fixed, auto[-1], min(fixed, key=lambda r: r["iteration_s"])


def autotune_table(rows, out=None):
    groups = defaultdict(list)
    for r in rows:
        if r.get("suite") == "overlap" and r.get("variant") in ("fixed", "autotuned"):
            groups[(r["layout"], r["ranks"], r.get("topology", "Ring"), r["compute_ratio"])].append(r)

    def kib(b):
        return "%d KiB" % (b >> 10) if b < (1 << 20) else "%d MiB" % (b >> 20)

    def switch(r):  # Topology<Hybrid>: the switch a row ran with
        sw = r.get("hybrid_switch_bytes", 0)
        if not sw:
            return ""
        return ", all ring" if sw == 1 else ", all hier." if sw >= (1 << 63) else ", switch " + kib(sw)

    print("| layout | ranks | topology | compute ratio | best fixed (ms) | at | 25 MiB (ms) | 64 MiB (ms) | auto-tuned (ms) | its plan | settled at | auto / best | paired | noise floor | auto / 25 MiB | auto / 64 MiB |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (layout, ranks, topo, ratio), rs in sorted(groups.items()):
        # several runs of one configuration: its last run (rows come run by run, the autotuned row last)
        last = [i for i, r in enumerate(rs) if r["variant"] == "autotuned"]
        if len(last) > 1:
            rs = rs[last[-2] + 1:]
        split = fixed_and_tuned(rs)
        if split is None:
            continue
        fixed, a, best = split
        # DDP's and Horovod's thresholds: the best row at that threshold (over the switches for Hybrid)
        f25 = min((r for r in fixed if r["threshold_bytes"] == 25 << 20), key=lambda r: r["iteration_s"])
        f64 = min((r for r in fixed if r["threshold_bytes"] == 64 << 20), key=lambda r: r["iteration_s"])
        # paired: the median over interleaved rounds of the tuner's / the best plan's time in that round
        paired = "%.3f" % a["paired_ratio_vs_best"] if "paired_ratio_vs_best" in a else "—"
        # noise floor: the settled tuner measured twice in every round, the second / the first (medians)
        noise = "%.3f" % a["repeat_ratio"] if "repeat_ratio" in a else "—"
        print("| %s | %d | %s | %.1f | %.1f | %s%s | %.1f | %.1f | %.1f | %s%s | %d | %.3f | %s | %s | %.3f | %.3f |" % (
            layout, ranks, topo, ratio, best["iteration_s"] * 1e3, kib(best["threshold_bytes"]), switch(best), f25["iteration_s"] * 1e3,
            f64["iteration_s"] * 1e3, a["iteration_s"] * 1e3, kib(a["threshold_bytes"]), switch(a), a["settled_at"],
            a["iteration_s"] / best["iteration_s"], paired, noise, a["iteration_s"] / f25["iteration_s"], a["iteration_s"] / f64["iteration_s"]))
    if out:
        autotune_plot(groups, out)


def tuner_runs(paths, run=None):
    """One line per run and compute ratio of overlap --autotune rows (the run's last autotuned row);
    a run is a file, or run K of a file that holds several (named <file>_rK)."""
    print("| file | ratio | auto / best | paired | tuned plan | auto / fixed at that plan | noise floor | retunes | settled at | auto / 25 MiB | auto / 64 MiB |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    runs = defaultdict(list)  # (file, run) -> rows, in the order of the files and their runs
    for r in load(paths, run):
        if r.get("suite") == "overlap" and r.get("variant") in ("fixed", "autotuned"):
            runs[run_of(r)].append(r)
    for (f, k), rows in runs.items():
        for ratio in sorted({r["compute_ratio"] for r in rows}):
            rs = [r for r in rows if r["compute_ratio"] == ratio]
            split = fixed_and_tuned(rs)
            if split is None:
                continue
            fixed, a, best = split
            same = [r for r in fixed if r["threshold_bytes"] == a["threshold_bytes"] and r.get("hybrid_switch_bytes", 0) == a.get("hybrid_switch_bytes", 0)]
            f25 = min((r for r in fixed if r["threshold_bytes"] == 25 << 20), key=lambda r: r["iteration_s"])
            f64 = min((r for r in fixed if r["threshold_bytes"] == 64 << 20), key=lambda r: r["iteration_s"])
            th = a["threshold_bytes"]
            plan = ("%d KiB" % (th >> 10)) if th < (1 << 20) else ("%d MiB" % (th >> 20))
            if a.get("first_bucket_bytes"):
                plan += " (first %d KiB)" % (a["first_bucket_bytes"] >> 10)
            sw = a.get("hybrid_switch_bytes", 0)
            if sw:
                plan += ", all ring" if sw == 1 else ", all hier." if sw >= (1 << 63) else ", switch %d KiB" % (sw >> 10)
            print("| %s | %.1f | %.3f | %s | %s | %s | %s | %d | %d | %.3f | %.3f |" % (
                run_name(f, k), ratio, a["iteration_s"] / best["iteration_s"],
                "%.3f" % a["paired_ratio_vs_best"] if "paired_ratio_vs_best" in a else "—", plan,
                "%.3f" % (a["iteration_s"] / same[0]["iteration_s"]) if same else "—",
                "%.3f" % a["repeat_ratio"] if "repeat_ratio" in a else "—", a["retunes"], a["settled_at"],
                a["iteration_s"] / f25["iteration_s"], a["iteration_s"] / f64["iteration_s"]))


def autotune_plot(groups, out):
    """auto / best fixed per configuration, one point per run (a group's rows come run by run:
    its fixed rows, then its autotuned row), the paired ratio beside it, the 5% target and the band
    the noise floor spans (the settled tuner measured twice in one run)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.2))
    labels, floors = [], []
    for x, (key, rs) in enumerate(sorted(groups.items())):
        labels.append("%s\n%s, ratio %.1f" % (key[0], key[2], key[3]))
        run = []
        k = 0
        for r in rs:
            if r["variant"] == "fixed":
                run.append(r)
                continue
            if run:
                best = min(run, key=lambda f: f["iteration_s"])
                dx = -0.15 + 0.1 * k
                ax.plot(x + dx, r["iteration_s"] / best["iteration_s"], "o", color="#1f77b4", ms=5, label="auto / best (medians)" if x == 0 and k == 0 else None)
                if "paired_ratio_vs_best" in r:
                    ax.plot(x + dx, r["paired_ratio_vs_best"], "x", color="#ff7f0e", ms=6, label="paired" if x == 0 and k == 0 else None)
                if "repeat_ratio" in r:
                    floors.append(r["repeat_ratio"])
                k += 1
            run = []
    if floors:
        ax.axhspan(min(floors), max(floors), color="#dddddd", zorder=0, label="noise floor: the tuner vs itself, %.3f-%.3f" % (min(floors), max(floors)))
    ax.axhline(1.05, color="#d62728", ls="--", lw=1, label="target: within 5%")
    ax.axhline(1.0, color="#555555", lw=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("auto-tuned / best fixed plan")
    ax.set_title("Fusion<Auto> against an exhaustive fixed-threshold sweep (bench/run overlap --autotune, 4 ranks)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print("wrote", out)
