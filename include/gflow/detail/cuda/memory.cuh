#pragma once
// Owning device memory for gflow's kernels and transports: device_array<T> (cudaMalloc on the
// current device, no initialisation, freed with the array) and the cudaFree deleter.
// Host code only (no kernels), like check.cuh: the NCCL transport (a .hpp) uses it too.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "check.cuh"

namespace gflow::detail::cuda {

/// Deleter for memory from cudaMalloc (std::unique_ptr<void, cuda_free>).
struct cuda_free {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};

/// Owning device array on the device current at construction, no initialisation. n = 0 still
/// allocates one element, so get() is a valid device pointer. `what` names the allocation in the
/// error a failed cudaMalloc raises.
template <class T>
class device_array {
 public:
  device_array() = default;
  explicit device_array(std::size_t n, const char* what) : n_(n) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, (n ? n : 1) * sizeof(T)), what);
    p_ = static_cast<T*>(p);
  }
  device_array(device_array&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  device_array& operator=(device_array&& o) noexcept {
    if (this != &o) {
      if (p_) (void)cudaFree(p_);
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() {
    if (p_) (void)cudaFree(p_);
  }
  [[nodiscard]] T* get() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace gflow::detail::cuda
