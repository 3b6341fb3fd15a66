"""gflow.torch on CUDA tensors under mpiexec (pytest -m cuda; tests/python/CMakeLists.txt runs this file at
1, 2 and 4 ranks, every rank on the node-local GPU). Where no GPU or no CUDA build of gflow.torch is
there, every test is skipped with the reason, and conftest.py makes the run exit 77 (ctest: skipped).

Every test is collective: each rank runs the same tests in the same order. The references:
  - the C++ exchanger's output for the same gradients (GFLOW_REFERENCE_DIR, tests/python/reference.cpp,
    the host path; the device path is bitwise the host path, tests/cuda checks that in C++);
  - gflow.torch's own CPU exchanger in the same process (libgflow_capi_cuda.so holds both menus)."""
import os

import numpy as np
import pytest
import torch

import gflow.torch as gt
from gflow import _capi, errors

BUILT, GPUS, WHY = gt.cuda_support()
HAVE_GPU = BUILT and GPUS > 0 and torch.cuda.is_available()
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAVE_GPU, reason="no GPU for gflow.torch here: %s" % (
                  WHY or "gflow sees %d CUDA devices, torch.cuda.is_available() is %s" % (GPUS, torch.cuda.is_available())))]

gt.init(device=None if HAVE_GPU else "cpu")
R, P = gt.rank(), gt.size()
DEV = gt.device()
SHAPES = [(5, 3), (3,), (7, 4), (4,), (300,)]  # as tests/python/reference.cpp


def gradient(rank, it, i, shape, device="cpu"):
    """reference.cpp's formula, exact in float32."""
    n = int(np.prod(shape))
    j = np.arange(n, dtype=np.int64)
    v = (rank * 131 + it * 71 + i * 37 + j * 13) % 1999 - 999
    return torch.from_numpy((v.astype(np.float32) / np.float32(64.0)).reshape(shape)).to(device)


def make(composition, device, shapes=SHAPES, optimizer=None, **kw):
    params = [torch.nn.Parameter(torch.zeros(s, device=device)) for s in shapes]
    named = [("p%d" % i, p) for i, p in enumerate(params)]
    base = optimizer(params) if optimizer else torch.optim.SGD(params, lr=0.0)
    return params, gt.DistributedOptimizer(base, named, composition=composition, **kw)


def backward(params, it, rank=R):
    """loss = sum_i <p_i, G_i>: autograd writes exactly G_i into each .grad (the pool)."""
    loss = sum((p * gradient(rank, it, i, p.shape, p.device)).sum() for i, p in enumerate(params))
    loss.backward()


def grads(params):
    return torch.cat([p.grad.reshape(-1) for p in params]).cpu().numpy().copy()


def test_the_device_transport_is_chosen_and_a_wrong_choice_refused():
    """First test: the device transport does not exist yet. Two ranks on one GPU: NCCL is refused on
    every rank with a UsageError naming the fix, and 'auto' then picks MPI."""
    on_one_gpu = gt.local_rank()[1] > GPUS  # more ranks on this node than GPUs: two of them share one
    if on_one_gpu:
        with pytest.raises(errors.UsageError) as e:
            _capi.device_init("nccl", DEV.index)
        assert e.value.subject == "transport" and "transport='mpi'" in e.value.fix
    params, opt = make("dense", DEV)
    assert gt.device_transport() == ("mpi" if on_one_gpu else "nccl")
    assert opt._pool.device == DEV and all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(params, opt._views))
    opt.close()


@pytest.mark.parametrize("composition", ["dense", "fp16+fusion=4MiB+topk=0.01+funneled", "gtopk=0.01", "csc=4096:15", "bf16",
                                         "fusion=4MiB+hier=2", "oktopk=0.01"])
def test_bitwise_equal_to_the_cpp_exchanger(composition):
    ref = os.path.join(os.environ["GFLOW_REFERENCE_DIR"], "%s.%d.%d.bin" % (composition, P, R))
    if not os.path.exists(ref):
        pytest.skip("no C++ reference at %d ranks (%s)" % (P, ref))
    expected = np.fromfile(ref, dtype=np.float32)
    params, opt = make(composition, DEV)
    got = []
    for it in range(4):
        opt.zero_grad()
        backward(params, it)
        opt.step()
        got.append(grads(params))
    got = np.concatenate(got)
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes(), "composition %s: first difference at %d" % (
        composition, int(np.argmax(got.view(np.uint32) != expected.view(np.uint32))))
    opt.close()


def test_the_exchange_waits_for_backward_on_a_busy_stream():
    """Forward and backward on a side stream that first spins for a while. The hooks hand ready()
    the stream autograd runs each AccumulateGrad on (after waiting for the side stream's work), so
    the exchange must wait for backward's writes. Without the ordering it would read the zeroed pool."""
    params, opt = make("fusion=4MiB", DEV)
    ref_params, ref = make("fusion=4MiB", "cpu")
    side = torch.cuda.Stream(DEV)
    for it in range(3):
        opt.zero_grad()
        ref.zero_grad()
        side.wait_stream(torch.cuda.current_stream(DEV))
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # about 10 ms of one SM spinning, before backward's kernels
            backward(params, it)
            opt.synchronize()  # finish() with the side stream current: it waits for the exchange
            got = grads(params)
        backward(ref_params, it)
        ref.synchronize()
        assert got.tobytes() == grads(ref_params).tobytes(), "iteration %d" % it
    opt.close()
    ref.close()


@pytest.mark.parametrize("composition", ["dense", "fp16+fusion=4MiB", "topk=0.01", "fusion=4MiB+shard"])
def test_no_sync_find_unused_and_learn_order_as_on_the_cpu(composition):
    """The training-loop options give the CPU exchanger's bits: gradient accumulation, a parameter
    that some ranks do not use, and the pool laid out in hook order."""
    runs = []
    for device in (DEV, "cpu"):
        params, opt = make(composition, device, find_unused=True, learn_order=True)
        out = []
        for it in range(3):
            opt.zero_grad()
            with opt.no_sync():
                backward(params, it)
            used = params if (it + R) % 2 == 0 else params[:-1]
            loss = sum((p * gradient(R, it + 10, i, p.shape, p.device)).sum() for i, p in enumerate(used))
            loss.backward()
            st = opt.synchronize()
            shard = [(f, e) for f, e in opt._exchanger.shard()] if opt._exchanger.sharded else [(0, opt._pool.numel())]
            pool = opt._pool.cpu().numpy()
            out.append(np.concatenate([pool[f:e] for f, e in shard]))
            assert st.finite()
        runs.append(np.concatenate(out))
        opt.close()
    assert runs[0].tobytes() == runs[1].tobytes()


def test_sharded_optimizer_matches_the_cpu_bitwise():
    """ShardedOptimizer over CUDA parameters: SGD with momentum on this rank's shard, then
    gather_shards on the device; the same parameters as the CPU ShardedOptimizer, bit for bit."""
    results = []
    for device in (DEV, "cpu"):
        params = [torch.nn.Parameter(torch.full(s, 0.5, device=device)) for s in SHAPES]
        # lr and momentum powers of two: every product is exact, so a fused multiply-add on one
        # device and separate operations on the other give the same bits
        opt = gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(params)], composition="fusion=4MiB+shard",
                                  lr=0.25, momentum=0.5)
        for it in range(4):
            opt.zero_grad()
            backward(params, it)
            opt.step()
        results.append(torch.cat([p.detach().reshape(-1) for p in params]).cpu().numpy().copy())
        assert opt.state_bytes() <= sum(int(np.prod(s)) for s in SHAPES) * 4  # momentum for the shard only
        opt.close()
    assert results[0].tobytes() == results[1].tobytes()


@pytest.mark.parametrize("first,second", [("cpu", "cuda"), ("cuda", "cpu")])
def test_a_state_saved_on_one_device_loads_on_the_other(first, second):
    """TopK's residuals and thresholds saved by the CPU exchanger continue bitwise on the GPU, and the reverse."""
    dev = {"cpu": torch.device("cpu"), "cuda": DEV}
    params, opt = make("topk=0.01", dev[first])
    for it in range(2):
        opt.zero_grad()
        backward(params, it)
        opt.synchronize()
    state = opt.save_state()
    tail = []
    for device in (dev[first], dev[second]):
        p2, o2 = make("topk=0.01", device)
        o2.load_state(state)
        o2.zero_grad()
        backward(p2, 2)
        o2.synchronize()
        tail.append(grads(p2))
        o2.close()
    opt.close()
    assert tail[0].tobytes() == tail[1].tobytes()


def test_join_with_uneven_inputs_on_the_gpu():
    """Uneven inputs on CUDA: rank r trains 2 + r steps; join shadows the others' iterations, then
    every rank holds the last rank's parameters."""
    params, opt = make("dense", DEV, shapes=[(3,)], uneven_inputs=True)
    for it in range(2 + R):
        opt.zero_grad()
        (params[0] * float(R + 1)).sum().backward()
        opt.step()
        assert opt.last_status.contributors == P - sum(1 for r in range(P) if 2 + r <= it)
    assert opt.join().last_rank == P - 1
    gt.verify_replicas([p.detach() for p in params])
    opt.close()


def test_cscsgd_and_the_timeline_on_the_gpu():
    """CSCSGD steps the chunks the CSC exchange selected, on CUDA as on the CPU (the same torch ops;
    lr and momentum powers of two, so every product is exact and the bits agree whatever each
    device fuses), and the timeline records a CUDA optimizer's exchanges."""
    results = []
    for device in (DEV, "cpu"):
        params, opt = make("csc=4096:15", device, shapes=[(64, 100), (300,)],
                           optimizer=lambda ps: gt.CSCSGD(ps, lr=0.25, momentum=0.5), sparsifier_momentum=0.5)
        path = os.path.join(os.environ.get("GFLOW_REFERENCE_DIR", "."), "timeline_cuda.%s.%d.json" % (torch.device(device).type, P))
        with gt.timeline(opt, path):
            for it in range(3):
                opt.zero_grad()
                backward(params, it)
                opt.step()
        if R == 0:
            text = open(path).read()
            assert '"ready"' in text and '"finish"' in text
        results.append(torch.cat([p.detach().reshape(-1) for p in params]).cpu().numpy().copy())
        opt.close()
    assert results[0].tobytes() == results[1].tobytes()


def test_parameters_on_two_devices_are_refused():
    a, b = torch.nn.Parameter(torch.zeros(3, device=DEV)), torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(errors.InvalidArgument) as e:
        gt.DistributedOptimizer(torch.optim.SGD([a, b], lr=0.1), [("a", a), ("b", b)])
    assert e.value.subject == "named_parameters" and "one device" in str(e.value)


def test_broadcast_and_verify_replicas_on_cuda_tensors():
    t = torch.full((1000,), float(R), device=DEV)
    gt.broadcast_parameters([t], root_rank=P - 1)
    assert torch.equal(t.cpu(), torch.full((1000,), float(P - 1)))
    gt.verify_replicas([("t", t)])
    b = torch.full((7,), float(R + 1), device=DEV)
    gt.allreduce_average_(b)
    assert torch.allclose(b.cpu(), torch.full((7,), (P + 1) / 2.0))
