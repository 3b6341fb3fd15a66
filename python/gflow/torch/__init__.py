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

CUDA: with libgflow_capi_cuda.so loaded (gflow.torch.cuda_support()), init() makes the node-local
rank's GPU the current device (gflow.torch.device()), and a DistributedOptimizer over CUDA parameters
runs the exchanger on device memory: over NCCL where every rank has a GPU of its own, else over
gflow::mpi_device::transport (several ranks on one GPU); init(transport="nccl" | "mpi") chooses.
The exchange is ordered after torch's current stream at each hook and before it at step().
"""
import atexit
import contextlib
import io

import torch

from .. import errors
from .. import _capi
from .optimizer import CSCSGD, DistributedOptimizer, ShardedOptimizer, _live  # noqa: F401

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "device", "cuda_support", "device_transport", "compositions", "canonical_name", "DistributedOptimizer", "ShardedOptimizer", "CSCSGD", "timeline",
           "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allreduce_average_", "verify_replicas",
           "Timeline", "errors"]

Timeline = _capi.Timeline


_device = {"torch": torch.device("cpu"), "transport": "auto", "chosen": None}


def init(transport="auto", device=None):
    """Initialises MPI (unless something else did) and gflow's world transport. Collective.

    device: None picks the node-local rank's GPU (local_rank() modulo the visible devices) where
    CUDA is available to both torch and gflow, and makes it torch's current device; "cpu" picks
    none; an int picks that GPU. transport: how CUDA exchangers talk, "auto" (NCCL where every rank
    has a GPU of its own, else MPI through host buffers), "nccl" or "mpi"; the device transport is
    made when the first CUDA DistributedOptimizer is (collective there)."""
    if transport not in ("auto", "nccl", "mpi"):
        raise errors.make(errors.InvalidArgument, "transport", "'%s' is not a device transport." % (transport,), "pass 'auto', 'nccl' or 'mpi'.")
    if isinstance(device, torch.device):
        device = "cpu" if device.type == "cpu" else (device.index if device.index is not None else None)
    elif isinstance(device, str) and device != "cpu":
        if device != "cuda" and not device.startswith("cuda:"):
            raise errors.make(errors.InvalidArgument, "device", "'%s' is not a device gflow.torch trains on." % device,
                              "pass None (the node-local rank's GPU where there is one), 'cpu', 'cuda', 'cuda:<i>' or a GPU index.")
        device = int(device[5:]) if device.startswith("cuda:") else None
    if not _capi.initialized():
        _capi.init()
        atexit.register(shutdown)
    local = local_rank()[0]  # collective (MPI_Comm_split_type): every rank calls it, GPU or not
    _device["transport"] = transport
    built, devices, _ = _capi.cuda_support()
    if device == "cpu" or (device is None and not (built and devices > 0 and torch.cuda.is_available())):
        _device["torch"] = torch.device("cpu")
        return
    _capi.require_cuda("a GPU was asked for", "init(device='cpu')")
    if not torch.cuda.is_available() or devices == 0:
        raise errors.make(errors.UsageError, "device", "a GPU was asked for, and this process sees none (torch: %s, gflow: %d devices)."
                          % (torch.cuda.is_available(), devices), "run where a GPU is visible (CUDA_VISIBLE_DEVICES), or init(device='cpu').")
    index = local % devices if device is None else int(device)
    if not 0 <= index < devices:
        raise errors.make(errors.InvalidArgument, "device", "CUDA device %d does not exist; this process sees %d." % (index, devices),
                          "pass a device in [0, %d), or None for the node-local rank's." % devices)
    torch.cuda.set_device(index)
    _device["torch"] = torch.device("cuda", index)


def shutdown():
    """Closes every DistributedOptimizer's exchanger, then the device transport, then finalises MPI (if init() initialised it)."""
    for opt in list(_live):
        opt._close()
    _capi.finalize()
    _device["chosen"] = None


def local_rank():
    """(this rank among the ranks on its node, how many ranks the node has)."""
    return _capi.local_rank()


def device():
    """The torch.device init() picked: cuda:<local rank modulo the GPUs> where CUDA is available, else cpu."""
    return _device["torch"]


def cuda_support():
    """(whether this gflow.torch has CUDA exchangers, the GPUs it sees, why not when it has none)."""
    return _capi.cuda_support()


def device_transport():
    """'nccl' or 'mpi' once a CUDA DistributedOptimizer exists (the device transport), else None."""
    return _device["chosen"]


def _device_world(dev):
    """The device transport on CUDA device `dev` (a torch.device), made on first use (collective;
    later calls with the same device return it, with another one raise UsageError('transport'))."""
    if _device["chosen"] is None and _device["torch"].type == "cuda" and _device["torch"] != dev:
        raise errors.make(errors.InvalidArgument, "named_parameters", "the parameters live on %s; gflow.torch.init() picked %s for this rank."
                          % (dev, _device["torch"]), "move the model to gflow.torch.device(), or pass init(device=%d)." % dev.index)
    _device["chosen"], _ = _capi.device_init(_device["transport"], dev.index)


def is_initialized():
    return _capi.initialized()


def rank():
    return _capi.rank()


def size():
    return _capi.size()


def compositions(with_spaces=False):
    """{name: C++ policies} of the compositions compiled into the module; with_spaces: {name: (policies,
    memory spaces)}, the spaces among "cpu", "cuda/mpi" and "cuda/nccl"."""
    if with_spaces:
        return {n: (p, s) for n, p, s in _capi.compositions(True)}
    return dict(_capi.compositions())


def canonical_name(name):
    """The menu spelling of a composition name: families in order, defaults left out."""
    return _capi.canonical_name(name)


def _staged(t):
    """A contiguous CPU tensor holding t's values (t itself where it is one), and a function that
    writes it back into t (nothing to do where it is t): collectives on CUDA tensors go through
    host memory, bitwise."""
    if t.device.type == "cpu" and t.is_contiguous():
        return t, lambda: None
    c = t.detach().to("cpu", copy=True).contiguous()
    return c, lambda: t.copy_(c)


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
            if t.numel() == 0:
                continue
            c, write_back = _staged(t)  # CUDA tensors through host memory (once per training run)
            _capi.broadcast_(_as_buffer(c), root_rank)
            write_back()


def broadcast_object(obj, root_rank=0, map_location=None):
    """Rank root_rank's `obj` (anything torch.save can write) on every rank. Collective.
    map_location: as torch.load's (CUDA tensors come back on the root's device index otherwise)."""
    data = b""
    if rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
    data = _capi.broadcast_bytes(data, root_rank)
    return torch.load(io.BytesIO(data), map_location=map_location)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Rank root_rank's optimizer state (momentum buffers, step counts, hyper-parameters) on every rank."""
    state = broadcast_object(optimizer.state_dict(), root_rank, map_location="cpu")  # load_state_dict moves it to the parameters' device
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def allreduce_average_(tensor):
    """The average over the ranks of a float32 tensor, in place (e.g. batch norm statistics; CUDA
    tensors go through host memory)."""
    with torch.no_grad():
        c, write_back = _staged(tensor)
        _capi.allreduce_average_(_as_buffer(c))
        write_back()


def verify_replicas(params):
    """gflow::verify_replicas over float32 tensors: MismatchError on every rank naming the first
    tensor whose bits differ between ranks. Collective."""
    named = [(n, t) for n, t in _tensors(params) if t.dtype == torch.float32 and t.numel() > 0]
    flat = torch.cat([t.detach().reshape(-1).cpu() for _, t in named]) if named else torch.zeros(0)
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
