#pragma once
// The kernels of the device top-k selection (cuda/topk_select.cuh, topk_selector: read its header
// for the algorithm), in gflow::detail::cuda::topk_detail: magnitude keys and the device helpers the other
// top-k kernels share (sanitize, round-to-nearest arithmetic), the radix digits' histogram and
// choice, the count and write passes, and the candidates path's sample kernel and emitters.
// (cuda/topk.cuh includes it with the rest of the top-k kernels; include that one.)
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstddef>
#include <cstdint>

#include "cast.cuh"
#include "launch.cuh"

namespace gflow::detail::cuda {

namespace topk_detail {

using kernel_detail::raw_t;
using kernel_detail::wire_ops;

inline constexpr unsigned threads = 256;
inline constexpr unsigned items = 8;                        // per thread, contiguous
inline constexpr std::size_t tile = std::size_t{threads} * items;  // elements per block in count / write
inline constexpr unsigned choose_threads = 1024;

__device__ __forceinline__ unsigned magnitude_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }
__device__ __forceinline__ float sanitize(float v) { return magnitude_key(v) > 0x7f800000u ? __uint_as_float(0x7f800000u) : v; }
__device__ __forceinline__ bool finite_bits(float v) { return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u; }
// Explicit round-to-nearest arithmetic, so -ftz / --use_fast_math cannot change results against the host.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }

/// Where the selection stands on the device: threshold key (built digit by digit) and how many
/// elements equal to it remain to be taken.
struct select_state {
  unsigned prefix;
  unsigned remaining;
};

struct float_keys {
  const float* v;
  __device__ __forceinline__ unsigned operator()(std::size_t i) const { return magnitude_key(v[i]); }
};
struct plain_keys {
  const unsigned* k;
  __device__ __forceinline__ unsigned operator()(std::size_t i) const { return k[i]; }
};

__device__ __forceinline__ std::size_t count_of(std::size_t n_max, const unsigned* d_n) {
  if (d_n == nullptr) return n_max;
  const std::size_t n = *d_n;
  return n < n_max ? n : n_max;
}

template <int D>
struct digit;
template <> struct digit<0> { static constexpr int shift = 20; static constexpr unsigned bins = 4096; };
template <> struct digit<1> { static constexpr int shift = 10; static constexpr unsigned bins = 1024; };
template <> struct digit<2> { static constexpr int shift = 0; static constexpr unsigned bins = 1024; };

template <int D, class Keys>
__global__ void __launch_bounds__(threads)
    histogram_kernel(Keys keys, std::size_t n_max, const unsigned* d_n, const select_state* st, unsigned* hist) {
  __shared__ unsigned sh[digit<D>::bins];
  for (unsigned b = threadIdx.x; b < digit<D>::bins; b += blockDim.x) sh[b] = 0;
  __syncthreads();
  const std::size_t n = count_of(n_max, d_n);
  const unsigned prefix = D == 0 ? 0u : st->prefix;
  for (std::size_t i = kernel_detail::thread_index(); i < n; i += kernel_detail::grid_stride()) {
    const unsigned key = keys(i);
    if constexpr (D == 0) {
      atomicAdd(&sh[key >> 20], 1u);
    } else if constexpr (D == 1) {
      if ((key >> 20) == (prefix >> 20)) atomicAdd(&sh[(key >> 10) & 1023u], 1u);
    } else {
      if ((key >> 10) == (prefix >> 10)) atomicAdd(&sh[key & 1023u], 1u);
    }
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < digit<D>::bins; b += blockDim.x)
    if (sh[b] != 0) atomicAdd(&hist[b], sh[b]);
}

/// Picks digit D: scans the bins from the largest down and finds where the remaining count is
/// covered; resets the histogram for the next pass. One block of choose_threads threads.
template <int D>
__global__ void __launch_bounds__(choose_threads)
    choose_kernel(select_state* st, unsigned* hist, unsigned long long k, std::size_t n_max, const unsigned* d_n) {
  constexpr unsigned bins = digit<D>::bins;
  constexpr unsigned per = bins / choose_threads;
  using scan_t = cub::BlockScan<unsigned, choose_threads>;
  __shared__ typename scan_t::TempStorage tmp;
  unsigned remaining;
  unsigned prefix;
  if constexpr (D == 0) {
    const std::size_t n = count_of(n_max, d_n);
    remaining = static_cast<unsigned>(k < n ? k : n);
    prefix = 0;
  } else {
    remaining = st->remaining;
    prefix = st->prefix;
  }
  __syncthreads();  // every thread has read the state before one of them writes it
  if (D == 0 && remaining == 0) {  // nothing to select: a threshold no key reaches
    if (threadIdx.x == 0) {
      st->prefix = 0xffffffffu;
      st->remaining = 0;
    }
  }
  unsigned c[per];
  unsigned sum = 0;
  for (unsigned j = 0; j < per; ++j) {
    const unsigned rb = bins - 1 - (threadIdx.x * per + j);
    c[j] = hist[rb];
    sum += c[j];
  }
  unsigned before = 0;
  scan_t(tmp).ExclusiveSum(sum, before);
  if (remaining != 0) {
    for (unsigned j = 0; j < per; ++j) {
      const unsigned rb = bins - 1 - (threadIdx.x * per + j);
      if (before < remaining && before + c[j] >= remaining) {
        st->prefix = prefix | (rb << digit<D>::shift);
        st->remaining = remaining - before;
      }
      before += c[j];
    }
  }
  for (unsigned j = 0; j < per; ++j) hist[bins - 1 - (threadIdx.x * per + j)] = 0;
}

__device__ __forceinline__ unsigned long long classify(unsigned key, unsigned T) {
  return key > T ? (1ull << 32) : (key == T ? 1ull : 0ull);
}

template <class Keys>
__global__ void __launch_bounds__(threads)
    count_kernel(Keys keys, std::size_t n_max, const unsigned* d_n, const select_state* st, unsigned long long* block_counts) {
  using reduce_t = cub::BlockReduce<unsigned long long, threads>;
  __shared__ typename reduce_t::TempStorage tmp;
  const std::size_t n = count_of(n_max, d_n);
  const unsigned T = st->prefix;
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * tile + static_cast<std::size_t>(threadIdx.x) * items;
  unsigned long long packed = 0;
  for (unsigned j = 0; j < items; ++j) {
    const std::size_t i = base + j;
    if (i < n) packed += classify(keys(i), T);
  }
  const unsigned long long total = reduce_t(tmp).Sum(packed);
  if (threadIdx.x == 0) block_counts[blockIdx.x] = total;
}

/// Visits every element in index order within each thread's items and reports whether it is
/// selected and, if so, its output position: #{key > T before i} + min(#{key == T before i}, take).
template <class Keys, class Emit>
__global__ void __launch_bounds__(threads) write_kernel(Keys keys, std::size_t n_max, const unsigned* d_n, const select_state* st,
                                                        const unsigned long long* block_offsets, Emit emit) {
  using scan_t = cub::BlockScan<unsigned long long, threads>;
  __shared__ typename scan_t::TempStorage tmp;
  const std::size_t n = count_of(n_max, d_n);
  const unsigned T = st->prefix;
  const unsigned long long take = st->remaining;
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * tile + static_cast<std::size_t>(threadIdx.x) * items;
  unsigned k[items];
  unsigned long long packed = 0;
  for (unsigned j = 0; j < items; ++j) {
    const std::size_t i = base + j;
    k[j] = i < n ? keys(i) : 0u;
    if (i < n) packed += classify(k[j], T);
  }
  unsigned long long before = 0;
  scan_t(tmp).ExclusiveSum(packed, before);
  before += block_offsets[blockIdx.x];
  unsigned long long gt = before >> 32;
  unsigned long long eq = before & 0xffffffffull;
  for (unsigned j = 0; j < items; ++j) {
    const std::size_t i = base + j;
    if (i >= n) break;
    if (k[j] > T) {
      emit(i, true, gt + (eq < take ? eq : take));
      ++gt;
    } else if (k[j] == T) {
      emit(i, eq < take, gt + eq);
      ++eq;
    } else {
      emit(i, false, 0ull);
    }
  }
}

template <class I>
struct emit_index {
  I* out;
  std::uint64_t base;
  __device__ __forceinline__ void operator()(std::size_t i, bool sel, unsigned long long pos) const {
    if (sel) out[pos] = static_cast<I>(base + i);
  }
};

template <class I>
__global__ void iota_kernel(I* out, std::size_t n, std::uint64_t base) {
  for (std::size_t i = kernel_detail::thread_index(); i < n; i += kernel_detail::grid_stride()) out[i] = static_cast<I>(base + i);
}

/// Samples `samples` evenly spaced keys, histograms their top 12 bits, and sets st->prefix to
/// lo - 1 where lo is the lowest bin edge with at least `want` samples at or above it (no such
/// bin, or lo = 0: prefix 0xffffffff, so that nothing counts as a candidate and the full
/// selection runs); st->remaining = 0. One block of choose_threads threads.
template <class Keys>
__global__ void __launch_bounds__(choose_threads)
    sample_kernel(Keys keys, std::size_t n, unsigned samples, unsigned want, select_state* st) {
  constexpr unsigned bins = digit<0>::bins;
  constexpr unsigned per = bins / choose_threads;
  using scan_t = cub::BlockScan<unsigned, choose_threads>;
  __shared__ unsigned hist[bins];
  __shared__ typename scan_t::TempStorage tmp;
  __shared__ unsigned found;
  for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
  if (threadIdx.x == 0) found = 0;
  __syncthreads();
  for (unsigned j = threadIdx.x; j < samples; j += blockDim.x) {
    const std::size_t i = static_cast<std::size_t>(static_cast<unsigned long long>(j) * n / samples);
    atomicAdd(&hist[keys(i) >> 20], 1u);
  }
  __syncthreads();
  unsigned c[per];
  unsigned sum = 0;
  for (unsigned j = 0; j < per; ++j) {
    c[j] = hist[bins - 1 - (threadIdx.x * per + j)];
    sum += c[j];
  }
  unsigned before = 0;
  scan_t(tmp).ExclusiveSum(sum, before);
  for (unsigned j = 0; j < per; ++j) {
    const unsigned rb = bins - 1 - (threadIdx.x * per + j);
    if (before < want && before + c[j] >= want) found = rb;  // one thread: the bin where the count from the top reaches want
    before += c[j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    st->prefix = found == 0 ? 0xffffffffu : (found << 20) - 1u;
    st->remaining = 0;
  }
}

/// The write pass's emitter for the candidates: position and key, in index order, at most cap.
struct emit_candidate {
  const float* v;
  unsigned* pos;
  unsigned* key;
  unsigned long long cap;
  __device__ __forceinline__ void operator()(std::size_t i, bool sel, unsigned long long p) const {
    if (sel && p < cap) {
      pos[p] = static_cast<unsigned>(i);
      key[p] = magnitude_key(v[i]);
    }
  }
};

/// The candidates' selection's emitter: the selected candidate's pool position.
template <class I>
struct emit_from_candidates {
  I* out;
  const unsigned* pos;
  std::uint64_t base;
  __device__ __forceinline__ void operator()(std::size_t i, bool sel, unsigned long long p) const {
    if (sel) out[p] = static_cast<I>(base + pos[i]);
  }
};

inline unsigned blocks_for(std::size_t n) { return kernel_detail::blocks_for(n, threads, kernel_detail::max_blocks); }
inline unsigned tiles_for(std::size_t n) { return static_cast<unsigned>((n + tile - 1) / tile); }

}  // namespace topk_detail

}  // namespace gflow::detail::cuda
