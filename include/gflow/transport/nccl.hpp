#pragma once
// NCCL transport: one rank per CUDA device, buffers in device memory, every operation ordered on
// the transport's CUDA stream. Plain host code (no kernels): it compiles with nvcc or with a
// host compiler given the CUDA include directory; link libnccl and cudart (target gflow::nccl).
//
// Creating ranks
//   - One process, several GPUs:  auto ranks = gflow::nccl::transport::init_all(ndev);
//     (ncclCommInitAll over devices 0..ndev-1; each rank owns its communicator and a stream of
//     its own.) Drive each rank from its own host thread, or issue the ranks' operations inside
//     a gflow::nccl::group (see below) — a blocking collective on one rank waits for the others.
//   - One process per GPU (MPI, torchrun-like launchers): rank 0 calls
//     gflow::nccl::transport::unique_id() and broadcasts the ncclUniqueId out of band, e.g.
//       ncclUniqueId id; if (rank == 0) id = gflow::nccl::transport::unique_id();
//       MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
//       auto t = gflow::nccl::transport::init_rank(nranks, id, rank, local_device);
//   - An existing communicator and stream (borrowed by default; ownership::owned hands the
//     communicator over, to be destroyed with the transport):
//       gflow::nccl::transport t(comm, stream);
//
// Semantics
//   - Collectives are ncclAllReduce / ncclAllGather / ncclBroadcast / ncclReduce (in place) /
//     ncclSend / ncclRecv on stream(). The i-forms enqueue the operation, record an event after
//     it and return a request; wait(request) blocks the host until that event has completed.
//     enqueue_wait(request, other_stream) makes another stream wait instead, without blocking.
//     The blocking forms enqueue, then wait until the stream is drained.
//   - Events come from a fixed ring created with the transport (event_ring_size), so an
//     operation allocates nothing. A request older than the ring waits on the newer operation
//     recorded into its slot: a later point of the same stream, hence still correct.
//   - While waiting, the transport polls ncclCommGetAsyncError: an asynchronous NCCL failure
//     (a peer died, a network error) aborts the communicator (ncclCommAbort, as NCCL's docs ask)
//     and raises gflow::transport_error instead of hanging.
//   - Timeouts: every host wait (wait, the blocking forms, barrier, the control messages) gives
//     up after timeout() (default_timeout unless set_timeout() says otherwise; 0 = never),
//     aborts the communicator so the kernels stuck on the stream exit, and raises
//     gflow::timeout_error naming the operation, its number on this transport and the rank.
//     NCCL has no side channel to ask the other ranks where they are, so unlike the MPI
//     transport it cannot name the ranks that did not arrive: run an MPI transport alongside
//     (it names them) or look for the rank that reports no timeout. After an abort the transport
//     refuses every operation (transport_error); a borrowed communicator is aborted too (its
//     owner must not destroy it again). Not bounded: the enqueue calls themselves, which a
//     blocking communicator may block in while it connects to its peers on first use.
//   - Every failing NCCL or CUDA call raises gflow::transport_error naming the operation, the
//     rank, NCCL's error text (ncclGetErrorString and ncclGetLastError) and a fix.
//   - Point-to-point: as in NCCL, a send and its matching recv must be in flight together. Two
//     ranks exchanging with each other must put their isend + irecv inside one gflow::nccl::group.
//   - gflow::nccl::group wraps ncclGroupStart / ncclGroupEnd. Inside a group, NCCL defers the
//     operations to the group's end, so the i-forms return requests that wait for the whole
//     stream, and the blocking forms, barrier() and split() are refused (usage_error).
//   - split(color, key): ncclCommSplit, collective over the ranks of this transport. color must
//     be >= 0 (NCCL's NCCL_SPLIT_NOCOLOR, "join no group", has no counterpart in the transport
//     concept). The sub-group shares this transport's stream (ordering between a rank's groups
//     stays the stream order) and owns its new communicator.
//   - Communicators must be blocking (the default; ncclConfig_t::blocking = 1).
//   - Device: each operation makes the transport's device current for its duration, so a rank
//     can be driven from any thread. Buffers must live on that device.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../cuda/check.cuh"
#include "timeout.hpp"
#include "../dtype.hpp"
#include "../error.hpp"
#include "transport.hpp"

namespace gflow::nccl {

namespace detail {

template <class T>
inline constexpr bool dependent_false = false;

/// NCCL's data type for a gflow wire element. NCCL reduces every type gflow moves.
template <class T>
constexpr ncclDataType_t data_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, half>) return ncclFloat16;
  else if constexpr (std::is_same_v<T, bfloat16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return ncclUint32;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return ncclUint64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ncclUint8;
  else static_assert(dependent_false<T>, "gflow::nccl: no NCCL data type for this element type.");
}

constexpr ncclRedOp_t red_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

inline const char* fix_for(ncclResult_t r) noexcept {
  switch (r) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check that the buffers are device memory of this rank's device and "
             "that no earlier kernel faulted (run under compute-sanitizer); NCCL_DEBUG=INFO shows the CUDA error.";
    case ncclSystemError:
      return "a system call failed (sockets, shared memory, /dev/shm size, ulimits): check the host setup; "
             "NCCL_DEBUG=INFO shows which call.";
    case ncclInternalError:
      return "NCCL hit an internal error: rerun with NCCL_DEBUG=INFO and report it with that log.";
    case ncclInvalidArgument:
      return "check the arguments: device pointers on this rank's device, element counts, and root / peer ranks "
             "in [0, size()).";
    case ncclInvalidUsage:
      return "every rank must issue the same collectives in the same order with the same counts and types, "
             "and a communicator must not be used by two threads at once.";
    case ncclRemoteError:
      return "a peer rank exited or the network failed: the communicator is unusable; destroy the transports "
             "and restart the job (or the failed ranks).";
    case ncclInProgress:
      return "the communicator is non-blocking; gflow::nccl::transport needs a blocking communicator "
             "(ncclConfig_t::blocking = 1, the default).";
    default:
      return "rerun with NCCL_DEBUG=INFO to see what NCCL did.";
  }
}

/// Throws gflow::transport_error for a failed NCCL call; `who` says which rank.
[[noreturn]] inline void fail(ncclResult_t r, const char* op, const std::string& who, ncclComm_t comm) {
  std::string msg = std::string(op) + " failed on " + who + ": " + ncclGetErrorString(r) + ".";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += std::string(" NCCL: ") + last;
  throw transport_error(op, msg, fix_for(r));
}

inline int& group_depth() noexcept {
  thread_local int depth = 0;
  return depth;
}

}  // namespace detail

/// Who destroys a communicator handed to gflow::nccl::transport.
enum class ownership { borrowed, owned };

/// ncclGroupStart / ncclGroupEnd as a scope. end() reports a failed ncclGroupEnd; the destructor
/// ends a group still open (while unwinding, ignoring errors).
///
///   { gflow::nccl::group g; for (auto& t : ranks) reqs.push_back(t.iall_reduce(buf[t.rank()], n, sum)); g.end(); }
class group {
 public:
  group() {
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) detail::fail(r, "ncclGroupStart", "this thread", nullptr);
    ++detail::group_depth();
  }
  group(const group&) = delete;
  group& operator=(const group&) = delete;
  ~group() {
    if (open_) {
      --detail::group_depth();
      (void)ncclGroupEnd();
    }
  }
  void end() {
    if (!open_) return;
    open_ = false;
    --detail::group_depth();
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess) detail::fail(r, "ncclGroupEnd", "this thread", nullptr);
  }
  /// True while this thread is inside a gflow::nccl::group.
  [[nodiscard]] static bool active() noexcept { return detail::group_depth() > 0; }

 private:
  bool open_ = true;
};

class transport {
 public:
  using memory_space = device_memory;
  /// NCCL sums (and takes max / min of) every element type gflow moves: f32, f64, f16, bf16,
  /// i32, i64, u32, u64, u8.
  template <class E>
  static constexpr bool can_reduce = wire_element<E>;

  /// Events in the ring that completes requests.
  static constexpr std::size_t event_ring_size = 256;

  /// A pending operation: wait(req) completes it. Default-constructed: nothing to wait for.
  struct request {
    std::uint64_t seq = 0;      // 1-based operation number; 0: nothing pending
    bool whole_stream = false;  // issued inside a group: completes with the whole stream
  };

  /// Wraps an existing communicator and stream. The stream is always borrowed (the caller keeps
  /// it alive); the communicator is destroyed with the transport when `comm_ownership` is owned.
  transport(ncclComm_t comm, cudaStream_t stream, ownership comm_ownership = ownership::borrowed)
      : transport(comm, std::shared_ptr<CUstream_st>(stream, [](CUstream_st*) {}), comm_ownership) {}

  transport(transport&& o) noexcept { swap(o); }
  transport& operator=(transport&& o) noexcept {
    if (this != &o) {
      transport tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  ~transport() { release(); }

  // ---- creation ------------------------------------------------------------------------------
  /// One rank per device 0..ndev-1 of this process (ncclCommInitAll), each with its own stream.
  static std::vector<transport> init_all(int ndev) {
    int count = 0;
    cuda::check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount in gflow::nccl::transport::init_all");
    if (ndev < 1 || ndev > count)
      throw invalid_argument("ndev", "init_all(" + std::to_string(ndev) + "): this process sees " + std::to_string(count) + " CUDA device(s).",
                             "pass a device count in [1, " + std::to_string(count) + "] (check CUDA_VISIBLE_DEVICES).");
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(ndev), nullptr);
    const ncclResult_t r = ncclCommInitAll(comms.data(), ndev, nullptr);
    if (r != ncclSuccess) detail::fail(r, "ncclCommInitAll", std::to_string(ndev) + " devices", nullptr);
    std::vector<transport> out;
    out.reserve(comms.size());
    std::size_t adopted = 0;
    try {
      for (int d = 0; d < ndev; ++d) {
        auto s = make_stream(d);
        out.push_back(transport(comms[static_cast<std::size_t>(d)], std::move(s), ownership::owned));
        ++adopted;
      }
    } catch (...) {
      for (std::size_t i = adopted; i < comms.size(); ++i) (void)ncclCommDestroy(comms[i]);
      throw;
    }
    return out;
  }
  /// Every device this process sees.
  static std::vector<transport> init_all() {
    int count = 0;
    cuda::check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount in gflow::nccl::transport::init_all");
    return init_all(count);
  }

  /// A new id for init_rank, made once (by rank 0) and sent to every rank out of band.
  static ncclUniqueId unique_id() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) detail::fail(r, "ncclGetUniqueId", "this process", nullptr);
    return id;
  }

  /// This process's rank of an `nranks`-rank communicator on CUDA device `device` (collective:
  /// every rank calls it with the same id). The transport owns the communicator and a stream.
  static transport init_rank(int nranks, const ncclUniqueId& id, int rank, int device) {
    if (nranks < 1 || rank < 0 || rank >= nranks)
      throw invalid_argument("rank", "init_rank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks.",
                             "pass nranks >= 1 and a rank in [0, nranks).");
    cuda::device_guard g(device);
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r != ncclSuccess) detail::fail(r, "ncclCommInitRank", "rank " + std::to_string(rank) + " of " + std::to_string(nranks), nullptr);
    try {
      return transport(comm, make_stream(device), ownership::owned);
    } catch (...) {
      (void)ncclCommDestroy(comm);
      throw;
    }
  }

  // ---- identity ----------------------------------------------------------------------------
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  [[nodiscard]] ncclComm_t comm() const noexcept { return comm_; }

  // ---- collectives -------------------------------------------------------------------------
  template <wire_element T>
  request iall_reduce(T* buf, std::size_t n, reduce_op op) {
    live("all_reduce");
    cuda::device_guard g(device_);
    check(ncclAllReduce(buf, buf, n, detail::data_type<T>(), detail::red_op(op), comm_, stream()), "all_reduce (ncclAllReduce)");
    return record("all_reduce");
  }
  /// recv holds n * size() elements, in rank order.
  template <wire_element T>
  request iall_gather(const T* send, T* recv, std::size_t n) {
    live("all_gather");
    cuda::device_guard g(device_);
    check(ncclAllGather(send, recv, n, detail::data_type<T>(), comm_, stream()), "all_gather (ncclAllGather)");
    return record("all_gather");
  }
  template <wire_element T>
  request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    live("broadcast");
    cuda::device_guard g(device_);
    check(ncclBroadcast(buf, buf, n, detail::data_type<T>(), root, comm_, stream()), "broadcast (ncclBroadcast)");
    return record("broadcast");
  }
  /// In place; the result lands in root's buf only.
  template <wire_element T>
  request ireduce(T* buf, std::size_t n, reduce_op op, int root) {
    check_peer(root, "root");
    live("reduce");
    cuda::device_guard g(device_);
    check(ncclReduce(buf, buf, n, detail::data_type<T>(), detail::red_op(op), root, comm_, stream()), "reduce (ncclReduce)");
    return record("reduce");
  }
  template <wire_element T>
  request isend(const T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    live("send");
    cuda::device_guard g(device_);
    check(ncclSend(buf, n, detail::data_type<T>(), peer, comm_, stream()), "send (ncclSend)");
    return record("send");
  }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    live("recv");
    cuda::device_guard g(device_);
    check(ncclRecv(buf, n, detail::data_type<T>(), peer, comm_, stream()), "recv (ncclRecv)");
    return record("recv");
  }

  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    refuse_in_group("all_reduce");
    auto r = iall_reduce(buf, n, op);
    wait(r);
  }
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    refuse_in_group("all_gather");
    auto r = iall_gather(send, recv, n);
    wait(r);
  }
  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    refuse_in_group("broadcast");
    auto r = ibroadcast(buf, n, root);
    wait(r);
  }
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op op, int root) {
    refuse_in_group("reduce");
    auto r = ireduce(buf, n, op, root);
    wait(r);
  }
  /// Returns once the data has left (the peer's matching recv must be in flight).
  template <wire_element T>
  void send(const T* buf, std::size_t n, int peer) {
    refuse_in_group("send");
    auto r = isend(buf, n, peer);
    wait(r);
  }
  template <wire_element T>
  void recv(T* buf, std::size_t n, int peer) {
    refuse_in_group("recv");
    auto r = irecv(buf, n, peer);
    wait(r);
  }

  /// Every rank of the group has reached the barrier (an allreduce of one int), and this rank's
  /// stream is drained.
  void barrier() {
    refuse_in_group("barrier");
    live("barrier");
    {
      cuda::device_guard g(device_);
      check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream()), "barrier (ncclAllReduce)");
    }
    drain("barrier");
  }

  /// Blocks until the request's operation has completed on the device (polling NCCL for
  /// asynchronous errors meanwhile). Waiting twice, or on a default request, returns at once.
  void wait(request& r) {
    if (r.whole_stream || (r.seq != 0 && r.seq > done_seq_)) live("wait");
    if (r.whole_stream) {
      drain("wait");
    } else if (r.seq != 0 && r.seq > done_seq_) {
      poll_event(events_[r.seq % events_.size()], "wait");
      done_seq_ = r.seq;
    }
    r = request{};
  }

  /// Makes `other` wait (on the device) for the request's operation; the host does not block.
  void enqueue_wait(const request& r, cudaStream_t other) {
    if (r.seq == 0 && !r.whole_stream) return;
    live("enqueue_wait");
    cuda::device_guard g(device_);
    if (r.whole_stream) {
      refuse_in_group("enqueue_wait on a grouped request");
      const std::uint64_t seq = next_seq_++;
      cuda::check_cuda(cudaEventRecord(events_[seq % events_.size()], stream()), "cudaEventRecord in gflow::nccl::transport::enqueue_wait");
      cuda::check_cuda(cudaStreamWaitEvent(other, events_[seq % events_.size()], 0), "cudaStreamWaitEvent");
      return;
    }
    cuda::check_cuda(cudaStreamWaitEvent(other, events_[r.seq % events_.size()], 0), "cudaStreamWaitEvent");
  }

  /// Collective over this transport's ranks: those with the same color form a sub-group,
  /// ordered by key (ties by rank). The sub-group shares this transport's stream.
  transport split(int color, int key) {
    refuse_in_group("split");
    live("split");
    if (color < 0)
      throw invalid_argument("color", "split(" + std::to_string(color) + ", " + std::to_string(key) + "): color must be >= 0.",
                             "give every rank a non-negative color; ranks that should stay out still need a group of their own.");
    cuda::device_guard g(device_);
    ncclComm_t sub = nullptr;
    check(ncclCommSplit(comm_, color, key, &sub, nullptr), "split (ncclCommSplit)");
    if (sub == nullptr)
      throw transport_error("split", "ncclCommSplit returned no communicator on " + who() + ".", "report this together with an NCCL_DEBUG=INFO log.");
    try {
      transport t(sub, stream_, ownership::owned);
      t.timeout_ = timeout_;
      return t;
    } catch (...) {
      (void)ncclCommDestroy(sub);
      throw;
    }
  }

  // ---- timeouts ----------------------------------------------------------------------------
  /// Bounds every later host wait of this transport (0: wait forever). Sub-groups made by
  /// split() afterwards inherit it.
  void set_timeout(std::chrono::milliseconds t) {
    gflow::detail::check_timeout(t);
    timeout_ = t;
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// True once a timeout or an asynchronous error made this transport abort its communicator.
  [[nodiscard]] bool aborted() const noexcept { return !aborted_.empty(); }

  // ---- control messages (host buffers) -------------------------------------------------------
  /// all_gather of a few host elements (the exchanger's consistency check), staged through a
  /// device buffer of this rank; returns when recv holds every rank's block.
  template <wire_element T>
  void control_all_gather(const T* send, T* recv, std::size_t n) {
    refuse_in_group("control_all_gather");
    live("control_all_gather");
    cuda::device_guard g(device_);
    const std::size_t P = static_cast<std::size_t>(size_);
    staging<T> d(n * (P + 1));
    cuda::check_cuda(cudaMemcpyAsync(d.p + n * P, send, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync of a control message");
    check(ncclAllGather(d.p + n * P, d.p, n, detail::data_type<T>(), comm_, stream()), "control_all_gather (ncclAllGather)");
    cuda::check_cuda(cudaMemcpyAsync(recv, d.p, n * P * sizeof(T), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync of a control message");
    drain("control_all_gather");
  }
  /// broadcast of a few host elements from root, staged like control_all_gather.
  template <wire_element T>
  void control_broadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    refuse_in_group("control_broadcast");
    live("control_broadcast");
    cuda::device_guard g(device_);
    staging<T> d(n);
    cuda::check_cuda(cudaMemcpyAsync(d.p, buf, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync of a control message");
    check(ncclBroadcast(d.p, d.p, n, detail::data_type<T>(), root, comm_, stream()), "control_broadcast (ncclBroadcast)");
    cuda::check_cuda(cudaMemcpyAsync(buf, d.p, n * sizeof(T), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync of a control message");
    drain("control_broadcast");
  }

 private:
  transport(ncclComm_t comm, std::shared_ptr<CUstream_st> shared_stream, ownership comm_ownership)
      : comm_(comm), owns_comm_(comm_ownership == ownership::owned), stream_(std::move(shared_stream)) {
    if (comm_ == nullptr) {
      owns_comm_ = false;
      throw invalid_argument("comm", "gflow::nccl::transport got a null ncclComm_t.", "pass an initialised communicator (or use init_all / init_rank).");
    }
    try {
      timeout_ = gflow::detail::default_timeout;
      check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
      check(ncclCommCount(comm_, &size_), "ncclCommCount");
      check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice");
      cuda::device_guard g(device_);
      events_.reserve(event_ring_size);
      for (std::size_t i = 0; i < event_ring_size; ++i) {
        cudaEvent_t e = nullptr;
        cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags for gflow::nccl::transport");
        events_.push_back(e);
      }
      void* p = nullptr;
      cuda::check_cuda(cudaMalloc(&p, sizeof(std::int32_t)), "cudaMalloc of the barrier scratch int");
      scratch_ = static_cast<std::int32_t*>(p);
      cuda::check_cuda(cudaMemsetAsync(scratch_, 0, sizeof(std::int32_t), stream()), "cudaMemsetAsync of the barrier scratch int");
    } catch (...) {
      if (!owns_comm_) comm_ = nullptr;  // a borrowed communicator stays with its owner
      release();
      throw;
    }
  }

  static std::shared_ptr<CUstream_st> make_stream(int device) {
    cuda::device_guard g(device);
    cudaStream_t s = nullptr;
    // A blocking stream: work on the legacy default stream stays ordered with it.
    cuda::check_cuda(cudaStreamCreate(&s), "cudaStreamCreate for gflow::nccl::transport");
    return std::shared_ptr<CUstream_st>(s, [](CUstream_st* p) { (void)cudaStreamDestroy(p); });
  }

  void swap(transport& o) noexcept {
    std::swap(comm_, o.comm_);
    std::swap(owns_comm_, o.owns_comm_);
    std::swap(stream_, o.stream_);
    std::swap(rank_, o.rank_);
    std::swap(size_, o.size_);
    std::swap(device_, o.device_);
    std::swap(events_, o.events_);
    std::swap(scratch_, o.scratch_);
    std::swap(next_seq_, o.next_seq_);
    std::swap(done_seq_, o.done_seq_);
    std::swap(timeout_, o.timeout_);
    std::swap(aborted_, o.aborted_);
  }

  void release() noexcept {
    if (comm_ == nullptr && events_.empty() && scratch_ == nullptr) {
      stream_.reset();
      return;
    }
    int prev = -1;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ && cudaSetDevice(device_) == cudaSuccess;
    if (comm_ != nullptr && stream_) (void)cudaStreamSynchronize(stream_.get());
    if (comm_ != nullptr && owns_comm_) (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    events_.clear();
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    scratch_ = nullptr;
    stream_.reset();
    if (switched) (void)cudaSetDevice(prev);
  }

  [[nodiscard]] std::string who() const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (CUDA device " + std::to_string(device_) + ")";
  }

  void check(ncclResult_t r, const char* op) const {
    if (r != ncclSuccess) detail::fail(r, op, who(), comm_);
  }

  void check_peer(int p, const char* what) const { gflow::detail::check_peer_rank(p, size_, what); }

  static void refuse_in_group(const char* op) {
    if (group::active())
      throw usage_error(op, std::string(op) + " was called inside a gflow::nccl::group: NCCL defers grouped operations to the group's end, so it would never complete.",
                        "use the i-form inside the group and wait() after group::end(), or call it outside the group.");
  }

  request record(const char* op) {
    if (group::active()) return request{0, true};
    const std::uint64_t seq = next_seq_++;
    const cudaError_t e = cudaEventRecord(events_[seq % events_.size()], stream());
    if (e != cudaSuccess) cuda::check_cuda(e, std::string("cudaEventRecord after ") + op + " on " + who());
    return request{seq, false};
  }

  /// A device buffer for control messages, freed on every path out.
  template <class T>
  struct staging {
    T* p = nullptr;
    explicit staging(std::size_t n) {
      void* v = nullptr;
      cuda::check_cuda(cudaMalloc(&v, (n > 0 ? n : 1) * sizeof(T)), "cudaMalloc of a control message buffer");
      p = static_cast<T*>(v);
    }
    staging(const staging&) = delete;
    staging& operator=(const staging&) = delete;
    ~staging() { (void)cudaFree(p); }
  };

  void live(const char* op) const {
    if (!aborted_.empty())
      throw transport_error(op, who() + ": the communicator was aborted after " + aborted_ + ".",
                            "destroy this transport (and whatever uses it) and create the communicators again (restart the job or its failed ranks).");
  }

  // ncclCommAbort: frees the communicator and makes its kernels still on the stream exit, so the
  // stream can drain. The handle is gone afterwards (also for a borrowed communicator).
  void abort_comm(std::string why) noexcept {
    if (comm_ != nullptr) {
      int prev = -1;
      const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ && cudaSetDevice(device_) == cudaSuccess;
      (void)ncclCommAbort(comm_);
      if (switched) (void)cudaSetDevice(prev);
    }
    comm_ = nullptr;
    aborted_ = std::move(why);
  }

  void check_async(const char* op) {
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async == ncclSuccess || async == ncclInProgress) return;
    std::string msg = std::string(op) + " failed on " + who() + " (asynchronous error): " + ncclGetErrorString(async) + ".";
    if (const char* last = ncclGetLastError(comm_); last != nullptr && *last != '\0') msg += std::string(" NCCL: ") + last;
    abort_comm(std::string("an asynchronous error in ") + op);
    throw transport_error(op, msg + " The communicator was aborted (ncclCommAbort).", detail::fix_for(async));
  }

  // Polls until query() says the work is done; with a timeout, aborts and throws once it passes.
  template <class Query>
  void poll(Query query, const char* op) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (unsigned spins = 0;; ++spins) {
      const cudaError_t e = query();
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda::check_cuda(e, std::string(op) + " on " + who());
      (void)cudaGetLastError();  // cudaErrorNotReady is an answer, not an error: keep it out of later checks
      check_async(op);
      if (spins < 64) continue;
      std::this_thread::yield();
      if (timeout_.count() > 0 && clock::now() - start >= timeout_) time_out(op);
    }
  }
  void poll_event(cudaEvent_t ev, const char* op) {
    poll([ev] { return cudaEventQuery(ev); }, op);
  }
  void drain(const char* op) {
    cudaStream_t s = stream();
    poll([s] { return cudaStreamQuery(s); }, op);
  }

  [[noreturn]] void time_out(const char* op) {
    const std::string what = who() + " waited " + std::to_string(timeout_.count()) + " ms for " + op + " (operation #" +
                             std::to_string(next_seq_ - 1) + " of this transport is the last one issued) to complete on its stream. NCCL "
                             "cannot report which ranks did not arrive: a rank that never issued its part, exited, or is stuck in "
                             "earlier work keeps every other rank waiting. The communicator was aborted (ncclCommAbort).";
    abort_comm(std::string("a timeout in ") + op);
    throw timeout_error(op, what,
                        "find the rank that reported no timeout or died (an MPI transport alongside names it); if the ranks are only "
                        "slow, raise the timeout (set_timeout). Destroy this transport and recreate the communicators.");
  }

  ncclComm_t comm_ = nullptr;
  bool owns_comm_ = false;
  std::shared_ptr<CUstream_st> stream_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::vector<cudaEvent_t> events_;
  std::int32_t* scratch_ = nullptr;
  std::uint64_t next_seq_ = 1;
  std::uint64_t done_seq_ = 0;
  std::chrono::milliseconds timeout_{0};  // default_timeout until set_timeout()
  std::string aborted_;  // why the communicator was aborted; empty while usable
};
static_assert(gflow::transport<transport>);

}  // namespace gflow::nccl
