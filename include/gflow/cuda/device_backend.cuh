#pragma once
// Memory and kernels of the exchanger for device-memory transports (NCCL): the twin of
// include/gflow/detail/host_backend.hpp, with the same members.
//
//   buffer<E>                  owning, zero-filled cudaMalloc'd array (current device)
//   context(transport&)        per-exchanger kernel context on the transport's stream
//     scale_to_wire(in, out, n, s)   out = W(in * s)
//     wire_to_float(in, out, n)      out = float(in); counts non-finite results
//     scale_in_place(buf, n, s)      buf *= s; counts non-finite results
//     count_nonfinite(buf, n)        counts non-finite results
//     copy(dst, src, n)              device to device, on the stream
//     take_nonfinite()               the count since the last call (synchronises the stream)
//
// Everything is enqueued on the transport's stream (t.stream()), in order with its collectives.
// What that asks of a trainer:
//   - Build the exchanger with the transport's device current (cudaSetDevice(t.device())): the
//     pool and wire buffers are allocated on the current device.
//   - A gradient must be complete, as seen from the transport's stream, when ready(i) is
//     called: compute it on that stream, or make the stream wait for the producing stream
//     (cudaEventRecord + cudaStreamWaitEvent) before ready(i). The copying ready(i, source)
//     reads `source` on the stream as well.
//   - finish() returns once the averaged gradients are in the pool (take_nonfinite
//     synchronises the stream), so they can be read from any stream afterwards.
//
// Include <gflow/cuda/exchanger.cuh> from a .cu file rather than this header directly.
#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <string>
#include <utility>

#include "../dtype.hpp"
#include "cast.cuh"
#include "check.cuh"

namespace gflow::detail {

struct cuda_free {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};

/// Owning, zero-filled device array on the device current at construction.
template <class E>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(E);
    void* p = nullptr;
    cuda::check_cuda(cudaMalloc(&p, bytes), "cudaMalloc of a " + std::to_string(bytes) + "-byte gflow device buffer");
    p_.reset(static_cast<E*>(p));
    // Zero-fill and wait, so the buffer is zero for every stream of the device.
    cuda::check_cuda(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync of a gflow device buffer");
    cuda::check_cuda(cudaStreamSynchronize(0), "cudaStreamSynchronize after zero-filling a gflow device buffer");
  }
  [[nodiscard]] E* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  std::unique_ptr<E, cuda_free> p_;
  std::size_t n_ = 0;
};

struct device_backend {
  // Kernels run on the transport's stream, after every collective started on it: the exchanger
  // starts a bucket's collective and enqueues the cast-back behind it without waiting;
  // take_nonfinite() in finish() is the one host synchronisation per iteration.
  static constexpr bool stream_ordered = true;
  template <class E>
  using buffer = device_buffer<E>;

  class context {
   public:
    /// T provides stream() (a cudaStream_t) and, optionally, device() (the CUDA device its
    /// stream and communicator belong to; otherwise the current device is used).
    template <class T>
    explicit context(T& t) : stream_(t.stream()) {
      if constexpr (requires { { t.device() } -> std::convertible_to<int>; }) {
        device_ = t.device();
      } else {
        cuda::check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
      }
      cuda::device_guard g(device_);
      void* c = nullptr;
      cuda::check_cuda(cudaMalloc(&c, sizeof(unsigned long long)), "cudaMalloc of the non-finite counter");
      counter_.reset(static_cast<unsigned long long*>(c));
      void* h = nullptr;
      cuda::check_cuda(cudaMallocHost(&h, sizeof(unsigned long long)), "cudaMallocHost of the non-finite counter's host copy");
      host_.reset(static_cast<unsigned long long*>(h));
      *host_ = 0;
      cuda::check_cuda(cudaMemsetAsync(c, 0, sizeof(unsigned long long), stream_), "cudaMemsetAsync of the non-finite counter");
    }

    template <class W>
    void scale_to_wire(const float* in, W* out, std::size_t n, float s) {
      cuda::device_guard g(device_);
      cuda::scale_to_wire(in, out, n, s, stream_);
    }
    template <class W>
    void wire_to_float(const W* in, float* out, std::size_t n) {
      cuda::device_guard g(device_);
      cuda::wire_to_float(in, out, n, counter_.get(), stream_);
    }
    void scale_in_place(float* buf, std::size_t n, float s) {
      cuda::device_guard g(device_);
      cuda::scale_in_place(buf, n, s, counter_.get(), stream_);
    }
    void count_nonfinite(const float* buf, std::size_t n) {
      cuda::device_guard g(device_);
      cuda::count_nonfinite(buf, n, counter_.get(), stream_);
    }
    void copy(float* dst, const float* src, std::size_t n) {
      if (n == 0 || dst == src) return;
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                       "cudaMemcpyAsync of a gradient into the pool");
    }
    /// The non-finite count since the last call. Synchronises the stream (all work enqueued so
    /// far is complete when it returns) and resets the counter.
    std::size_t take_nonfinite() {
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaMemcpyAsync(host_.get(), counter_.get(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync of the non-finite counter");
      cuda::check_cuda(cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), stream_), "cudaMemsetAsync of the non-finite counter");
      cuda::check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize in Exchanger::finish");
      return static_cast<std::size_t>(*host_);
    }

    [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
    [[nodiscard]] int device() const noexcept { return device_; }

    /// The stream the trainer's backward produces gradients on. Once set, every bucket's work on
    /// the transport's stream is ordered after everything enqueued on the producer so far, by an
    /// event: no host synchronisation in ready().
    void set_producer(cudaStream_t producer) {
      cuda::device_guard g(device_);
      if (!producer_event_) {
        cudaEvent_t e = nullptr;
        cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags for the producer event");
        producer_event_.reset(e);
      }
      producer_ = producer;
      has_producer_ = true;
    }
    /// Called by the exchanger right before a bucket's work is enqueued.
    void order_after_producer() {
      if (!has_producer_ || producer_ == stream_) return;
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaEventRecord(producer_event_.get(), producer_), "cudaEventRecord on the producer stream");
      cuda::check_cuda(cudaStreamWaitEvent(stream_, producer_event_.get(), 0), "cudaStreamWaitEvent of the exchange stream");
    }

   private:
    struct host_free {
      void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
    };
    struct event_destroy {
      void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
    };
    cudaStream_t stream_;
    int device_ = 0;
    cudaStream_t producer_ = nullptr;
    bool has_producer_ = false;
    std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_destroy> producer_event_;
    std::unique_ptr<unsigned long long, cuda_free> counter_;
    std::unique_ptr<unsigned long long, host_free> host_;
  };
};

template <class Space>
struct backend_for;
template <>
struct backend_for<device_memory> {
  using type = device_backend;
};

}  // namespace gflow::detail
