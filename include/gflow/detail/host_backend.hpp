#pragma once
// Memory and kernels of the exchanger for host-memory transports (MPI, in-process, mock).
// The device twin (include/gflow/cuda/device_backend.cuh) has the same members and runs the
// CUDA kernels on the transport's stream.
//
//   stream_ordered             true when kernels queue behind started collectives (CUDA stream)
//   buffer<E>                  owning, zero-filled array (malloc'd)
//   context(transport&)        per-exchanger kernel context
//     scale_to_wire(in, out, n, s)   out = W(in * s)
//     wire_to_float(in, out, n)      out = float(in); counts non-finite results
//     scale_in_place(buf, n, s)      buf *= s; counts non-finite results
//     count_nonfinite(buf, n)        counts non-finite results
//     add_nonfinite(k)               adds k to the count (host only: for engines that count while
//                                    they scatter, CSC)
//     copy(dst, src, n)              src lives in the same memory space
//     take_nonfinite()               the count since the last call (device: synchronises)
//     order_after_producer()         before a bucket's work: device contexts make their stream
//                                    wait for the trainer's producer stream (set_producer)
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "../kernels/cast.hpp"

namespace gflow::detail {

// Allocated with malloc, like std::vector: a 64-byte aligned pool (operator new with
// align_val_t) made Open MPI's in-place allreduce of ResNet-50 ~20% slower than the same
// hand-written loop on a malloc'd buffer (bench/run exchange, 2 ranks; see docs/BENCHMARKS.md).
struct malloc_free {
  void operator()(void* p) const noexcept { std::free(p); }
};

template <class E>
class host_buffer {
 public:
  host_buffer() = default;
  explicit host_buffer(std::size_t n) : n_(n) {
    if (n) {
      p_.reset(static_cast<E*>(std::malloc(n * sizeof(E))));
      if (!p_) throw std::bad_alloc();
      std::memset(static_cast<void*>(p_.get()), 0, n * sizeof(E));
    }
  }
  [[nodiscard]] E* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  std::unique_ptr<E, malloc_free> p_;
  std::size_t n_ = 0;
};

struct host_backend {
  // Host kernels run on the caller's thread: a collective must complete before its result is read.
  static constexpr bool stream_ordered = false;
  template <class E>
  using buffer = host_buffer<E>;

  class context {
   public:
    template <class T>
    explicit context(T&) {}
    template <class W>
    void scale_to_wire(const float* in, W* out, std::size_t n, float s) { kernels::scale_to_wire(in, out, n, s); }
    template <class W>
    void wire_to_float(const W* in, float* out, std::size_t n) { bad_ += kernels::wire_to_float(in, out, n); }
    void scale_in_place(float* buf, std::size_t n, float s) { bad_ += kernels::scale_in_place(buf, n, s); }
    void count_nonfinite(const float* buf, std::size_t n) { bad_ += kernels::count_nonfinite(buf, n); }
    void add_nonfinite(std::size_t k) { bad_ += k; }
    void copy(float* dst, const float* src, std::size_t n) { if (n && dst != src) std::memmove(dst, src, n * sizeof(float)); }
    std::size_t take_nonfinite() { const std::size_t b = bad_; bad_ = 0; return b; }
    void order_after_producer() {}  // host gradients are complete when ready() is called

   private:
    std::size_t bad_ = 0;
  };
};

}  // namespace gflow::detail
