"""Shared by bench/plot.py and its parts: the JSON lines of bench/run outputs."""
import json
from collections import defaultdict


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    row = json.loads(line)
                    row["_file"] = p
                    rows.append(row)
    return rows


def hidden_fractions(rows, suffix):
    """overlap rows' hidden fractions by (layout, ranks, strategy, variant ends in suffix), one entry
    per run: the strategy with and without a variant suffix such as "+learn" or "+shard"."""
    hidden = defaultdict(list)
    for r in rows:
        if r.get("suite") == "overlap" and "hidden_fraction" in r:
            v = r["variant"]
            marked = v.endswith(suffix)
            hidden[(r["layout"], r["ranks"], v[:-len(suffix)] if marked else v, marked)].append(r["hidden_fraction"])
    return hidden
