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
// buffers kept alive until then. Waiting on a default-constructed request is a no-op.
//
// Timeouts (Horovod's stall inspector idea). Every blocking wait (the blocking collectives,
// send, recv, barrier, split, wait(request)) is bounded by timeout() when it is non-zero. A
// blocking collective (all_reduce, all_gather, broadcast, reduce, barrier) is the blocking MPI
// call, made on the transport's issuing thread (call_thread.hpp) while the calling thread sleeps
// until it returns or the deadline passes; point-to-point operations and wait(request) poll
// MPI_Test. On expiry the rank asks every other rank (point to point: the peer), over a
// duplicate of the communicator kept for this, how many collectives it has started and what it
// is waiting in; ranks that are themselves waiting in gflow answer within a few milliseconds,
// and a grace period later (timeout / 5, clamped to [100 ms, 5 s]) gflow::timeout_error names
// the operation, its number and the ranks that did not arrive: those that answered from an
// earlier point and those that did not answer at all (computing outside gflow, stuck, or
// exited). The rank that gives up tells the others, so ranks waiting in the same collective fail
// at once instead of each waiting out its own timeout. MPI cannot cancel a collective: after a
// timeout the issuing thread stays blocked in it, and the transport (and copies sharing its
// communicator) refuses every further operation with transport_error; destroy it and restart
// the job (or its failed ranks).
//   The timeout comes from the constructor or set_timeout(); a transport made without one uses
// default_timeout (10 minutes). Because the timed and the untimed path make the same blocking
// calls, ranks may differ in their timeouts.
//   Why a thread (docs/DESIGN.md "Timeouts" has the figures): Open MPI's non-blocking
// collectives (libnbc) are slower than its tuned blocking ones — polling MPI_Iallreduce made
// the exchange benchmark 1.1-1.8x slower than a hand-written loop of MPI_Allreduce — and a
// blocking call cannot be bounded on the thread that makes it. The hand-off costs two thread
// wake-ups per collective (microseconds); the waiting thread takes no CPU. It needs
// MPI_THREAD_MULTIPLE (gflow::mpi::environment asks for it): the stall inspector talks on the
// control communicator while the issuing thread is inside the collective. Where MPI provides
// less, timed collectives fall back to the non-blocking call polled with MPI_Test (correct, and
// slower).
//   Constructing a transport (and split) is a collective over its communicator: it duplicates
// the communicator for the stall inspector's messages (MPI_Comm_idup, bounded by the timeout).

// The MPI-2 C++ bindings (deprecated, removed in MPI-3) are not used: skip them, so that
// gflow::mpi needs only the C library (MPI::MPI_C) and compiles without their warnings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../detail/timeout.hpp"
#include "../kernels/cast.hpp"
#include "call_thread.hpp"
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
  kernels::combine_wire<Op>(static_cast<const T*>(in), static_cast<T*>(inout), n);  // b = W(a op b), SIMD where available
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

// ---- large-count wrappers: one #if each, so the transport below reads as plain MPI ---------------

#if defined(MPI_VERSION) && MPI_VERSION >= 4
inline int allreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m) { return MPI_Allreduce_c(MPI_IN_PLACE, b, c, t, o, m); }
inline int iallreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m, MPI_Request* r) { return MPI_Iallreduce_c(MPI_IN_PLACE, b, c, t, o, m, r); }
inline int allgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m) { return MPI_Allgather_c(s, c, t, b, c, t, m); }
inline int iallgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m, MPI_Request* r) { return MPI_Iallgather_c(s, c, t, b, c, t, m, r); }
inline int bcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m) { return MPI_Bcast_c(b, c, t, root, m); }
inline int ibcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ibcast_c(b, c, t, root, m, r); }
inline int reduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m) { return MPI_Reduce_c(s, b, c, t, o, root, m); }
inline int ireduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ireduce_c(s, b, c, t, o, root, m, r); }
inline int send(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m) { return MPI_Send_c(b, c, t, peer, tag, m); }
inline int isend(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Isend_c(b, c, t, peer, tag, m, r); }
inline int irecv(void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Irecv_c(b, c, t, peer, tag, m, r); }
inline int get_count(const MPI_Status* st, MPI_Datatype t, count_t* c) { return MPI_Get_count_c(st, t, c); }
#else
inline int allreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m) { return MPI_Allreduce(MPI_IN_PLACE, b, c, t, o, m); }
inline int iallreduce(void* b, count_t c, MPI_Datatype t, MPI_Op o, MPI_Comm m, MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, b, c, t, o, m, r); }
inline int allgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m) { return MPI_Allgather(s, c, t, b, c, t, m); }
inline int iallgather(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Comm m, MPI_Request* r) { return MPI_Iallgather(s, c, t, b, c, t, m, r); }
inline int bcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m) { return MPI_Bcast(b, c, t, root, m); }
inline int ibcast(void* b, count_t c, MPI_Datatype t, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ibcast(b, c, t, root, m, r); }
inline int reduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m) { return MPI_Reduce(s, b, c, t, o, root, m); }
inline int ireduce(const void* s, void* b, count_t c, MPI_Datatype t, MPI_Op o, int root, MPI_Comm m, MPI_Request* r) { return MPI_Ireduce(s, b, c, t, o, root, m, r); }
inline int send(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m) { return MPI_Send(b, c, t, peer, tag, m); }
inline int isend(const void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Isend(b, c, t, peer, tag, m, r); }
inline int irecv(void* b, count_t c, MPI_Datatype t, int peer, int tag, MPI_Comm m, MPI_Request* r) { return MPI_Irecv(b, c, t, peer, tag, m, r); }
inline int get_count(const MPI_Status* st, MPI_Datatype t, count_t* c) { return MPI_Get_count(st, t, c); }
#endif

// ---- timeouts and the stall inspector ----------------------------------------------------------

inline constexpr std::uint64_t no_seq = ~std::uint64_t{0};
// Tags of the stall inspector's messages, on the control communicator only.
inline constexpr int tag_query = 1;   // {collective number asked about}
inline constexpr int tag_reply = 2;   // {asked, collectives started, waiting kind, waiting number, op code, peer}
inline constexpr int tag_notice = 3;  // {collective given up on, n, missing rank 1..n}

// Operation names travel as their index here.
inline constexpr const char* op_names[] = {"?",     "all_reduce", "iall_reduce", "all_gather", "iall_gather", "broadcast",
                                           "ibroadcast", "reduce", "ireduce", "barrier", "split", "send", "recv", "isend", "irecv", "wait"};
inline std::uint64_t op_code(const char* op) {
  for (std::size_t i = 1; i < std::size(op_names); ++i)
    if (std::strcmp(op, op_names[i]) == 0) return i;
  return 0;
}
inline const char* op_name(std::uint64_t code) { return code < std::size(op_names) ? op_names[code] : op_names[0]; }

/// What this rank is blocked in, as it tells an inspector.
struct waiting_info {
  std::uint64_t kind = 0;  // 0: nothing, 1: a collective, 2: send / recv
  std::uint64_t seq = no_seq;
  std::uint64_t op = 0;
  int peer = -1;
};

/// "Rank `rank` gave up on collective `seq` and found `missing` had not arrived."
struct notice {
  int rank = -1;
  std::uint64_t seq = no_seq;
  std::vector<int> missing;
};

/// Shared by a transport and its copies (they use the same communicator).
struct comm_state {
  MPI_Comm ctl = MPI_COMM_NULL;  // duplicate of the communicator: stall-inspector messages only
  std::uint64_t seq = 0;         // collectives started on the communicator
  waiting_info waiting;
  std::string broken;  // why the communicator was abandoned (after a timeout); empty while usable
  std::vector<notice> notices;
  struct outgoing {
    MPI_Request r = MPI_REQUEST_NULL;
    std::unique_ptr<std::uint64_t[]> buf;
  };
  std::list<outgoing> sends;  // control messages in flight (their buffers must outlive them)
  bool thread_multiple = false;  // MPI provides MPI_THREAD_MULTIPLE: timed collectives run on `issuer`
  std::unique_ptr<gflow::detail::call_thread> issuer;  // made on the first timed blocking collective
  std::chrono::milliseconds linger{0};                  // the transport's grace period when it was made

  comm_state() = default;
  comm_state(const comm_state&) = delete;
  comm_state& operator=(const comm_state&) = delete;
  ~comm_state() {
    // Joins the issuing thread; one still in a collective abandoned after a timeout gets `linger`
    // to return (the late ranks may be arriving now), and is detached after that.
    if (issuer) issuer->shutdown(linger);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& s : sends) {
      int done = 0;
      if (s.r != MPI_REQUEST_NULL && MPI_Test(&s.r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
        MPI_Request_free(&s.r);  // MPI completes it on its own; the few bytes it reads must stay
        (void)s.buf.release();
      }
    }
    if (ctl != MPI_COMM_NULL) MPI_Comm_free(&ctl);
  }

  /// Fire-and-forget control message (best effort: a dead peer just never gets it).
  void post(int dest, int tag, std::vector<std::uint64_t> v) {
    outgoing o;
    o.buf = std::make_unique<std::uint64_t[]>(v.size());
    std::copy(v.begin(), v.end(), o.buf.get());
    if (MPI_Isend(o.buf.get(), static_cast<int>(v.size()), MPI_UINT64_T, dest, tag, ctl, &o.r) == MPI_SUCCESS) sends.push_back(std::move(o));
  }

  /// Answers queries, collects notices, forgets completed sends. Best effort: errors are ignored
  /// (this runs while waiting for something else, which reports its own failures).
  void serve() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, tag_query, ctl, &flag, &st) != MPI_SUCCESS || !flag) break;
      std::uint64_t asked = 0;
      if (MPI_Recv(&asked, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_query, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      post(st.MPI_SOURCE, tag_reply, {asked, seq, waiting.kind, waiting.seq, waiting.op, static_cast<std::uint64_t>(waiting.peer)});
    }
    for (;;) {
      int flag = 0, n = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, tag_notice, ctl, &flag, &st) != MPI_SUCCESS || !flag) break;
      if (MPI_Get_count(&st, MPI_UINT64_T, &n) != MPI_SUCCESS || n < 2) break;
      std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
      if (MPI_Recv(v.data(), n, MPI_UINT64_T, st.MPI_SOURCE, tag_notice, ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      notice g{st.MPI_SOURCE, v[0], {}};
      for (std::size_t i = 2; i < v.size() && i - 2 < v[1]; ++i) g.missing.push_back(static_cast<int>(v[i]));
      notices.push_back(std::move(g));
    }
    for (auto it = sends.begin(); it != sends.end();) {
      int done = 0;
      if (MPI_Test(&it->r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) it = sends.erase(it);
      else ++it;
    }
  }

  [[nodiscard]] const notice* gave_up_on(std::uint64_t s) const {
    for (const auto& g : notices)
      if (g.seq == s) return &g;
    return nullptr;
  }
};

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
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

/// The timeout of transports made without one (see the header
/// comment for why timeouts are on by default).
inline constexpr std::chrono::milliseconds default_timeout = gflow::detail::default_timeout;

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
    int peer = -1;                       // send / recv: the other rank
    std::uint64_t seq = detail::no_seq;  // collectives: their number on this communicator
    dtype type = dtype::u8;              // what it moves (for timeout messages)
    std::size_t count = 0;
  };

  /// Borrows `comm` (it is not freed). Sets MPI_ERRORS_RETURN on it so failures come back as
  /// error codes and are raised as gflow::transport_error. The timeout is default_timeout.
  /// Collective over comm.
  explicit transport(MPI_Comm comm = MPI_COMM_WORLD) : transport(comm, default_timeout) {}
  /// The same with an explicit timeout for every blocking wait (0: none, plain blocking calls).
  transport(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm) {
    set_timeout(timeout);
    init();
  }

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  /// True for communicators made by split(), which this transport (and its copies) free.
  [[nodiscard]] bool owns_comm() const { return static_cast<bool>(owned_); }

  /// Bounds every later blocking wait of this transport (0: no timeout). Local: copies and
  /// sub-groups made before keep theirs; sub-groups made after inherit it.
  void set_timeout(std::chrono::milliseconds t) {
    gflow::detail::check_timeout(t);
    timeout_ = t;
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// How long a rank that timed out waits for the others to say where they are.
  [[nodiscard]] std::chrono::milliseconds grace() const noexcept {
    return std::clamp<std::chrono::milliseconds>(timeout_ / 5, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
  }
  /// After a timeout: waits up to `linger` for the collective abandoned on the issuing thread to
  /// return (it does once the late ranks arrive). True when no call of this transport is still
  /// inside MPI. Until then MPI may still write that collective's buffer: keep it (and the
  /// exchanger whose pool it is) alive until settle() returns true, or end the process.
  bool settle(std::chrono::milliseconds linger) { return !state_->issuer || state_->issuer->wait_idle(linger); }

  /// Collectives started on this communicator (the number the next one gets).
  [[nodiscard]] std::uint64_t collectives_started() const noexcept { return state_->seq; }

  // ---- collectives ----------------------------------------------------------------------------
  // The blocking forms are the blocking MPI calls, made on the issuing thread when timed (see
  // blocking()); the i-forms start the non-blocking call, completed by wait().
  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op o) {
    const count_t c = count(n, "all_reduce");
    request q = start("all_reduce", dtype_of_v<T>, n);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Op mo = detail::op<T>(o);
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return detail::allreduce(buf, c, t, mo, m); })) return;
    check(detail::iallreduce(buf, c, detail::datatype<T>(), detail::op<T>(o), comm_, &q.r), "all_reduce");
    wait(q);
  }
  template <wire_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op o) {
    const count_t c = count(n, "iall_reduce");
    request q = start("iall_reduce", dtype_of_v<T>, n);
    check(detail::iallreduce(buf, c, detail::datatype<T>(), detail::op<T>(o), comm_, &q.r), "iall_reduce");
    return q;
  }

  /// recv holds n * size() elements, rank r's block at recv + r * n.
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    const count_t c = count(n, "all_gather");
    request q = start("all_gather", dtype_of_v<T>, n);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return detail::allgather(send, recv, c, t, m); })) return;
    check(detail::iallgather(send, recv, c, detail::datatype<T>(), comm_, &q.r), "all_gather");
    wait(q);
  }
  template <wire_element T>
  request iall_gather(const T* send, T* recv, std::size_t n) {
    const count_t c = count(n, "iall_gather");
    request q = start("iall_gather", dtype_of_v<T>, n);
    check(detail::iallgather(send, recv, c, detail::datatype<T>(), comm_, &q.r), "iall_gather");
    return q;
  }

  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "broadcast");
    request q = start("broadcast", dtype_of_v<T>, n);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return detail::bcast(buf, c, t, root, m); })) return;
    check(detail::ibcast(buf, c, detail::datatype<T>(), root, comm_, &q.r), "broadcast");
    wait(q);
  }
  template <wire_element T>
  request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "ibroadcast");
    request q = start("ibroadcast", dtype_of_v<T>, n);
    check(detail::ibcast(buf, c, detail::datatype<T>(), root, comm_, &q.r), "ibroadcast");
    return q;
  }

  /// In place: root's buf receives the reduction; the other ranks' buffers are only read.
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op o, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "reduce");
    request q = start("reduce", dtype_of_v<T>, n);
    const bool me = rank_ == root;
    const void* send = me ? MPI_IN_PLACE : static_cast<const void*>(buf);
    void* recv = me ? static_cast<void*>(buf) : nullptr;
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Op mo = detail::op<T>(o);
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return detail::reduce(send, recv, c, t, mo, root, m); })) return;
    check(detail::ireduce(send, recv, c, detail::datatype<T>(), detail::op<T>(o), root, comm_, &q.r), "reduce");
    wait(q);
  }
  template <wire_element T>
  request ireduce(T* buf, std::size_t n, reduce_op o, int root) {
    check_peer(root, "root");
    const count_t c = count(n, "ireduce");
    request q = start("ireduce", dtype_of_v<T>, n);
    const bool me = rank_ == root;
    const void* send = me ? MPI_IN_PLACE : static_cast<const void*>(buf);
    void* recv = me ? static_cast<void*>(buf) : nullptr;
    check(detail::ireduce(send, recv, c, detail::datatype<T>(), detail::op<T>(o), root, comm_, &q.r), "ireduce");
    return q;
  }

  void barrier() {
    request q = start("barrier", dtype::u8, 0);
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return MPI_Barrier(m); })) return;
    check(MPI_Ibarrier(comm_, &q.r), "barrier");
    wait(q);
  }

  // ---- point to point ---------------------------------------------------------------------------
  // One tag; MPI keeps messages between a pair of ranks in order. A blocking send of a large
  // message may wait for the matching receive (no buffering is promised), so order rings
  // accordingly or use isend/irecv.
  static constexpr int tag = 0x6f6c;

  template <wire_element T>
  void send(const T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    const count_t c = count(n, "send");
    request q = start_p2p("send", dtype_of_v<T>, n, peer);
    if (!timed()) {
      check(detail::send(buf, c, detail::datatype<T>(), peer, tag, comm_), "send");
      return;
    }
    check(detail::isend(buf, c, detail::datatype<T>(), peer, tag, comm_, &q.r), "send");
    wait(q);
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
    request q = start_p2p("isend", dtype_of_v<T>, n, peer);
    check(detail::isend(buf, c, detail::datatype<T>(), peer, tag, comm_, &q.r), "isend");
    return q;
  }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    const count_t c = count(n, "irecv");
    request q = start_p2p("irecv", dtype_of_v<T>, n, peer);
    q.recv_type = detail::datatype<T>();
    q.recv_count = c;
    check(detail::irecv(buf, c, q.recv_type, peer, tag, comm_, &q.r), "irecv");
    return q;
  }

  /// Completes r (a no-op for a default-constructed or already completed request). With a
  /// timeout, raises timeout_error naming the ranks that did not arrive once it passes.
  void wait(request& r) {
    if (r.r == MPI_REQUEST_NULL) return;
    const char* op = r.op;
    refuse_if_broken(op);
    MPI_Status st;
    MPI_Status* stp = r.recv_type == MPI_DATATYPE_NULL ? MPI_STATUS_IGNORE : &st;
    if (timed()) wait_until_deadline(r, stp);
    else check(MPI_Wait(&r.r, stp), op);
    if (r.recv_type == MPI_DATATYPE_NULL) return;
    const MPI_Datatype type = r.recv_type;
    r.recv_type = MPI_DATATYPE_NULL;
    count_t got = 0;
    check(detail::get_count(&st, type, &got), op);
    if (got != r.recv_count)
      throw mismatch_error(op, "rank " + std::to_string(rank_) + " expected " + std::to_string(r.recv_count) + " elements from rank " +
                                   std::to_string(r.peer) + " but the message held " + std::to_string(got) + ".",
                           "make send and recv agree on count and element type.");
  }

  /// Collective over this group: ranks with the same color (>= 0) form a new group, ordered by
  /// (key, rank). The new communicator is owned by the returned transport and its copies, which
  /// get this transport's timeout. A barrier first (bounded by the timeout) makes sure every rank
  /// is there, since MPI_Comm_split itself cannot be polled.
  transport split(int color, int key) {
    if (color < 0)
      throw invalid_argument("color", "split color " + std::to_string(color) + " is negative; MPI_Comm_split needs a non-negative color.",
                             "pass a color >= 0 (every rank must get a group).");
    request q = start("split", dtype::u8, 0);
    check(MPI_Ibarrier(comm_, &q.r), "split");
    wait(q);
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &out), "split");
    std::shared_ptr<MPI_Comm> owner(new MPI_Comm(out), detail::comm_deleter{});
    return transport(owner, timeout_);
  }

 private:
  using clock = std::chrono::steady_clock;

  transport(std::shared_ptr<MPI_Comm> owned, std::chrono::milliseconds timeout) : comm_(*owned), owned_(std::move(owned)), timeout_(timeout) {
    init();
  }

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
    state_ = std::make_shared<detail::comm_state>();
    int level = MPI_THREAD_SINGLE;
    detail::check(MPI_Query_thread(&level), "MPI_Query_thread", "on a new transport");
    state_->thread_multiple = level >= MPI_THREAD_MULTIPLE;
    // The control communicator. MPI writes the handle when the idup completes, so on a timeout
    // its target is leaked rather than freed under MPI's feet.
    auto* ctl = new MPI_Comm(MPI_COMM_NULL);
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = MPI_Comm_idup(comm_, ctl, &r);
    if (rc != MPI_SUCCESS) {
      delete ctl;
      detail::check(rc, "MPI_Comm_idup", where());
    }
    const auto deadline = clock::now() + timeout_;
    for (;;) {
      int done = 0;
      const int trc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (trc != MPI_SUCCESS) {
        delete ctl;
        detail::check(trc, "MPI_Comm_idup", where());
      }
      if (done) break;
      if (timed() && clock::now() >= deadline)
        throw timeout_error("transport", "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                                             std::to_string(timeout_.count()) + " ms for the other ranks to construct the transport (MPI_Comm_idup).",
                            "construct the transport on every rank of the communicator (it is a collective), or raise the timeout.");
    }
    state_->ctl = *ctl;
    delete ctl;
  }

  [[nodiscard]] bool timed() const noexcept { return timeout_.count() > 0; }
  [[nodiscard]] std::string where() const { return "on rank " + std::to_string(rank_) + " of " + std::to_string(size_); }
  void check(int rc, const char* op) const {
    if (rc != MPI_SUCCESS) detail::check(rc, op, where());
  }

  void check_peer(int p, const char* what) const { gflow::detail::check_peer_rank(p, size_, what); }

  void refuse_if_broken(const char* op) const {
    if (!state_->broken.empty())
      throw transport_error(op, "rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                    ": this communicator was abandoned after a timeout (" + state_->broken + ").",
                            "destroy this transport (and whatever uses it) and restart the job or its failed ranks: MPI cannot cancel "
                            "the collective that timed out.");
  }

  /// A collective begins: refuse on a dead communicator, give it the next number.
  request start(const char* op, dtype type, std::size_t n) {
    refuse_if_broken(op);
    request q;
    q.op = op;
    q.seq = state_->seq++;
    q.type = type;
    q.count = n;
    return q;
  }
  request start_p2p(const char* op, dtype type, std::size_t n, int peer) {
    refuse_if_broken(op);
    request q;
    q.op = op;
    q.peer = peer;
    q.type = type;
    q.count = n;
    return q;
  }

  [[nodiscard]] std::string describe(const request& q) const {
    std::string s = q.seq != detail::no_seq ? "collective #" + std::to_string(q.seq) + " " : std::string();
    s += std::string(q.op) + "(" + std::to_string(q.count) + " x " + std::string(to_string(q.type));
    if (q.seq == detail::no_seq) s += std::string(q.recv_type != MPI_DATATYPE_NULL ? ", from rank " : ", to rank ") + std::to_string(q.peer);
    return s + ")";
  }

  // Runs a blocking collective. Without a timeout: on this thread. With one (and
  // MPI_THREAD_MULTIPLE): on the transport's issuing thread, while this thread sleeps until it
  // returns, wakes every service_interval() to answer stall queries and look for a notice that a
  // rank gave up on this collective, and runs the stall inspector at the deadline. Returns false
  // (nothing done) when MPI lacks MPI_THREAD_MULTIPLE: the caller then starts the non-blocking
  // form and polls it (wait_until_deadline), which is correct but slower.
  template <class Call>
  bool blocking(request& q, const Call& call) {
    if (!timed()) {
      check(call(), q.op);
      return true;
    }
    detail::comm_state& S = *state_;
    if (!S.thread_multiple) return false;
    if (!S.issuer) {
      S.issuer = std::make_unique<gflow::detail::call_thread>();
      S.linger = grace();
    }
    S.issuer->start(call);
    const auto t0 = clock::now();
    const auto deadline = t0 + timeout_;
    S.waiting = {1u, q.seq, detail::op_code(q.op), -1};
    struct idle {
      detail::comm_state& s;
      ~idle() { s.waiting = {}; }
    } reset{S};
    auto next_service = t0 + service_interval();
    for (;;) {
      int rc = MPI_SUCCESS;
      if (S.issuer->wait_until(std::min(deadline, next_service), &rc)) {
        check(rc, q.op);
        return true;
      }
      const auto now = clock::now();
      if (now >= next_service) {
        S.serve();
        if (const detail::notice* g = S.gave_up_on(q.seq)) {
          S.issuer->abandon();
          fail_after_notice(q, *g, now - t0);
        }
        next_service = now + service_interval();
      }
      if (now >= deadline) {
        S.issuer->abandon();
        stall(q);
      }
    }
  }

  // How often a rank waiting on its issuing thread answers stall queries: well inside the grace
  // period other ranks give it (>= 100 ms), rarely enough to cost nothing (a collective that
  // completes within it never wakes the waiting thread early).
  [[nodiscard]] std::chrono::milliseconds service_interval() const noexcept {
    return std::clamp<std::chrono::milliseconds>(grace() / 10, std::chrono::milliseconds(1), std::chrono::milliseconds(10));
  }

  // Polls q until it completes or the deadline passes. Every millisecond it also answers other
  // ranks' stall queries and looks for a notice that a rank gave up on this very collective.
  void wait_until_deadline(request& q, MPI_Status* st) {
    detail::comm_state& S = *state_;
    const auto t0 = clock::now();
    const auto deadline = t0 + timeout_;
    S.waiting = {q.seq == detail::no_seq ? 2u : 1u, q.seq, detail::op_code(q.op), q.peer};
    struct idle {
      detail::comm_state& s;
      ~idle() { s.waiting = {}; }
    } reset{S};
    auto next_service = t0 + std::chrono::milliseconds(1);
    for (;;) {
      int done = 0;
      check(MPI_Test(&q.r, &done, st), q.op);
      if (done) return;
      const auto now = clock::now();
      if (now >= next_service) {
        S.serve();
        if (q.seq != detail::no_seq)
          if (const detail::notice* g = S.gave_up_on(q.seq)) fail_after_notice(q, *g, now - t0);
        next_service = now + std::chrono::milliseconds(1);
      }
      if (now >= deadline) stall(q);
    }
  }

  [[noreturn]] void fail_after_notice(const request& q, const detail::notice& g, clock::duration waited) {
    const std::string missing = g.missing.empty() ? std::string("every rank had arrived") : "rank(s) " + detail::rank_list(g.missing) + " had not arrived";
    const std::string what = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) + " ms in " + describe(q) +
                             " until rank " + std::to_string(g.rank) + " gave up on it after its timeout; by then " + missing + ".";
    state_->broken = "collective #" + std::to_string(q.seq) + " " + q.op + " given up by rank " + std::to_string(g.rank);
    throw timeout_error(q.op, what, stall_fix());
  }

  static const char* stall_fix() {
    return "find out why the named ranks did not reach this operation (a crash, a different code path, a much slower rank); if they "
           "are only slow, raise the timeout (transport::set_timeout or the constructor's timeout). This transport is unusable now: destroy it "
           "and restart the job.";
  }

  // The stall inspector: ask the ranks this operation waits for where they are, give them a
  // grace period to answer, name those that did not arrive, tell the others, throw.
  [[noreturn]] void stall(const request& q) {
    detail::comm_state& S = *state_;
    const bool collective = q.seq != detail::no_seq;
    std::vector<int> targets;
    if (collective) {
      for (int r = 0; r < size_; ++r)
        if (r != rank_) targets.push_back(r);
    } else {
      targets.push_back(q.peer);
    }
    struct answer {
      std::array<std::uint64_t, 6> v{};
      MPI_Request r = MPI_REQUEST_NULL;
      bool got = false;
    };
    std::vector<answer> ans(targets.size());
    for (std::size_t i = 0; i < targets.size(); ++i) {
      S.post(targets[i], detail::tag_query, {q.seq});
      MPI_Irecv(ans[i].v.data(), 6, MPI_UINT64_T, targets[i], detail::tag_reply, S.ctl, &ans[i].r);
    }
    const auto grace_end = clock::now() + grace();
    std::size_t pending = targets.size();
    while (pending > 0 && clock::now() < grace_end) {
      for (std::size_t i = 0; i < ans.size(); ++i) {
        if (ans[i].got || ans[i].r == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&ans[i].r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          ans[i].r = MPI_REQUEST_NULL;  // unreachable peer: counts as no answer
          --pending;
          continue;
        }
        if (!done) continue;
        if (ans[i].v[0] == q.seq) {
          ans[i].got = true;
          --pending;
        } else {  // a stale answer to an older question: listen again
          MPI_Irecv(ans[i].v.data(), 6, MPI_UINT64_T, targets[i], detail::tag_reply, S.ctl, &ans[i].r);
        }
      }
      S.serve();  // ranks timing out at the same moment ask us too
    }
    for (auto& a : ans)
      if (!a.got && a.r != MPI_REQUEST_NULL) {
        MPI_Cancel(&a.r);
        MPI_Wait(&a.r, MPI_STATUS_IGNORE);
      }
    S.serve();

    std::vector<int> missing;
    std::string details, arrived;  // details: "rank p: why; rank q: why"
    for (std::size_t i = 0; i < targets.size(); ++i) {
      const int p = targets[i];
      const auto& v = ans[i].v;
      const detail::notice* g = nullptr;
      if (collective)
        for (const auto& n : S.notices)
          if (n.rank == p && n.seq == q.seq) g = &n;
      if (collective && ((ans[i].got && v[1] > q.seq) || g != nullptr)) {
        arrived += (arrived.empty() ? "" : ", ") + std::to_string(p);
        continue;
      }
      missing.push_back(p);
      details += (details.empty() ? "rank " : "; rank ") + std::to_string(p) + ": ";
      if (!ans[i].got) {
        details += "no answer within the " + std::to_string(grace().count()) + " ms grace period: computing outside gflow, stuck, or exited";
        continue;
      }
      details += "has started " + std::to_string(v[1]) + " collective(s) and is waiting in ";
      if (v[2] == 1) details += "collective #" + std::to_string(v[3]) + " " + detail::op_name(v[4]);
      else if (v[2] == 2) details += std::string(detail::op_name(v[4])) + " with rank " + std::to_string(static_cast<std::int64_t>(v[5]));
      else details += "nothing";
    }
    std::string what = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " + std::to_string(timeout_.count()) +
                       " ms for " + describe(q) + "; ";
    if (missing.empty()) {
      what += "every rank arrived (" + arrived + "), but it did not complete (a very slow network or a huge message?).";
    } else {
      what += std::string(collective ? "rank(s) " : "the peer, rank ") + detail::rank_list(missing) + " did not arrive (" + details + ").";
      if (!arrived.empty()) what += " Arrived: rank(s) " + arrived + ".";
    }
    if (collective) {
      std::vector<std::uint64_t> note{q.seq, missing.size()};
      for (int m : missing) note.push_back(static_cast<std::uint64_t>(m));
      for (int p : targets) S.post(p, detail::tag_notice, note);
    }
    S.broken = (collective ? "collective #" + std::to_string(q.seq) + " " : std::string()) + q.op + " timed out after " +
               std::to_string(timeout_.count()) + " ms";
    throw timeout_error(q.op, what, stall_fix());
  }

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
  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<detail::comm_state> state_;  // shared with copies: sequence numbers, control comm
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
