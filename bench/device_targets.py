#!/usr/bin/env python3
"""Reads the device benchmarks' JSON lines (bench/run kernels --device; gflow_bench_exchange_device,
suite "exchange_device") from the files named and prints each target, MET or MISSED:
  kernels: casts, norms and residual >= 0.80 x the copy kernel of the same run (CSC's fused kernels
  included); top-k of 25.6 M fp32 <= 100 us at d = 0.001 and <= 130 us at d = 0.01, >= 5x faster
  than torch.topk at d = 0.001 (when torch was measured), selections equal to the host's;
  exchanges (resnet50, d = 0.001, medians): GTopK at 1 rank <= 0.40 ms; OkTopK <= 1.0x GTopK at 1
  rank and <= 1.5x at 4 ranks in one process; TopK <= 1.1x GTopK."""
import json, sys

rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip().startswith("{")]
if not rows:
    print("targets: no measurements")
    sys.exit(1)
missed = 0
def verdict(ok, text):
    global missed
    missed += not ok
    print(("  MET    " if ok else "  MISSED ") + text)
kernels = [r for r in rows if "kernel" in r]
exchanges = [r for r in rows if r.get("suite") == "exchange_device"]
print("targets:")
for r in kernels:
    k = r["kernel"]
    if any(k.startswith(p) for p in ("scale_to_wire", "wire_to_float", "scale_in_place", "count_nonfinite", "chunk_l1_norms",
                                     "defer_chunks", "scatter_chunks", "residual")):
        verdict(r["vs_copy"] >= 0.80, f"{k}: {r['vs_copy']:.2f} x copy (>= 0.80)")
for r in kernels:
    if r["kernel"] != "topk":
        continue
    d = r["density"]
    limit = 100 if abs(d - 0.001) < 1e-12 else 130 if abs(d - 0.01) < 1e-12 else None
    if limit is not None:
        verdict(r["us"] <= limit, f"top-k n={r['n']} d={d}: {r['us']:.1f} us (<= {limit})")
    if abs(d - 0.001) < 1e-12:
        if r.get("torch_us"):
            verdict(r["torch_us"] / r["us"] >= 5, f"top-k d=0.001 vs torch.topk: {r['torch_us'] / r['us']:.2f}x (>= 5)")
        else:
            print("  n/a    top-k vs torch.topk: torch not measured")
    verdict(r["equal_to_host"], f"top-k d={d}: selection equal to the host's")
for r in kernels:
    if r["kernel"] == "oktopk_gather_above":  # one pass (plus a re-read of the gathering tiles), no target figure
        verdict(r["equal_to_host"], f"OkTopK threshold gather n={r['n']}: {r['us']:.1f} us, {r['vs_copy']:.2f} x copy, {r['gathered']} gathered, "
                "equal to the host's count")
for r in exchanges:
    where = f"{r['ranks']} rank(s), {r.get('transport', 'inproc')}"
    s = r["scheme"].split()[0]
    if s == "GTopK" and r["ranks"] == 1:
        verdict(r["median_ms"] <= 0.40, f"GTopK resnet50 d=0.001 {where}: {r['median_ms']:.3f} ms (<= 0.40)")
    if s == "OkTopK" and r.get("transport", "inproc") == "inproc" and r["ranks"] in (1, 4):
        limit = 1.0 if r["ranks"] == 1 else 1.5
        verdict(r["vs_gtopk"] <= limit, f"OkTopK {where}: {r['vs_gtopk']:.2f}x GTopK (<= {limit})")
    if s == "TopK":
        verdict(r["vs_gtopk"] <= 1.1, f"TopK {where}: {r['vs_gtopk']:.2f}x GTopK (<= 1.1)")
print(f"targets missed: {missed}")
