#pragma once
// CUDA twins of include/gflow/detail/kernels/sparse_chunks.hpp (CSC, GradientFlow (Sun et al.) section 3.2 and
// Algorithm 1), same semantics on device memory:
//
//   chunk_l1_norms(pool, n, C, list, count, norms, scale, stream)   norms[c] = scale * L1(chunk c)
//   compact_chunks(pool, hist, n, C, list, count, out, stream)      out = pool + hist, back to back; hist = 0
//   scatter_chunks(buf, pool, n, C, list, count, norms, scale, st)  pool = buf; norms[c] = scale * L1 (optional)
//   defer_chunks(pool, hist, n, C, list, count, m, norms, stream)   g = pool + hist; norms[c] = L1(g);
//                                                                   hist = m * g (0 where g is inf/NaN); pool = 0
//   the engine's fused kernels, bitwise identical to the host's (norms included, see below):
//   compact_chunks_to_wire(pool, hist, n, C, list, count, out, s, u, stream)
//   scatter_chunks_counted(buf, pool, n, C, list, count, mul, v, norms, s, counter, stream)
//   scatter_chunks_from_wire(wire, pool, n, C, list, count, norms, s, counter, stream)
//   defer_chunks_exact(pool, hist, n, C, list, count, m, norms, stream)
//   count_nonfinite_at(v, list, count, counter, stream)            counter += #{j : v[list[j]] inf/NaN}
//   chunk_selector sel(max_chunks);  sel.select(norms, chunks, k, out, stream)
//                                                                   top-k chunks, ties to the lower index,
//                                                                   ascending in out[0, k), the rest ascending
//
// Pointers are device pointers of the current device; `list` is a device array of `count`
// ascending 32-bit chunk indices (so compacted chunk j starts at j * C: only the last chunk of
// the pool can be partial, and it can only be last in an ascending list). hist may be null in
// compact_chunks, norms may be null where marked optional. Every call only enqueues work on
// `stream` and throws gflow::transport_error if the launch fails.
//
// Results: bit-identical to the host kernels. The element-wise parts (compaction, scatter,
// pool + hist, m * g) use explicit __fadd_rn / __fmul_rn (no contraction into FMA whatever the
// flags). The L1 norms follow the one order that host and device share (kernels/sparse_chunks.hpp):
// the block's 256 threads are the 256 lanes, thread t adding |x_j| in double for the chunk's
// elements j = t, t + 256, ... in increasing j (the coalesced grid-stride loop every kernel here
// runs anyway), then the lanes fold pairwise (lane l += lane l + h, h = 128, ..., 1: shared memory
// down to 32 lanes, warp shuffles after) and lane 0's total is rounded to float once. So a device
// exchange selects exactly the chunks the host one does, at the cost of one pass over each chunk.
// The selection is exact: a stable radix sort (CUB) on the same keys as kernels::chunk_key (NaN
// highest), so equal norms go to the lower index as on the host.
//
// Shape: one block of 256 threads per listed chunk (grid-stride over the list), threads stride
// over the chunk's elements, one fold per chunk for the norm.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../../error.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "launch.cuh"
#include "memory.cuh"

namespace gflow::detail::cuda {

namespace chunk_detail {

inline constexpr unsigned block_threads = 256;
inline constexpr std::size_t max_blocks = 65535;        // chunk kernels: one block per listed chunk
inline constexpr std::size_t max_stride_blocks = 4096;  // element-wise kernels: grid-stride loops

inline unsigned blocks_for(std::size_t count) { return kernel_detail::blocks_for(count, 1, max_blocks); }
inline unsigned grid_for(std::size_t work) { return kernel_detail::blocks_for(work, block_threads, max_stride_blocks); }

__device__ __forceinline__ std::size_t chunk_end(std::size_t c, std::size_t n, std::size_t C) {
  const std::size_t e = (c + 1) * C;
  return e < n ? e : n;
}

// The norm's fold over the block's lanes (kernels/sparse_chunks.hpp's l1_total): lane l += lane
// l + h for l < h, h = 128, 64, 32 in shared memory, then 16, ..., 1 by shuffles within warp 0 (the
// same additions: lane l reads lane l + h as it was after the previous fold). The total is valid
// in thread 0. `lanes` is the block's shared array of 256; every thread must call.
__device__ __forceinline__ double fold_lanes(double v, double* lanes) {
  static_assert(block_threads == 256, "the norm's order has 256 lanes (kernels/sparse_chunks.hpp)");
  lanes[threadIdx.x] = v;
  __syncthreads();
  for (unsigned h = block_threads / 2; h >= 32; h /= 2) {
    if (threadIdx.x < h) lanes[threadIdx.x] = __dadd_rn(lanes[threadIdx.x], lanes[threadIdx.x + h]);
    __syncthreads();
  }
  double t = 0.0;
  if (threadIdx.x < 32) {
    t = lanes[threadIdx.x];
    for (unsigned h = 16; h >= 1; h /= 2) t = __dadd_rn(t, __shfl_down_sync(0xffffffffu, t, h));
  }
  __syncthreads();  // lanes may be reused by the next chunk
  return t;
}

enum class mode { norms, compact, scatter, defer };

template <mode M>
__global__ void __launch_bounds__(block_threads)
chunk_kernel(float* pool, float* hist, const float* in, float* out, std::size_t n, std::size_t C, const std::uint32_t* list,
             std::size_t count, float momentum, float* norms, float scale) {
  __shared__ double lanes[block_threads];
  for (std::size_t j = blockIdx.x; j < count; j += gridDim.x) {
    const std::size_t c = list[j];
    const std::size_t b = c * C, e = chunk_end(c, n, C);
    const std::size_t k0 = j * C;  // position in the compaction buffer
    double s = 0;
    for (std::size_t i = b + threadIdx.x; i < e; i += block_threads) {
      if constexpr (M == mode::norms) {
        s = __dadd_rn(s, fabs(static_cast<double>(pool[i])));
      } else if constexpr (M == mode::compact) {
        if (hist != nullptr) {
          out[k0 + (i - b)] = __fadd_rn(pool[i], hist[i]);
          hist[i] = 0.0f;
        } else {
          out[k0 + (i - b)] = pool[i];
        }
      } else if constexpr (M == mode::scatter) {
        const float v = in[k0 + (i - b)];
        pool[i] = v;
        s = __dadd_rn(s, fabs(static_cast<double>(v)));
      } else {  // defer
        const float g = __fadd_rn(pool[i], hist[i]);
        s = __dadd_rn(s, fabs(static_cast<double>(g)));
        hist[i] = isfinite(g) ? __fmul_rn(momentum, g) : 0.0f;  // as the host: inf/NaN never enters the history
        pool[i] = 0.0f;
      }
    }
    if constexpr (M != mode::compact) {
      if (norms != nullptr) {
        const double total = fold_lanes(s, lanes);
        if (threadIdx.x == 0) norms[c] = __fmul_rn(scale, __double2float_rn(total));
      }
    }
  }
}

template <mode M>
void launch(const char* what, float* pool, float* hist, const float* in, float* out, std::size_t n, std::size_t C, const std::uint32_t* list,
            std::size_t count, float momentum, float* norms, float scale, cudaStream_t stream) {
  if (count == 0) return;
  kernel_detail::launch(chunk_kernel<M>, blocks_for(count), block_threads, stream, what, pool, hist, in, out, n, C, list, count, momentum, norms,
                        scale);
}

// Same map as kernels::chunk_key.
__device__ __forceinline__ std::uint32_t chunk_key(float norm) {
  const std::uint32_t b = __float_as_uint(norm);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void keys_kernel(const float* norms, std::size_t chunks, std::uint32_t* keys, std::uint32_t* index, std::uint32_t* flags) {
  for (std::size_t c = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; c < chunks; c += std::size_t{gridDim.x} * blockDim.x) {
    keys[c] = chunk_key(norms[c]);
    index[c] = static_cast<std::uint32_t>(c);
    flags[c] = 0;
  }
}

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void mark_kernel(const std::uint32_t* top, std::size_t k, std::uint32_t* flags) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < k; j += std::size_t{gridDim.x} * blockDim.x) flags[top[j]] = 1;
}

// out[0, k): flagged chunks ascending; out[k, chunks): the others ascending. pos = exclusive scan of flags.
// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void place_kernel(const std::uint32_t* flags, const std::uint32_t* pos, std::size_t chunks, std::size_t k, std::uint32_t* out) {
  for (std::size_t c = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; c < chunks; c += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t at = flags[c] ? pos[c] : k + (c - pos[c]);
    out[at] = static_cast<std::uint32_t>(c);
  }
}

}  // namespace chunk_detail

/// norms[list[j]] = scale * (L1 norm of chunk list[j] of the pool).
inline void chunk_l1_norms(const float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float* norms,
                           float scale, cudaStream_t stream) {
  chunk_detail::launch<chunk_detail::mode::norms>("launch of gflow::detail::cuda::chunk_l1_norms", const_cast<float*>(pool), nullptr, nullptr, nullptr,
                                                  n, C, list, count, 0.0f, norms, scale, stream);
}

/// out = pool + hist over the listed chunks, back to back (out[j * C...]); hist = 0 there.
/// hist may be null (plain copy).
inline void compact_chunks(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                           float* out, cudaStream_t stream) {
  chunk_detail::launch<chunk_detail::mode::compact>("launch of gflow::detail::cuda::compact_chunks", const_cast<float*>(pool), hist, nullptr, out, n,
                                                    C, list, count, 0.0f, nullptr, 1.0f, stream);
}

/// pool = buf over the listed chunks (read back to back); norms[c] = scale * L1 of what was
/// written when norms is not null.
inline void scatter_chunks(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                           float* norms, float scale, cudaStream_t stream) {
  chunk_detail::launch<chunk_detail::mode::scatter>("launch of gflow::detail::cuda::scatter_chunks", pool, nullptr, buf, nullptr, n, C, list, count,
                                                    0.0f, norms, scale, stream);
}

/// Algorithm 1 for kept-back chunks: g = pool + hist; norms[c] = L1(g) (norms may be null);
/// hist = momentum * g; pool = 0.
inline void defer_chunks(float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float momentum,
                         float* norms, cudaStream_t stream) {
  chunk_detail::launch<chunk_detail::mode::defer>("launch of gflow::detail::cuda::defer_chunks", pool, hist, nullptr, nullptr, n, C, list, count,
                                                  momentum, norms, 1.0f, stream);
}

namespace chunk_detail {

enum class fused { to_wire, scatter, scatter_mul, from_wire, defer };

__device__ __forceinline__ float finite_or_zero(float v) { return kernel_detail::nonfinite(v) ? 0.0f : v; }

template <fused M, class W>
__global__ void __launch_bounds__(block_threads)
fused_chunk_kernel(float* pool, float* hist, const W* win, W* wout, const float* fin, std::size_t n, std::size_t C, const std::uint32_t* list,
                   std::size_t count, float a, float u, float* norms, float norm_scale, unsigned long long* counter) {
  using ops = kernel_detail::wire_ops<W>;
  __shared__ double lanes[block_threads];
  unsigned long long bad = 0;
  for (std::size_t j = blockIdx.x; j < count; j += gridDim.x) {
    const std::size_t c = list[j];
    const std::size_t b = c * C, e = chunk_end(c, n, C);
    const std::size_t k0 = j * C;  // position in the compaction buffer
    if constexpr (M == fused::to_wire) {
      for (std::size_t i = b + threadIdx.x; i < e; i += block_threads) {
        const float g = __fadd_rn(pool[i], hist[i]);
        const auto o = ops::from_float(__fmul_rn(g, a));
        reinterpret_cast<kernel_detail::raw_t<W>*>(wout)[k0 + (i - b)] = o;
        hist[i] = finite_or_zero(__fsub_rn(g, __fmul_rn(ops::to_float(o), u)));
      }
    } else {
      // defer: g = pool + hist, hist = m g (0 where inf/NaN), pool = 0, the norm of g; the
      // scatters: pool = the exchanged value, counted, the norm of what was written. Thread t is
      // the norm's lane t (see the header comment).
      const bool norm = norms != nullptr;  // the same for the whole block
      double s = 0.0;
      for (std::size_t i = b + threadIdx.x; i < e; i += block_threads) {
        float v;
        if constexpr (M == fused::defer) {
          v = __fadd_rn(pool[i], hist[i]);
          hist[i] = finite_or_zero(__fmul_rn(a, v));
          pool[i] = 0.0f;
        } else {
          if constexpr (M == fused::from_wire) v = ops::to_float(reinterpret_cast<const kernel_detail::raw_t<W>*>(win)[k0 + (i - b)]);
          else if constexpr (M == fused::scatter_mul) v = __fmul_rn(fin[k0 + (i - b)], a);
          else v = fin[k0 + (i - b)];
          pool[i] = v;
          bad += kernel_detail::nonfinite(v);
        }
        s = __dadd_rn(s, fabs(static_cast<double>(v)));
      }
      if (norm) {
        const double t = fold_lanes(s, lanes);
        if (threadIdx.x == 0) {
          const float f = __double2float_rn(t);
          norms[c] = M == fused::defer ? f : __fmul_rn(norm_scale, f);
        }
      }
    }
  }
  if (counter != nullptr) kernel_detail::warp_add(counter, bad);
}

template <fused M, class W>
void launch_fused(const char* what, float* pool, float* hist, const W* win, W* wout, const float* fin, std::size_t n, std::size_t C,
                  const std::uint32_t* list, std::size_t count, float a, float u, float* norms, float norm_scale, unsigned long long* counter,
                  cudaStream_t stream) {
  if (count == 0) return;
  kernel_detail::launch(fused_chunk_kernel<M, W>, blocks_for(count), block_threads, stream, what, pool, hist, win, wout, fin, n, C, list, count, a,
                        u, norms, norm_scale, counter);
}

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void count_at_kernel(const float* v, const std::uint32_t* list, std::size_t count, unsigned long long* counter) {
  unsigned long long bad = 0;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < count; j += std::size_t{gridDim.x} * blockDim.x)
    bad += kernel_detail::nonfinite(v[list[j]]);
  kernel_detail::warp_add(counter, bad);
}

}  // namespace chunk_detail

/// The twin of kernels::compact_chunks_to_wire: g = pool + hist; out = W(g * scale) back to back;
/// hist = g - float(out) * unscale there (0 where that is inf/NaN). W is gflow::half or bfloat16.
template <class W>
void compact_chunks_to_wire(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, W* out,
                            float scale, float unscale, cudaStream_t stream) {
  chunk_detail::launch_fused<chunk_detail::fused::to_wire, W>("launch of gflow::detail::cuda::compact_chunks_to_wire", const_cast<float*>(pool), hist,
                                                             nullptr, out, nullptr, n, C, list, count, scale, unscale, nullptr, 1.0f, nullptr,
                                                             stream);
}

/// The twin of kernels::scatter_chunks_counted: pool = buf (times value_scale when multiply) over
/// the listed chunks; norms[c] = norm_scale * L1 in the shared order (norms may be null);
/// counter += the inf/NaN values written.
inline void scatter_chunks_counted(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                   bool multiply, float value_scale, float* norms, float norm_scale, unsigned long long* counter,
                                   cudaStream_t stream) {
  if (multiply)
    chunk_detail::launch_fused<chunk_detail::fused::scatter_mul, float>("launch of gflow::detail::cuda::scatter_chunks_counted", pool, nullptr, nullptr,
                                                                       nullptr, buf, n, C, list, count, value_scale, 1.0f, norms, norm_scale,
                                                                       counter, stream);
  else
    chunk_detail::launch_fused<chunk_detail::fused::scatter, float>("launch of gflow::detail::cuda::scatter_chunks_counted", pool, nullptr, nullptr,
                                                                   nullptr, buf, n, C, list, count, 1.0f, 1.0f, norms, norm_scale, counter,
                                                                   stream);
}

/// The twin of kernels::scatter_chunks_from_wire: pool = float(wire) over the listed chunks;
/// norms as scatter_chunks_counted; counter += the inf/NaN values.
template <class W>
void scatter_chunks_from_wire(const W* wire, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                              float* norms, float norm_scale, unsigned long long* counter, cudaStream_t stream) {
  chunk_detail::launch_fused<chunk_detail::fused::from_wire, W>("launch of gflow::detail::cuda::scatter_chunks_from_wire", pool, nullptr, wire, nullptr,
                                                               nullptr, n, C, list, count, 1.0f, 1.0f, norms, norm_scale, counter, stream);
}

/// defer_chunks with the host's history rule (finite_or_zero(m * g)): bitwise identical to
/// kernels::defer_chunks.
inline void defer_chunks_exact(float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                               float momentum, float* norms, cudaStream_t stream) {
  chunk_detail::launch_fused<chunk_detail::fused::defer, float>("launch of gflow::detail::cuda::defer_chunks_exact", pool, hist, nullptr, nullptr,
                                                               nullptr, n, C, list, count, momentum, 1.0f, norms, 1.0f, nullptr, stream);
}

/// counter += the number of listed entries v[list[j]] that are inf or NaN.
inline void count_nonfinite_at(const float* v, const std::uint32_t* list, std::size_t count, unsigned long long* counter, cudaStream_t stream) {
  if (count == 0) return;
  kernel_detail::launch(chunk_detail::count_at_kernel, chunk_detail::grid_for(count), chunk_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::count_nonfinite_at", v, list, count, counter);
}

/// Top-k chunk selection on the device, the twin of kernels::select_top_chunks. Owns its
/// scratch (keys, indices, flags, positions and CUB's temporary storage), allocated once for up
/// to max_chunks chunks on the current device: select() allocates nothing.
class chunk_selector {
 public:
  explicit chunk_selector(std::size_t max_chunks) : max_(max_chunks) {
    // CUB's radix sort and scan take an int item count.
    if (max_chunks == 0 || max_chunks > 0x7fffffffull)
      throw invalid_argument("max_chunks", fmt::format("a chunk selector needs between 1 and 2^31 - 1 chunks (got {}).", max_chunks),
                             "pass the exchanger's chunk count; for more chunks, use a larger chunk size.");
    const int items = static_cast<int>(max_chunks);
    std::size_t sort_bytes = 0, scan_bytes = 0;
    check_cuda(cub::DeviceRadixSort::SortPairsDescending(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                         static_cast<std::uint32_t*>(nullptr), static_cast<const std::uint32_t*>(nullptr),
                                                         static_cast<std::uint32_t*>(nullptr), items),
               "cub::DeviceRadixSort::SortPairsDescending (temporary storage query)");
    check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const std::uint32_t*>(nullptr),
                                             static_cast<std::uint32_t*>(nullptr), items),
               "cub::DeviceScan::ExclusiveSum (temporary storage query)");
    temp_bytes_ = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
    const std::size_t words = 6 * max_chunks;  // keys, keys sorted, index, index sorted, flags, positions
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, words * sizeof(std::uint32_t) + temp_bytes_ + 16), "cudaMalloc of the chunk selector's scratch");
    mem_.reset(p);
  }

  /// out[0, k): the k chunks with the largest norms (NaN highest, ties to the lower index),
  /// ascending; out[k, chunks): the others, ascending. norms and out are device arrays.
  void select(const float* norms, std::size_t chunks, std::size_t k, std::uint32_t* out, cudaStream_t stream) {
    if (chunks > max_)
      throw invalid_argument("chunks", fmt::format("selecting among {} chunks with a selector built for {}.", chunks, max_),
                             "build the chunk_selector with the largest chunk count you select from.");
    if (k > chunks) k = chunks;
    if (chunks == 0) return;
    using namespace chunk_detail;
    auto* w = static_cast<std::uint32_t*>(mem_.get());
    std::uint32_t* keys = w;
    std::uint32_t* keys_sorted = w + max_;
    std::uint32_t* index = w + 2 * max_;
    std::uint32_t* index_sorted = w + 3 * max_;
    std::uint32_t* flags = w + 4 * max_;
    std::uint32_t* pos = w + 5 * max_;
    void* temp = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(w + 6 * max_) + 15) & ~std::uintptr_t{15});
    kernel_detail::launch(keys_kernel, grid_for(chunks), block_threads, stream, "launch of the chunk selector's key kernel", norms, chunks, keys,
                          index, flags);
    if (k != 0) {
      std::size_t bytes = temp_bytes_;
      // Stable: equal keys keep their input order, i.e. ascending chunk index.
      check_cuda(cub::DeviceRadixSort::SortPairsDescending(temp, bytes, keys, keys_sorted, index, index_sorted, static_cast<int>(chunks), 0, 32,
                                                           stream),
                 "cub::DeviceRadixSort::SortPairsDescending of the chunk norms");
      kernel_detail::launch(mark_kernel, grid_for(k), block_threads, stream, "launch of the chunk selector's mark kernel", index_sorted, k, flags);
    }
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp, bytes, flags, pos, static_cast<int>(chunks), stream),
               "cub::DeviceScan::ExclusiveSum of the chunk flags");
    kernel_detail::launch(place_kernel, grid_for(chunks), block_threads, stream, "launch of the chunk selector's place kernel", flags, pos, chunks,
                          k, out);
  }

  [[nodiscard]] std::size_t max_chunks() const noexcept { return max_; }

 private:
  std::size_t max_;
  std::size_t temp_bytes_ = 0;
  std::unique_ptr<void, cuda_free> mem_;
};

}  // namespace gflow::detail::cuda
