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
//     ncclSend / ncclRecv / ncclReduceScatter on stream(). The i-forms enqueue the operation,
//     record an event after it and return a request; wait(request) blocks the host until that
//     event has completed.
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
//
// The parts under transport/nccl/: check.hpp (<nccl.h>, data types, the check of every NCCL call),
// group.hpp (gflow::nccl::group, ownership), grouped.hpp with variable.hpp and shards.hpp (the
// collectives NCCL has no single call for), watchdog.hpp (asynchronous errors, timeouts, abort).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../detail/cuda/check.cuh"
#include "../detail/cuda/memory.cuh"
#include "../dtype.hpp"
#include "../error.hpp"
#include "nccl/check.hpp"
#include "nccl/group.hpp"
#include "nccl/grouped.hpp"
#include "nccl/watchdog.hpp"
#include "timeout.hpp"
#include "transport.hpp"

namespace gflow::nccl {

/// NCCL sums (and takes max / min of) every element type gflow moves: f32, f64, f16, bf16, i32,
/// i64, u32, u64, u8 (transport_base's can_reduce).
class transport : public detail::comm_watch, public transport_base<device_memory>, public detail::grouped_collectives<transport> {
  friend class detail::grouped_collectives<transport>;

 public:

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
    gflow::detail::cuda::check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount in gflow::nccl::transport::init_all");
    if (ndev < 1 || ndev > count)
      throw invalid_argument("ndev", fmt::format("init_all({}): this process sees {} CUDA device(s).", ndev, count),
                             fmt::format("pass a device count in [1, {}] (check CUDA_VISIBLE_DEVICES).", count));
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(ndev), nullptr);
    const ncclResult_t r = ncclCommInitAll(comms.data(), ndev, nullptr);
    if (r != ncclSuccess) detail::fail(r, "ncclCommInitAll", fmt::format("{} devices", ndev), nullptr);
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
    gflow::detail::cuda::check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount in gflow::nccl::transport::init_all");
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
      throw invalid_argument("rank", fmt::format("init_rank: rank {} of {} ranks.", rank, nranks),
                             "pass nranks >= 1 and a rank in [0, nranks).");
    gflow::detail::cuda::device_guard g(device);
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r != ncclSuccess) detail::fail(r, "ncclCommInitRank", fmt::format("rank {} of {}", rank, nranks), nullptr);
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
    return issue("all_reduce", "all_reduce (ncclAllReduce)",
                 [&] { return ncclAllReduce(buf, buf, n, detail::data_type<T>(), detail::red_op(op), comm_, stream()); });
  }
  /// recv holds n * size() elements, in rank order.
  template <wire_element T>
  request iall_gather(const T* send, T* recv, std::size_t n) {
    return issue("all_gather", "all_gather (ncclAllGather)", [&] { return ncclAllGather(send, recv, n, detail::data_type<T>(), comm_, stream()); });
  }
  template <wire_element T>
  request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    return issue("broadcast", "broadcast (ncclBroadcast)", [&] { return ncclBroadcast(buf, buf, n, detail::data_type<T>(), root, comm_, stream()); });
  }
  /// In place; the result lands in root's buf only.
  template <wire_element T>
  request ireduce(T* buf, std::size_t n, reduce_op op, int root) {
    check_peer(root, "root");
    return issue("reduce", "reduce (ncclReduce)",
                 [&] { return ncclReduce(buf, buf, n, detail::data_type<T>(), detail::red_op(op), root, comm_, stream()); });
  }
  template <wire_element T>
  request isend(const T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    return issue("send", "send (ncclSend)", [&] { return ncclSend(buf, n, detail::data_type<T>(), peer, comm_, stream()); });
  }
  template <wire_element T>
  request irecv(T* buf, std::size_t n, int peer) {
    check_peer(peer, "peer");
    return issue("recv", "recv (ncclRecv)", [&] { return ncclRecv(buf, n, detail::data_type<T>(), peer, comm_, stream()); });
  }

  // The blocking forms: the i-form, then wait (refused inside a group, where it would never complete).
  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    blocking("all_reduce", [&] { return iall_reduce(buf, n, op); });
  }
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    blocking("all_gather", [&] { return iall_gather(send, recv, n); });
  }
  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    blocking("broadcast", [&] { return ibroadcast(buf, n, root); });
  }
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op op, int root) {
    blocking("reduce", [&] { return ireduce(buf, n, op, root); });
  }
  /// Returns once the data has left (the peer's matching recv must be in flight).
  template <wire_element T>
  void send(const T* buf, std::size_t n, int peer) {
    blocking("send", [&] { return isend(buf, n, peer); });
  }
  template <wire_element T>
  void recv(T* buf, std::size_t n, int peer) {
    blocking("recv", [&] { return irecv(buf, n, peer); });
  }

  // all_to_all / all_to_allv / all_gatherv, reduce_scatter / ireduce_scatter / all_gatherv_in_place:
  // detail::grouped_collectives (nccl/grouped.hpp).

  /// Every rank of the group has reached the barrier (an allreduce of one int), and this rank's
  /// stream is drained.
  void barrier() {
    refuse_in_group("barrier");
    live("barrier");
    {
      gflow::detail::cuda::device_guard g(device_);
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
    gflow::detail::cuda::device_guard g(device_);
    if (r.whole_stream) {
      refuse_in_group("enqueue_wait on a grouped request");
      const std::uint64_t seq = next_seq_++;
      gflow::detail::cuda::check_cuda(cudaEventRecord(events_[seq % events_.size()], stream()), "cudaEventRecord in gflow::nccl::transport::enqueue_wait");
      gflow::detail::cuda::check_cuda(cudaStreamWaitEvent(other, events_[seq % events_.size()], 0), "cudaStreamWaitEvent");
      return;
    }
    gflow::detail::cuda::check_cuda(cudaStreamWaitEvent(other, events_[r.seq % events_.size()], 0), "cudaStreamWaitEvent");
  }

  /// Collective over this transport's ranks: those with the same color form a sub-group,
  /// ordered by key (ties by rank). The sub-group shares this transport's stream.
  transport split(int color, int key) {
    refuse_in_group("split");
    live("split");
    if (color < 0)
      throw invalid_argument("color", fmt::format("split({}, {}): color must be >= 0.", color, key),
                             "give every rank a non-negative color; ranks that should stay out still need a group of their own.");
    gflow::detail::cuda::device_guard g(device_);
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

  // ---- control messages (host buffers) -------------------------------------------------------
  /// all_gather of a few host elements (the exchanger's consistency check), staged through a
  /// device buffer of this rank; returns when recv holds every rank's block.
  template <wire_element T>
  void control_all_gather(const T* send, T* recv, std::size_t n) {
    refuse_in_group("control_all_gather");
    live("control_all_gather");
    gflow::detail::cuda::device_guard g(device_);
    const std::size_t P = static_cast<std::size_t>(size_);
    gflow::detail::cuda::device_array<T> d(n * (P + 1), "cudaMalloc of a control message buffer");
    gflow::detail::cuda::check_cuda(cudaMemcpyAsync(d.get() + n * P, send, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync of a control message");
    check(ncclAllGather(d.get() + n * P, d.get(), n, detail::data_type<T>(), comm_, stream()), "control_all_gather (ncclAllGather)");
    gflow::detail::cuda::check_cuda(cudaMemcpyAsync(recv, d.get(), n * P * sizeof(T), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync of a control message");
    drain("control_all_gather");
  }
  /// broadcast of a few host elements from root, staged like control_all_gather.
  template <wire_element T>
  void control_broadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "root");
    refuse_in_group("control_broadcast");
    live("control_broadcast");
    gflow::detail::cuda::device_guard g(device_);
    gflow::detail::cuda::device_array<T> d(n, "cudaMalloc of a control message buffer");
    gflow::detail::cuda::check_cuda(cudaMemcpyAsync(d.get(), buf, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync of a control message");
    check(ncclBroadcast(d.get(), d.get(), n, detail::data_type<T>(), root, comm_, stream()), "control_broadcast (ncclBroadcast)");
    gflow::detail::cuda::check_cuda(cudaMemcpyAsync(buf, d.get(), n * sizeof(T), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync of a control message");
    drain("control_broadcast");
  }

 private:
  transport(ncclComm_t comm, std::shared_ptr<CUstream_st> shared_stream, ownership comm_ownership)
      : comm_watch(comm, comm_ownership == ownership::owned), stream_(std::move(shared_stream)) {
    if (comm_ == nullptr) {
      owns_comm_ = false;
      throw invalid_argument("comm", "gflow::nccl::transport got a null ncclComm_t.", "pass an initialised communicator (or use init_all / init_rank).");
    }
    try {
      timeout_ = gflow::detail::default_timeout;
      check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
      check(ncclCommCount(comm_, &size_), "ncclCommCount");
      check(ncclCommCuDevice(comm_, &device_), "ncclCommCuDevice");
      gflow::detail::cuda::device_guard g(device_);
      events_.reserve(event_ring_size);
      for (std::size_t i = 0; i < event_ring_size; ++i) {
        cudaEvent_t e = nullptr;
        gflow::detail::cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags for gflow::nccl::transport");
        events_.push_back(e);
      }
      void* p = nullptr;
      gflow::detail::cuda::check_cuda(cudaMalloc(&p, sizeof(std::int32_t)), "cudaMalloc of the barrier scratch int");
      scratch_ = static_cast<std::int32_t*>(p);
      gflow::detail::cuda::check_cuda(cudaMemsetAsync(scratch_, 0, sizeof(std::int32_t), stream()), "cudaMemsetAsync of the barrier scratch int");
    } catch (...) {
      if (!owns_comm_) comm_ = nullptr;  // a borrowed communicator stays with its owner
      release();
      throw;
    }
  }

  static std::shared_ptr<CUstream_st> make_stream(int device) {
    gflow::detail::cuda::device_guard g(device);
    cudaStream_t s = nullptr;
    // A blocking stream: work on the legacy default stream stays ordered with it.
    gflow::detail::cuda::check_cuda(cudaStreamCreate(&s), "cudaStreamCreate for gflow::nccl::transport");
    return std::shared_ptr<CUstream_st>(s, [](CUstream_st* p) { (void)cudaStreamDestroy(p); });
  }

  void swap(transport& o) noexcept {
    swap_watch(o);
    std::swap(stream_, o.stream_);
    std::swap(events_, o.events_);
    std::swap(scratch_, o.scratch_);
    std::swap(next_seq_, o.next_seq_);
    std::swap(done_seq_, o.done_seq_);
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

  // The i-forms: enqueue on the stream (this rank's device current), then record the request.
  template <class Enqueue>
  request issue(const char* op, const char* call, Enqueue enqueue) {
    live(op);
    gflow::detail::cuda::device_guard g(device_);
    check(enqueue(), call);
    return record(op);
  }
  template <class Start>
  void blocking(const char* op, Start start) {
    refuse_in_group(op);
    auto r = start();
    wait(r);
  }

  static void refuse_in_group(const char* op) {
    if (group::active())
      throw usage_error(op, std::string(op) + " was called inside a gflow::nccl::group: NCCL defers grouped operations to the group's end, so it would never complete.",
                        "use the i-form inside the group and wait() after group::end(), or call it outside the group.");
  }

  request record(const char* op) {
    if (group::active()) return request{0, true};
    const std::uint64_t seq = next_seq_++;
    const cudaError_t e = cudaEventRecord(events_[seq % events_.size()], stream());
    if (e != cudaSuccess) gflow::detail::cuda::check_cuda(e, std::string("cudaEventRecord after ") + op + " on " + who());
    return request{seq, false};
  }

  void poll_event(cudaEvent_t ev, const char* op) {
    poll([ev] { return cudaEventQuery(ev); }, op, next_seq_ - 1);
  }
  void drain(const char* op) {
    cudaStream_t s = stream();
    poll([s] { return cudaStreamQuery(s); }, op, next_seq_ - 1);
  }

  std::shared_ptr<CUstream_st> stream_;
  std::vector<cudaEvent_t> events_;
  std::int32_t* scratch_ = nullptr;
  std::uint64_t next_seq_ = 1;
  std::uint64_t done_seq_ = 0;
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport> && gflow::sharding_transport<transport>);

}  // namespace gflow::nccl
