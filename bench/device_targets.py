#!/usr/bin/env python3
"""Reads bench/run kernels --device's JSON lines and prints issue 12's targets, each MET or MISSED:
cast, norm and residual kernels >= 0.80 x the copy kernel of the same run; top-k of 25.6 M fp32 at
d = 0.001 <= 120 us and >= 3x faster than torch.topk (when torch was measured)."""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
if not rows:
    print("targets: no measurements")
    sys.exit(1)
missed = 0
def verdict(ok, text):
    global missed
    missed += not ok
    print(("  MET    " if ok else "  MISSED ") + text)
print("targets (issue 12):")
for r in rows:
    k = r["kernel"]
    if k == "topk":
        continue
    if any(k.startswith(p) for p in ("scale_to_wire", "wire_to_float", "scale_in_place", "count_nonfinite", "chunk_l1_norms",
                                     "defer_chunks", "scatter_chunks", "residual")):
        verdict(r["vs_copy"] >= 0.80, f"{k}: {r['vs_copy']:.2f} x copy (>= 0.80)")
for r in rows:
    if r["kernel"] == "topk" and abs(r["density"] - 0.001) < 1e-12:
        verdict(r["us"] <= 120, f"top-k n={r['n']} d=0.001: {r['us']:.1f} us (<= 120)")
        if r.get("torch_us"):
            verdict(r["torch_us"] / r["us"] >= 3, f"top-k d=0.001 vs torch.topk: {r['torch_us'] / r['us']:.2f}x (>= 3)")
        else:
            print("  n/a    top-k vs torch.topk: torch not measured")
    if r["kernel"] == "topk":
        verdict(r["equal_to_host"], f"top-k d={r['density']}: selection equal to the host's")
for r in rows:
    if r["kernel"] == "oktopk_gather_above":  # issue 24: one pass (plus a re-read of the gathering tiles), no target figure
        verdict(r["equal_to_host"], f"OkTopK threshold gather n={r['n']}: {r['us']:.1f} us, {r['vs_copy']:.2f} x copy, {r['gathered']} gathered, "
                "equal to the host's count")
print(f"targets missed: {missed}")
