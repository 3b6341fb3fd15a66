#pragma once
// gflow::inproc_device::transport: P ranks as P threads of one process on ONE GPU, each rank with
// its own CUDA stream. NCCL refuses several ranks on one device; this transport is what makes
// multi-rank tests of the exchanger's device path (device_backend, the sparse engines on device
// memory) possible on a machine with a single GPU.
//
//   gflow::inproc_device::run(4, [&](gflow::inproc_device::transport& t) {
//     gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.01>>>::on<gflow::inproc_device::transport> ex(t, layout);
//     ...   // buffers are device pointers; kernels run on t.stream()
//   });
//
// memory_space is device_memory and every buffer is a device pointer of t.device(). Each
// collective waits for the rank's stream (the buffer is complete), then runs the in-process
// transport's collective (transport/inproc.hpp: the same matching, the same mismatch and timeout
// errors, reductions adding ranks 0..P-1 in order in fp32 and rounding once) on host staging
// copies, and copies the result back before returning; the i-forms complete before they return.
// The variable collectives (all_to_all, all_to_allv, all_gatherv: gflow::variable_transport) are
// staged the same way, with the host transport's count checks.
// The data path therefore crosses the host: this is a test transport (the reductions are those
// of the host in-process transport, so device exchanges can be compared bit for bit with host
// ones), not a fast one; NCCL is the production device transport.
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../transport/inproc.hpp"
#include "../transport/transport.hpp"
#include "../detail/cuda/check.cuh"

namespace gflow::inproc_device {

class transport : public transport_base<device_memory> {
 public:
  /// Every operation completes before it returns: a request is only a token.
  struct request {};

  /// Rank `host.rank()` of the group on CUDA device `device`, with a new non-blocking stream.
  transport(inproc::transport host, int device) : host_(std::move(host)), device_(device) {
    gflow::detail::cuda::device_guard g(device_);
    cudaStream_t s = nullptr;
    gflow::detail::cuda::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags for an in-process device rank");
    stream_.reset(s, [](cudaStream_t p) { (void)cudaStreamDestroy(p); });
  }

  [[nodiscard]] int rank() const { return host_.rank(); }
  [[nodiscard]] int size() const { return host_.size(); }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }

  // In-place collectives: copied to the host, run there, copied back.
  template <wire_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) { in_place(buf, n, [&](T* h) { host_.all_reduce(h, n, op); }); }
  template <wire_element T>
  void all_gather(const T* send, T* recv, std::size_t n) {
    auto h = down(send, n);
    std::vector<T> r(n * static_cast<std::size_t>(size()));
    host_.all_gather(h.data(), r.data(), n);
    up(recv, r.data(), r.size());
  }
  template <wire_element T>
  void broadcast(T* buf, std::size_t n, int root) { in_place(buf, n, [&](T* h) { host_.broadcast(h, n, root); }); }
  template <wire_element T>
  void reduce(T* buf, std::size_t n, reduce_op op, int root) { in_place(buf, n, [&](T* h) { host_.reduce(h, n, op, root); }); }
  template <wire_element T>
  void send(const T* buf, std::size_t n, int peer) {
    auto h = down(buf, n);
    host_.send(h.data(), n, peer);
  }
  template <wire_element T>
  void recv(T* buf, std::size_t n, int peer) {
    std::vector<T> h(n);
    host_.recv(h.data(), n, peer);
    up(buf, h.data(), n);
  }
  void barrier() {
    sync();
    host_.barrier();
  }

  // The variable collectives (gflow::variable_transport, Sparsifier<OkTopK<d>>): staged like the
  // others; the counts are host arrays of size() entries, and a pair of ranks that disagree on a
  // count gets the host transport's mismatch_error (nothing is copied back then).
  /// Block q of send (n elements) to rank q; recv's block q from rank q.
  template <wire_element T>
  void all_to_all(const T* send, T* recv, std::size_t n) {
    const std::size_t total = n * static_cast<std::size_t>(size());
    auto h = down(send, total);
    std::vector<T> r(total);
    host_.all_to_all(h.data(), r.data(), n);
    up(recv, r.data(), total);
  }
  /// Packed blocks: send_counts[q] elements to rank q, recv_counts[q] from rank q.
  template <wire_element T>
  void all_to_allv(const T* send, const std::size_t* send_counts, T* recv, const std::size_t* recv_counts) {
    auto h = down(send, sum(send_counts));
    std::vector<T> r(sum(recv_counts));
    host_.all_to_allv(h.data(), send_counts, r.data(), recv_counts);
    up(recv, r.data(), r.size());
  }
  /// recv holds counts[0] + ... + counts[P-1] elements, rank q's n = counts[q] in rank order.
  template <wire_element T>
  void all_gatherv(const T* send, std::size_t n, T* recv, const std::size_t* counts) {
    auto h = down(send, n);
    std::vector<T> r(sum(counts));
    host_.all_gatherv(h.data(), n, r.data(), counts);
    up(recv, r.data(), r.size());
  }

  template <wire_element T> request iall_reduce(T* buf, std::size_t n, reduce_op op) { all_reduce(buf, n, op); return {}; }
  template <wire_element T> request iall_gather(const T* s, T* r, std::size_t n) { all_gather(s, r, n); return {}; }
  template <wire_element T> request ibroadcast(T* buf, std::size_t n, int root) { broadcast(buf, n, root); return {}; }
  template <wire_element T> request ireduce(T* buf, std::size_t n, reduce_op op, int root) { reduce(buf, n, op, root); return {}; }
  template <wire_element T> request isend(const T* buf, std::size_t n, int peer) { send(buf, n, peer); return {}; }
  template <wire_element T> request irecv(T* buf, std::size_t n, int peer) { recv(buf, n, peer); return {}; }
  void wait(request&) {}

  /// The control channel (consistency checks at construction, exchanger/consistency.hpp): host
  /// buffers, straight through the in-process transport.
  template <wire_element T>
  void control_all_gather(const T* send, T* recv, std::size_t n) { host_.all_gather(send, recv, n); }
  template <wire_element T>
  void control_broadcast(T* buf, std::size_t n, int root) { host_.broadcast(buf, n, root); }

  /// Collective: ranks with the same color form a group ordered by key, on the same device, each
  /// with a new stream.
  transport split(int color, int key) {
    sync();
    return transport(host_.split(color, key), device_);
  }

 private:
  [[nodiscard]] std::size_t sum(const std::size_t* counts) const {
    std::size_t s = 0;
    for (int q = 0; q < size(); ++q) s += counts[q];
    return s;
  }
  void sync() const {
    gflow::detail::cuda::device_guard g(device_);
    gflow::detail::cuda::check_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize in gflow::inproc_device::transport");
  }
  template <class T, class F>
  void in_place(T* buf, std::size_t n, F&& run) {
    auto h = down(buf, n);
    run(h.data());
    up(buf, h.data(), n);
  }
  template <class T>
  std::vector<T> down(const T* d, std::size_t n) const {
    sync();  // the buffer's producers, enqueued on this rank's stream, are done
    std::vector<T> h(n);
    if (n) {
      gflow::detail::cuda::check_cuda(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, stream_.get()),
                       "cudaMemcpyAsync of an in-process device collective's input");
      sync();
    }
    return h;
  }
  template <class T>
  void up(T* d, const T* h, std::size_t n) const {
    // On the rank's stream, so the kernels enqueued next see the result; the pageable source is
    // staged before cudaMemcpyAsync returns, so h may go at once.
    if (n) {
      gflow::detail::cuda::device_guard g(device_);
      gflow::detail::cuda::check_cuda(cudaMemcpyAsync(d, h, n * sizeof(T), cudaMemcpyHostToDevice, stream_.get()),
                       "cudaMemcpyAsync of an in-process device collective's result");
    }
  }

  inproc::transport host_;
  int device_;
  std::shared_ptr<CUstream_st> stream_;
};
static_assert(gflow::transport<transport> && gflow::variable_transport<transport>);

/// Runs fn(transport&) on `ranks` threads, all on CUDA device `device`, one stream each, and
/// rethrows the first exception (lowest rank) after every thread has ended.
template <class Fn>
void run(int ranks, Fn&& fn, int device = 0, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  inproc::run(
      ranks,
      [&](inproc::transport& h) {
        gflow::detail::cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice for an in-process device rank");
        transport t(h, device);
        fn(t);
      },
      timeout);
}

}  // namespace gflow::inproc_device
