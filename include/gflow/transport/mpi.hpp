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
// Element types: every wire_element; fp16 and bf16 travel as a 2-byte datatype with
// user-defined sum / max / min ops (mpi/datatypes.hpp). Counts beyond what this MPI addresses:
// mpi/large_count.hpp.
//
// Requests: the i-forms return a request that must be passed to wait() once, with the
// buffers kept alive until then. Waiting on a default-constructed request is a no-op.
//
// Timeouts. Every blocking wait is bounded by timeout() when it is non-zero: the transport's
// default is default_timeout (10 minutes; constructor or set_timeout() to change it, 0 for plain
// blocking calls). On expiry gflow::timeout_error names the operation, its number and the ranks
// that did not arrive, and the ranks waiting in the same collective fail at once too; the
// transport (and copies sharing its communicator) then refuses every further operation with
// transport_error: destroy it and restart the job (or its failed ranks). How (an issuing thread
// makes the blocking call; a stall inspector asks the other ranks where they are):
// mpi/stall_inspector.hpp. Because the timed and the untimed path make the same blocking calls,
// ranks may differ in their timeouts.
//   Constructing a transport (and split) is a collective over its communicator: it duplicates
// the communicator for the stall inspector's messages (MPI_Comm_idup, bounded by the timeout).
//
// The parts, one concern each, under transport/mpi/: check.hpp (<mpi.h>, error checks),
// large_count.hpp (the MPI-3 / MPI-4 twins), datatypes.hpp (datatypes and 16-bit ops),
// comm_state.hpp (state shared by copies), stall_inspector.hpp (the timed path),
// environment.hpp (MPI_Init_thread / MPI_Finalize).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "mpi/check.hpp"
#include "mpi/comm_state.hpp"
#include "mpi/datatypes.hpp"
#include "mpi/environment.hpp"
#include "mpi/large_count.hpp"
#include "mpi/schedules.hpp"
#include "mpi/stall_inspector.hpp"
#include "mpi/variable.hpp"
#include "timeout.hpp"
#include "transport.hpp"

namespace gflow::mpi {

/// The timeout of transports made without one (see the header
/// comment for why timeouts are on by default).
inline constexpr std::chrono::milliseconds default_timeout = gflow::detail::default_timeout;

class transport : public detail::stall_inspector, public transport_base<host_memory> {
  friend struct detail::variable_schedules;  // all_to_allv and all_gatherv with a variable window (mpi/schedules.hpp)

 public:
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

  [[nodiscard]] std::uint64_t collectives_started() const noexcept { return state_->seq; }

  /// How all_to_allv and all_gatherv run. window > 0: gflow's schedules (mpi/schedules.hpp):
  /// all_to_allv with at most `window` peers in flight, ceil((P-1) / window) latencies where Open
  /// MPI's pairwise algorithm takes P-1; all_gatherv, while latency-bound (gathered_slice_limit),
  /// in ceil(log2 P) + 1 rounds however uneven the blocks. window 0: MPI_Alltoallv and
  /// MPI_Allgatherv. The same on every rank (a rank in MPI_Alltoallv never matches a peer's
  /// point-to-point messages: the timeout then names the operation). Local: copies made before
  /// keep theirs; sub-groups made after inherit it.
  void set_variable_window(int window) {
    if (window < 0)
      throw invalid_argument("window", fmt::format("the variable window is {}.", window),
                             "pass 0 for the MPI library's MPI_Alltoallv / MPI_Allgatherv, or a positive number of peers in flight "
                             "(gflow::mpi::default_variable_window is the default).");
    window_ = window;
  }
  [[nodiscard]] int variable_window() const noexcept { return window_; }

  // ---- collectives ----------------------------------------------------------------------------
  // The blocking forms are the blocking MPI calls, made on the issuing thread when timed (see
  // blocking()); the i-forms start the non-blocking call, completed by wait().
  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op o) {
    const count_t c = detail::count(n, "all_reduce");
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
    const count_t c = detail::count(n, "iall_reduce");
    request q = start("iall_reduce", dtype_of_v<T>, n);
    check(detail::iallreduce(buf, c, detail::datatype<T>(), detail::op<T>(o), comm_, &q.r), "iall_reduce");
    return q;
  }

  /// recv holds n * size() elements, rank r's block at recv + r * n.
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    const count_t c = detail::count(n, "all_gather");
    request q = start("all_gather", dtype_of_v<T>, n);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return detail::allgather(send, recv, c, t, m); })) return;
    check(detail::iallgather(send, recv, c, detail::datatype<T>(), comm_, &q.r), "all_gather");
    wait(q);
  }
  template <wire_element T>
  request iall_gather(const T* send, T* recv, std::size_t n) {
    const count_t c = detail::count(n, "iall_gather");
    request q = start("iall_gather", dtype_of_v<T>, n);
    check(detail::iallgather(send, recv, c, detail::datatype<T>(), comm_, &q.r), "iall_gather");
    return q;
  }

  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    const count_t c = detail::count(n, "broadcast");
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
    const count_t c = detail::count(n, "ibroadcast");
    request q = start("ibroadcast", dtype_of_v<T>, n);
    check(detail::ibcast(buf, c, detail::datatype<T>(), root, comm_, &q.r), "ibroadcast");
    return q;
  }

  /// In place: root's buf receives the reduction; the other ranks' buffers are only read.
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op o, int root) {
    reduce_call rc = begin_reduce(buf, n, root, "reduce");
    // Plain copies for the lambda (Clang before 16 cannot capture structured bindings).
    const void* send = rc.send;
    void* recv = rc.recv;
    const count_t c = rc.count;
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Op mo = detail::op<T>(o);
    const MPI_Comm m = comm_;
    if (blocking(rc.q, [=] { return detail::reduce(send, recv, c, t, mo, root, m); })) return;
    check(detail::ireduce(send, recv, c, t, mo, root, comm_, &rc.q.r), "reduce");
    wait(rc.q);
  }
  template <wire_element T>
  request ireduce(T* buf, std::size_t n, reduce_op o, int root) {
    reduce_call rc = begin_reduce(buf, n, root, "ireduce");
    check(detail::ireduce(rc.send, rc.recv, rc.count, detail::datatype<T>(), detail::op<T>(o), root, comm_, &rc.q.r), "ireduce");
    return rc.q;
  }

  /// Block q of send (n elements) to rank q; recv's block q from rank q (MPI_Alltoall).
  template <wire_element T>
  void all_to_all(const T* send, T* recv, std::size_t n) {
    const int c = detail::int_count(n, "all_to_all");
    request q = start("all_to_all", dtype_of_v<T>, n);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    if (blocking(q, [=] { return MPI_Alltoall(send, c, t, recv, c, t, m); })) return;
    check(MPI_Ialltoall(send, c, t, recv, c, t, comm_, &q.r), "all_to_all");
    wait(q);
  }
  /// Packed blocks: send_counts[q] elements to rank q, recv_counts[q] from rank q: gflow's schedule
  /// or MPI_Alltoallv (set_variable_window).
  template <wire_element T>
  void all_to_allv(const T* send, const std::size_t* send_counts, T* recv, const std::size_t* recv_counts) {
    if (send_counts[rank_] != recv_counts[rank_]) throw detail::variable_schedules::own_counts(rank_, send_counts[rank_], recv_counts[rank_]);
    if (window_ > 0) return detail::variable_schedules::all_to_allv(*this, window_, send, send_counts, recv, recv_counts);
    const detail::v_layout sl(send_counts, size_, "all_to_allv"), rl(recv_counts, size_, "all_to_allv");
    request q = start("all_to_allv", dtype_of_v<T>, static_cast<std::size_t>(rl.displs.back()) + recv_counts[size_ - 1]);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    const int *sc = sl.counts.data(), *sd = sl.displs.data(), *rc = rl.counts.data(), *rd = rl.displs.data();
    if (blocking(q, [=] { return MPI_Alltoallv(send, sc, sd, t, recv, rc, rd, t, m); })) return;
    check(MPI_Ialltoallv(send, sc, sd, t, recv, rc, rd, t, comm_, &q.r), "all_to_allv");
    wait(q);
  }
  /// recv holds counts[0] + ... + counts[P-1] elements, rank q's n = counts[q]: gflow's schedule
  /// (a variable window, at most gathered_slice_limit bytes a rank on average) or MPI_Allgatherv.
  template <wire_element T>
  void all_gatherv(const T* send, std::size_t n, T* recv, const std::size_t* counts) {
    if (n != counts[rank_])
      throw mismatch_error("all_gatherv", fmt::format("rank {} contributes {} elements but counts[{}] is {}.", rank_, n, rank_, counts[rank_]),
                           "pass counts with this rank's own n at its index, the same array on every rank.");
    std::size_t total = 0;
    for (int q = 0; q < size_; ++q) total += counts[q];
    if (window_ > 0 && total * sizeof(T) <= static_cast<std::size_t>(size_) * gathered_slice_limit) {
      detail::variable_schedules::concatenate<T>(*this, send, recv, counts);
      return;
    }
    const int c = detail::int_count(n, "all_gatherv");
    const detail::v_layout rl(counts, size_, "all_gatherv");
    request q = start("all_gatherv", dtype_of_v<T>, n);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    const int *rc = rl.counts.data(), *rd = rl.displs.data();
    if (blocking(q, [=] { return MPI_Allgatherv(send, c, t, recv, rc, rd, t, m); })) return;
    check(MPI_Iallgatherv(send, c, t, recv, rc, rd, t, comm_, &q.r), "all_gatherv");
    wait(q);
  }
  /// send holds counts[0] + ... + counts[P-1] elements in P packed blocks; recv gets block rank()
  /// reduced over every rank (MPI_Reduce_scatter). The summation order is this MPI's: with Open MPI
  /// it equals MPI_Allreduce's at 2 ranks and may differ in the last bits from 3 on.
  template <wire_element T>
  request ireduce_scatter(const T* send, T* recv, const std::size_t* counts, reduce_op o) {
    auto l = std::make_shared<const detail::v_layout>(counts, size_, "reduce_scatter");
    request q = start("ireduce_scatter", dtype_of_v<T>, counts[rank_]);
    check(MPI_Ireduce_scatter(send, recv, l->counts.data(), detail::datatype<T>(), detail::op<T>(o), comm_, &q.r), "ireduce_scatter");
    q.hold = std::move(l);
    return q;
  }
  template <wire_element T>
  void reduce_scatter(const T* send, T* recv, const std::size_t* counts, reduce_op o) {
    const detail::v_layout l(counts, size_, "reduce_scatter");
    request q = start("reduce_scatter", dtype_of_v<T>, counts[rank_]);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Op mo = detail::op<T>(o);
    const MPI_Comm m = comm_;
    const int* rc = l.counts.data();
    if (blocking(q, [=] { return MPI_Reduce_scatter(send, recv, rc, t, mo, m); })) return;
    check(MPI_Ireduce_scatter(send, recv, rc, t, mo, comm_, &q.r), "reduce_scatter");
    wait(q);
  }
  /// buf holds P packed blocks (counts, the same on every rank); block q comes from rank q's buf
  /// (MPI_Allgatherv with MPI_IN_PLACE).
  template <wire_element T>
  void all_gatherv_in_place(T* buf, const std::size_t* counts) {
    const detail::v_layout l(counts, size_, "all_gatherv_in_place");
    request q = start("all_gatherv_in_place", dtype_of_v<T>, counts[rank_]);
    const MPI_Datatype t = detail::datatype<T>();
    const MPI_Comm m = comm_;
    const int *rc = l.counts.data(), *rd = l.displs.data();
    if (blocking(q, [=] { return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, rc, rd, t, m); })) return;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, rc, rd, t, comm_, &q.r), "all_gatherv_in_place");
    wait(q);
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
    const count_t c = detail::count(n, "send");
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
    const count_t c = detail::count(n, "isend");
    request q = start_p2p("isend", dtype_of_v<T>, n, peer);
    check(detail::isend(buf, c, detail::datatype<T>(), peer, tag, comm_, &q.r), "isend");
    return q;
  }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    const count_t c = detail::count(n, "irecv");
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
    if (timed()) wait_polled(r, stp);
    else check(MPI_Wait(&r.r, stp), op);
    if (r.recv_type == MPI_DATATYPE_NULL) return;
    const MPI_Datatype type = r.recv_type;
    r.recv_type = MPI_DATATYPE_NULL;
    count_t got = 0;
    check(detail::get_count(&st, type, &got), op);
    if (got != r.recv_count)
      throw mismatch_error(op, fmt::format("rank {} expected {} elements from rank "
                                   "{} but the message held {}.", rank_, r.recv_count, r.peer, got),
                           "make send and recv agree on count and element type.");
  }

  /// Collective over this group: ranks with the same color (>= 0) form a new group, ordered by
  /// (key, rank). The new communicator is owned by the returned transport and its copies, which
  /// get this transport's timeout. A barrier first (bounded by the timeout) makes sure every rank
  /// is there, since MPI_Comm_split itself cannot be polled.
  transport split(int color, int key) {
    if (color < 0)
      throw invalid_argument("color", fmt::format("split color {} is negative; MPI_Comm_split needs a non-negative color.", color),
                             "pass a color >= 0 (every rank must get a group).");
    request q = start("split", dtype::u8, 0);
    check(MPI_Ibarrier(comm_, &q.r), "split");
    wait(q);
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &out), "split");
    std::shared_ptr<MPI_Comm> owner(new MPI_Comm(out), detail::comm_deleter{});
    transport sub(owner, timeout_);
    sub.window_ = window_;
    return sub;
  }

 private:
  // A reduce's checked count, its request, and its buffers: in place, the root passes MPI_IN_PLACE
  // and receives into buf; the others only send.
  struct reduce_call {
    count_t count;
    request q;
    const void* send;
    void* recv;
  };
  template <wire_element T>
  reduce_call begin_reduce(T* buf, std::size_t n, int root, const char* op) {
    check_peer(root, "root");
    const count_t c = detail::count(n, op);
    request q = start(op, dtype_of_v<T>, n);
    if (rank_ == root) return {c, q, MPI_IN_PLACE, buf};
    return {c, q, buf, nullptr};
  }
  transport(std::shared_ptr<MPI_Comm> owned, std::chrono::milliseconds timeout)
      : stall_inspector(timeout), comm_(*owned), owned_(std::move(owned)) {
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
    if constexpr (detail::smpi) {  // SMPI has no MPI_Comm_idup (mpi/check.hpp)
      detail::check(MPI_Comm_dup(comm_, &state_->ctl), "MPI_Comm_dup", where());
      return;
    }
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
        throw timeout_error("transport", fmt::format("rank {} of {} waited "
                                             "{} ms for the other ranks to construct the transport (MPI_Comm_idup).", rank_, size_, timeout_.count()),
                            "construct the transport on every rank of the communicator (it is a collective), or raise the timeout.");
    }
    state_->ctl = *ctl;
    delete ctl;
  }

  void check_peer(int p, const char* what) const { gflow::detail::check_peer_rank(p, size_, what); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int window_ = default_variable_window;
  std::shared_ptr<MPI_Comm> owned_;  // set for communicators made by split()
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport> && gflow::sharding_transport<transport>);

}  // namespace gflow::mpi
