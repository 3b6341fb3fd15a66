#pragma once
// How the CUDA kernels of gflow are launched: the grid for a number of work items, the
// grid-stride indices a kernel loops with, and a launch that reports a failed launch as
// gflow::transport_error (every kernel file launches through it).
//
//   const unsigned grid = kernel_detail::blocks_for(n, 256, 4096);  // ceil(n / 256), in [1, 4096]
//   kernel_detail::launch(my_kernel<W>, grid, 256, stream, "launch of gflow::detail::cuda::f", args...);
//
// Each kernel file keeps its own constants (threads per block, items per block, most blocks).
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "check.cuh"

namespace gflow::detail::cuda::kernel_detail {

/// Blocks for `items` work items, `per_block` to a block: ceil(items / per_block), at least 1
/// (a launch needs a block, also for no work), at most `max_blocks` (grid-stride loops do the rest).
inline unsigned blocks_for(std::size_t items, std::size_t per_block, std::size_t max_blocks) {
  std::size_t b = items / per_block + (items % per_block != 0 ? 1 : 0);
  if (b > max_blocks) b = max_blocks;
  if (b == 0) b = 1;
  return static_cast<unsigned>(b);
}

/// kernel<<<grid, block, 0, stream>>>(args...), then throws transport_error naming `what` if the
/// launch failed (bad configuration, no kernel image for this GPU, an earlier sticky error).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), unsigned grid, unsigned block, cudaStream_t stream, const char* what, Args&&... args) {
  kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
  check_cuda(cudaGetLastError(), what);
}

__device__ __forceinline__ std::size_t thread_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

}  // namespace gflow::detail::cuda::kernel_detail
