#!/usr/bin/env python3
"""The CNN of examples/python/train.py under torch.nn.parallel.DistributedDataParallel over gloo,
for the issue-27 comparison: gflow.torch vs DDP with the same buckets.

    mpiexec -n 4 /usr/bin/python3 bench/python_ddp.py --bucket-mb 25 --first-bucket-mb 1 --epochs 1
    mpiexec -n 4 /usr/bin/python3 examples/python/train.py --composition "fusion=25MiB,first=1MiB" --epochs 1

DDP's buckets: bucket_cap_mb (25 by default) after a first bucket of 1 MiB; gflow's
"fusion=25MiB,first=1MiB" plans the same sizes (both close a bucket once it holds the threshold, whole
tensors only, in reverse forward order). gradient_as_bucket_view=True: .grad are views of DDP's
buckets, as gflow's are of its pool. Same data, shards, model, SGD, batch norm averaging and RESULT
line as train.py. The ranks find each other from Open MPI's environment (OMPI_COMM_WORLD_*) and
MASTER_ADDR / MASTER_PORT (default 127.0.0.1:29517).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from train import Net, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--first-bucket-mb", type=float, default=1.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    R = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    P = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=R, world_size=P)
    # DDP's first bucket (torch 1.13: dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB) set like gflow's first=.
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_mb * (1 << 20))

    xtr, ytr, xte, yte = load(a.data, a.train_limit)
    n = xtr.shape[0]
    shard = np.random.default_rng(a.seed).permutation(n)[R::P]
    steps = len(shard) // a.batch
    torch.manual_seed(a.seed)
    model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=a.bucket_mb, gradient_as_bucket_view=True, broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    name = "ddp-gloo:bucket=%gMiB,first=%gMiB" % (a.bucket_mb, a.first_bucket_mb)
    if R == 0:
        print("[%s] CNN, %d ranks, batch %d per rank, %d iterations per epoch" % (name, P, a.batch, steps), flush=True)
    losses, total_ms, total_iters, acc = [], 0.0, 0, 0.0
    for epoch in range(a.epochs):
        g = np.random.default_rng(a.seed * 1000003 + epoch * 7919 + R)
        order = torch.from_numpy(shard[g.permutation(len(shard))].astype(np.int64))
        model.train()
        loss_sum, t_iter = 0.0, 0.0
        for s in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            idx = order[s * a.batch:(s + 1) * a.batch]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()  # DDP allreduces the buckets (averaged) during backward
            opt.step()
            t_iter += time.perf_counter() - t0
            losses.append(loss.item())
            loss_sum += losses[-1]
        with torch.no_grad():
            for b in model.module.buffers():
                if b.dtype == torch.float32:
                    dist.all_reduce(b)
                    b.div_(P)
        model.eval()
        lo, hi = xte.shape[0] * R // P, xte.shape[0] * (R + 1) // P
        with torch.no_grad():
            out = model.module(xte[lo:hi])
            correct = float((out.argmax(1) == yte[lo:hi]).sum())
        v = torch.tensor([loss_sum, float(steps), correct, t_iter], dtype=torch.float64)
        dist.all_reduce(v)
        acc = 100.0 * float(v[2]) / xte.shape[0]
        ms = 1e3 * float(v[3]) / P / steps
        total_ms += ms * steps
        total_iters += steps
        if R == 0:
            print("[%s] epoch %d/%d  train_loss %.4f  test_acc %.2f%%  %.2f ms/iter" % (name, epoch + 1, a.epochs, float(v[0]) / float(v[1]), acc, ms), flush=True)
    if R == 0:
        k = max(1, len(losses) // 10)
        print("RESULT name=%s ranks=%d epochs=%d batch=%d test_acc=%.2f ms_per_iter=%.3f loss_first=%.4f loss_last=%.4f" % (
            name, P, a.epochs, a.batch, acc, total_ms / total_iters, sum(losses[:k]) / k, sum(losses[-k:]) / k), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
