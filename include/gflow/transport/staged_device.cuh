#pragma once
// staged_transport<Host, Derived>: what the device-memory transports over a host transport share
// (gflow::inproc_device::transport over the in-process transport, gflow::mpi_device::transport
// over MPI). Derived names the concrete class (CRTP: split() returns one, constructed from
// (Host, device, split_tag)).
//
// Each collective waits for the rank's stream (the producers of its input are done), copies the
// input down into a staging buffer of this transport object (page-locked, or pageable where
// Derived asks for it), runs Host's collective there, and copies the result up on the rank's
// stream before returning, so the kernels enqueued next see it. The i-forms complete before they
// return (a request is a token). Matching, count checks, the mismatch and timeout errors and the
// reductions' order are Host's, so a device exchange gives the bytes a host exchange over Host
// gives; a collective that throws copies nothing back. The control channel (the exchanger's consistency checks) goes straight to Host on
// host buffers.
//
// Where Host can read and write device memory itself (a CUDA-aware MPI, Derived's choice at
// construction: direct()), the collectives pass the device pointers to Host after the stream
// synchronisation, with no staging.
//
// The staging buffers grow to the largest message seen and are kept (allocated again only to
// grow, not per call); a copy of the transport shares Host's group and the stream but gets
// buffers of its own. A sub-group (split) shares the stream too, as gflow::nccl::transport's does:
// the exchanger enqueues its kernels on the transport's stream, and a sub-group's collectives
// (Topology<Hierarchical>, Overlap<Concurrent<N>>) must be ordered with them. One thread at a time
// per transport object, as for the host transports.
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "../detail/cuda/check.cuh"
#include "../dtype.hpp"
#include "transport.hpp"

namespace gflow::detail::cuda {

/// A growable host staging buffer, page-locked (cudaMallocHost) or pageable. Copies start empty
/// (the contents are scratch) and keep the kind; a move takes the memory along, so a moved-from
/// transport (which has no stream left to wait for) frees nothing an upload may still read.
class staging_buffer {
 public:
  explicit staging_buffer(bool pinned) : pinned_(pinned) {}
  staging_buffer(const staging_buffer& o) noexcept : pinned_(o.pinned_) {}
  staging_buffer(staging_buffer&& o) noexcept
      : pinned_(o.pinned_), p_(std::exchange(o.p_, nullptr)), cap_(std::exchange(o.cap_, 0)), pageable_(std::move(o.pageable_)) {}
  staging_buffer& operator=(staging_buffer&& o) noexcept {
    if (this != &o) {
      release();
      pinned_ = o.pinned_;
      p_ = std::exchange(o.p_, nullptr);
      cap_ = std::exchange(o.cap_, 0);
      pageable_ = std::move(o.pageable_);
    }
    return *this;
  }
  staging_buffer& operator=(const staging_buffer& o) noexcept {
    if (this != &o) {
      release();
      pinned_ = o.pinned_;
    }
    return *this;
  }
  ~staging_buffer() { release(); }

  /// At least `bytes` bytes; the old contents are not kept when it grows.
  void* get(std::size_t bytes, const char* what) {
    if (bytes <= cap_) return p_;
    const std::size_t want = bytes > 2 * cap_ ? bytes : 2 * cap_;
    release();
    if (pinned_) {
      check_cuda(cudaMallocHost(&p_, want), what);
    } else {
      pageable_.resize(want);
      p_ = pageable_.data();
    }
    cap_ = want;
    return p_;
  }

 private:
  void release() noexcept {
    if (pinned_ && p_ != nullptr) (void)cudaFreeHost(p_);
    pageable_ = {};
    p_ = nullptr;
    cap_ = 0;
  }
  bool pinned_;
  void* p_ = nullptr;
  std::size_t cap_ = 0;
  std::vector<unsigned char> pageable_;
};

template <class Host, class Derived>
class staged_transport : public transport_base<device_memory> {
 public:
  /// Every operation completes before it returns: a request is only a token.
  struct request {};

  [[nodiscard]] int rank() const { return host_.rank(); }
  [[nodiscard]] int size() const { return host_.size(); }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  /// True when the collectives hand device pointers to Host (no staging).
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  /// The host transport the collectives run on (its timeout, communicator, ...).
  [[nodiscard]] Host& host() noexcept { return host_; }
  [[nodiscard]] const Host& host() const noexcept { return host_; }

  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    in_place(buf, n, [&](T* h) { host_.all_reduce(h, n, op); });
  }
  /// recv holds n * size() elements, rank r's block at recv + r * n.
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    const std::size_t total = n * static_cast<std::size_t>(size());
    if (direct_) return run_direct([&] { host_.all_gather(send, recv, n); });
    const T* h = down(send_, send, n);
    T* r = scratch<T>(recv_, total);
    host_.all_gather(h, r, n);
    up(recv, r, total);
  }
  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    in_place(buf, n, [&](T* h) { host_.broadcast(h, n, root); });
  }
  /// In place; root's buf receives the reduction, the others' buffers are only read (and not
  /// written back).
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op op, int root) {
    if (direct_) return run_direct([&] { host_.reduce(buf, n, op, root); });
    T* h = down(send_, static_cast<const T*>(buf), n);
    host_.reduce(h, n, op, root);
    if (rank() == root) up(buf, h, n);
  }
  template <wire_element T>
  void send(const T* buf, std::size_t n, int peer) {
    if (direct_) return run_direct([&] { host_.send(buf, n, peer); });
    host_.send(down(send_, buf, n), n, peer);
  }
  template <wire_element T>
  void recv(T* buf, std::size_t n, int peer) {
    if (direct_) return run_direct([&] { host_.recv(buf, n, peer); });
    T* r = scratch<T>(recv_, n);
    host_.recv(r, n, peer);
    up(buf, r, n);
  }
  void barrier() {
    sync();
    host_.barrier();
  }

  // The variable collectives (gflow::variable_transport, Sparsifier<OkTopK<d>>); the counts are
  // host arrays of size() entries, checked by Host.
  /// Block q of send (n elements) to rank q; recv's block q from rank q.
  template <wire_element T>
  void all_to_all(const T* send, T* recv, std::size_t n) {
    if (direct_) return run_direct([&] { host_.all_to_all(send, recv, n); });
    const std::size_t total = n * static_cast<std::size_t>(size());
    const T* h = down(send_, send, total);
    T* r = scratch<T>(recv_, total);
    host_.all_to_all(h, r, n);
    up(recv, r, total);
  }
  /// Packed blocks: send_counts[q] elements to rank q, recv_counts[q] from rank q.
  template <wire_element T>
  void all_to_allv(const T* send, const std::size_t* send_counts, T* recv, const std::size_t* recv_counts) {
    if (direct_) return run_direct([&] { host_.all_to_allv(send, send_counts, recv, recv_counts); });
    const T* h = down(send_, send, sum(send_counts));
    const std::size_t total = sum(recv_counts);
    T* r = scratch<T>(recv_, total);
    host_.all_to_allv(h, send_counts, r, recv_counts);
    up(recv, r, total);
  }
  /// recv holds counts[0] + ... + counts[P-1] elements, rank q's n = counts[q] in rank order.
  template <wire_element T>
  void all_gatherv(const T* send, std::size_t n, T* recv, const std::size_t* counts) {
    if (direct_) return run_direct([&] { host_.all_gatherv(send, n, recv, counts); });
    const T* h = down(send_, send, n);
    const std::size_t total = sum(counts);
    T* r = scratch<T>(recv_, total);
    host_.all_gatherv(h, n, r, counts);
    up(recv, r, total);
  }

  // Sharding<ReduceScatter> (gflow::sharding_transport); the counts are host arrays of size()
  // entries, checked by Host.
  /// Packed blocks of send, counts[q] elements for rank q; recv receives this rank's block of the
  /// reduction (counts[rank()] elements).
  template <wire_element T>
  void reduce_scatter(const T* send, T* recv, const std::size_t* counts, reduce_op op) {
    if (direct_) return run_direct([&] { host_.reduce_scatter(send, recv, counts, op); });
    const T* h = down(send_, send, sum(counts));
    const std::size_t mine = counts[rank()];
    T* r = scratch<T>(recv_, mine);
    host_.reduce_scatter(h, r, counts, op);
    up(recv, r, mine);
  }
  /// In place over counts[0] + ... + counts[P-1] elements: rank q's block (after the blocks of the
  /// ranks before it) to every rank. Staged, the whole buffer goes down and up.
  template <wire_element T>
  void all_gatherv_in_place(T* buf, const std::size_t* counts) {
    in_place(buf, sum(counts), [&](T* h) { host_.all_gatherv_in_place(h, counts); });
  }

  template <wire_element T> request iall_reduce(T* buf, std::size_t n, reduce_op op) { all_reduce(buf, n, op); return {}; }
  template <wire_element T> request iall_gather(const T* s, T* r, std::size_t n) { all_gather(s, r, n); return {}; }
  template <wire_element T> request ibroadcast(T* buf, std::size_t n, int root) { broadcast(buf, n, root); return {}; }
  template <wire_element T> request ireduce(T* buf, std::size_t n, reduce_op op, int root) { reduce(buf, n, op, root); return {}; }
  template <wire_element T> request isend(const T* buf, std::size_t n, int peer) { send(buf, n, peer); return {}; }
  template <wire_element T> request irecv(T* buf, std::size_t n, int peer) { recv(buf, n, peer); return {}; }
  template <wire_element T>
  request ireduce_scatter(const T* s, T* r, const std::size_t* counts, reduce_op op) {
    reduce_scatter(s, r, counts, op);
    return {};
  }
  void wait(request&) {}

  /// The control channel (consistency checks at construction, exchanger/consistency.hpp): host
  /// buffers, straight through Host.
  template <wire_element T>
  void control_all_gather(const T* send, T* recv, std::size_t n) { host_.all_gather(send, recv, n); }
  template <wire_element T>
  void control_broadcast(T* buf, std::size_t n, int root) { host_.broadcast(buf, n, root); }

  /// Collective: ranks with the same color form a group ordered by key, on the same device and
  /// stream as this rank (see the header comment).
  Derived split(int color, int key) {
    sync();
    return Derived(host_.split(color, key), device_, split_tag{direct_, pinned_, stream_});
  }

 protected:
  /// What split() passes to Derived's constructor (host, device, split_tag): the sub-group keeps
  /// the parent's path, staging kind and stream.
  struct split_tag {
    bool direct;
    bool pinned;
    std::shared_ptr<CUstream_st> stream;
  };
  /// Rank host.rank() of Host's group on CUDA device `device`, with a new non-blocking stream;
  /// staging through page-locked buffers when `pinned`, else pageable ones.
  staged_transport(Host host, int device, bool direct, bool pinned)
      : host_(std::move(host)), device_(device), direct_(direct), pinned_(pinned), send_(pinned), recv_(pinned) {
    device_guard g(device_);
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags for a device transport's rank");
    stream_.reset(s, [](cudaStream_t p) { (void)cudaStreamDestroy(p); });
  }
  /// A sub-group of split(): the parent's stream.
  staged_transport(Host host, int device, split_tag s)
      : host_(std::move(host)), device_(device), direct_(s.direct), pinned_(s.pinned), stream_(std::move(s.stream)), send_(s.pinned), recv_(s.pinned) {}
  staged_transport(const staged_transport&) = default;
  staged_transport(staged_transport&&) noexcept = default;
  staged_transport& operator=(const staged_transport&) = default;
  staged_transport& operator=(staged_transport&&) noexcept = default;
  ~staged_transport() {
    // An upload from a staging buffer may still be in flight on the stream.
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_.get());
  }

 private:
  [[nodiscard]] std::size_t sum(const std::size_t* counts) const {
    std::size_t s = 0;
    for (int q = 0; q < size(); ++q) s += counts[q];
    return s;
  }
  void sync() const {
    device_guard g(device_);
    check_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize in a device transport's collective");
  }
  template <class F>
  void run_direct(F&& f) {
    sync();  // the buffer's producers, enqueued on this rank's stream, are done
    f();
  }
  /// `n` elements of staging; the stream is idle after (no upload still reads the buffer).
  template <class T>
  T* scratch(staging_buffer& s, std::size_t n) {
    sync();
    return static_cast<T*>(s.get(n * sizeof(T) + 1, "cudaMallocHost of a device transport's page-locked staging buffer"));
  }
  template <class T>
  T* down(staging_buffer& s, const T* d, std::size_t n) {
    T* h = scratch<T>(s, n);
    if (n) {
      check_cuda(cudaMemcpyAsync(h, d, n * sizeof(T), cudaMemcpyDeviceToHost, stream_.get()), "cudaMemcpyAsync of a device collective's input");
      sync();
    }
    return h;
  }
  template <class T>
  void up(T* d, const T* h, std::size_t n) {
    // On the rank's stream, so the kernels enqueued next see the result; the staging buffer is
    // not reused before the stream has passed this copy (scratch() synchronises first; a pageable
    // source is copied out before cudaMemcpyAsync returns).
    if (n) {
      device_guard g(device_);
      check_cuda(cudaMemcpyAsync(d, h, n * sizeof(T), cudaMemcpyHostToDevice, stream_.get()), "cudaMemcpyAsync of a device collective's result");
    }
  }
  template <class T, class F>
  void in_place(T* buf, std::size_t n, F&& run) {
    if (direct_) return run_direct([&] { run(buf); });
    T* h = down(send_, static_cast<const T*>(buf), n);
    run(h);
    up(buf, h, n);
  }

  Host host_;
  int device_;
  bool direct_;
  bool pinned_;
  std::shared_ptr<CUstream_st> stream_;
  staging_buffer send_, recv_;
};

}  // namespace gflow::detail::cuda
