"""gflow for PyTorch, in Horovod's shape.

    import gflow.torch as gt
    gt.init()                                   # MPI; launch with mpiexec -n 4 python3 train.py
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * gt.size(), momentum=0.9)
    opt = gt.DistributedOptimizer(opt, model.named_parameters(), composition="fp16+fusion=4MiB+topk=0.01+funneled")
    gt.broadcast_parameters(model.state_dict(), root_rank=0)
    gt.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()         # each parameter's hook hands its gradient to gflow
        opt.step()                              # finish(): averaged gradients in .grad, then the step

Each .grad is a view of the exchanger's gradient pool (no copy); the hooks call ready(i) as
autograd's AccumulateGrad finishes each parameter, so buckets are exchanged during backward.
"""
import atexit
import contextlib
import io

import torch

from .. import errors
from .. import _capi
from .optimizer import CSCSGD, DistributedOptimizer, ShardedOptimizer, _live  # noqa: F401

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "compositions", "canonical_name", "DistributedOptimizer", "ShardedOptimizer", "CSCSGD", "timeline",
           "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allreduce_average_", "verify_replicas",
           "Timeline", "errors"]

Timeline = _capi.Timeline


def init():
    """Initialises MPI (unless something else did) and gflow's world transport. Collective."""
    if not _capi.initialized():
        _capi.init()
        atexit.register(shutdown)


def shutdown():
    """Closes every DistributedOptimizer's exchanger, then finalises MPI (if init() initialised it)."""
    for opt in list(_live):
        opt._close()
    _capi.finalize()


def is_initialized():
    return _capi.initialized()


def rank():
    return _capi.rank()


def size():
    return _capi.size()


def compositions():
    """{name: C++ policies} of the compositions compiled into the module."""
    return dict(_capi.compositions())


def canonical_name(name):
    """The menu spelling of a composition name: families in order, defaults left out."""
    return _capi.canonical_name(name)


def _as_buffer(t):
    """A NumPy array sharing t's memory (t contiguous, on the CPU)."""
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        t = t.view(torch.int16)
    elif t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.detach().numpy()


def _tensors(params):
    if isinstance(params, dict):
        return list(params.items())
    out = []
    for i, p in enumerate(params):
        out.append(p if isinstance(p, tuple) else (str(i), p))
    return out


def broadcast_parameters(params, root_rank=0):
    """Rank root_rank's values of every tensor in `params` on every rank, in place (bitwise).

    `params`: a state_dict (model.state_dict(): parameters and buffers), named_parameters(), or a
    list of tensors; the same tensors in the same order on every rank. Collective."""
    with torch.no_grad():
        for name, t in _tensors(params):
            if not isinstance(t, torch.Tensor):
                raise errors.make(errors.InvalidArgument, "params", "entry '%s' is a %s, not a tensor." % (name, type(t).__name__),
                                  "pass model.state_dict(), model.named_parameters() or a list of tensors.")
            if t.device.type != "cpu":
                raise errors.make(errors.InvalidArgument, "params", "tensor '%s' lives on %s; gflow.torch exchanges over MPI from host memory." % (name, t.device),
                                  "keep the model on the CPU.")
            if t.numel() == 0:
                continue
            if t.is_contiguous():
                _capi.broadcast_(_as_buffer(t), root_rank)
            else:
                c = t.contiguous()
                _capi.broadcast_(_as_buffer(c), root_rank)
                t.copy_(c)


def broadcast_object(obj, root_rank=0):
    """Rank root_rank's `obj` (anything torch.save can write) on every rank. Collective."""
    data = b""
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
    data = _capi.broadcast_bytes(data, root_rank)
    return torch.load(io.BytesIO(data))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Rank root_rank's optimizer state (momentum buffers, step counts, hyper-parameters) on every rank."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def allreduce_average_(tensor):
    """The average over the ranks of a float32 CPU tensor, in place (e.g. batch norm statistics)."""
    with torch.no_grad():
        if tensor.is_contiguous():
            _capi.allreduce_average_(_as_buffer(tensor))
        else:
            c = tensor.contiguous()
            _capi.allreduce_average_(_as_buffer(c))
            tensor.copy_(c)


def verify_replicas(params):
    """gflow::verify_replicas over float32 tensors: MismatchError on every rank naming the first
    tensor whose bits differ between ranks. Collective."""
    named = [(n, t) for n, t in _tensors(params) if t.dtype == torch.float32 and t.numel() > 0]
    flat = torch.cat([t.detach().reshape(-1) for _, t in named]) if named else torch.zeros(0)
    _capi.verify_replicas(flat.numpy(), [n for n, _ in named], [t.numel() for _, t in named])


@contextlib.contextmanager
def timeline(optimizer, path):
    """Records the optimizer's exchanges while the block runs; writes a Chrome trace to `path`
    (rank 0 writes every rank's events; collective at the end of the block)."""
    tl = Timeline()
    optimizer._exchanger.set_timeline(tl)
    tl.start()
    try:
        yield tl
    finally:
        optimizer._exchanger.set_timeline(None)
        tl.write(path)
