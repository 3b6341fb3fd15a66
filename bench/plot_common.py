"""Shared by bench/plot.py and its parts: the JSON lines of bench/run outputs."""
import json


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
