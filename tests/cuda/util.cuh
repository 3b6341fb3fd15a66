#pragma once
// Helpers shared by the CUDA tests: a checked CUDA call, an owning device buffer, the device count,
// and a runner that drives one host thread per rank of a multi-GPU transport.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <gflow/detail/cuda/check.cuh>

#include "harness.cuh"

namespace gflow_cuda_test {

inline void ok(cudaError_t e, const char* what) { gflow::detail::cuda::check_cuda(e, what); }

inline int device_count() {
  int n = 0;
  ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  return n;
}

/// Runs fn(t) for every rank, one host thread per rank (the rank's device made current), and
/// reports exceptions as failures.
template <class Transport, class Fn>
void run_ranks(std::vector<Transport>& ranks, Fn fn) {
  auto body = [&](Transport& t) {
    try {
      ok(cudaSetDevice(t.device()), "cudaSetDevice");
      fn(t);
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, "rank " + std::to_string(t.rank()) + ": " + e.what());
    }
  };
  if (ranks.size() == 1) {
    body(ranks[0]);
    return;
  }
  std::vector<std::thread> threads;
  for (auto& t : ranks) threads.emplace_back([&body, &t] { body(t); });
  for (auto& th : threads) th.join();
}

/// An owning device array of n elements (at least one is allocated).
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t count) : n(count) {
    void* q = nullptr;
    ok(cudaMalloc(&q, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
    p = static_cast<T*>(q);
  }
  explicit dbuf(const std::vector<T>& h) : dbuf(h.size()) { put(h); }
  ~dbuf() { (void)cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  // cudaMemcpy from pageable memory may return before the copy has landed, and the tests' kernels
  // run on non-blocking streams that do not wait for the legacy stream: wait for the device.
  void put(const std::vector<T>& h) {
    ok(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after an H2D copy");
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
};

}  // namespace gflow_cuda_test
