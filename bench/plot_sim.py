"""bench/plot.py sim: the simulated clusters of bench/simulate.sh (docs/BENCHMARKS.md section 10).

Reads docs/results/sim.jsonl (bench/measure.sh simvalidate / simscale): bench/simulate.sh validate rows
("source": "netem" / "simulated", a "run" field per repeat) and bench/simulate.sh run rows
("simulated": true, "platform"). Prints:
  1. validation: simulated / netem per rank count, variant and density, every run;
  2. at scale: the median time per layout, platform, density and P of dense, TopK, GTopK, OkTopK
     (sparse suite) and of the ring, Hierarchical<g> and Hybrid (exchange --topology all), with
     the sparse schemes' ratios (GTopK / dense, GTopK / TopK, OkTopK / GTopK);
With -o, draws the log-log time against P, one panel per layout and platform.
"""
from collections import defaultdict


ORDER = ("dense", "TopK", "GTopK", "OkTopK", "CSC")  # the sparse suite's variants, as it runs them


def _validation(rows):
    runs = defaultdict(dict)  # (run, ranks, variant, density) -> source -> row
    for r in rows:
        if r.get("source") in ("netem", "simulated") and r.get("suite") == "sparse":
            runs[(r.get("run", 1), r["ranks"], r["variant"], r["density"])][r["source"]] = r
    if not runs:
        return
    by = defaultdict(list)  # (ranks, variant, density) -> [(run, netem ms, sim ms)]
    for (run, P, v, d), s in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][3], kv[0][2], kv[0][0])):
        if "netem" in s and "simulated" in s:
            by[(P, v, d)].append((run, 1e3 * s["netem"]["median_s"], 1e3 * s["simulated"]["median_s"]))
    print("| ranks | variant | density | netem ms (runs) | simulated ms (runs) | simulated / netem (runs) | within 25% |")
    print("|---:|---|---:|---|---|---|---:|")
    inside = total = 0
    for (P, v, d), xs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][2], ORDER.index(kv[0][1]) if kv[0][1] in ORDER else len(ORDER))):
        rat = [s / n for _, n, s in xs]
        ok = sum(1 for x in rat if 0.75 <= x <= 1.25)
        inside += ok
        total += len(rat)
        print(f"| {P} | {v} | {d:g} | " + ", ".join(f"{n:.1f}" for _, n, _ in xs) + " | " + ", ".join(f"{s:.1f}" for _, _, s in xs) +
              " | " + ", ".join(f"{x:.3f}" for x in rat) + f" | {ok} of {len(rat)} |")
    print(f"\nwithin 25%: {inside} of {total} (run, ranks, variant, density) pairs\n")


SPARSE = ("dense", "TopK", "GTopK", "OkTopK")
TOPO = ("gflow", "gflow_hierarchical2", "gflow_hierarchical4", "gflow_hierarchical8", "gflow_hierarchical16", "gflow_hybrid1M_2", "gflow_hybrid1M_8")


def _scale(rows):
    """(layout, platform, series) -> {P: median ms}; series is 'variant d' for the sparse suite, the variant for exchange;
    runs without local work (--local-work none) are their own platform, "<platform>, network alone"."""
    t = defaultdict(dict)
    for r in rows:
        if not r.get("simulated") or "source" in r or "median_s" not in r:
            continue
        if r.get("suite") == "sparse" and r["variant"] in SPARSE:
            s = "dense" if r["variant"] == "dense" else f"{r['variant']} d={r['density']:g}"
        elif r.get("suite") == "exchange" and r["variant"] in TOPO:
            s = {"gflow": "ring"}.get(r["variant"], r["variant"].replace("gflow_", ""))
            s = "topo " + s
        else:
            continue
        pf = r["platform"] if r.get("local_work", "host") == "host" else r["platform"] + ", network alone"  # --local-work none
        t[(r["layout"], pf, s)][r["ranks"]] = 1e3 * r["median_s"]
    return t


def _traffic(rows):
    """KB one rank sends per iteration (the engines' own counts, sent_bytes_per_rank) against P, per
    layout and density, with OkTopK's bound 6k(P-1)/P four-byte words (k = the density's share of the pool)."""
    b = defaultdict(dict)  # (layout, density, variant) -> P -> KB (the same on every platform: the max)
    pool = {}
    for r in rows:
        if r.get("simulated") and "source" not in r and r.get("suite") == "sparse" and r["variant"] in SPARSE:
            key = (r["layout"], r["density"], r["variant"])
            b[key][r["ranks"]] = max(b[key].get(r["ranks"], 0.0), r["sent_bytes_per_rank"] / 1e3)
            pool[r["layout"]] = r["pool_elements"]
    for layout in sorted(pool):
        dens = sorted({d for (l, d, v) in b if l == layout and v != "dense"})
        Ps = sorted({P for (l, _, _), v in b.items() if l == layout for P in v})
        print(f"{layout}: KB sent per rank per iteration (simulated runs; the engines' counts)")
        print("| scheme | density | " + " | ".join(f"P={P}" for P in Ps) + " |")
        print("|---|---:|" + "---:|" * len(Ps))
        dn = b.get((layout, 1.0, "dense"), {})
        print("| dense | 1 | " + " | ".join(f"{dn[P]:.0f}" if P in dn else "-" for P in Ps) + " |")
        for d in dens:
            for v in ("TopK", "GTopK", "OkTopK"):
                x = b.get((layout, d, v), {})
                print(f"| {v} | {d:g} | " + " | ".join(f"{x[P]:.1f}" if P in x else "-" for P in Ps) + " |")
            k = max(1, round(d * pool[layout]))
            print(f"| OkTopK bound 6k(P-1)/P words | {d:g} | " + " | ".join(f"{6 * k * (P - 1) / P * 4 / 1e3:.1f}" for P in Ps) + " |")
        print()


def sim_report(rows, out=None):
    _validation(rows)
    _traffic(rows)
    t = _scale(rows)
    if not t:
        return
    panels = sorted({(k[0], k[1]) for k in t})
    for layout, pf in panels:
        series = sorted(s for (l, p, s) in t if (l, p) == (layout, pf))
        Ps = sorted({P for s in series for P in t[(layout, pf, s)]})
        how = "--local-work none: no local work charged" if pf.endswith("network alone") else "this host's local work, one core per rank"
        print(f"{layout} on {pf} (median ms per iteration; {how})")
        print("| series | " + " | ".join(f"P={P}" for P in Ps) + " |")
        print("|---|" + "---:|" * len(Ps))
        for s in series:
            v = t[(layout, pf, s)]
            print(f"| {s} | " + " | ".join(f"{v[P]:.2f}" if P in v else "-" for P in Ps) + " |")
        for d in ("0.001", "0.01"):
            g, k, ok = (t.get((layout, pf, f"{n} d={d}"), {}) for n in ("GTopK", "TopK", "OkTopK"))
            dn = t.get((layout, pf, "dense"), {})
            if not g:
                continue
            print(f"| ratios d={d}: GTopK/dense | " + " | ".join(f"{g[P] / dn[P]:.3f}" if P in g and P in dn else "-" for P in Ps) + " |")
            print(f"| ratios d={d}: GTopK/TopK | " + " | ".join(f"{g[P] / k[P]:.3f}" if P in g and P in k else "-" for P in Ps) + " |")
            print(f"| ratios d={d}: OkTopK/GTopK | " + " | ".join(f"{ok[P] / g[P]:.3f}" if P in g and P in ok else "-" for P in Ps) + " |")
        print()
    if not out:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pfs = sorted({p for _, p in panels})
    # one row per (layout, kind) that has data: sparse (dense and the sparse schemes), topo (the dense topologies)
    rows_ = [(l, kind) for l in sorted({l for l, _ in panels}) for kind in ("sparse", "topo")
             if any(l2 == l and (kind == "topo") == s.startswith("topo ") for (l2, _, s) in t)]
    fig, axes = plt.subplots(len(rows_), len(pfs), figsize=(4.6 * len(pfs), 3.6 * len(rows_)), squeeze=False)
    for row, (layout, kind) in enumerate(rows_):
        for j, pf in enumerate(pfs):
            ax = axes[row][j]
            for s in sorted(s for (l, p, s) in t if (l, p) == (layout, pf)):
                if (kind == "topo") != s.startswith("topo "):
                    continue
                v = t[(layout, pf, s)]
                Ps = sorted(v)
                ax.plot(Ps, [v[P] for P in Ps], "o-" if "0.01" not in s else "s--", ms=3, label=s.replace("topo ", ""))
            if not ax.lines:  # no such series on this platform (the network-alone runs have no topologies)
                ax.axis("off")
                continue
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("ranks P")
            ax.set_ylabel("ms per iteration")
            ax.set_title(f"{layout} on {pf}: " + ("dense and sparse" if kind == "sparse" else "dense topologies"), fontsize=9)
            ax.legend(fontsize=6)
            ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
