"""gflow.torch.DistributedOptimizer: a torch optimizer whose gradients go through a gflow exchanger."""
import contextlib
import weakref

import numpy as np
import torch

from .. import errors
from .. import _capi

_live = weakref.WeakSet()  # open DistributedOptimizers, closed before MPI_Finalize (gflow.torch.shutdown)


class _DistributedOptimizer:
    """Methods mixed into a subclass of the wrapped optimizer's class (as Horovod does), so that
    isinstance(opt, torch.optim.SGD) and learning-rate schedulers keep working. The new object takes
    over the wrapped optimizer's attributes (param_groups, defaults, state), so any optimizer works,
    whatever its constructor's arguments."""

    def _gflow_init(self, named_parameters, composition, find_unused, learn_order, uneven_inputs, sparsifier_momentum, warmup,
                    threshold_bytes):
        in_groups = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            named = [("param.%d" % i, p) for i, p in enumerate(in_groups)]
        else:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
                raise errors.make(errors.InvalidArgument, "named_parameters", "expected (name, parameter) pairs.",
                                  "pass model.named_parameters().")
        named = [(n, p) for n, p in named if p.requires_grad]
        ids = {id(p) for p in in_groups}
        seen = set()
        for n, p in named:
            if id(p) not in ids:
                raise errors.make(errors.InvalidArgument, "named_parameters",
                                  "parameter '%s' is not among the optimizer's parameters." % n,
                                  "pass the named_parameters() of the model whose parameters() the optimizer was built with.")
            if id(p) in seen:
                raise errors.make(errors.InvalidArgument, "named_parameters", "parameter '%s' is listed twice." % n,
                                  "pass each parameter once (model.named_parameters() does).")
            seen.add(id(p))
            if p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda"):
                raise errors.make(errors.InvalidArgument, "named_parameters",
                                  "parameter '%s' is %s on %s; gflow.torch exchanges float32 gradients on the CPU or on a CUDA device." %
                                  (n, p.dtype, p.device), "keep the model in float32 (model.float()), on the CPU or on gflow.torch.device().")
        missing = [p for p in in_groups if p.requires_grad and id(p) not in seen]
        if missing:
            raise errors.make(errors.InvalidArgument, "named_parameters",
                              "%d of the optimizer's parameters are not in named_parameters; their gradients would not be exchanged." % len(missing),
                              "pass model.named_parameters() of the whole model the optimizer trains.")
        self._names = [n for n, _ in named]
        self._gparams = [p for _, p in named]
        self._device = self._device_of(named)
        on_device = self._device.type == "cuda"
        if on_device:
            from . import _device_world
            _device_world(self._device)
        self._exchanger = _capi.Exchanger(composition, self._names, [list(p.shape) for p in self._gparams],
                                           find_unused=find_unused, learn_order=learn_order, uneven_inputs=uneven_inputs,
                                           threshold_bytes=threshold_bytes, on_device=on_device)
        self._exchanger.configure(float(sparsifier_momentum), int(warmup))
        self.composition = self._exchanger.name
        self.find_unused = find_unused
        self.last_status = None
        self._synchronized = False
        self.skipped = 0
        self._hooks_seen = []   # layout indices in the order the hooks fired this pass (hook order tests)
        self._accumulators = []
        self._handles = []
        self._bind()
        for i, p in enumerate(self._gparams):
            # ready(i) once AccumulateGrad has written the gradient into the pool: a hook on the
            # accumulator node (torch 1.13 has no post-accumulate hook on the tensor; Horovod does the same).
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._handles.append(acc.register_hook(self._make_hook(i)))
            self._accumulators.append(acc)  # the node must stay alive for the hook to stay
        _live.add(self)

    @staticmethod
    def _device_of(named):
        """The one device every parameter lives on (CUDA needs the library's device menu)."""
        devices = sorted({str(p.device) for _, p in named})
        if len(devices) > 1:
            raise errors.make(errors.InvalidArgument, "named_parameters", "the parameters live on %s; one exchanger pools them on one device."
                              % ", ".join(devices), "move the whole model to one device (model.to(gflow.torch.device())).")
        dev = named[0][1].device if named else torch.device("cpu")
        if dev.type == "cuda":
            _capi.require_cuda("the parameters live on %s" % dev, "train on the CPU")
        return dev

    def _stream(self):
        """torch's current CUDA stream on the pool's device (an integer cudaStream_t), or None on the CPU."""
        if self._device.type != "cuda":
            return None
        return torch.cuda.current_stream(self._device).cuda_stream or None  # the legacy default stream is 0: pass NULL

    # ---- the pool ------------------------------------------------------------------------
    def _pool_tensor(self):
        pool = self._exchanger.pool()
        if isinstance(pool, _capi.CudaPoolView):
            return torch.as_tensor(pool, device=torch.device("cuda", pool.device))
        return torch.from_numpy(pool)

    def _bind(self, moved=False):
        """.grad of every parameter = its slot in the exchanger's pool (zero copy). At construction a
        .grad that exists is copied in; after a move (moved=True) the exchanger has moved the values."""
        self._pool = self._pool_tensor()
        self._generation = self._exchanger.generation
        offsets = self._exchanger.offsets()
        self._views = []
        for p, off in zip(self._gparams, offsets):
            v = self._pool.narrow(0, off, p.numel()).view(p.shape)
            if not moved and p.grad is not None and p.grad.data_ptr() != v.data_ptr():
                v.copy_(p.grad)
            p.grad = v
            self._views.append(v)

    def _rebind_if_moved(self):
        moved = self._exchanger.generation != self._generation
        if moved:
            self._bind(moved=True)  # learn_order / load_state moved the views; the exchanger moved the values
        relay = getattr(self, "_relay_shard", None)
        if relay is not None and (moved or self._shard_moved()):
            relay()  # ShardedOptimizer: its weights and shard views follow the new layout or shard

    def _make_hook(self, i):
        def hook(*unused):
            p, v = self._gparams[i], self._views[i]
            if p.grad is None or p.grad.data_ptr() != v.data_ptr():
                # autograd replaced .grad (zero_grad(set_to_none=True), an assignment): copy it in and re-bind
                if p.grad is not None:
                    v.copy_(p.grad)
                p.grad = v
            self._hooks_seen.append(i)
            self._exchanger.ready(i, self._stream())
        return hook

    # ---- the optimizer -------------------------------------------------------------------
    def synchronize(self):
        """finish(): the averaged gradients in every .grad (identical bits on every rank)."""
        status = self._exchanger.finish(self._stream())
        self._rebind_if_moved()
        self.last_status = status
        self._hooks_seen = []
        self._synchronized = True
        return status

    def step(self, closure=None):
        """finish() (unless synchronize() was called since the last step), then the wrapped
        optimizer's step; skipped on every rank when the exchanged gradients hold inf / NaN."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        status = self.last_status if self._synchronized else self.synchronize()
        self._synchronized = False
        if not status.finite():
            self.skipped += 1  # every rank saw the same non-finite count: every rank skips
            return loss
        super(self.__class__, self).step()
        return loss

    def zero_grad(self, set_to_none=False):
        """Zeroes the pool in place (the .grad views stay bound; set_to_none is ignored)."""
        self._pool.zero_()
        for p, v in zip(self._gparams, self._views):
            if p.grad is None or p.grad.data_ptr() != v.data_ptr():
                p.grad = v

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backward passes inside the block add into .grad and exchange
        nothing; the first backward after it exchanges the sum (then step())."""
        self._exchanger.begin_no_sync()
        try:
            yield
        finally:
            self._exchanger.end_no_sync()
            self._hooks_seen = []

    def join(self):
        """Uneven inputs (uneven_inputs=True, dense compositions): this rank is out of data. It
        shadows the other ranks' iterations until every rank has joined, then takes the parameters
        and optimizer state of the last rank that trained. Returns gflow's JoinStatus. Broadcast
        other state (batch norm buffers) from status.last_rank yourself. A ShardedOptimizer steps
        its shard after each shadowed iteration instead (the average of the ranks that trained),
        so every rank ends with the same parameters and its own shard's state."""
        from . import broadcast_parameters, broadcast_optimizer_state
        if self._exchanger.sharded:
            # ShardedOptimizer: this rank still owns a shard. After each iteration it shadows, it
            # steps the shard and gathers, as the training ranks' step() does, so every rank ends
            # with the same parameters and keeps its own shard's state: nothing to broadcast.
            step = super(self.__class__, self).step

            def after_each(status):
                self._rebind_if_moved()  # a join before the first finish(): learn_order may have laid the pool out
                if status.finite():  # the training ranks skip a non-finite step too
                    step()
                else:
                    self.skipped += 1
            status = self._exchanger.join(step=after_each, stream=self._stream())
            self._rebind_if_moved()
            return status
        status = self._exchanger.join(stream=self._stream())
        self._rebind_if_moved()
        broadcast_parameters(self._gparams, status.last_rank)
        broadcast_optimizer_state(self, status.last_rank)
        return status

    def save_state(self, path=None):
        """The exchanger's checkpoint (residuals, schedules, learned order, ...) as bytes; written
        to `path` too if given. Every rank saves its own (residuals differ per rank). Save the model
        and the optimizer's state_dict() as usual besides."""
        data = self._exchanger.save_state()
        if path is not None:
            with open(path, "wb") as f:
                f.write(data)
        return data

    def load_state(self, data_or_path):
        """Restores what save_state wrote on this rank (bytes or a path). A ShardedOptimizer whose
        optimizer has state refuses a state of another pool order (its state is per element of the
        shard that order gives): UsageError('load_state'), and nothing is loaded."""
        data = data_or_path
        if not isinstance(data, (bytes, bytearray)):
            with open(data_or_path, "rb") as f:
                data = f.read()
        held = getattr(self, "_shard_state_held", None)
        backup = self._exchanger.save_state() if held is not None and held() else None
        self._exchanger.load_state(bytes(data))
        if backup is not None and (self._exchanger.generation != self._generation or self._shard_moved()):
            self._put_back(backup)  # back to the order the optimizer's state is of
            raise errors.make(errors.UsageError, "load_state",
                              "the state was saved over another pool order (learn_order) than this sharded optimizer's, whose "
                              "optimizer state is per element of its shard in this order; nothing was loaded.",
                              "load it before the first step, or load a state saved by a job with the same learned order.")
        self._rebind_if_moved()

    @property
    def parameter_names(self):
        return list(self._names)

    def buckets(self):
        """The exchanger's buckets as (first pool element, element count), in pool order."""
        return self._exchanger.buckets()

    def pool_offsets(self):
        return self._exchanger.offsets()

    def close(self):
        """Removes the hooks and frees the exchanger; each .grad becomes a copy of its view."""
        self._close()

    def _close(self):
        for h in getattr(self, "_handles", []):
            h.remove()
        self._handles = []
        if getattr(self, "_exchanger", None) is not None:
            for p in self._gparams:
                p.grad = None if p.grad is None else p.grad.clone()  # off the pool before it goes
            inner = getattr(self, "inner", None)  # ShardedOptimizer: its shard views' .grad are slices of the pool too
            for g in (inner.param_groups if inner is not None else []):
                for w in g["params"]:
                    w.grad = None
            self._views = []
            self._pool = None
            self._exchanger = None


def DistributedOptimizer(optimizer, named_parameters=None, composition="dense", find_unused=False, learn_order=False,
                         uneven_inputs=False, sparsifier_momentum=0.0, warmup=0, threshold_bytes=None):
    """Wraps `optimizer` so that its gradients are exchanged by the gflow composition named `composition`.

    named_parameters: model.named_parameters() (the order is the layout order; give it in forward order).
    composition: a name from gflow.torch.compositions(), e.g. "fp16+fusion=4MiB+topk=0.01+funneled".
    find_unused: parameters a pass does not use are exchanged as zeros (else finish() raises UsageError).
    learn_order: lay the pool out in the order the hooks fire in the first iteration (rank 0's).
    uneven_inputs: allows join() (dense compositions).
    sparsifier_momentum, warmup: CSC's momentum correction and warm-up; TopK/GTopK's warm-up densities.
    threshold_bytes: re-plans the composition's buckets at this threshold (set_fusion; not with fusion=auto).
    """
    from . import is_initialized
    if not is_initialized():
        raise errors.make(errors.UsageError, "init", "gflow.torch.init() has not been called in this process.",
                          "call gflow.torch.init() once, before DistributedOptimizer.")
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items() if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    opt = cls.__new__(cls)
    opt.__dict__.update(optimizer.__dict__)
    opt._gflow_init(named_parameters, composition, find_unused, learn_order, uneven_inputs, sparsifier_momentum, warmup, threshold_bytes)
    return opt


def _set_dir(root, iteration):
    """gflow::checkpoint_set_dir: the set saved after `iteration` iterations under root."""
    import os
    return os.path.join(str(root), "iter-%012d" % iteration)


def _same(a, b):
    """Equal state values: tensors element by element (and shape), anything else by ==."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
    return a == b


class _ShardedStep(torch.optim.Optimizer):
    """What ShardedOptimizer wraps in a DistributedOptimizer. Until _shard() it is an optimizer over the
    model's parameters (DistributedOptimizer checks them against named_parameters); _shard() then lays
    the parameters out like the pool in one weights tensor (each parameter's .data a view of it), makes
    one flat view per range of this rank's shard, gives each the matching slice of the gradient pool as
    .grad, and builds the user's optimizer over those views only: its state is 1/P of the model's.
    step() steps them and gather_shards() brings every rank's stepped shard into the weights."""

    def __init__(self, params, optimizer_class, optimizer_kwargs):
        super().__init__(params, {})
        self._inner_class = optimizer_class
        self._inner_kwargs = dict(optimizer_kwargs)

    def _shard(self):
        ex = self._exchanger
        if not ex.sharded:
            name = ex.name
            self._close()
            raise errors.make(errors.InvalidArgument, "composition",
                              "ShardedOptimizer needs a composition with Sharding<ReduceScatter>; '%s' has no 'shard'." % name,
                              "pass e.g. composition=\"fusion=4MiB+shard\" (gflow.torch.compositions() lists the menu).")
        self.inner = self._inner_class(self._lay_out(), **self._inner_kwargs)
        # The user's optimizer is the one that steps: its groups and state are this object's
        # (learning-rate schedulers, state_dict() of this rank's shard).
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state
        self.defaults = self.inner.defaults

    @torch.no_grad()
    def _lay_out(self):
        """The weights laid out like the pool (the parameters' .data views of them, their values
        kept) and one flat view per non-empty range of this rank's shard, its .grad the pool's slice."""
        ex = self._exchanger
        weights = torch.empty(self._pool.numel(), dtype=torch.float32, device=self._pool.device)
        for p, off in zip(self._gparams, ex.offsets()):
            n = p.numel()
            weights.narrow(0, off, n).copy_(p.detach().reshape(-1))
            p.data = weights.narrow(0, off, n).view(p.shape)
        self._weights = weights
        self._shard_ranges = [tuple(r) for r in ex.shard()]
        shard_views = []
        for first, end in ex.shard():
            if end > first:
                w = weights.narrow(0, first, end - first)
                w.grad = self._pool.narrow(0, first, end - first)
                shard_views.append(w)
        return shard_views

    def _shard_state_held(self):
        """Whether the optimizer holds state (None entries, e.g. SGD's momentum_buffer without
        momentum on torch 1.13, are none)."""
        return any(v is not None for st in self.inner.state.values() for v in st.values())

    def _shard_moved(self):
        """Whether the exchanger's shard is no longer the one the views were cut from (buckets
        re-planned by a load_state, say), which the pool's generation does not count."""
        return [tuple(r) for r in self._exchanger.shard()] != self._shard_ranges

    def _put_back(self, backup):
        """The exchanger's state `backup` (saved before a load) again: the pool order and shard the
        views were cut from. The pool tensor is re-bound, and each shard view's .grad with it."""
        self._exchanger.load_state(backup)
        self._bind(moved=True)
        ranges = [(f, e) for f, e in self._exchanger.shard() if e > f]
        for w, (f, e) in zip(self._shard_views(), ranges):
            w.grad = self._pool.narrow(0, f, e - f)

    def _relay_shard(self):
        """After learn_order's first finish() (or a load_state of another order before the first step)
        laid the pool out anew: the weights and the shard views follow. The optimizer has no state yet
        (load_state refuses a new order once it has: the state is per element of the old shard)."""
        assert not self._shard_state_held(), "a pool move with optimizer state (load_state checks this first)"
        groups = self.inner.param_groups
        if len(groups) != 1:
            raise errors.make(errors.UsageError, "param_groups", "the sharded optimizer has %d parameter groups; it builds one." % len(groups),
                              "leave param_groups as ShardedOptimizer built them (one group over the shard).")
        groups[0]["params"] = self._lay_out()  # the group's settings (lr as a scheduler set it) stay
        self.inner.state.clear()

    @torch.no_grad()
    def step(self, closure=None):
        self.inner.step()
        self._exchanger.gather_shards((self._weights.data_ptr(), self._weights.numel()), self._stream())  # ours: contiguous float32

    def _shard_views(self):
        return list(self.inner.param_groups[0]["params"])

    def save_checkpoint(self, root):
        """gflow's checkpoint set with this rank's shard of the optimizer state (every rank, between
        the same iterations): root/iter-<n>/rank-<r>.gflow (the exchanger), shard-<r>.gflow (each
        per-element state tensor, e.g. momentum_buffer or Adam's exp_avg / exp_avg_sq, packed over
        the shard) and optim-<r>.pt (the per-parameter state that is not per element, such as Adam's
        step, identical over the shard's views, and the groups' settings). load_checkpoint reads it
        on any number of ranks. The model's parameters are saved as usual (model.state_dict()).
        Returns the rank file's path."""
        import os
        views = self._shard_views()
        state = [{k: v for k, v in self.inner.state.get(w, {}).items() if v is not None} for w in views]  # None: no state (SGD without momentum)
        keys, scalars = [], {}
        for k, v in (state[0].items() if views else ()):
            if torch.is_tensor(v) and v.shape == views[0].shape and v.dtype == torch.float32:
                keys.append(k)
            else:
                scalars[k] = v
        for st in state:
            if sorted(st.keys()) != sorted(keys + list(scalars.keys())) or not all(_same(st[k], v) for k, v in scalars.items()):
                raise errors.make(errors.UsageError, "state",
                                  "the shard's views hold different state (keys, or per-parameter values such as a step count); "
                                  "a checkpoint packs one array per key over the whole shard.",
                                  "step every view together (ShardedOptimizer.step() does), then save.")
        arrays = [torch.cat([st[k].reshape(-1) for st in state]).cpu().numpy() for k in keys]
        ex = self._exchanger
        set_dir = _set_dir(root, ex.iteration)
        os.makedirs(set_dir, exist_ok=True)
        side = os.path.join(set_dir, "optim-%d.pt" % _capi.rank())
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.inner.param_groups]
        torch.save({"keys": keys, "scalars": scalars, "groups": groups}, side + ".tmp")
        os.replace(side + ".tmp", side)  # before the rank file, as the shard file: a complete set has both
        return ex.save_checkpoint(str(root), arrays)

    def load_checkpoint(self, root):
        """Loads the newest complete set under root that save_checkpoint wrote, on this job's number of
        ranks or another (the exchanger's state and the shard state re-shard as gflow::load_checkpoint
        does): the optimizer's per-element state over this rank's new shard, its other state and the
        groups' settings (rank 0's optim-0.pt: rank 0's shard is never empty). Returns the iteration
        it resumes at. On an error nothing is loaded: the exchanger and the optimizer keep their
        state. Load the model's parameters as usual."""
        import os
        ex = self._exchanger
        backup = ex.save_state()
        held = dict(self.inner.state)
        self.inner.state.clear()
        try:
            it, arrays = ex.load_checkpoint(str(root), True)
            side = os.path.join(_set_dir(root, it), "optim-0.pt")
            if not os.path.exists(side):
                raise errors.make(errors.InvalidArgument, "root", "the checkpoint set '%s' has no optim-0.pt; nothing was loaded." % os.path.dirname(side),
                                  "load a set that ShardedOptimizer.save_checkpoint wrote.")
            meta = torch.load(side, weights_only=False)  # gflow's own file in the trainer's checkpoint set (torch 1.13's weights-only reader refuses floats)
            if len(meta["keys"]) != len(arrays):
                raise errors.make(errors.MismatchError, "root",
                                  "optim-0.pt names %d state arrays; the shard files hold %d; nothing was loaded." % (len(meta["keys"]), len(arrays)),
                                  "load a set whose files all come from one save.")
        except Exception:
            self._put_back(backup)
            self.inner.state.update(held)
            raise
        self._rebind_if_moved()
        for g, saved in zip(self.inner.param_groups, meta["groups"]):
            g.update(saved)
        at = 0
        for w in self._shard_views():
            n = w.numel()
            st = {k: torch.from_numpy(a[at:at + n].copy()).view(w.shape).to(w.device) for k, a in zip(meta["keys"], arrays)}
            for k, v in meta["scalars"].items():
                st[k] = v.clone() if torch.is_tensor(v) else v
            if st:
                self.inner.state[w] = st
            at += n
        self._synchronized = False
        return it

    def state_bytes(self):
        """The optimizer state this rank holds, counted: the bytes of every tensor in its state."""
        return sum(v.numel() * v.element_size() for st in self.inner.state.values() for v in st.values() if torch.is_tensor(v))


def ShardedOptimizer(optimizer_class, named_parameters, composition="fusion=4MiB+shard", find_unused=False, uneven_inputs=False,
                     learn_order=False, **optimizer_kwargs):
    """ZeRO-2 over a gflow composition with Sharding<ReduceScatter> ('shard' in its name).

    optimizer_class(params, **optimizer_kwargs) is built over this rank's shard of the parameters only
    (flat views of a pool-shaped weights tensor that the model's parameters now live in), so its
    state (momentum, Adam's moments) is 1/P of the model's. step(): the reduce-scatter's average in
    this rank's shard of each .grad (the rest of .grad is unspecified), the step of the shard, then
    gather_shards of the weights: every rank holds every parameter again. Everything else is
    DistributedOptimizer's (zero_grad, no_sync, synchronize, the hooks); with uneven_inputs=True a rank
    out of data calls join(), which steps its shard after each iteration it shadows. learn_order=True
    lays the pool out in the order the hooks fire in the first iteration; the weights and the shard
    follow it at that first step, before the optimizer has state. A load_state that lays the pool
    out in another order after the first step raises UsageError('load_state').

        opt = gt.ShardedOptimizer(torch.optim.SGD, model.named_parameters(), lr=0.1, momentum=0.9)
    """
    named = list(named_parameters)
    host = _ShardedStep([p for _, p in named if isinstance(p, torch.Tensor) and p.requires_grad], optimizer_class, optimizer_kwargs)
    opt = DistributedOptimizer(host, named, composition=composition, find_unused=find_unused, uneven_inputs=uneven_inputs,
                               learn_order=learn_order)
    opt._shard()
    return opt


class CSCSGD(torch.optim.Optimizer):
    """Momentum SGD with CSC's update rule (gflow::optim::momentum_sgd; GradientFlow (Sun et al.), Algorithm 1):
    for the chunks the exchange selected, u = hu = momentum * hu + lr * g and w -= u; the chunks
    kept back are left alone (weights and velocity). Wrap it in DistributedOptimizer with a csc=...
    composition (it reads the selection from the exchanger); sparsifier_momentum=momentum gives
    CSC's momentum correction, as the libtorch trainer does."""

    def __init__(self, params, lr, momentum=0.9):
        if not lr >= 0.0:
            raise errors.make(errors.InvalidArgument, "learning_rate", "the learning rate must be finite and non-negative (got %r)." % lr,
                              "pass e.g. 0.1 (gflow descends: w -= u).")
        if not 0.0 <= momentum < 1.0:
            raise errors.make(errors.InvalidArgument, "momentum", "the SGD momentum must lie in [0, 1) (got %r)." % momentum, "pass e.g. 0.9.")
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self, closure=None):
        ex = getattr(self, "_exchanger", None)
        if ex is None or ex.chunk_elems() == 0:
            raise errors.make(errors.UsageError, "CSCSGD", "CSCSGD steps the chunks a CSC exchange selected; this optimizer has no CSC exchanger.",
                              "wrap it: gflow.torch.DistributedOptimizer(CSCSGD(...), model.named_parameters(), composition=\"csc=4096:15\").")
        chunk = ex.chunk_elems()
        dev = self._pool.device
        selected = torch.zeros(self._pool.numel(), dtype=torch.bool, device=dev)
        chosen = torch.tensor(ex.selected_chunks(), dtype=torch.long, device=dev)
        if chosen.numel():
            starts = chosen * chunk
            idx = (starts.unsqueeze(1) + torch.arange(chunk, device=dev).unsqueeze(0)).reshape(-1)
            selected[idx[idx < selected.numel()]] = True
        group = self.param_groups[0]
        lr, m = group["lr"], group["momentum"]
        for p, off in zip(self._gparams, ex.offsets()):
            mask = selected.narrow(0, off, p.numel()).view(p.shape)
            state = self.state[p]
            if "csc_velocity" not in state:
                state["csc_velocity"] = torch.zeros_like(p)
            hu = state["csc_velocity"]
            hu.copy_(torch.where(mask, m * hu + lr * p.grad, hu))
            p.sub_(torch.where(mask, hu, torch.zeros_like(hu)))
