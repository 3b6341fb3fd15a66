#!/usr/bin/env python3
"""torch.topk of N fp32 on the GPU (the baseline of bench/run kernels --device), one JSON line per
density: {"density": d, "us": median}. Exits 3 when torch or a CUDA device is missing."""
import json, math, sys

try:
    import torch
except Exception:
    sys.exit(3)
if not torch.cuda.is_available():
    sys.exit(3)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 25_600_000
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
g = torch.Generator(device="cuda").manual_seed(12)
x = torch.randn(n, device="cuda", generator=g)
for d in (0.001, 0.01):
    k = math.ceil(d * n)
    for _ in range(3):
        torch.topk(x.abs(), k, sorted=False)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.topk(x.abs(), k, sorted=False)  # |x| as the exchanger ranks; abs included, as ours reads |v|
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    print(json.dumps({"density": d, "us": times[len(times) // 2]}))
