#!/usr/bin/env python3
"""PyTorch's exchange over gloo on the same buckets as gflow's exchange suite.

Launched on N MPI ranks (rank and size from Open MPI's environment), e.g. by bench/ddp_gloo.sh:
  mpiexec -n 4 /usr/bin/python3 bench/ddp_gloo.py --layout resnet50 --iters 15 --warmup 3

Variants, interleaved iteration by iteration in a new random order each iteration (same seed on
every rank), each timed as gflow's exchange suite times its own (barrier, then the slowest rank):
  gloo_bucketed  what DDP's reducer issues for one backward once every gradient is ready: the
                 buckets of gflow's plan (whole tensors in generation order, a bucket closes at
                 >= threshold bytes), each divided by the rank count and all-reduced asynchronously
                 over gloo, then waited for. No autograd: the exchange alone, as in gflow's suite.
  ddp_backward   torch.nn.parallel.DistributedDataParallel (gloo, bucket_cap_mb = the threshold,
                 gradient_as_bucket_view) over one parameter per layout row; the loss is
                 sum(p * c), so the backward is one multiply per element and DDP's allreduces run
                 inside it. local_backward is the same backward without DDP; ddp_backward minus
                 local_backward is what DDP adds to an iteration.
With --gflow COMPOSITION (PYTHONPATH reaching gflow.torch; gflow's MPI beside gloo's rendezvous)
three more variants, on the same parameters and loss:
  gflow_backward the backward with gflow.torch.DistributedOptimizer over the net (its hooks hand
                 each gradient to the exchanger), then synchronize(): the exchange as gflow.torch
                 runs it in training (against ddp_backward: the same backward under DDP);
  gflow_python   an exchanger of the same composition driven from Python through the binding:
                 ready(count - 1) ... ready(0), then finish(), no autograd;
  gflow_cpp      the same calls in a C++ loop inside the library (gflow_run_iterations): the C++
                 exchanger's own time, the yardstick of gflow_python.
--device cuda puts every tensor on the rank's GPU (gflow.torch.device(): the node-local rank's;
gloo with CUDA tensors, as DDP's NCCL backend refuses several ranks on one GPU) and synchronises
the device before each time is taken.
One JSON object per variant on stdout, in the exchange suite's fields; a table on stderr.
"""
import argparse
import json
import os
import random
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def read_layout(name):
    here = os.path.dirname(os.path.abspath(__file__))
    path = name if os.path.sep in name or name.endswith(".tsv") else os.path.join(here, "layouts", name + ".tsv")
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                sys.exit(f"ddp_gloo.py: {path}: expected 'name<TAB>shape<TAB>numel', got {line!r}")
            rows.append((fields[0], int(fields[2])))
    if not rows:
        sys.exit(f"ddp_gloo.py: {path} has no tensor rows")
    return os.path.splitext(os.path.basename(path))[0], rows


def buckets_of(rows, threshold):
    """gflow's plan, as bench/gflow_bench.cpp's hand_buckets: generation order is the reverse of
    the layout order, whole tensors, a bucket closes once it holds >= threshold bytes (fp32)."""
    out, start, off, nbytes = [], 0, 0, 0
    for _, numel in reversed(rows):
        off += numel
        nbytes += numel * 4
        if nbytes >= threshold:
            out.append((start, off - start))
            start, nbytes = off, 0
    if off > start:
        out.append((start, off - start))
    return out


def stats(ts):
    s = sorted(ts)
    pick = lambda q: s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]
    return pick(0.5), pick(0.1), pick(0.9)


class Net(torch.nn.Module):
    def __init__(self, rows):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n)) for _, n in rows])

    def forward(self, cs):
        return sum((p * c).sum() for p, c in zip(self.ps, cs))


def gflow_variants(a, rows, cs, dev, sync):
    """gflow_backward, gflow_python, gflow_cpp (the module docstring)."""
    import gflow.torch as gt
    from gflow import _capi
    gt.init(device="cpu" if dev.type == "cpu" else dev.index)
    net = Net(rows).to(dev)
    opt = gt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.0), list(net.named_parameters()), composition=a.gflow)
    # the optimizer made the device transport (on CUDA); this exchanger runs on it too
    ex = _capi.Exchanger(a.gflow, [n for n, _ in rows], [[k] for _, k in rows], on_device=dev.type == "cuda")
    stream = opt._stream  # torch's current stream on dev, or None on the CPU
    count = len(rows)

    def backward():
        net(cs).backward()
        opt.synchronize()

    def python_loop():
        s = stream()
        for i in range(count - 1, -1, -1):
            ex.ready(i, s)
        ex.finish(s)

    def cpp_loop():
        ex.run_iterations(1, stream())

    return {"gflow_backward": (opt.zero_grad, backward), "gflow_python": (sync, python_loop), "gflow_cpp": (sync, cpp_loop)}, (opt, ex)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="resnet50")
    ap.add_argument("--threshold", type=int, default=4 << 20)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--gflow", default="", help="a gflow.torch composition: adds gflow_backward, gflow_python, gflow_cpp")
    a = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=timedelta(seconds=120))
    name, rows = read_layout(a.layout)
    total = sum(n for _, n in rows)
    plan = buckets_of(rows, a.threshold)
    dev = torch.device("cpu")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("ddp_gloo.py --device cuda: torch sees no GPU here")
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    # The same pool contents as gflow's suite (a fixed function of the index and the rank).
    i = torch.arange(total, dtype=torch.int64)
    fresh = ((((i * 2654435761 + rank * 40503) % 2001).to(torch.float32) / 1000.0) - 1.0).to(dev)
    pool = torch.empty(total, device=dev)
    views = [pool.narrow(0, off, n) for off, n in plan]

    def gloo_bucketed():
        works = []
        for v in views:
            v.div_(size)
            works.append(dist.all_reduce(v, async_op=True))
        for w in works:
            w.wait()

    cs = [torch.full((n,), 0.5, device=dev) for _, n in rows]
    ddp_net = torch.nn.parallel.DistributedDataParallel(
        Net(rows).to(dev), device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=a.threshold / float(1 << 20),
        gradient_as_bucket_view=True)
    local_net = Net(rows).to(dev)

    def backward(net):
        def run():
            net(cs).backward()
        return run

    def zero(net):
        def run():
            for p in net.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        return run

    variants = {
        "gloo_bucketed": (lambda: pool.copy_(fresh), gloo_bucketed),
        "ddp_backward": (zero(ddp_net), backward(ddp_net)),
        "local_backward": (zero(local_net), backward(local_net)),
    }
    keep = None
    if a.gflow:
        more, keep = gflow_variants(a, rows, cs, dev, sync)
        variants.update(more)
    times = {k: [] for k in variants}
    names = list(variants)
    rng = random.Random(20261125)
    t_max = torch.zeros(1, dtype=torch.float64)
    for it in range(a.warmup + a.iters):
        rng.shuffle(names)
        for k in names:
            prepare, run = variants[k]
            prepare()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            run()
            sync()
            t_max[0] = time.perf_counter() - t0
            dist.all_reduce(t_max, op=dist.ReduceOp.MAX)
            if it >= a.warmup:
                times[k].append(float(t_max[0]))
        if rank == 0:
            print(f"\r  ddp_gloo: iteration {it + 1}/{a.warmup + a.iters}", end="", file=sys.stderr, flush=True)
    if rank == 0:
        print("", file=sys.stderr)
        print(f"{'variant':<16} {'buckets':>8} {'median ms':>10} {'p10 ms':>9} {'p90 ms':>9}", file=sys.stderr)
        for k in variants:
            med, p10, p90 = stats(times[k])
            print(f"{k:<16} {len(plan):>8} {med * 1e3:>10.3f} {p10 * 1e3:>9.3f} {p90 * 1e3:>9.3f}", file=sys.stderr)
            print(json.dumps({"suite": "exchange", "layout": name, "ranks": size, "variant": k, "wire": "fp32",
                              "threshold_bytes": a.threshold, "median_s": med, "p10_s": p10, "p90_s": p90,
                              "bytes_per_rank": total * 4, "collectives": len(plan), "iterations": a.iters,
                              "torch": torch.__version__, "threads": a.threads, "device": str(dev.type),
                              "composition": a.gflow if k.startswith("gflow") else ""}), flush=True)
        if a.gflow:  # the gflow.torch targets (one GPU: at most 0.6x DDP over gloo; within 5% of the C++ loop)
            med = {k: stats(times[k])[0] for k in times}
            print(f"gflow_backward / ddp_backward: {med['gflow_backward'] / med['ddp_backward']:.3f}   "
                  f"gflow_python / gflow_cpp: {med['gflow_python'] / med['gflow_cpp']:.3f}   "
                  f"gflow_backward / local_backward: {med['gflow_backward'] / med['local_backward']:.3f}", file=sys.stderr)
    if keep is not None:  # the exchangers before MPI goes (gflow.torch's atexit shutdown finalises it)
        keep[0].close()
        keep[1].close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
