#pragma once
// verify_replicas (replicas.hpp) on device memory: each tensor is copied to the host and
// fingerprinted there with the host's values_fingerprint, so a device rank and a host rank of the
// same values agree bit for bit. Host code only (cudaMemcpyAsync, no kernels). The copy runs on
// the transport's stream when it has one (t.stream(): NCCL, inproc_device), after what is already
// enqueued there; otherwise after cudaDeviceSynchronize. Brought in by <gflow/cuda/exchanger.cuh>.
//
// Cost: the values cross PCIe once per check (resnet50's 25.6 M floats: about 100 MB). A kernel
// fingerprinting on the device would avoid the copy; for a check every N steps the copy is kept.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../layout.hpp"
#include "../replicas.hpp"
#include "../detail/support/fingerprint.hpp"
#include "../detail/cuda/check.cuh"

namespace gflow::detail {

template <>
struct replica_reader<device_memory> {
  static constexpr bool available = true;
  template <class T>
  static void fingerprints(T& t, const float* values, const Layout& layout, std::uint64_t* out) {
    int device = -1;
    if constexpr (requires { t.device(); }) device = t.device();
    if (device < 0) cuda::check_cuda(cudaGetDevice(&device), "cudaGetDevice for verify_replicas");
    cuda::device_guard g(device);
    cudaStream_t s = nullptr;
    if constexpr (requires { t.stream(); }) s = t.stream();
    else cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before verify_replicas reads the values");
    std::size_t largest = 0;
    for (const auto& d : layout.tensors()) largest = std::max(largest, d.numel);
    std::vector<float> host(largest);
    std::size_t off = 0;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      const std::size_t n = layout[i].numel;
      cuda::check_cuda(cudaMemcpyAsync(host.data(), values + off, n * sizeof(float), cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync of a tensor verify_replicas fingerprints");
      cuda::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize after verify_replicas' copy");
      out[i] = values_fingerprint(host.data(), n);
      off += n;
    }
  }
};

}  // namespace gflow::detail
