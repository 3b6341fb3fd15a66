"""Shared by bench/plot.py and its parts: the JSON lines of bench/run outputs."""
import json
from collections import defaultdict


def load(paths, run=None):
    """The JSON rows of the files, each with "_file" (its path). A file that holds several runs of
    one configuration (bench/measure.sh --repeats N) begins each row with "run": K; with `run`,
    only run K's rows are kept."""
    rows = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    row = json.loads(line)
                    if run is not None and row.get("run") != run:
                        continue
                    row["_file"] = p
                    rows.append(row)
    return rows


def run_of(row):
    """The run a row came from: its file, and its "run" where the file holds several."""
    return row.get("_file"), row.get("run")


def run_name(path, run):
    """A run's name in tables: the file's name without .jsonl, and _rK for run K of a file that
    holds several (autotune_resnet50_4.jsonl, run 2: autotune_resnet50_4_r2)."""
    name = path.rsplit("/", 1)[-1].replace(".jsonl", "")
    return name if run is None else f"{name}_r{run}"


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
