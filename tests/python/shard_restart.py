"""ShardedOptimizer.save_checkpoint on P ranks, load_checkpoint on P' (tests/python/CMakeLists.txt:
python.shard_restart_*). `save DIR`: 3 steps of Adam, save_checkpoint(DIR), and each rank's state in
pool coordinates (DIR/expect-<r>.pt: pool index -> exp_avg, exp_avg_sq). `load DIR`: a fresh
ShardedOptimizer on another number of ranks loads DIR; every element of its new shard must hold the
saved values, bit for bit, and the step count must be the saved one."""
import os
import sys

import torch

import gflow.torch as gt

SHAPES = [(5, 3), (3,), (7, 4), (4,), (300,)]
gt.init()
R, P = gt.rank(), gt.size()
mode, root = sys.argv[1], sys.argv[2]
params = [torch.nn.Parameter(torch.linspace(-1, 1, int(torch.tensor(s).prod())).reshape(s)) for s in SHAPES]
opt = gt.ShardedOptimizer(torch.optim.Adam, [("p%d" % i, p) for i, p in enumerate(params)], composition="fusion=4MiB+shard", lr=0.01)


def by_pool_index(o):
    out = {}
    ranges = [(f, e) for f, e in o._exchanger.shard() if e > f]
    for w, (f, e) in zip(o._shard_views(), ranges):
        st = o.inner.state[w]
        for j in range(e - f):
            out[f + j] = (st["exp_avg"][j].item(), st["exp_avg_sq"][j].item(), float(st["step"]))
    return out


if mode == "save":
    for it in range(3):
        opt.zero_grad()
        loss = sum((p * (p + 0.1 * (R + 1) * (it + 1))).sum() for p in params)
        loss.backward()
        opt.step()
    opt.save_checkpoint(root)
    torch.save(by_pool_index(opt), os.path.join(root, "expect-%d.pt" % R))
else:
    assert opt.load_checkpoint(root) == 3
    expect = {}
    for f in sorted(os.listdir(root)):
        if f.startswith("expect-"):
            for k, v in torch.load(os.path.join(root, f), weights_only=False).items():
                expect.setdefault(k, v)  # ranks of different groups would hold the same values
    got = by_pool_index(opt)
    assert got, "rank %d holds no shard" % R
    bad = [k for k, v in got.items() if expect.get(k) != v]
    assert not bad, "rank %d of %d: %d of %d elements differ (first: pool index %d)" % (R, P, len(bad), len(got), bad[0])
    print("rank %d of %d: %d elements of its new shard hold the saved state" % (R, P, len(got)))
opt.close()
