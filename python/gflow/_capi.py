"""gflow's exchangers over MPI and NCCL, through the C ABI of libgflow_capi.so (python/src/capi.h) and ctypes.

gflow.torch is the interface; this module is its binding. The library depends on no Python version,
so one build loads in any Python 3 with NumPy (and torch, for gflow.torch). ctypes releases the GIL
around every call into the library. Buffers cross without a copy: pool() is a NumPy array over the
exchanger's own memory (a device exchanger's: an object with __cuda_array_interface__, which
torch.as_tensor wraps), and it keeps the exchanger alive.

Which library: GFLOW_CAPI_LIBRARY when set; else libgflow_capi_cuda.so (the host menu and the device
menu) when it sits next to this file and loads; else libgflow_capi.so (host memory only).
"""
import ctypes
import os

import numpy

from . import errors

_u64, _i32, _i64 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
_p_u64, _p_u32, _p_f32 = ctypes.POINTER(_u64), ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_float)
_cstr = ctypes.c_char_p


class _Status(ctypes.Structure):
    _fields_ = [("iteration", _u64), ("nonfinite", _u64), ("collectives", _u64), ("wire_bytes", _u64), ("contributors", _i32),
                ("unused", _p_u64), ("unused_count", _u64)]


class _Join(ctypes.Structure):
    _fields_ = [("shadowed", _u64), ("last_rank", _i32)]


_STEP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Status), ctypes.c_void_p)


_cuda_unloaded = ""  # why libgflow_capi_cuda.so was not loaded (empty: it was, or it is not there)


def _open(path):
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # RTLD_GLOBAL: Open MPI's plugins resolve MPI's symbols through it


def _open_library():
    global _cuda_unloaded
    explicit = os.environ.get("GFLOW_CAPI_LIBRARY")
    here = os.path.dirname(os.path.abspath(__file__))
    if not explicit:
        cuda = os.path.join(here, "libgflow_capi_cuda.so")
        if os.path.exists(cuda):
            try:
                return cuda, _open(cuda)
            except OSError as e:  # e.g. no CUDA runtime or NCCL on this machine: host memory only
                _cuda_unloaded = "%s did not load (%s)" % (cuda, e)
    path = explicit or os.path.join(here, "libgflow_capi.so")
    try:
        return path, _open(path)
    except OSError as e:
        raise ImportError("gflow: cannot load %s (%s)%s. Build it (cmake --build <build> --target gflow_python, or pip install .) "
                          "and import gflow from <build>/python, or set GFLOW_CAPI_LIBRARY to the library's path."
                          % (path, e, "; " + _cuda_unloaded if _cuda_unloaded else "")) from e


def _load():
    path, lib = _open_library()
    sig = {
        "gflow_capi_version": (ctypes.c_int, []),
        "gflow_last_error": (None, [ctypes.POINTER(_cstr)] * 5),
        "gflow_init": (ctypes.c_int, []),
        "gflow_initialized": (ctypes.c_int, []),
        "gflow_finalize": (ctypes.c_int, []),
        "gflow_abort": (None, [ctypes.c_int]),
        "gflow_rank": (ctypes.c_int, [ctypes.POINTER(_i32)]),
        "gflow_size": (ctypes.c_int, [ctypes.POINTER(_i32)]),
        "gflow_local_rank": (ctypes.c_int, [ctypes.POINTER(_i32), ctypes.POINTER(_i32)]),
        "gflow_cuda_support": (ctypes.c_int, [ctypes.POINTER(_i32), ctypes.POINTER(_i32)]),
        "gflow_device_init": (ctypes.c_int, [_cstr, _i32, ctypes.POINTER(_cstr), ctypes.POINTER(_i32)]),
        "gflow_menu_size": (_u64, []),
        "gflow_menu_entry": (ctypes.c_int, [_u64, ctypes.POINTER(_cstr), ctypes.POINTER(_cstr), ctypes.POINTER(ctypes.c_uint32)]),
        "gflow_canonical_name": (ctypes.c_int, [_cstr, ctypes.POINTER(_cstr)]),
        "gflow_broadcast": (ctypes.c_int, [ctypes.c_void_p, _u64, _i32]),
        "gflow_broadcast_bytes": (ctypes.c_int, [ctypes.c_char_p, _u64, _i32, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_u64)]),
        "gflow_allreduce_average": (ctypes.c_int, [ctypes.c_void_p, _u64]),
        "gflow_verify_replicas": (ctypes.c_int, [ctypes.c_void_p, _u64, ctypes.POINTER(_cstr), ctypes.POINTER(_u64), _u64]),
        "gflow_timeline_new": (ctypes.c_int, [_u64, ctypes.POINTER(ctypes.c_void_p)]),
        "gflow_timeline_free": (None, [ctypes.c_void_p]),
        "gflow_timeline_start": (ctypes.c_int, [ctypes.c_void_p]),
        "gflow_timeline_write": (ctypes.c_int, [ctypes.c_void_p, _cstr]),
        "gflow_timeline_size": (_u64, [ctypes.c_void_p]),
        "gflow_exchanger_new": (ctypes.c_int, [_cstr, _i32, _u64, ctypes.POINTER(_cstr), ctypes.POINTER(_u64), ctypes.POINTER(_u64), _i32, _i32, _i32,
                                               _i32, _i64, ctypes.POINTER(ctypes.c_void_p)]),
        "gflow_exchanger_free": (None, [ctypes.c_void_p]),
        "gflow_pool": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_p_f32), ctypes.POINTER(_u64)]),
        "gflow_offsets": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_p_u64), ctypes.POINTER(_u64)]),
        "gflow_ready": (ctypes.c_int, [ctypes.c_void_p, _u64, ctypes.c_void_p]),
        "gflow_finish": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_Status)]),
        "gflow_begin_no_sync": (ctypes.c_int, [ctypes.c_void_p]),
        "gflow_end_no_sync": (ctypes.c_int, [ctypes.c_void_p]),
        "gflow_join": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, _STEP, ctypes.c_void_p, ctypes.POINTER(_Join)]),
        "gflow_counters": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
        "gflow_describe": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_cstr), ctypes.POINTER(_i32), ctypes.POINTER(_i32), ctypes.POINTER(_i32)]),
        "gflow_shard": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_p_u64), ctypes.POINTER(_u64)]),
        "gflow_buckets": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_p_u64), ctypes.POINTER(_u64)]),
        "gflow_gather_shards": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, _u64, ctypes.c_void_p]),
        "gflow_save_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_u64)]),
        "gflow_load_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, _u64]),
        "gflow_save_checkpoint": (ctypes.c_int, [ctypes.c_void_p, _cstr, _u64, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_u64),
                                                 ctypes.POINTER(_cstr)]),
        "gflow_load_checkpoint": (ctypes.c_int, [ctypes.c_void_p, _cstr, _i32, ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
        "gflow_loaded_array": (ctypes.c_int, [_u64, ctypes.POINTER(_p_f32), ctypes.POINTER(_u64)]),
        "gflow_selected_chunks": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_p_u32), ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
        "gflow_configure": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_double, _u64]),
        "gflow_set_timeline": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
        "gflow_run_iterations": (ctypes.c_int, [ctypes.c_void_p, _u64, ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    if lib.gflow_capi_version() != 2:
        raise ImportError("gflow: %s speaks C ABI version %d; this gflow package expects 2. Rebuild the library from the same checkout."
                          % (path, lib.gflow_capi_version()))
    return path, lib


library_path, _lib = _load()


def _raise_last():
    fields = [_cstr() for _ in range(5)]
    _lib.gflow_last_error(*[ctypes.byref(f) for f in fields])
    cls, kind, subject, message, fix = [(f.value or b"").decode("utf-8", "replace") for f in fields]
    if cls in ("RuntimeError", "StepFailed"):
        raise RuntimeError(message)
    raise getattr(errors, cls, errors.Error)(message, kind, subject, fix)


def _call(rc):
    if rc != 0:
        _raise_last()


def _text(b):
    return b.decode("utf-8")


def _u64_array(values):
    values = [int(v) for v in values]
    return (_u64 * max(len(values), 1))(*values)


def _cstr_array(values):
    return (_cstr * max(len(values), 1))(*[str(v).encode("utf-8") for v in values])


def _pairs(fn, handle):
    ptr, n = _p_u64(), _u64()
    _call(fn(handle, ctypes.byref(ptr), ctypes.byref(n)))
    return [(ptr[2 * i], ptr[2 * i + 1]) for i in range(n.value)]


def _writable(a, what):
    """(address, element count, itemsize) of a C-contiguous, writable NumPy array."""
    if not isinstance(a, numpy.ndarray) or not a.flags.c_contiguous:
        raise errors.make(errors.InvalidArgument, what, "the buffer is not contiguous.", "pass tensor.contiguous() (gflow.torch does this for you).")
    if not a.flags.writeable:
        raise errors.make(errors.InvalidArgument, what, "the buffer is read-only.", "pass a writable tensor.")
    return a.ctypes.data, a.size, a.itemsize


def _float32(a, what, call):
    ptr, n, _ = _writable(a, what)
    if a.dtype != numpy.float32:
        raise errors.make(errors.InvalidArgument, what, "%s takes float32 tensors (got %s)." % (call, a.dtype), "pass a float32 tensor.")
    return ptr, n


# ---- MPI and the world -------------------------------------------------------------------------

def init():
    """MPI_Init_thread (unless MPI is initialised already) and the world transport (collective)."""
    _call(_lib.gflow_init())


def initialized():
    return bool(_lib.gflow_initialized())


def finalize():
    _call(_lib.gflow_finalize())


def abort(code):
    """MPI_Abort on the world: ends every rank (a failed test must not leave the others in a collective)."""
    _lib.gflow_abort(int(code))


def rank():
    out = _i32()
    _call(_lib.gflow_rank(ctypes.byref(out)))
    return out.value


def size():
    out = _i32()
    _call(_lib.gflow_size(ctypes.byref(out)))
    return out.value


def local_rank():
    """(this rank among its node's ranks, the node's rank count)."""
    r, n = _i32(), _i32()
    _call(_lib.gflow_local_rank(ctypes.byref(r), ctypes.byref(n)))
    return r.value, n.value


def cuda_support():
    """(whether the loaded library has the device menu, the CUDA devices this process sees, why not when it lacks it)."""
    built, devices = _i32(), _i32()
    _call(_lib.gflow_cuda_support(ctypes.byref(built), ctypes.byref(devices)))
    why = "" if built.value else (_cuda_unloaded or "%s was built without CUDA (nvcc and NCCL were not found at configure)" % library_path)
    return bool(built.value), devices.value, why


def require_cuda(what, otherwise):
    """The CUDA devices this process sees; UsageError('device') naming the library to build when the
    loaded one has no device menu (`what`: the request, `otherwise`: the way out besides building)."""
    built, devices, why = cuda_support()
    if not built:
        raise errors.make(errors.UsageError, "device", "%s, and gflow.torch has no CUDA support here: %s." % (what, why),
                          "build gflow where nvcc and NCCL are found (libgflow_capi_cuda.so), or %s." % otherwise)
    return devices


def device_init(transport="auto", device=-1):
    """The device transport (collective): ('nccl' or 'mpi', the CUDA device)."""
    chosen, dev = _cstr(), _i32()
    _call(_lib.gflow_device_init(str(transport).encode("utf-8"), int(device), ctypes.byref(chosen), ctypes.byref(dev)))
    return _text(chosen.value), dev.value


SPACES = ("cpu", "cuda/mpi", "cuda/nccl")  # bit i of a menu entry's spaces


def compositions(with_spaces=False):
    """The compositions compiled into the library: (name, C++ policies[, memory spaces])."""
    out = []
    for i in range(_lib.gflow_menu_size()):
        name, policies, spaces = _cstr(), _cstr(), ctypes.c_uint32()
        _call(_lib.gflow_menu_entry(i, ctypes.byref(name), ctypes.byref(policies), ctypes.byref(spaces)))
        entry = (_text(name.value), _text(policies.value))
        if with_spaces:
            entry += (tuple(s for b, s in enumerate(SPACES) if spaces.value >> b & 1),)
        out.append(entry)
    return out


def canonical_name(name):
    out = _cstr()
    _call(_lib.gflow_canonical_name(str(name).encode("utf-8"), ctypes.byref(out)))
    return _text(out.value)


# ---- collectives on host buffers, in place ----------------------------------------------------

def broadcast_(buffer, root=0):
    ptr, n, itemsize = _writable(buffer, "tensor")
    _call(_lib.gflow_broadcast(ptr, n * itemsize, int(root)))


def broadcast_bytes(data, root=0):
    data = bytes(data)
    out, n = ctypes.c_void_p(), _u64()
    _call(_lib.gflow_broadcast_bytes(data, len(data), int(root), ctypes.byref(out), ctypes.byref(n)))
    return ctypes.string_at(out, n.value) if n.value else b""


def allreduce_average_(buffer):
    ptr, n = _float32(buffer, "tensor", "allreduce_average_")
    _call(_lib.gflow_allreduce_average(ptr, n))


def verify_replicas(values, names, sizes):
    values = numpy.ascontiguousarray(values, dtype=numpy.float32)
    _call(_lib.gflow_verify_replicas(values.ctypes.data, values.size, _cstr_array(names), _u64_array(sizes), len(sizes)))


# ---- results ------------------------------------------------------------------------------------

class ExchangeStatus:
    """gflow::exchange_status of one finish()."""
    __slots__ = ("iteration", "nonfinite", "collectives", "wire_bytes", "contributors", "unused")

    def __init__(self, c):
        self.iteration, self.nonfinite, self.collectives = c.iteration, c.nonfinite, c.collectives
        self.wire_bytes, self.contributors = c.wire_bytes, c.contributors
        self.unused = [c.unused[i] for i in range(c.unused_count)]

    def finite(self):
        return self.nonfinite == 0


class JoinStatus:
    """gflow::join_status."""
    __slots__ = ("shadowed", "last_rank")

    def __init__(self, c):
        self.shadowed, self.last_rank = c.shadowed, c.last_rank


class Timeline:
    """gflow::timeline: a per-rank record of the exchange's events, written as a Chrome trace."""

    def __init__(self, capacity=1 << 18):
        handle = ctypes.c_void_p()
        _call(_lib.gflow_timeline_new(int(capacity), ctypes.byref(handle)))
        self._handle = handle

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.gflow_timeline_free(self._handle)
            self._handle = None

    def start(self):
        _call(_lib.gflow_timeline_start(self._handle))

    def write(self, path):
        _call(_lib.gflow_timeline_write(self._handle, os.fspath(path).encode("utf-8")))

    def __len__(self):
        return int(_lib.gflow_timeline_size(self._handle))


class _PoolView:
    """NumPy's view of the pool: __array_interface__ over the exchanger's memory, holding the exchanger."""

    def __init__(self, owner, address, n):
        self.owner = owner
        self.__array_interface__ = {"version": 3, "shape": (n,), "typestr": "<f4", "data": (address, False)}


class CudaPoolView:
    """A device exchanger's pool: __cuda_array_interface__ over its device memory, holding the exchanger
    (torch.as_tensor(view, device=...) keeps the view alive). No stream is named: the exchanger orders
    itself against the caller's stream (ready / finish take it)."""

    def __init__(self, owner, address, n, device):
        self.owner = owner
        self.device = device
        self.__cuda_array_interface__ = {"version": 3, "shape": (n,), "typestr": "<f4", "data": (address, False), "strides": None}


class Exchanger:
    """gflow::Exchanger<composition>::on<transport> (the composition by menu name): over the MPI world
    (on_device=False), or over the device transport device_init() made (on_device=True: the pool is
    CUDA memory; ready / finish / join / gather_shards take the caller's CUDA stream as an integer)."""

    def __init__(self, composition, names, shapes, find_unused=False, learn_order=False, uneven_inputs=False, average=True,
                 threshold_bytes=None, on_device=False):
        if len(names) != len(shapes):
            raise errors.make(errors.InvalidArgument, "names", "%d names for %d shapes." % (len(names), len(shapes)), "pass one name per tensor.")
        dims = [int(d) for s in shapes for d in s]
        handle = ctypes.c_void_p()
        _call(_lib.gflow_exchanger_new(str(composition).encode("utf-8"), int(bool(on_device)), len(shapes), _cstr_array(names),
                                       _u64_array([len(s) for s in shapes]), _u64_array(dims), int(bool(find_unused)), int(bool(learn_order)),
                                       int(bool(uneven_inputs)), int(bool(average)), -1 if threshold_bytes is None else int(threshold_bytes),
                                       ctypes.byref(handle)))
        self._handle = handle
        self._timeline = None
        # Fixed by the composition's type and the memory space: read once.
        name, dense, sharded, device = _cstr(), _i32(), _i32(), _i32()
        _call(_lib.gflow_describe(handle, ctypes.byref(name), ctypes.byref(dense), ctypes.byref(sharded), ctypes.byref(device)))
        self.name, self.dense, self.sharded, self.device = _text(name.value), bool(dense.value), bool(sharded.value), device.value

    def close(self):
        """Frees the exchanger now (before MPI is finalised); a pool view taken earlier must be gone."""
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.gflow_exchanger_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def pool(self):
        """The gradient pool over the exchanger's memory (no copy), alive as long as what is returned: a float32
        NumPy array (host memory), or a CudaPoolView for torch.as_tensor (device memory)."""
        ptr, n = _p_f32(), _u64()
        _call(_lib.gflow_pool(self._handle, ctypes.byref(ptr), ctypes.byref(n)))
        address = ctypes.cast(ptr, ctypes.c_void_p).value or 0
        if self.device >= 0:
            return CudaPoolView(self, address, n.value, self.device)
        return numpy.asarray(_PoolView(self, address, n.value))

    def offsets(self):
        ptr, n = _p_u64(), _u64()
        _call(_lib.gflow_offsets(self._handle, ctypes.byref(ptr), ctypes.byref(n)))
        return [ptr[i] for i in range(n.value)]

    def ready(self, i, stream=None):
        _call(_lib.gflow_ready(self._handle, int(i), stream))

    def finish(self, stream=None):
        st = _Status()
        _call(_lib.gflow_finish(self._handle, stream, ctypes.byref(st)))
        return ExchangeStatus(st)

    def begin_no_sync(self):
        _call(_lib.gflow_begin_no_sync(self._handle))

    def end_no_sync(self):
        _call(_lib.gflow_end_no_sync(self._handle))

    def join(self, step=None, stream=None):
        """step (a callable taking the iteration's ExchangeStatus, or None): run after each shadowed iteration."""
        raised = []

        def trampoline(status, _user):
            try:
                step(ExchangeStatus(status.contents))
                return 0
            except BaseException as e:  # noqa: B036 (handed back to the caller of join below)
                raised.append(e)
                return 1

        fn = _STEP(trampoline) if step is not None else ctypes.cast(None, _STEP)
        out = _Join()
        rc = _lib.gflow_join(self._handle, stream, fn, None, ctypes.byref(out))
        if rc != 0:
            if raised:
                raise raised[0]
            _raise_last()
        return JoinStatus(out)

    def _counters(self):
        generation, iteration = _u64(), _u64()
        _call(_lib.gflow_counters(self._handle, ctypes.byref(generation), ctypes.byref(iteration)))
        return generation.value, iteration.value

    @property
    def generation(self):
        return self._counters()[0]

    @property
    def iteration(self):
        return self._counters()[1]

    def shard(self):
        """This rank's shard: (first, end) pool elements per bucket (sharded compositions)."""
        return _pairs(_lib.gflow_shard, self._handle)

    def buckets(self):
        return _pairs(_lib.gflow_buckets, self._handle)

    def gather_shards(self, values, stream=None):
        """In place: this rank's shard of `values` (laid out like the pool) to every rank, the others' back (collective).
        values: a float32 NumPy array, or (address, element count) of a contiguous float32 buffer in the pool's memory."""
        if isinstance(values, tuple):
            ptr, n = values
        else:
            ptr, n = _float32(values, "values", "gather_shards")
        _call(_lib.gflow_gather_shards(self._handle, ptr, n, stream))

    def save_state(self):
        data, n = ctypes.c_void_p(), _u64()
        _call(_lib.gflow_save_state(self._handle, ctypes.byref(data), ctypes.byref(n)))
        return ctypes.string_at(data, n.value) if n.value else b""

    def load_state(self, data):
        data = bytes(data)
        _call(_lib.gflow_load_state(self._handle, data, len(data)))

    def save_checkpoint(self, root, state=()):
        """gflow::save_checkpoint: root/iter-<n>/rank-<r>.gflow (+ shard-<r>.gflow with state); the rank file's path."""
        arrays = []
        for a in state:
            if not isinstance(a, numpy.ndarray) or a.dtype != numpy.float32 or a.ndim != 1 or not a.flags.c_contiguous:
                raise errors.make(errors.InvalidArgument, "state", "save_checkpoint takes contiguous one-dimensional float32 arrays (got %s)."
                                  % (getattr(a, "dtype", type(a).__name__),), "pass each state array packed over shard(), e.g. torch.cat([...]).numpy().")
            arrays.append(a)
        ptrs = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        path = _cstr()
        _call(_lib.gflow_save_checkpoint(self._handle, os.fspath(root).encode("utf-8"), len(arrays), ptrs, _u64_array([a.size for a in arrays]),
                                         ctypes.byref(path)))
        return _text(path.value)

    def load_checkpoint(self, root, with_state=False):
        """gflow::load_checkpoint: the newest complete set under root (re-sharded on another number of ranks); (iteration, state arrays)."""
        iteration, count = _u64(), _u64()
        _call(_lib.gflow_load_checkpoint(self._handle, os.fspath(root).encode("utf-8"), int(bool(with_state)), ctypes.byref(iteration),
                                         ctypes.byref(count)))
        arrays = []
        for i in range(count.value):
            ptr, n = _p_f32(), _u64()
            _call(_lib.gflow_loaded_array(i, ctypes.byref(ptr), ctypes.byref(n)))
            arrays.append(numpy.ctypeslib.as_array(ptr, shape=(n.value,)).copy() if n.value else numpy.zeros(0, numpy.float32))
        return iteration.value, arrays

    def _chunks(self):
        ptr, n, elems = _p_u32(), _u64(), _u64()
        _call(_lib.gflow_selected_chunks(self._handle, ctypes.byref(ptr), ctypes.byref(n), ctypes.byref(elems)))
        return [ptr[i] for i in range(n.value)], elems.value

    def selected_chunks(self):
        return self._chunks()[0]

    def chunk_elems(self):
        return self._chunks()[1]

    def configure(self, momentum, warmup):
        _call(_lib.gflow_configure(self._handle, float(momentum), int(warmup)))

    def run_iterations(self, iterations, stream=None):
        """Seconds for `iterations` iterations of ready(count - 1) ... ready(0) and finish() in a C++ loop
        (the binding's yardstick: the same calls made from Python cost the binding's overhead more)."""
        out = ctypes.c_double()
        _call(_lib.gflow_run_iterations(self._handle, int(iterations), stream, ctypes.byref(out)))
        return out.value

    def set_timeline(self, timeline):
        _call(_lib.gflow_set_timeline(self._handle, None if timeline is None else timeline._handle))
        self._timeline = timeline
