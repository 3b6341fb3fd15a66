#pragma once
// CUDA twin of include/gflow/optim/momentum_sgd.hpp: Algorithm 1's SGD update step (GradientFlow (Sun et al.))
// on device memory, bit-identical to the host kernels (explicit __fmul_rn / __fadd_rn /
// __fsub_rn, so no FMA contraction whatever the compile flags):
//
//   exchanged chunk:  u = hu = momentum * hu + lr * g;  w = w - u        kept-back chunk: nothing
//
//   momentum_sgd_step(w, g, hu, offset, n, C, selected, count, lr, m, stream)
//       updates pool range [offset, offset + n) where it lies in the listed chunks; w, g, hu
//       point at element `offset`; `selected` is a device array of ascending chunk indices
//   momentum_sgd_step_all(w, g, hu, n, lr, m, stream)     every element (dense exchange)
//
// Device pointers of the current device; each call only enqueues work on `stream`.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "check.cuh"
#include "launch.cuh"

namespace gflow::detail::cuda {

namespace sgd_detail {

inline constexpr unsigned block_threads = 256;
inline constexpr std::size_t max_chunk_blocks = 65535;  // step: one block per listed chunk
inline constexpr std::size_t max_blocks = 4096;         // step_all: grid-stride over the elements

__device__ __forceinline__ void update(float& w, float g, float& hu, float lr, float momentum) {
  const float u = __fadd_rn(__fmul_rn(momentum, hu), __fmul_rn(lr, g));
  hu = u;
  w = __fsub_rn(w, u);
}

// One block per listed chunk (grid-stride over the list); chunks outside the range do nothing.
// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void __launch_bounds__(block_threads)
step_kernel(float* w, const float* g, float* hu, std::size_t offset, std::size_t n, std::size_t C, const std::uint32_t* selected,
            std::size_t count, float lr, float momentum) {
  const std::size_t end = offset + n;
  for (std::size_t j = blockIdx.x; j < count; j += gridDim.x) {
    const std::size_t b = static_cast<std::size_t>(selected[j]) * C;
    if (b >= end || b + C <= offset) continue;
    const std::size_t lo = b < offset ? offset : b;
    const std::size_t hi = b + C < end ? b + C : end;
    for (std::size_t i = lo + threadIdx.x; i < hi; i += block_threads) {
      const std::size_t k = i - offset;
      update(w[k], g[k], hu[k], lr, momentum);
    }
  }
}

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void step_all_kernel(float* w, const float* g, float* hu, std::size_t n, float lr, float momentum) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    update(w[i], g[i], hu[i], lr, momentum);
}

}  // namespace sgd_detail

inline void momentum_sgd_step(float* w, const float* g, float* hu, std::size_t offset, std::size_t n, std::size_t chunk_elems,
                              const std::uint32_t* selected, std::size_t count, float lr, float momentum, cudaStream_t stream) {
  if (n == 0 || count == 0) return;
  kernel_detail::launch(sgd_detail::step_kernel, kernel_detail::blocks_for(count, 1, sgd_detail::max_chunk_blocks), sgd_detail::block_threads,
                        stream, "launch of gflow::detail::cuda::momentum_sgd_step", w, g, hu, offset, n, chunk_elems, selected, count, lr, momentum);
}

inline void momentum_sgd_step_all(float* w, const float* g, float* hu, std::size_t n, float lr, float momentum, cudaStream_t stream) {
  if (n == 0) return;
  kernel_detail::launch(sgd_detail::step_all_kernel, kernel_detail::blocks_for(n, sgd_detail::block_threads, sgd_detail::max_blocks),
                        sgd_detail::block_threads, stream, "launch of gflow::detail::cuda::momentum_sgd_step_all", w, g, hu, n, lr, momentum);
}

}  // namespace gflow::detail::cuda
