"""gflow.torch under mpiexec (tests/python/CMakeLists.txt runs this file at 2 and 4 ranks).

Every test is collective: each rank runs the same tests in the same order."""
import os

import numpy as np
import pytest
import torch

import gflow.torch as gt
from gflow import errors

gt.init()
R, P = gt.rank(), gt.size()

SHAPES = [(5, 3), (3,), (7, 4), (4,), (300,)]  # as tests/python/reference.cpp


def gradient(rank, it, i, shape):
    """reference.cpp's formula, exact in float32."""
    n = int(np.prod(shape))
    j = np.arange(n, dtype=np.int64)
    v = (rank * 131 + it * 71 + i * 37 + j * 13) % 1999 - 999
    return torch.from_numpy((v.astype(np.float32) / np.float32(64.0)).reshape(shape))


def make(composition, shapes=SHAPES, **kw):
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    named = [("p%d" % i, p) for i, p in enumerate(params)]
    opt = gt.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named, composition=composition, **kw)
    return params, opt


def backward(params, it, rank=R):
    """loss = sum_i <p_i, G_i>: autograd writes exactly G_i into each .grad (the pool)."""
    loss = sum((p * gradient(rank, it, i, p.shape)).sum() for i, p in enumerate(params))
    loss.backward()


@pytest.mark.parametrize("composition", ["dense", "fp16+fusion=4MiB+topk=0.01+funneled", "gtopk=0.01", "csc=4096:15", "bf16",
                                         "fusion=4MiB+hier=2", "oktopk=0.01"])
def test_bitwise_equal_to_the_cpp_exchanger(composition):
    ref = os.path.join(os.environ["GFLOW_REFERENCE_DIR"], "%s.%d.%d.bin" % (composition, P, R))
    expected = np.fromfile(ref, dtype=np.float32)
    params, opt = make(composition)
    got = []
    for it in range(4):
        opt.zero_grad()
        backward(params, it)
        opt.step()
        got.append(torch.cat([p.grad.reshape(-1) for p in params]).numpy().copy())
    got = np.concatenate(got)
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes(), "composition %s: first difference at %d" % (
        composition, int(np.argmax(got.view(np.uint32) != expected.view(np.uint32))))


def test_grads_are_views_of_the_pool():
    params, opt = make("fusion=4MiB")
    pool = opt._pool
    lo, hi = pool.data_ptr(), pool.data_ptr() + 4 * pool.numel()
    backward(params, 0)
    for p, off in zip(params, opt.pool_offsets()):
        assert p.grad.data_ptr() == pool.data_ptr() + 4 * off
        assert lo <= p.grad.data_ptr() < hi
    opt.step()
    assert all(p.grad.data_ptr() == pool.data_ptr() + 4 * off for p, off in zip(params, opt.pool_offsets()))


def test_hook_order_and_learned_layout():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), composition="dense",
                                  learn_order=True)
    names = opt.parameter_names
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    model(torch.ones(3, 6)).sum().backward()
    order = list(opt._hooks_seen)
    # Backward reaches the last layer first: each layer's hooks fire before the layer in front of it.
    layer = [names[i].split(".")[0] for i in order]
    assert layer == sorted(layer, key=lambda s: -int(s)), order
    assert sorted(order) == list(range(6))
    opt.step()
    # Reverse forward order is the default pool layout: learn_order keeps it (no move).
    assert opt._exchanger.generation == 0
    offsets = opt.pool_offsets()
    assert sorted(range(6), key=lambda i: offsets[i]) == order
    # Parameters listed in reverse: the hooks fire in layout order 0, 1, ..., which learn_order
    # adopts (rank 0's order), moving every view once.
    opt.close()  # its hooks off the model
    opt2 = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), list(reversed(list(model.named_parameters()))),
                                   composition="dense", learn_order=True)
    opt2.zero_grad()  # the .grad values opt left behind were copied into the new pool (torch would add to them too)
    model(torch.ones(3, 6)).sum().backward()
    order2 = list(opt2._hooks_seen)
    assert [opt2.parameter_names[i] for i in order2] == [names[i] for i in order]
    opt2.step()
    assert opt2._exchanger.generation == 1
    offsets2 = opt2.pool_offsets()
    assert sorted(range(6), key=lambda i: offsets2[i]) == order2
    p2 = list(reversed(list(model.parameters())))
    assert all(q.grad.data_ptr() == opt2._pool.data_ptr() + 4 * offsets2[i] for i, q in enumerate(p2))
    # The gradients followed their views (lr 0: the same weights): a second pass gives the first exchange's values.
    g1 = [q.grad.clone() for q in p2]
    opt2.zero_grad()
    model(torch.ones(3, 6)).sum().backward()
    opt2.step()
    assert all(torch.equal(a, q.grad) for a, q in zip(g1, p2))


def test_no_sync_accumulates_and_exchanges_the_sum():
    params, opt = make("fp16+fusion=4MiB")  # 16-bit wire: sum then average, as one exchange
    plain = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    opt.zero_grad()
    with opt.no_sync():
        backward(params, 0)
        backward(params, 1)
    assert opt.last_status is None  # nothing exchanged yet
    backward(params, 2)
    opt.step()
    # The same sum through the reference path: one exchange of G0 + G1 + G2 by the C++ exchanger's view.
    params2, opt2 = make("fp16+fusion=4MiB")
    for i, p in enumerate(params2):
        p.grad.copy_(gradient(R, 0, i, p.shape) + gradient(R, 1, i, p.shape) + gradient(R, 2, i, p.shape))
    for i in reversed(range(len(params2))):
        opt2._exchanger.ready(i)
    opt2.synchronize()
    for p, q in zip(params, params2):
        assert torch.equal(p.grad, q.grad)
    del plain


def test_unused_parameters():
    # p1 is used on even ranks only; p2 on no rank.
    params, opt = make("dense", shapes=[(4,), (3,), (2,)], find_unused=True)
    loss = (params[0] * 2.0).sum()
    if R % 2 == 0:
        loss = loss + (params[1] * 3.0).sum()
    loss.backward()
    st = opt.synchronize()
    assert st.unused == [2]
    users = (P + 1) // 2
    assert torch.equal(params[0].grad, torch.full((4,), 2.0))
    assert torch.allclose(params[1].grad, torch.full((3,), 3.0 * users / P))
    assert torch.equal(params[2].grad, torch.zeros(2))


def test_unused_parameter_without_find_unused_is_a_usage_error():
    params, opt = make("dense", shapes=[(4,), (3,)])
    (params[0] * 2.0).sum().backward()
    with pytest.raises(errors.UsageError) as e:
        opt.step()
    assert e.value.subject == "finish"
    assert "find_unused" in e.value.fix
    assert str(e.value).startswith("gflow: usage error in 'finish': ")


def test_backward_twice_is_a_usage_error_naming_no_sync():
    params, opt = make("dense")
    backward(params, 0)
    with pytest.raises(errors.UsageError) as e:
        backward(params, 1)
    assert e.value.subject == "ready"
    assert "no_sync" in e.value.fix
    assert isinstance(e.value, errors.Error) and e.value.kind == "usage error"


def test_unknown_composition_lists_the_menu():
    with pytest.raises(errors.InvalidArgument) as e:
        make("topk=0.5+chained")
    msg = str(e.value)
    assert e.value.subject == "composition"
    assert msg.startswith("gflow: invalid argument in 'composition': 'topk=0.5+chained'")
    for name in ("dense", "fp16+fusion=4MiB+topk=0.01+funneled", "csc=4096:15", "gtopk=0.01", "concurrent=2", "fusion=auto"):
        assert name in msg
    assert "gflow_add_python_composition" in e.value.fix
    assert isinstance(e.value, ValueError)


def test_names_in_any_order_and_spelling():
    assert gt.canonical_name("Funneled + topk=0.010 + fp16 + fusion=4194304") == "fp16+fusion=4MiB+topk=0.01+funneled"
    assert gt.canonical_name("fp32+dense+ring+none") == "dense"
    _, opt = make("FUNNELED+fp16+topk=0.01+fusion=4MiB")
    assert opt.composition == "fp16+fusion=4MiB+topk=0.01+funneled"


@pytest.mark.skipif(P < 2, reason="needs 2 ranks")
def test_ranks_with_different_compositions_get_a_mismatch_error_on_every_rank():
    with pytest.raises(errors.MismatchError) as e:
        make("dense" if R == 0 else "fp16")
    assert e.value.subject == "policies"
    assert "rank 0 uses" in str(e.value)
    assert e.value.fix


def test_join_on_a_sparse_composition_is_refused():
    _, opt = make("topk=0.01", uneven_inputs=True)
    with pytest.raises(errors.InvalidArgument) as e:
        opt._exchanger.join()
    assert e.value.subject == "join"
    assert "dense composition" in e.value.fix


def test_join_with_uneven_inputs():
    params, opt = make("dense", shapes=[(3,)], uneven_inputs=True)
    steps = 2 + R  # rank r trains 2 + r steps
    for it in range(steps):
        opt.zero_grad()
        (params[0] * float(R + 1)).sum().backward()
        st = opt.step() or opt.last_status
        active = P - sum(1 for r in range(P) if 2 + r <= it)
        assert opt.last_status.contributors == active
    js = opt.join()
    assert js.last_rank == P - 1
    gt.verify_replicas([p.detach() for p in params])


def test_checkpoint_round_trip_restores_the_residual():
    comp = "topk=0.01"
    params, opt = make(comp)
    for it in range(2):
        opt.zero_grad()
        backward(params, it)
        opt.step()
    state = opt.save_state()
    for it in (2, 3):
        opt.zero_grad()
        backward(params, it)
        opt.step()
    after = torch.cat([p.grad.reshape(-1) for p in params]).clone()
    params2, opt2 = make(comp)
    opt2.load_state(state)
    for it in (2, 3):
        opt2.zero_grad()
        backward(params2, it)
        opt2.step()
    again = torch.cat([p.grad.reshape(-1) for p in params2])
    assert after.numpy().tobytes() == again.numpy().tobytes()
    # Without the checkpoint the residual is missing: the result differs.
    params3, opt3 = make(comp)
    for it in (2, 3):
        opt3.zero_grad()
        backward(params3, it)
        opt3.step()
    assert not torch.equal(torch.cat([p.grad.reshape(-1) for p in params3]), after)


def test_corrupt_checkpoint_is_a_parse_error():
    _, opt = make("topk=0.01")
    state = bytearray(opt.save_state())
    state[len(state) // 2] ^= 0xFF
    with pytest.raises(errors.ParseError) as e:
        opt.load_state(bytes(state))
    assert e.value.fix


def test_added_composition():
    # tests/python/CMakeLists.txt: gflow_add_python_composition(NAME test_added POLICIES TopK<0.05> Fusion<1 << 10>)
    menu = gt.compositions()
    assert "test_added" in menu and "fusion=1KiB+topk=0.05" in menu
    assert menu["test_added"] == "gflow::Sparsifier<gflow::TopK<0.05>>, gflow::Fusion<1 << 10>"
    params, opt = make("test_added")
    assert opt.composition == "fusion=1KiB+topk=0.05"
    backward(params, 0)
    st = opt.step() or opt.last_status
    # 5% of each 1 KiB bucket's elements per rank: some, not all, elements are non-zero; identical bits on every rank.
    g = torch.cat([p.grad.reshape(-1) for p in params])
    assert 0 < int((g != 0).sum()) < g.numel()
    gt.verify_replicas([p.grad for p in params])
    assert opt.last_status.wire_bytes > 0


def test_broadcast_parameters_and_optimizer_state():
    torch.manual_seed(100 + R)  # different on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    model(torch.randn(5, 4))  # batch norm statistics differ per rank
    opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model.named_parameters())
    gt.broadcast_parameters(model.state_dict(), root_rank=P - 1)
    torch.manual_seed(100 + P - 1)
    root = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    root(torch.randn(5, 4))
    for (k, a), (_, b) in zip(model.state_dict().items(), root.state_dict().items()):
        assert torch.equal(a, b), k
    # One step creates momentum buffers that differ per rank (the lr differs); broadcast them.
    for g in opt.param_groups:
        g["lr"] = 0.1 * (R + 1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    gt.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    bufs = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    gt.verify_replicas(bufs)


def test_timeline_writes_a_trace(tmp_path_factory):
    params, opt = make("fusion=4MiB+funneled")
    path = os.path.join(os.environ["GFLOW_REFERENCE_DIR"], "timeline.%d.json" % P)
    with gt.timeline(opt, path):
        for it in range(2):
            opt.zero_grad()
            backward(params, it)
            opt.step()
    if R == 0:
        text = open(path).read()
        assert '"ready"' in text and '"finish"' in text


def test_named_parameters_are_checked():
    model = torch.nn.Linear(3, 2)
    other = torch.nn.Linear(3, 2)
    with pytest.raises(errors.InvalidArgument) as e:
        gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), other.named_parameters())
    assert e.value.subject == "named_parameters" and "not among the optimizer's parameters" in str(e.value)
    half = torch.nn.Linear(3, 2).double()
    with pytest.raises(errors.InvalidArgument) as e:
        gt.DistributedOptimizer(torch.optim.SGD(half.parameters(), lr=0.1), half.named_parameters())
    assert e.value.subject == "named_parameters" and "float32" in str(e.value) and e.value.fix.startswith("keep the model in float32")


def test_nested_no_sync_is_a_usage_error():
    _, opt = make("dense")
    with opt.no_sync():
        with pytest.raises(errors.UsageError) as e:
            with opt.no_sync():
                pass
    assert e.value.subject == "no_sync" and "already open" in str(e.value)


def test_broadcast_and_average_check_their_arguments():
    with pytest.raises(errors.InvalidArgument) as e:
        gt.broadcast_parameters({"w": 3.0})
    assert e.value.subject == "params" and "not a tensor" in str(e.value)
    with pytest.raises(errors.InvalidArgument) as e:
        gt.allreduce_average_(torch.zeros(3, dtype=torch.float64))
    assert e.value.subject == "tensor" and "float32" in str(e.value)


def test_device_requests_are_checked_where_there_is_no_gpu():
    """The CUDA entry points refuse what this machine cannot do, with typed errors naming the fix
    (on a machine with a GPU, test_gflow_torch_cuda.py runs them for real)."""
    from gflow import _capi
    built, gpus, why = gt.cuda_support()
    with pytest.raises(errors.InvalidArgument) as e:
        gt.init(transport="gloo")
    assert e.value.subject == "transport" and "'nccl'" in e.value.fix
    with pytest.raises(errors.InvalidArgument) as e:
        gt.init(device="tpu")
    assert e.value.subject == "device" and "'cuda:<i>'" in e.value.fix
    if gpus == 0:
        with pytest.raises(errors.UsageError) as e:
            gt.init(device=0)  # MPI is up already: only the device request is refused
        assert e.value.subject == "device" and "device='cpu'" in e.value.fix
        assert gt.device() == torch.device("cpu")
    with pytest.raises(errors.UsageError) as e:
        _capi.Exchanger("dense", ["w"], [[4]], on_device=True)  # no device transport yet (or no CUDA library)
    assert e.value.subject == "device"
    ex = _capi.Exchanger("dense", ["w"], [[4]])
    with pytest.raises(errors.InvalidArgument) as e:
        ex.ready(0, stream=0x1234)  # a CUDA stream with a host-memory exchanger
    assert e.value.subject == "stream"
    assert ex.device == -1 and all("cpu" in spaces for _, (_, spaces) in gt.compositions(with_spaces=True).items())


def test_cscsgd_needs_a_csc_exchange():
    with pytest.raises(errors.InvalidArgument) as e:
        gt.CSCSGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=1.0)
    assert e.value.subject == "momentum"
    p = torch.nn.Parameter(torch.zeros(4))
    opt = gt.DistributedOptimizer(gt.CSCSGD([p], lr=0.1), [("p", p)], composition="dense")
    (p * 1.0).sum().backward()
    with pytest.raises(errors.UsageError) as e:
        opt.step()
    assert e.value.subject == "CSCSGD" and "csc=" in e.value.fix


def test_cscsgd_steps_the_selected_chunks_only():
    # CSC<4096, 15> over 3 x 4096 elements: after the dense warm-up (warmup=0) some chunks are kept back.
    params, opt = make("csc=4096:15", shapes=[(4096,), (4096,), (4096,)])
    opt.close()
    p = [torch.nn.Parameter(torch.zeros(4096)) for _ in range(3)]
    opt = gt.DistributedOptimizer(gt.CSCSGD(p, lr=1.0, momentum=0.5), [("p%d" % i, q) for i, q in enumerate(p)], composition="csc=4096:15")
    sum((q * (i + 1.0)).sum() for i, q in enumerate(p)).backward()
    opt.step()
    chosen = set(opt._exchanger.selected_chunks())
    offs = opt.pool_offsets()
    for i, q in enumerate(p):
        c = offs[i] // 4096
        moved = bool((q != 0).any())
        assert moved == (c in chosen), (i, c, chosen)
        if moved:  # u = 0.5 * 0 + 1.0 * g; w = 0 - u
            assert torch.equal(q.detach(), -q.grad)


def test_distributed_optimizer_before_init_is_a_usage_error():
    import subprocess
    import sys
    code = ("import torch, gflow.torch as gt\n"
            "m = torch.nn.Linear(2, 2)\n"
            "try:\n"
            "    gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters())\n"
            "except gt.errors.UsageError as e:\n"
            "    print(e.subject, '|', e.fix)\n")
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("OMPI_") or k.startswith("PMIX_"):
            del env[k]  # a plain process, not a rank of this job (it never initialises MPI)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("init | call gflow.torch.init() once"), out.stdout + out.stderr


# ---- ShardedOptimizer (ZeRO-2) -------------------------------------------------------------------

def _model_params(seed_offset=0):
    """The SHAPES as parameters with the same (exactly representable) start values on every rank."""
    out = []
    for i, s in enumerate(SHAPES):
        out.append(torch.nn.Parameter(gradient(0, 100 + seed_offset, i, s) / 8))
    return out


def _lockstep(full, plain, sharded, zero, iterations):
    """The same iterations on the unsharded and the sharded optimizer; their parameters must agree
    to the bit after each."""
    for it in iterations:
        for params, opt in ((full, plain), (sharded, zero)):
            opt.zero_grad()
            backward(params, it)
            opt.step()
        for a, b in zip(full, sharded):
            assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes(), "iteration %d" % it


def test_sharded_step_is_bitwise_the_full_step_with_one_eighth_of_the_state():
    """Gradients k/64 and lr = momentum = 0.5 keep every sum and product exact, so reduce-scatter and
    allreduce (whatever order Open MPI adds in) and the shard's SGD against the whole model's must
    agree to the bit; the sharded optimizer's counted state is 1/P of the plain one's."""
    full = _model_params()
    sharded = _model_params()
    plain = gt.DistributedOptimizer(torch.optim.SGD(full, lr=0.5, momentum=0.5), [("p%d" % i, p) for i, p in enumerate(full)],
                                    composition="fusion=4MiB")
    zero = gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(sharded)], composition="fusion=4MiB+shard",
                               lr=0.5, momentum=0.5)
    assert zero.composition == "fusion=4MiB+shard"
    _lockstep(full, plain, sharded, zero, range(4))
    plain_bytes = sum(v.numel() * v.element_size() for st in plain.state.values() for v in st.values() if torch.is_tensor(v))
    total = sum(p.numel() for p in full)
    assert plain_bytes == 4 * total
    shard_elems = sum(e - f for f, e in zero._exchanger.shard())
    assert zero.state_bytes() == 4 * shard_elems
    assert shard_elems <= total // P + len(zero.buckets())
    plain.close()
    zero.close()


def test_sharded_optimizer_over_oktopk_keeps_replicas_equal_with_one_shard_of_state():
    """Compressed and sharded: OkTopK's split-and-reduce over the shards, then each rank steps its
    shard and gathers. Every rank must end with the same parameters, changed from the start, and
    hold momentum for its shard only."""
    params = _model_params(2)
    start = [p.detach().clone() for p in params]
    zero = gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(params)],
                               composition="oktopk=0.01+fusion=64MiB+shard", lr=0.5, momentum=0.5)
    assert zero.composition == "fusion=64MiB+oktopk=0.01+shard"
    for it in range(5):
        zero.zero_grad()
        backward(params, it)
        zero.step()
        assert zero.last_status.wire_bytes > 0
    gt.verify_replicas(params)
    assert any(not torch.equal(a, p.detach()) for a, p in zip(start, params))
    shard_elems = sum(e - f for f, e in zero._exchanger.shard())
    assert zero.state_bytes() == 4 * shard_elems
    zero.close()


def test_sharded_optimizer_refuses_a_composition_without_shard_and_a_join_without_a_step():
    params = _model_params(1)
    with pytest.raises(errors.InvalidArgument) as e:
        gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(params)], composition="fusion=4MiB", lr=0.1)
    assert e.value.subject == "composition"
    assert gt.canonical_name("Shard+FUSION=4194304") == "fusion=4MiB+shard"
    zero = gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(params)], lr=0.1, uneven_inputs=True)
    with pytest.raises(errors.InvalidArgument) as e:
        zero._exchanger.join()  # the module's join without a step: the shard would go unstepped
    assert e.value.subject == "join"
    assert "needs a step" in str(e.value)
    zero.close()
    plain = gt.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), [("p%d" % i, p) for i, p in enumerate(params)], composition="dense")
    with pytest.raises(errors.UsageError) as e:
        plain._exchanger.gather_shards(np.zeros(plain._pool.numel(), dtype=np.float32))
    assert e.value.subject == "gather_shards"
    plain.close()


def test_sharded_learn_order_follows_the_learned_layout_bitwise():
    """Parameters listed in reverse, so that learn_order lays the pool out anew at the first step: the
    sharded optimizer's weights and shard follow it, and its parameters stay bitwise the unsharded
    learn_order optimizer's (gradients k/64, lr = momentum = 0.5: every sum exact)."""
    full = _model_params(3)
    sharded = _model_params(3)
    plain = gt.DistributedOptimizer(torch.optim.SGD(full, lr=0.5, momentum=0.5), list(reversed([("p%d" % i, p) for i, p in enumerate(full)])),
                                    composition="fusion=4MiB", learn_order=True)
    zero = gt.ShardedOptimizer(torch.optim.SGD, list(reversed([("p%d" % i, p) for i, p in enumerate(sharded)])), composition="fusion=4MiB+shard",
                               lr=0.5, momentum=0.5, learn_order=True)
    before = zero.pool_offsets()
    _lockstep(full, plain, sharded, zero, range(4))
    assert zero._exchanger.generation == 1 and plain._exchanger.generation == 1  # the pool moved once
    offsets = zero.pool_offsets()
    assert offsets != before and offsets == plain.pool_offsets()
    w = zero._weights
    for p, off in zip(reversed(sharded), offsets):  # layout order is the reversed list
        assert p.data_ptr() == w.data_ptr() + 4 * off
    shard_elems = sum(e - f for f, e in zero._exchanger.shard())
    assert zero.state_bytes() == 4 * shard_elems
    gt.verify_replicas([p.detach() for p in sharded])
    # A state of another pool order (saved before the order was learned) once the optimizer has
    # state: refused, nothing loaded, and the next step still matches the unsharded one bitwise.
    early = gt.ShardedOptimizer(torch.optim.SGD, list(reversed([("p%d" % i, p) for i, p in enumerate(_model_params(3))])),
                                composition="fusion=4MiB+shard", lr=0.5, momentum=0.5, learn_order=True)
    other_order = early.save_state()
    early.close()
    with pytest.raises(errors.UsageError) as e:
        zero.load_state(other_order)
    assert e.value.subject == "load_state" and "nothing was loaded" in str(e.value)
    assert zero.pool_offsets() == offsets
    _lockstep(full, plain, sharded, zero, [4])
    plain.close()
    zero.close()


def test_sharded_checkpoint_with_adam_state_resumes_bitwise():
    """ShardedOptimizer.save_checkpoint after 3 steps of Adam, then 2 more steps; a fresh
    ShardedOptimizer over the saved parameters loads the set and takes the same 2 steps: the
    parameters agree to the bit, and the loaded state is the saved one (exp_avg, exp_avg_sq, step)."""
    import shutil
    import tempfile
    root = gt.broadcast_object(tempfile.mkdtemp(prefix="gflow_pyckpt_") if R == 0 else None)
    params = _model_params(5)
    zero = gt.ShardedOptimizer(torch.optim.Adam, [("p%d" % i, p) for i, p in enumerate(params)], composition="fusion=4MiB+shard", lr=0.01)
    for it in range(3):
        zero.zero_grad()
        backward(params, it)
        zero.step()
    path = zero.save_checkpoint(root)
    set_dir = os.path.dirname(path)
    assert os.path.basename(path) == "rank-%d.gflow" % R and os.path.basename(set_dir) == "iter-%012d" % 3
    assert os.path.exists(os.path.join(set_dir, "shard-%d.gflow" % R)) and os.path.exists(os.path.join(set_dir, "optim-%d.pt" % R))
    saved = [p.detach().clone() for p in params]
    state_then = [{k: v.clone() for k, v in zero.inner.state[w].items()} for w in zero._shard_views()]
    bytes_then = zero.state_bytes()
    for it in range(3, 5):
        zero.zero_grad()
        backward(params, it)
        zero.step()
    went_on = [p.detach().numpy().tobytes() for p in params]
    zero.close()
    params2 = [torch.nn.Parameter(s.clone()) for s in saved]
    zero2 = gt.ShardedOptimizer(torch.optim.Adam, [("p%d" % i, p) for i, p in enumerate(params2)], composition="fusion=4MiB+shard", lr=0.5)
    assert zero2.load_checkpoint(root) == 3
    assert zero2.param_groups[0]["lr"] == 0.01  # the groups' settings come back too
    assert zero2.state_bytes() == bytes_then
    assert sorted(zero2.inner.state[zero2._shard_views()[0]].keys()) == ["exp_avg", "exp_avg_sq", "step"]
    loaded = [zero2.inner.state[w] for w in zero2._shard_views()]
    assert len(loaded) == len(state_then)
    for got, want in zip(loaded, state_then):  # view by view, bit for bit
        assert sorted(got.keys()) == sorted(want.keys())
        assert all(got[k].numpy().tobytes() == want[k].numpy().tobytes() for k in want)
    for it in range(3, 5):
        zero2.zero_grad()
        backward(params2, it)
        zero2.step()
    assert [p.detach().numpy().tobytes() for p in params2] == went_on
    zero2.close()
    gt.broadcast_object(None)  # every rank has read the set before rank 0 removes it
    if R == 0:
        shutil.rmtree(root)


def test_sharded_checkpoint_of_sgd_without_momentum():
    """torch keeps momentum_buffer = None without momentum (1.13): no state to pack, nothing refused."""
    import shutil
    import tempfile
    root = gt.broadcast_object(tempfile.mkdtemp(prefix="gflow_pyckpt_sgd_") if R == 0 else None)
    params = _model_params(7)
    zero = gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(params)], lr=0.5)
    zero.zero_grad()
    backward(params, 0)
    zero.step()
    zero.save_checkpoint(root)
    gt.broadcast_object(None)
    assert zero.load_checkpoint(root) == 1
    zero.zero_grad()
    backward(params, 1)
    zero.step()
    gt.verify_replicas([p.detach() for p in params])
    zero.close()
    gt.broadcast_object(None)
    if R == 0:
        shutil.rmtree(root)


def test_sharded_checkpoint_refuses_uneven_view_state_and_incomplete_sets():
    """composition="shard" (a bucket per tensor: one shard view per tensor) so that views can differ."""
    import shutil
    import tempfile
    root = gt.broadcast_object(tempfile.mkdtemp(prefix="gflow_pyckpt_bad_") if R == 0 else None)
    params = _model_params(6)
    zero = gt.ShardedOptimizer(torch.optim.Adam, [("p%d" % i, p) for i, p in enumerate(params)], composition="shard", lr=0.01)
    zero.zero_grad()
    backward(params, 0)
    zero.step()
    views = zero._shard_views()
    assert len(views) >= 2
    keep = zero.inner.state[views[1]]["step"]
    zero.inner.state[views[1]]["step"] = torch.tensor(99.0)
    with pytest.raises(errors.UsageError) as e:
        zero.save_checkpoint(root)
    assert e.value.subject == "state" and "different state" in str(e.value)
    zero.inner.state[views[1]]["step"] = keep
    path = zero.save_checkpoint(root)
    gt.broadcast_object(None)  # every rank's files are written before any rank loads
    zero.zero_grad()
    backward(params, 1)
    zero.step()  # iteration 2, step 2: a load of the set (iteration 1) would show
    side = os.path.join(os.path.dirname(path), "optim-0.pt")  # what every rank loads the settings from
    steps = zero.inner.state[views[0]]["step"].clone()
    held = zero.state_bytes()

    def refused(cls, says):
        """After every rank changed the set: the load raises cls('root') saying `says`, and loads
        nothing (the optimizer's state and the exchanger's iteration stay)."""
        gt.broadcast_object(None)
        with pytest.raises(cls) as e:
            zero.load_checkpoint(root)
        assert e.value.subject == "root" and says in str(e.value)
        assert zero.state_bytes() == held and torch.equal(zero.inner.state[zero._shard_views()[0]]["step"], steps)
        assert zero._exchanger.iteration == 2 and float(steps) == 2.0
        gt.broadcast_object(None)
    if R == 0:
        meta = torch.load(side, weights_only=False)
        torch.save(dict(meta, keys=meta["keys"][:1]), side)  # names one array of the two saved
    refused(errors.MismatchError, "names 1 state arrays; the shard files hold 2")
    if R == 0:
        os.remove(side)
    refused(errors.InvalidArgument, "has no optim-0.pt")
    os.remove(os.path.join(os.path.dirname(path), "shard-%d.gflow" % R))  # every rank its own: gflow's H9 inside
    refused(errors.InvalidArgument, "has no shard state file")
    zero.close()
    gt.broadcast_object(None)
    if R == 0:
        shutil.rmtree(root)


def test_sharded_join_steps_the_shard_and_ends_with_the_unsharded_jobs_parameters():
    """Rank r trains 2 + r iterations, then joins. The unsharded job's join() takes the last training
    rank's parameters; the sharded job's join() steps each rank's shard after each shadowed iteration.
    Gradients k/64 make every sum exact, so the two jobs' parameters agree to the bit on every rank."""
    steps = 2 + R
    full = _model_params(2)
    sharded = _model_params(2)
    plain = gt.DistributedOptimizer(torch.optim.SGD(full, lr=0.5, momentum=0.5), [("p%d" % i, p) for i, p in enumerate(full)],
                                    composition="fusion=4MiB", uneven_inputs=True)
    for it in range(steps):
        plain.zero_grad()
        backward(full, it)
        plain.step()
    plain.join()
    zero = gt.ShardedOptimizer(torch.optim.SGD, [("p%d" % i, p) for i, p in enumerate(sharded)], composition="fusion=4MiB+shard",
                               lr=0.5, momentum=0.5, uneven_inputs=True)
    for it in range(steps):
        zero.zero_grad()
        backward(sharded, it)
        zero.step()
        assert zero.last_status.contributors == P - sum(1 for r in range(P) if 2 + r <= it)
    js = zero.join()
    assert js.shadowed == (P - 1) - R
    for a, b in zip(full, sharded):
        assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()
    gt.verify_replicas([p.detach() for p in sharded])
    plain.close()
    zero.close()


def test_sharded_join_before_the_first_step_follows_the_learned_layout():
    """learn_order with uneven inputs: rank 1 joins before the first step, so it learns rank 0's
    order (the parameters are listed in reverse: the pool moves) inside its first shadowed iteration,
    and join's after_each must re-lay its weights and shard before stepping them. Every rank ends
    with the unsharded learn_order job's parameters, bitwise."""
    steps = [2, 0, 1, 3][R]
    full = _model_params(4)
    sharded = _model_params(4)
    plain = gt.DistributedOptimizer(torch.optim.SGD(full, lr=0.5, momentum=0.5), list(reversed([("p%d" % i, p) for i, p in enumerate(full)])),
                                    composition="fusion=4MiB", uneven_inputs=True, learn_order=True)
    for it in range(steps):
        plain.zero_grad()
        backward(full, it)
        plain.step()
    plain.join()
    zero = gt.ShardedOptimizer(torch.optim.SGD, list(reversed([("p%d" % i, p) for i, p in enumerate(sharded)])),
                               composition="fusion=4MiB+shard", lr=0.5, momentum=0.5, uneven_inputs=True, learn_order=True)
    before = zero.pool_offsets()
    for it in range(steps):
        zero.zero_grad()
        backward(sharded, it)
        zero.step()
    js = zero.join()
    assert js.shadowed == max([2, 0, 1, 3][:P]) - steps
    assert zero._exchanger.generation == 1 and zero.pool_offsets() != before and zero.pool_offsets() == plain.pool_offsets()
    w = zero._weights
    for p, off in zip(reversed(sharded), zero.pool_offsets()):  # the parameters live in the moved pool
        assert p.data_ptr() == w.data_ptr() + 4 * off
    assert zero.state_bytes() == 4 * sum(e - f for f, e in zero._exchanger.shard())
    for a, b in zip(full, sharded):
        assert a.detach().numpy().tobytes() == b.detach().numpy().tobytes()
    gt.verify_replicas([p.detach() for p in sharded])
    plain.close()
    zero.close()
