#pragma once
// MPI transport: the gflow::transport concept over an MPI communicator, host buffers.
//
//   gflow::mpi::environment env(argc, argv);        // MPI_Init_thread / MPI_Finalize (RAII)
//   gflow::mpi::transport world;                     // borrows MPI_COMM_WORLD
//   auto node = world.split(color, key);             // owns the new communicator
//
// Every MPI call is checked: the communicators this transport uses get MPI_ERRORS_RETURN, and
// a failing call raises gflow::transport_error naming the operation, MPI's own error text and
// the rank. (On a borrowed communicator such as MPI_COMM_WORLD the error handler also applies
// to the caller's own calls, which then return error codes instead of aborting.) Arguments MPI would reject (peer or root outside the group, counts beyond what
// this MPI can address) raise gflow::invalid_argument before any MPI call, on the calling rank.
//
// Element types: every wire_element. fp16 and bf16 have no MPI datatype; as Horovod does, they
// travel as a committed 2-byte datatype, and sum / max / min use user-defined commutative
// MPI_Ops that widen to float (kernels::to_float), combine, and round back to nearest even
// (kernels::wire_cast). Each pairwise combine rounds, so a 16-bit sum over P ranks rounds P-1
// times; the exchanger divides before it casts so the partial sums stay in range.
//
// Counts: MPI-3 interfaces take `int` counts. With an MPI-4 library (MPI_VERSION >= 4) the
// large-count `_c` functions are used and any std::size_t count that fits MPI_Count works;
// with MPI-3 (Open MPI 4.1, e.g. Debian bookworm) a count above INT_MAX raises
// gflow::invalid_argument("count"): split the buffer, or build against an MPI-4 library.
//
// Requests: the i-forms return a request that must be passed to wait() once, with the
// buffers kept alive until then. Waiting on a default-constructed request is a no-op. MPI has
// no timeouts: a rank that never joins a collective hangs the others (run tests under a
// ctest TIMEOUT).

// The MPI-2 C++ bindings (deprecated, removed in MPI-3) are not used: skip them, so that
// gflow::mpi needs only the C library (MPI::MPI_C) and compiles without their warnings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../kernels/cast.hpp"
#include "transport.hpp"

namespace gflow::mpi {

#if defined(MPI_VERSION) && MPI_VERSION >= 4
inline constexpr bool has_large_count = true;
using count_t = MPI_Count;
#else
inline constexpr bool has_large_count = false;
using count_t = int;
#endif

namespace detail {

inline std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS || len <= 0) return "MPI error code " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}

/// Throws transport_error for a failed call. `where` is "on rank R of N" or similar.
inline void check(int rc, const char* op, const std::string& where, const char* fix = nullptr) {
  if (rc == MPI_SUCCESS) return;
  throw transport_error(op, error_text(rc) + " " + where + ".",
                        fix ? fix
                            : "check that every rank issues the same operations in the same order with matching counts, "
                              "element types and roots, and that MPI is initialised (gflow::mpi::environment).");
}

// ---- 16-bit floating-point types: committed 2-byte datatypes and user-defined ops ---------

template <class T, reduce_op Op>
void combine16(void* in, void* inout, const std::size_t n) noexcept {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = kernels::to_float(a[i]);
    const float y = kernels::to_float(b[i]);
    float r;
    if constexpr (Op == reduce_op::sum) r = x + y;
    else if constexpr (Op == reduce_op::max) r = x > y ? x : y;
    else r = x < y ? x : y;
    b[i] = kernels::wire_cast<T>(r);
  }
}

#if defined(MPI_VERSION) && MPI_VERSION >= 4
template <class T, reduce_op Op>
void user_fn(void* in, void* inout, MPI_Count* len, MPI_Datatype*) {
  combine16<T, Op>(in, inout, static_cast<std::size_t>(*len));
}
inline int op_create(void (*fn)(void*, void*, MPI_Count*, MPI_Datatype*), MPI_Op* op) { return MPI_Op_create_c(fn, 1, op); }
#else
template <class T, reduce_op Op>
void user_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine16<T, Op>(in, inout, static_cast<std::size_t>(*len));
}
inline int op_create(void (*fn)(void*, void*, int*, MPI_Datatype*), MPI_Op* op) { return MPI_Op_create(fn, 1, op); }
#endif

/// The datatype and the three ops of one 16-bit type, created on first use (thread-safe static
/// initialisation; MPI must be initialised by then). They live until the process ends: MPI
/// releases them in MPI_Finalize, and freeing them later would be an error.
template <class T>
struct types16 {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;

  types16() {
    const std::string where = std::string("while creating the ") + std::string(to_string(dtype_of_v<T>)) + " datatype";
    check(MPI_Type_contiguous(2, MPI_BYTE, &type), "MPI_Type_contiguous", where);
    check(MPI_Type_commit(&type), "MPI_Type_commit", where);
    check(op_create(&user_fn<T, reduce_op::sum>, &sum), "MPI_Op_create", where);
    check(op_create(&user_fn<T, reduce_op::max>, &max), "MPI_Op_create", where);
    check(op_create(&user_fn<T, reduce_op::min>, &min), "MPI_Op_create", where);
  }
  static const types16& get() {
    static const types16 t;
    return t;
  }
};

template <class T>
inline constexpr bool is16 = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <wire_element T>
MPI_Datatype datatype() {
  if constexpr (is16<T>) return types16<T>::get().type;
  else if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  else static_assert(sizeof(T) == 0, "gflow::mpi: no MPI datatype for this wire_element; add it to detail::datatype().");
}

template <wire_element T>
MPI_Op op(reduce_op o) {
  if constexpr (is16<T>) {
    const auto& t = types16<T>::get();
    switch (o) {
      case reduce_op::sum: return t.sum;
      case reduce_op::max: return t.max;
      case reduce_op::min: return t.min;
    }
    return t.sum;
  } else {
    switch (o) {
      case reduce_op::sum: return MPI_SUM;
      case reduce_op::max: return MPI_MAX;
      case reduce_op::min: return MPI_MIN;
    }
    return MPI_SUM;
  }
}

/// Frees an owned communicator, unless MPI is already finalized (then it is gone anyway).
struct comm_deleter {
  void operator()(MPI_Comm* c) const noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && *c != MPI_COMM_NULL) MPI_Comm_free(c);
    delete c;
  }
};

}  // namespace detail

class transport {
 public:
  using memory_space = host_memory;
  template <class E>
  static constexpr bool can_reduce = wire_element<E>;

  /// A pending operation. `op` names it in errors; a receive remembers what it expects so a
  /// short message is reported instead of silently leaving the tail of the buffer stale.
  struct request {
    MPI_Request r = MPI_REQUEST_NULL;
    const char* op = "wait";
    MPI_Datatype recv_type = MPI_DATATYPE_NULL;  // set for receives only
    count_t recv_count = 0;
    int peer = -1;
  };

  /// Borrows `comm` (it is not freed). Sets MPI_ERRORS_RETURN on it so failures come back as
  /// error codes and are raised as gflow::transport_error.
  explicit transport(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) { init(); }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  /// True for communicators made by split(), which this transport (and its copies) free.
  [[nodiscard]] bool owns_comm() const { return static_cast<bool>(owned_); }

  // ---- collectives ----------------------------------------------------------------------------
  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op o) {
    const count_t c = count(n, "all_reduce");
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Allreduce_c(MPI_IN_PLACE, buf, c, detail::datatype<T>(), detail::op<T>(o), comm_), "all_reduce");
#else
    check(MPI_Allreduce(MPI_IN_PLACE, buf, c, detail::datatype<T>(), detail::op<T>(o), comm_), "all_reduce");
#endif
  }
  template <wire_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op o) {
    const count_t c = count(n, "iall_reduce");
    request q;
    q.op = "iall_reduce";
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Iallreduce_c(MPI_IN_PLACE, buf, c, detail::datatype<T>(), detail::op<T>(o), comm_, &q.r), "iall_reduce");
#else
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, c, detail::datatype<T>(), detail::op<T>(o), comm_, &q.r), "iall_reduce");
#endif
    return q;
  }

  /// recv holds n * size() elements, rank r's block at recv + r * n.
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    const count_t c = count(n, "all_gather");
    const MPI_Datatype t = detail::datatype<T>();
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Allgather_c(send, c, t, recv, c, t, comm_), "all_gather");
#else
    check(MPI_Allgather(send, c, t, recv, c, t, comm_), "all_gather");
#endif
  }
  template <wire_element T>
  request iall_gather(const T* send, T* recv, std::size_t n) {
    const count_t c = count(n, "iall_gather");
    const MPI_Datatype t = detail::datatype<T>();
    request q;
    q.op = "iall_gather";
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Iallgather_c(send, c, t, recv, c, t, comm_, &q.r), "iall_gather");
#else
    check(MPI_Iallgather(send, c, t, recv, c, t, comm_, &q.r), "iall_gather");
#endif
    return q;
  }

  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "broadcast");
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Bcast_c(buf, c, detail::datatype<T>(), root, comm_), "broadcast");
#else
    check(MPI_Bcast(buf, c, detail::datatype<T>(), root, comm_), "broadcast");
#endif
  }
  template <wire_element T>
  request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "ibroadcast");
    request q;
    q.op = "ibroadcast";
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Ibcast_c(buf, c, detail::datatype<T>(), root, comm_, &q.r), "ibroadcast");
#else
    check(MPI_Ibcast(buf, c, detail::datatype<T>(), root, comm_, &q.r), "ibroadcast");
#endif
    return q;
  }

  /// In place: root's buf receives the reduction; the other ranks' buffers are only read.
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op o, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "reduce");
    const bool me = rank_ == root;
    const void* send = me ? MPI_IN_PLACE : static_cast<const void*>(buf);
    void* recv = me ? static_cast<void*>(buf) : nullptr;
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Reduce_c(send, recv, c, detail::datatype<T>(), detail::op<T>(o), root, comm_), "reduce");
#else
    check(MPI_Reduce(send, recv, c, detail::datatype<T>(), detail::op<T>(o), root, comm_), "reduce");
#endif
  }
  template <wire_element T>
  request ireduce(T* buf, std::size_t n, reduce_op o, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "ireduce");
    const bool me = rank_ == root;
    const void* send = me ? MPI_IN_PLACE : static_cast<const void*>(buf);
    void* recv = me ? static_cast<void*>(buf) : nullptr;
    request q;
    q.op = "ireduce";
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Ireduce_c(send, recv, c, detail::datatype<T>(), detail::op<T>(o), root, comm_, &q.r), "ireduce");
#else
    check(MPI_Ireduce(send, recv, c, detail::datatype<T>(), detail::op<T>(o), root, comm_, &q.r), "ireduce");
#endif
    return q;
  }

  void barrier() { check(MPI_Barrier(comm_), "barrier"); }

  // ---- point to point ---------------------------------------------------------------------------
  // One tag; MPI keeps messages between a pair of ranks in order. A blocking send of a large
  // message may wait for the matching receive (no buffering is promised), so order rings
  // accordingly or use isend/irecv.
  static constexpr int tag = 0x6f6c;

  template <wire_element T>
  void send(const T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    const count_t c = count(n, "send");
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Send_c(buf, c, detail::datatype<T>(), peer, tag, comm_), "send");
#else
    check(MPI_Send(buf, c, detail::datatype<T>(), peer, tag, comm_), "send");
#endif
  }
  template <wire_element T>
  void recv(T* buf, std::size_t n, int peer) {
    request q = irecv(buf, n, peer);
    q.op = "recv";
    wait(q);
  }
  template <wire_element T>
  request isend(const T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    const count_t c = count(n, "isend");
    request q;
    q.op = "isend";
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Isend_c(buf, c, detail::datatype<T>(), peer, tag, comm_, &q.r), "isend");
#else
    check(MPI_Isend(buf, c, detail::datatype<T>(), peer, tag, comm_, &q.r), "isend");
#endif
    return q;
  }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    const count_t c = count(n, "irecv");
    request q;
    q.op = "irecv";
    q.recv_type = detail::datatype<T>();
    q.recv_count = c;
    q.peer = peer;
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    check(MPI_Irecv_c(buf, c, q.recv_type, peer, tag, comm_, &q.r), "irecv");
#else
    check(MPI_Irecv(buf, c, q.recv_type, peer, tag, comm_, &q.r), "irecv");
#endif
    return q;
  }

  /// Completes r (a no-op for a default-constructed or already completed request).
  void wait(request& r) {
    if (r.r == MPI_REQUEST_NULL) return;
    const char* op = r.op;
    if (r.recv_type == MPI_DATATYPE_NULL) {
      check(MPI_Wait(&r.r, MPI_STATUS_IGNORE), op);
      return;
    }
    MPI_Status st;
    check(MPI_Wait(&r.r, &st), op);
    const MPI_Datatype type = r.recv_type;
    r.recv_type = MPI_DATATYPE_NULL;
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    MPI_Count got = 0;
    check(MPI_Get_count_c(&st, type, &got), op);
#else
    int got = 0;
    check(MPI_Get_count(&st, type, &got), op);
#endif
    if (got != r.recv_count)
      throw mismatch_error(op, "rank " + std::to_string(rank_) + " expected " + std::to_string(r.recv_count) + " elements from rank " +
                                   std::to_string(r.peer) + " but the message held " + std::to_string(got) + ".",
                           "make send and recv agree on count and element type.");
  }

  /// Collective over this group: ranks with the same color (>= 0) form a new group, ordered by
  /// (key, rank). The new communicator is owned by the returned transport and its copies.
  transport split(int color, int key) {
    if (color < 0)
      throw invalid_argument("color", "split color " + std::to_string(color) + " is negative; MPI_Comm_split needs a non-negative color.",
                             "pass a color >= 0 (every rank must get a group).");
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &out), "split");
    std::shared_ptr<MPI_Comm> owner(new MPI_Comm(out), detail::comm_deleter{});
    return transport(owner);
  }

 private:
  explicit transport(std::shared_ptr<MPI_Comm> owned) : comm_(*owned), owned_(std::move(owned)) { init(); }

  void init() {
    if (comm_ == MPI_COMM_NULL)
      throw invalid_argument("comm", "the communicator is MPI_COMM_NULL.", "pass a valid communicator such as MPI_COMM_WORLD.");
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw usage_error("comm", finalized ? "MPI is already finalized." : "MPI is not initialised.",
                        "create a gflow::mpi::environment (or call MPI_Init_thread) before any gflow::mpi::transport, "
                        "and destroy every transport before MPI_Finalize.");
    detail::check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "on a new transport");
    detail::check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "on a new transport");
    detail::check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", "on a new transport");
  }

  [[nodiscard]] std::string where() const { return "on rank " + std::to_string(rank_) + " of " + std::to_string(size_); }
  void check(int rc, const char* op) const {
    if (rc != MPI_SUCCESS) detail::check(rc, op, where());
  }

  void check_peer(int p, const char* what) const { gflow::detail::check_peer_rank(p, size_, what); }

  static count_t count(std::size_t n, const char* op) {
#if defined(MPI_VERSION) && MPI_VERSION >= 4
    if (n > static_cast<std::size_t>(std::numeric_limits<MPI_Count>::max()))
      throw invalid_argument("count", std::string(op) + ": " + std::to_string(n) + " elements exceed MPI_Count.", "split the buffer.");
    return static_cast<MPI_Count>(n);
#else
    if (n > static_cast<std::size_t>(INT_MAX))
      throw invalid_argument("count",
                             std::string(op) + ": " + std::to_string(n) + " elements exceed INT_MAX (" + std::to_string(INT_MAX) +
                                 "), the largest count this MPI-" + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION) +
                                 " library accepts (its large-count _c functions need MPI 4).",
                             "split the buffer into pieces of at most INT_MAX elements, or build against an MPI-4 library.");
    return static_cast<int>(n);
#endif
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<MPI_Comm> owned_;  // set for communicators made by split()
  int rank_ = 0;
  int size_ = 0;
};
static_assert(gflow::transport<transport>);

/// MPI_Init_thread / MPI_Finalize as an object. Requests MPI_THREAD_MULTIPLE and accepts what
/// the library provides (see provided()). If MPI was already initialised by someone else, it
/// does nothing and leaves finalising to them.
class environment {
 public:
  environment() : environment(nullptr, nullptr) {}
  environment(int& argc, char**& argv) : environment(&argc, &argv) {}
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  ~environment() {
    if (!owner_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  /// The thread level MPI provides: MPI_THREAD_SINGLE, _FUNNELED, _SERIALIZED or _MULTIPLE.
  [[nodiscard]] int provided() const noexcept { return provided_; }
  [[nodiscard]] bool thread_multiple() const noexcept { return provided_ >= MPI_THREAD_MULTIPLE; }
  /// True when this object initialised MPI and will finalise it.
  [[nodiscard]] bool owner() const noexcept { return owner_; }

 private:
  environment(int* argc, char*** argv) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
      throw usage_error("environment", "MPI was already finalized; it cannot be initialised again.",
                        "create one gflow::mpi::environment at the start of main() and keep it alive until the end.");
    if (initialized) {
      detail::check(MPI_Query_thread(&provided_), "MPI_Query_thread", "in gflow::mpi::environment");
      return;
    }
    detail::check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_), "MPI_Init_thread", "in gflow::mpi::environment",
                  "check the MPI installation and launch the program with mpiexec.");
    owner_ = true;
  }

  int provided_ = MPI_THREAD_SINGLE;
  bool owner_ = false;
};

}  // namespace gflow::mpi
