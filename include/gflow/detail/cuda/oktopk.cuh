#pragma once
// The device kernels of Sparsifier<OkTopK<d>> (engines/oktopk/) beyond the Top-k ones, each the
// twin of a host kernel with the same output (device_backend.cuh calls them on its stream):
//
//   threshold_gatherer tg(max_n);                               device scratch, allocated once
//   tg.gather(g, res, n, t, base, pos, keys, cap, stream)       kernels::accumulate_gather_above:
//                                                               res = g + res over all n, then base + i
//                                                               and the key of every element whose key
//                                                               is >= t, increasing, at most cap of
//                                                               them; returns the count (cap + 1 when
//                                                               there were more). Synchronises the
//                                                               stream once: the count reaches the host
//   gather_keys(v, idx, count, keys, stream)                    kernels::gather_keys: keys[j] = the
//                                                               magnitude key of v[idx[j]]
//   add_at(dst, idx, v, count, stream)                          kernels::scatter_add with a float wire:
//                                                               dst[idx[j]] += v[j] (indices distinct)
//
// The threshold selection in three kernels and a scan: (1) every block stores G = g + res over
// its tile of 2048 elements (coalesced, striped) and counts the keys >= t in it; (2)
// cub::DeviceScan turns the tile counts into tile offsets, the total last; (3) every tile with a
// gathered element below the capacity reads its G again (8 consecutive elements a thread), scans
// its threads' counts with cub::BlockScan and writes each gathered element at its exact
// position: in index order, deterministic, no atomics. Cost: the host's one pass (read g and res,
// write res) plus one more read of the unit's tiles that hold a gathered element below cap.
// A single call handles up to 2^32 - 1 elements; larger units raise invalid_argument.
//
// The additions (G = g + res, dst + v) are rounded to nearest (__fadd_rn: -ftz / --use_fast_math
// cannot change them), and where the sum is NaN it takes the bits x86 gives (the host twins'):
// the NaN operand's, quieted, or the default NaN of inf - inf (0xffc00000 on x86; 0x7fc00000 when
// the host is AArch64, whose default NaN is positive). CUDA's own addition returns the canonical
// NaN 0x7fffffff instead, whose magnitude key would differ from the host's (cuda::scatter_add and
// cuda::accumulate_into_residual do). Where BOTH operands are NaN, x86 returns one operand's
// payload and which one depends on the operand order the host compiler chose
// (kernels/topk_sampled.hpp), so there the device takes the first one's (g, dst) and only the
// NaN-ness is the host's (an engine never meets the case: its residual never holds NaN).
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "../../error.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "launch.cuh"
#include "memory.cuh"
#include "topk_select.cuh"

namespace gflow::detail::cuda {

namespace oktopk_detail {

using topk_detail::magnitude_key;

inline constexpr unsigned threads = 256;
inline constexpr unsigned items = 8;  // per thread
inline constexpr std::size_t tile = std::size_t{threads} * items;

#if defined(__aarch64__)
inline constexpr unsigned host_default_nan = 0x7fc00000u;
#else
inline constexpr unsigned host_default_nan = 0xffc00000u;  // x86's "real indefinite"
#endif

/// a + b with the host's bits, NaN included (see the header comment).
__device__ __forceinline__ float add_host(float a, float b) {
  const float s = __fadd_rn(a, b);
  if (magnitude_key(s) <= 0x7f800000u) return s;
  const unsigned ua = __float_as_uint(a), ub = __float_as_uint(b);
  if ((ua & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(ua | 0x00400000u);
  if ((ub & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(ub | 0x00400000u);
  return __uint_as_float(host_default_nan);
}

// (1) res = g + res over the tile (striped: coalesced), and the number of keys >= t in it.
// Block 0 also zeroes the entry after the last tile, so that the exclusive scan over tiles + 1
// entries ends with the total. (static: a non-template kernel in a header has one definition per
// translation unit.)
static __global__ void __launch_bounds__(threads)
    accumulate_count_kernel(const float* __restrict__ g, float* __restrict__ res, std::size_t n, unsigned t, unsigned long long* counts,
                            unsigned tiles) {
  using reduce_t = cub::BlockReduce<unsigned, threads>;
  __shared__ typename reduce_t::TempStorage tmp;
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * tile;
  unsigned c = 0;
  for (unsigned j = 0; j < items; ++j) {
    const std::size_t i = base + static_cast<std::size_t>(j) * threads + threadIdx.x;
    if (i < n) {
      const float G = add_host(g[i], res[i]);
      res[i] = G;
      c += magnitude_key(G) >= t;
    }
  }
  const unsigned total = reduce_t(tmp).Sum(c);
  if (threadIdx.x == 0) {
    counts[blockIdx.x] = total;
    if (blockIdx.x == 0) counts[tiles] = 0;
  }
}

// (3) Every gathered element of the tile at its position (tile offset + the block scan of the
// threads' counts + its rank within the thread), where that position is below cap.
static __global__ void __launch_bounds__(threads)
    gather_write_kernel(const float* __restrict__ G, std::size_t n, unsigned t, std::uint64_t pos0, const unsigned long long* counts,
                        const unsigned long long* offsets, std::uint64_t* __restrict__ pos, std::uint32_t* __restrict__ keys,
                        unsigned long long cap) {
  using scan_t = cub::BlockScan<unsigned, threads>;
  __shared__ typename scan_t::TempStorage tmp;
  const unsigned long long off = offsets[blockIdx.x];
  if (counts[blockIdx.x] == 0 || off >= cap) return;  // the whole block leaves: no barrier is skipped by part of it
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * tile + static_cast<std::size_t>(threadIdx.x) * items;
  unsigned k[items];
  unsigned c = 0;
  for (unsigned j = 0; j < items; ++j) {
    const std::size_t i = base + j;
    k[j] = i < n ? magnitude_key(G[i]) : 0u;
    c += i < n && k[j] >= t;
  }
  unsigned before = 0;
  scan_t(tmp).ExclusiveSum(c, before);
  unsigned long long o = off + before;
  for (unsigned j = 0; j < items && o < cap; ++j) {
    const std::size_t i = base + j;
    if (i < n && k[j] >= t) {
      pos[o] = pos0 + i;
      keys[o] = k[j];
      ++o;
    }
  }
}

template <class I>
__global__ void gather_keys_kernel(const float* __restrict__ v, const I* __restrict__ idx, std::size_t count, std::uint32_t* __restrict__ keys) {
  for (std::size_t j = kernel_detail::thread_index(); j < count; j += kernel_detail::grid_stride())
    keys[j] = magnitude_key(v[static_cast<std::size_t>(idx[j])]);
}

template <class I>
__global__ void add_at_kernel(float* __restrict__ dst, const I* __restrict__ idx, const float* __restrict__ v, std::size_t count) {
  for (std::size_t j = kernel_detail::thread_index(); j < count; j += kernel_detail::grid_stride()) {
    const std::size_t i = static_cast<std::size_t>(idx[j]);
    dst[i] = add_host(dst[i], v[j]);
  }
}

inline unsigned tiles_for(std::size_t n) { return static_cast<unsigned>((n + tile - 1) / tile); }

}  // namespace oktopk_detail

/// OkTopK's threshold selection on the device (see the header comment). Owns its scratch, sized
/// for units of up to max_n elements (at most 2^32 - 1); gather() synchronises the stream once.
class threshold_gatherer {
 public:
  explicit threshold_gatherer(std::size_t max_n) : max_n_(max_n) {
    check_limit(max_n, "max_n");
    const std::size_t entries = std::size_t{oktopk_detail::tiles_for(max_n)} + 1;  // the total last
    counts_ = device_array<unsigned long long>(entries, "cudaMalloc of the threshold selection's tile counts");
    offsets_ = device_array<unsigned long long>(entries, "cudaMalloc of the threshold selection's tile offsets");
    std::size_t bytes = 0;
    check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, counts_.get(), offsets_.get(), static_cast<int>(entries)),
               "cub::DeviceScan::ExclusiveSum size query (threshold selection)");
    temp_ = device_array<unsigned char>(bytes, "cudaMalloc of the threshold selection's scan scratch");
    temp_bytes_ = bytes;
    void* h = nullptr;
    check_cuda(cudaMallocHost(&h, sizeof(unsigned long long)), "cudaMallocHost of the threshold selection's count");
    total_.reset(static_cast<unsigned long long*>(h));
  }

  [[nodiscard]] std::size_t max_n() const noexcept { return max_n_; }

  /// kernels::accumulate_gather_above on device pointers: res = g + res over [0, n), then
  /// (base + i, key) of every key >= t in increasing i, at most cap of them. Returns how many
  /// were gathered, or cap + 1 when there were more (pos / keys then hold the first cap).
  /// Enqueued on `stream`, which it then synchronises to bring the count to the host.
  std::size_t gather(const float* g, float* res, std::size_t n, std::uint32_t t, std::uint64_t base, std::uint64_t* pos, std::uint32_t* keys,
                     std::size_t cap, cudaStream_t stream) {
    using namespace oktopk_detail;
    if (n > max_n_)
      throw invalid_argument("n", fmt::format("this threshold_gatherer was sized for {} elements; gather() got {}.", max_n_, n),
                             "build the gatherer with the largest unit it will see.");
    if (n == 0) return 0;
    const unsigned tiles = tiles_for(n);
    kernel_detail::launch(accumulate_count_kernel, tiles, threads, stream, "launch of the gflow::detail::cuda::threshold_gatherer accumulate pass", g, res,
                          n, static_cast<unsigned>(t), counts_.get(), tiles);
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp_.get(), bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles) + 1, stream),
               "cub::DeviceScan::ExclusiveSum of the threshold selection's tile counts");
    if (cap != 0)
      kernel_detail::launch(gather_write_kernel, tiles, threads, stream, "launch of the gflow::detail::cuda::threshold_gatherer write pass", res, n,
                            static_cast<unsigned>(t), base, counts_.get(), offsets_.get(), pos, keys, static_cast<unsigned long long>(cap));
    check_cuda(cudaMemcpyAsync(total_.get(), offsets_.get() + tiles, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync of the threshold selection's count");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize for the threshold selection's count");
    const auto total = static_cast<std::size_t>(*total_);
    return total > cap ? cap + 1 : total;
  }

 private:
  static void check_limit(std::size_t n, const char* what) {
    if (n > std::numeric_limits<unsigned>::max())
      throw invalid_argument(what, fmt::format("a device threshold selection handles at most 2^32 - 1 elements (got {}).", n),
                             "select over smaller units (Fusion buckets).");
  }
  struct host_free {
    void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
  };

  std::size_t max_n_;
  device_array<unsigned long long> counts_, offsets_;
  device_array<unsigned char> temp_;
  std::size_t temp_bytes_ = 0;
  std::unique_ptr<unsigned long long, host_free> total_;
};

/// keys[j] = bits(v[idx[j]]) & 0x7fffffff (kernels::gather_keys). I: std::uint32_t or std::uint64_t.
template <class I>
void gather_keys(const float* v, const I* idx, std::size_t count, std::uint32_t* keys, cudaStream_t stream) {
  if (count == 0) return;
  kernel_detail::launch(oktopk_detail::gather_keys_kernel<I>, kernel_detail::grid_for(count), kernel_detail::block_threads,
                        stream, "launch of gflow::detail::cuda::gather_keys", v, idx, count, keys);
}

/// dst[idx[j]] += v[j], the indices of one call distinct (kernels::scatter_add with a float wire,
/// NaN bits included). I: std::uint32_t or std::uint64_t.
template <class I>
void add_at(float* dst, const I* idx, const float* v, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  kernel_detail::launch(oktopk_detail::add_at_kernel<I>, kernel_detail::grid_for(count), kernel_detail::block_threads, stream,
                        "launch of gflow::detail::cuda::add_at", dst, idx, v, count);
}

}  // namespace gflow::detail::cuda
