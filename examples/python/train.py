#!/usr/bin/env python3
"""The libtorch trainer's CNN (examples/torch/cnn.cpp) on Fashion-MNIST in plain PyTorch + gflow.torch.

    mpiexec -n 4 /usr/bin/python3 examples/python/train.py --composition "fp16+fusion=4MiB+topk=0.01+funneled"
    mpiexec -n 2 python3 examples/python/train.py --device cuda     # each rank on its node-local GPU

--device cuda trains on gflow.torch.device() (the node-local rank's GPU) with the exchanger on device
memory: NCCL when every rank has a GPU of its own, else MPI through host buffers (--transport).
Where no GPU or no CUDA build of gflow.torch is there, it says so and exits 77 (skipped).

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, the files the C++
trainers read; offline). PYTHONPATH must reach the gflow package (<build>/python, or pip install .).
Prints one line per epoch and a RESULT line in the C++ trainers' format (name, test_acc,
ms_per_iter, bytes_per_iter, ...), so the same scripts compare the two.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gflow.torch as gt

PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


class Net(nn.Module):
    """cnn.cpp's NetImpl: two conv blocks (3x3 conv without bias, batch norm, ReLU, 2x2 max-pool)
    and a 128-wide two-layer classifier; --unused-branch adds a residual block some iterations skip."""

    def __init__(self, with_branch=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        self.branch = nn.Linear(128, 128) if with_branch else None

    def forward(self, x, use_branch=True):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        if self.branch is not None and use_branch:
            x = x + F.relu(self.branch(x))
        return self.fc2(x)


def read_idx(path, magic):
    if not os.path.exists(path):
        raise gt.errors.make(gt.errors.InvalidArgument, "--data", "cannot open '%s'." % path,
                             "apt-get install dataset-fashion-mnist (the files in /usr/share/datasets/fashion-mnist), "
                             "or pass --data DIR with the four IDX .gz files.")
    with gzip.open(path, "rb") as f:
        b = f.read()
    if int.from_bytes(b[0:4], "big") != magic:
        raise gt.errors.make(gt.errors.ParseError, path, "not an IDX file of the expected type.", "reinstall dataset-fashion-mnist.")
    ndim = b[3]
    dims = [int.from_bytes(b[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim)]
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, limit):
    f = lambda n: os.path.join(data_dir, n)  # noqa: E731
    xtr, ytr = read_idx(f("train-images-idx3-ubyte.gz"), 0x803), read_idx(f("train-labels-idx1-ubyte.gz"), 0x801)
    xte, yte = read_idx(f("t10k-images-idx3-ubyte.gz"), 0x803), read_idx(f("t10k-labels-idx1-ubyte.gz"), 0x801)
    if limit:
        xtr, ytr = xtr[:limit], ytr[:limit]
    norm = lambda x: torch.from_numpy(((x.astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD)[:, None])  # noqa: E731
    return norm(xtr), torch.from_numpy(ytr.astype(np.int64)), norm(xte), torch.from_numpy(yte.astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--composition", default="dense", help="a name from gflow.torch.compositions() (--list prints them)")
    ap.add_argument("--list", action="store_true", help="print the compositions compiled into the module and exit")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per iteration")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--warmup-iters", type=int, default=-1, help="sparse warm-up (CSC, TopK); -1: half an epoch")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per step, all but the last under no_sync()")
    ap.add_argument("--unused-branch", action="store_true", help="a residual block some iterations skip (find_unused)")
    ap.add_argument("--no-learn-order", action="store_true")
    ap.add_argument("--loss-scale", default="auto", help="auto (dynamic on a dense 16-bit wire), none, or a constant")
    ap.add_argument("--check-acc", type=float, default=-1.0, help="exit 3 unless the final accuracy reaches this and the loss fell")
    ap.add_argument("--timeline", default="", help="write a Chrome trace of the exchanges of the first epoch")
    ap.add_argument("--csv", default="")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="train on the CPU or on gflow.torch.device()'s GPU")
    ap.add_argument("--transport", choices=("auto", "nccl", "mpi"), default="auto", help="the device transport (--device cuda)")
    a = ap.parse_args()

    torch.set_num_threads(1)  # several ranks share the machine's cores, as the C++ trainer does
    built, gpus, why = (False, 0, "")
    if a.device == "cuda":
        gt.init(transport=a.transport, device="cpu")
        built, gpus, why = gt.cuda_support()
        if not (built and gpus > 0 and torch.cuda.is_available()):
            if gt.rank() == 0:
                print("train.py --device cuda: skipped, no GPU to train on here (%s)." % (
                    why or "gflow sees %d CUDA devices, torch.cuda.is_available() is %s" % (gpus, torch.cuda.is_available())), flush=True)
            return 77
        gt.init(transport=a.transport)  # the node-local rank's GPU
    else:
        gt.init(device="cpu")
    dev = gt.device()
    P, R = gt.size(), gt.rank()
    if a.list:
        if R == 0:
            print("\n".join(sorted(gt.compositions())))
        return 0
    for flag, v, lo in (("--epochs", a.epochs, 1), ("--batch", a.batch, 1), ("--accumulate", a.accumulate, 1)):
        if v < lo:
            raise gt.errors.make(gt.errors.InvalidArgument, flag, "'%d' is not a whole number >= %d." % (v, lo), "pass e.g. %s %d." % (flag, max(lo, 2)))
    xtr, ytr, xte, yte = load(a.data, a.train_limit)
    n = xtr.shape[0]
    if n // P < a.batch * a.accumulate:
        raise gt.errors.make(gt.errors.InvalidArgument, "--batch", "each rank's shard holds %d samples, fewer than one step's %d." % (n // P, a.batch * a.accumulate),
                             "pass a smaller --batch or --accumulate, use fewer ranks, or raise --train-limit.")
    # Shards: a fixed global shuffle (the same seed on every rank), rank r takes every P-th sample.
    shard = np.random.default_rng(a.seed).permutation(n)[R::P]
    steps = len(shard) // (a.batch * a.accumulate)

    torch.manual_seed(a.seed)  # the same initial weights on every rank (and broadcast below)
    model = Net(a.unused_branch).to(dev)
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    comp = gt.canonical_name(a.composition)
    csc = comp.startswith("csc=") or "+csc=" in comp
    warmup = a.warmup_iters if a.warmup_iters >= 0 else steps // 2
    base = gt.CSCSGD(model.parameters(), lr=a.lr, momentum=a.momentum) if csc else torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    opt = gt.DistributedOptimizer(base, model.named_parameters(), composition=a.composition, find_unused=a.unused_branch,
                                  learn_order=not a.no_learn_order, sparsifier_momentum=a.momentum if csc else 0.0, warmup=warmup)
    gt.broadcast_parameters(model.state_dict(), root_rank=0)

    sparse = any(t.split("=")[0] in ("csc", "topk", "gtopk") for t in comp.split("+"))
    wide = not (comp.startswith("fp16") or comp.startswith("bf16"))
    scale, dynamic = 1.0, False
    if a.loss_scale == "auto":
        if not wide and not sparse:
            scale, dynamic = 32768.0, True
    elif a.loss_scale != "none":
        scale = float(a.loss_scale)
    good = 0
    name = "python:" + opt.composition
    if R == 0:
        print("[%s] CNN, %d ranks, batch %d per rank, %d iterations per epoch, lr %g, momentum %g, on %s%s" % (
            name, P, a.batch, steps, a.lr, a.momentum, dev, " over " + gt.device_transport() if dev.type == "cuda" else ""), flush=True)
    csv = open(a.csv, "w") if a.csv and R == 0 else None
    if csv:
        csv.write("name,epoch,test_acc,test_loss,train_loss,ms_per_iter,bytes_per_iter,skipped\n")
    losses, total_ms, total_iters, total_bytes, acc, skipped = [], 0.0, 0, 0.0, 0.0, 0
    for epoch in range(a.epochs):
        g = np.random.default_rng(a.seed * 1000003 + epoch * 7919 + R)
        order = torch.from_numpy(shard[g.permutation(len(shard))].astype(np.int64)).to(dev)
        model.train()
        loss_sum, wire, t_iter = 0.0, 0, 0.0
        trace = gt.timeline(opt, a.timeline) if a.timeline and epoch == 0 else None
        if trace:
            trace.__enter__()
        for s in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss_v = 0.0
            for m in range(a.accumulate):
                it = s * a.accumulate + m
                idx = order[it * a.batch:(it + 1) * a.batch]
                use_branch = not a.unused_branch or (it % 4 != 3 and (it + R) % 2 == 0)
                loss = F.cross_entropy(model(xtr[idx], use_branch), ytr[idx]) / a.accumulate
                if m + 1 < a.accumulate:
                    with opt.no_sync():
                        (loss * scale).backward()
                else:
                    (loss * scale).backward()
                loss_v += loss.item()
            st = opt.synchronize()
            if st.finite():
                if scale != 1.0:
                    for p in model.parameters():
                        p.grad.mul_(1.0 / scale)
                good += 1
                if dynamic and good % 500 == 0:
                    scale = min(scale * 2.0, 2.0 ** 24)
            elif dynamic:
                scale, good = max(scale / 2.0, 1.0), 0
            opt.step()  # skipped on every rank when st is not finite
            t_iter += time.perf_counter() - t0
            wire += st.wire_bytes
            loss_sum += loss_v
            losses.append(loss_v)
        if trace:
            trace.__exit__(None, None, None)
        # Batch norm statistics: averaged over the ranks before evaluation (as the C++ trainer).
        for b in model.buffers():
            if b.dtype == torch.float32:
                gt.allreduce_average_(b)
        model.eval()
        lo, hi = xte.shape[0] * R // P, xte.shape[0] * (R + 1) // P
        with torch.no_grad():
            out = model(xte[lo:hi])
            correct = float((out.argmax(1) == yte[lo:hi]).sum())
            tl = float(F.cross_entropy(out, yte[lo:hi], reduction="sum"))
        v = torch.tensor([loss_sum, float(steps), correct, tl, t_iter, float(wire)], dtype=torch.float32)  # on the CPU
        gt.allreduce_average_(v)
        v *= P
        acc = 100.0 * float(v[2]) / xte.shape[0]
        ms = 1e3 * float(v[4]) / P / steps
        bytes_it = float(v[5]) / P / steps
        skipped = opt.skipped
        total_ms += ms * steps
        total_iters += steps
        total_bytes += bytes_it * steps
        if R == 0:
            print("[%s] epoch %d/%d  train_loss %.4f  test_acc %.2f%%  test_loss %.4f  %.2f ms/iter  %.1f KiB/iter/rank  skipped %d" % (
                name, epoch + 1, a.epochs, float(v[0]) / float(v[1]), acc, float(v[3]) / xte.shape[0], ms, bytes_it / 1024, skipped), flush=True)
            if csv:
                csv.write("%s,%d,%.4f,%.5f,%.5f,%.4f,%.1f,%d\n" % (name, epoch + 1, acc, float(v[3]) / xte.shape[0], float(v[0]) / float(v[1]), ms, bytes_it, skipped))
                csv.flush()
    k = max(1, len(losses) // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if R == 0:
        print("RESULT name=%s ranks=%d epochs=%d batch=%d test_acc=%.2f ms_per_iter=%.3f bytes_per_iter=%.0f loss_first=%.4f loss_last=%.4f skipped=%d" % (
            name, P, a.epochs, a.batch, acc, total_ms / total_iters, total_bytes / total_iters, first, last, skipped), flush=True)
    if a.check_acc >= 0 and not (acc >= a.check_acc and last < first):
        if R == 0:
            print("train.py: accuracy %.2f%% below --check-acc %.2f or the loss did not fall (%.4f -> %.4f)" % (acc, a.check_acc, first, last), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
