#pragma once
// The exact top-k selection on the device (the twin of kernels::select_topk, same indices):
// gflow::cuda::topk_selector, its radix-select kernels, and the device helpers the other top-k
// kernels share (magnitude keys, sanitize, round-to-nearest arithmetic).
// (cuda/topk.cuh includes it with the rest of the top-k kernels; include that one.)
//
// Selection: the toolkit's CCCL 3.0.1 has no cub::DeviceTopK (it arrives in CCCL 3.2), so this is
// a radix select of our own, the same algorithm as the host reference: the |v| keys
// (bits & 0x7fffffff, NaN above inf) are histogrammed on 12 + 10 + 10 bit digits, most
// significant first (one pass over all n per digit, shared-memory histograms, one atomic per bin
// and block), and a one-block kernel picks each digit with a cub::BlockScan over the bins, so the
// threshold key T and the number `take` of elements equal to T to keep never go back to the host.
// The selected indices are then written in index order at their exact positions
// (#{key > T before i} + min(#{key == T before i}, take)) from per-tile counts scanned with
// cub::DeviceScan and cub::BlockScan: deterministic, no atomics in the output, no sort. Cost:
// five reads of the keys for 3 digit passes, the count and the write pass. A single selection
// handles up to 2^32 - 1 elements (its counts are 32-bit); larger units raise invalid_argument.
//
// Candidates first (select() on large units, n >= 2^20 and k <= n / 64): one block histograms the
// top 12 key bits of 65536 evenly spaced samples and picks the lowest bin edge `lo` above which
// about twice the expected share of k (plus 32) samples lie; the count pass (the one above, with
// the threshold lo - 1) counts the elements with key >= lo, and that count comes to the host (one
// stream synchronisation). If it lies in [k, capacity] (capacity max(8k + 256 n / 65536, n / 64)), the write
// pass gathers those candidates (positions and keys, in index order) and the radix select runs
// on the candidates alone: every element of the top k is one of them, so the result is the same
// indices. Two reads of the keys instead of five. Otherwise (a sample that missed, or keys too
// concentrated for 12 bits to separate: many ties, zeros) the full selection above runs as well.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "../error.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "launch.cuh"
#include "memory.cuh"

namespace gflow::cuda {

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

/// Exact top-k selection on the device (see the header comment). Owns its scratch, sized for
/// units of up to max_n elements; select() enqueues work only.
class topk_selector {
 public:
  explicit topk_selector(std::size_t max_n) : max_n_(max_n) {
    if (max_n > std::numeric_limits<unsigned>::max())
      throw invalid_argument("max_n", fmt::format("a device top-k selection handles at most 2^32 - 1 elements (got {}).", max_n),
                             "select over smaller units (Fusion buckets).");
    state_ = device_array<topk_detail::select_state>(1, "cudaMalloc of the top-k selection state");
    hist_ = device_array<unsigned>(4096, "cudaMalloc of the top-k histogram");
    check_cuda(cudaMemset(hist_.get(), 0, 4096 * sizeof(unsigned)), "cudaMemset of the top-k histogram");
    const std::size_t tiles = topk_detail::tiles_for(max_n ? max_n : 1);
    counts_ = device_array<unsigned long long>(tiles, "cudaMalloc of the top-k tile counts");
    offsets_ = device_array<unsigned long long>(tiles, "cudaMalloc of the top-k tile offsets");
    std::size_t bytes = 0;
    check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles)),
               "cub::DeviceScan::ExclusiveSum size query");
    temp_ = device_array<unsigned char>(bytes, "cudaMalloc of the top-k scan scratch");
    temp_bytes_ = bytes;
    void* h = nullptr;
    check_cuda(cudaMallocHost(&h, 2 * sizeof(unsigned long long)), "cudaMallocHost of the top-k candidate count");
    host_.reset(static_cast<unsigned long long*>(h));
  }

  [[nodiscard]] std::size_t max_n() const noexcept { return max_n_; }

  /// How select() ran so far: through the candidates, or the full selection (small units, large
  /// k, or candidates out of [k, capacity]). The result is the same either way.
  struct path_counts {
    std::size_t candidates = 0, full = 0;
  };
  [[nodiscard]] path_counts paths() const noexcept { return paths_; }

  /// Writes base + position of the min(k, n) largest |v[0, n)| to out, increasing; ties to the
  /// lower index. Device pointers; enqueued on `stream`, except that on large units the candidate
  /// count comes to the host first (one synchronisation of `stream`; see the header).
  template <class I>
  void select(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, cudaStream_t stream) {
    check_n(n);
    if (n == 0 || k == 0) return;
    if (k >= n) {
      kernel_detail::launch(topk_detail::iota_kernel<I>, topk_detail::blocks_for(n), topk_detail::threads, stream,
                            "launch of gflow::cuda::topk_selector (k >= n)", out, n, base);
      return;
    }
    if (n >= min_sampled_n && k <= n / 64 && select_candidates(v, n, k, base, out, stream)) {
      ++paths_.candidates;
      return;
    }
    ++paths_.full;
    run(topk_detail::float_keys{v}, n, nullptr, k, topk_detail::emit_index<I>{out, base}, stream);
  }

  /// The selection on precomputed keys with a device-side count (*d_n <= n_max): what the
  /// merge uses. emit(i, selected, position) is called for every element below *d_n.
  template <class Keys, class Emit>
  void run(Keys keys, std::size_t n_max, const unsigned* d_n, std::size_t k, Emit emit, cudaStream_t stream) {
    check_n(n_max);
    if (n_max == 0) return;
    using namespace topk_detail;
    digit_pass<0>(keys, n_max, d_n, k, stream);
    digit_pass<1>(keys, n_max, d_n, k, stream);
    digit_pass<2>(keys, n_max, d_n, k, stream);
    const unsigned tiles = tiles_for(n_max);
    kernel_detail::launch(count_kernel<Keys>, tiles, threads, stream, "launch of the gflow::cuda::topk_selector count pass", keys, n_max, d_n,
                          state_.get(), counts_.get());
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp_.get(), bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles), stream),
               "cub::DeviceScan::ExclusiveSum of the top-k tile counts");
    kernel_detail::launch(write_kernel<Keys, Emit>, tiles, threads, stream, "launch of the gflow::cuda::topk_selector write pass", keys, n_max, d_n,
                          state_.get(), offsets_.get(), emit);
  }

 private:
  static constexpr std::size_t min_sampled_n = std::size_t{1} << 20;
  static constexpr unsigned samples = 65536;

  // The candidates path (see the header); false when the count is outside [k, capacity] (nothing
  // was written to out, the full selection must run).
  template <class I>
  bool select_candidates(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, cudaStream_t stream) {
    using namespace topk_detail;
    const unsigned expect = static_cast<unsigned>((static_cast<unsigned long long>(k) * samples + n - 1) / n);
    const unsigned want = 2 * expect + 32;
    // Room for the candidates: about 4 x what `want` asks for, at least n / 64 (12-bit bins can
    // hold many more elements than the samples in them suggest); only memory, the count decides the cost.
    const std::size_t cap = std::min<std::size_t>(n, std::max<std::size_t>(8 * k + 256 * (n / samples), n / 64));
    const float_keys keys{v};
    kernel_launch_sample(keys, n, want, stream);
    const unsigned tiles = tiles_for(n);
    kernel_detail::launch(count_kernel<float_keys>, tiles, threads, stream, "launch of the gflow::cuda::topk_selector candidate count", keys, n,
                          static_cast<const unsigned*>(nullptr), state_.get(), counts_.get());
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp_.get(), bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles), stream),
               "cub::DeviceScan::ExclusiveSum of the top-k candidate counts");
    check_cuda(cudaMemcpyAsync(host_.get(), counts_.get() + (tiles - 1), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync of the top-k candidate count");
    check_cuda(cudaMemcpyAsync(host_.get() + 1, offsets_.get() + (tiles - 1), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync of the top-k candidate offset");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize for the top-k candidate count");
    const std::size_t count = static_cast<std::size_t>((host_.get()[0] >> 32) + (host_.get()[1] >> 32));  // key > lo - 1
    if (count < k || count > cap) return false;
    if (cand_cap_ < cap) {
      cand_pos_ = device_array<unsigned>(cap, "cudaMalloc of the top-k candidate positions");
      cand_key_ = device_array<unsigned>(cap, "cudaMalloc of the top-k candidate keys");
      cand_cap_ = cap;
    }
    kernel_detail::launch(write_kernel<float_keys, emit_candidate>, tiles, threads, stream, "launch of the gflow::cuda::topk_selector candidate write", keys,
                          n, static_cast<const unsigned*>(nullptr), state_.get(), offsets_.get(),
                          emit_candidate{v, cand_pos_.get(), cand_key_.get(), static_cast<unsigned long long>(cap)});
    run(plain_keys{cand_key_.get()}, count, nullptr, k, emit_from_candidates<I>{out, cand_pos_.get(), base}, stream);
    return true;
  }
  template <class Keys>
  void kernel_launch_sample(Keys keys, std::size_t n, unsigned want, cudaStream_t stream) {
    kernel_detail::launch(topk_detail::sample_kernel<Keys>, 1u, topk_detail::choose_threads, stream, "launch of the gflow::cuda::topk_selector sample",
                          keys, n, samples, want, state_.get());
  }

  // Digit D of the threshold: histogram the keys that match the digits chosen so far, then pick.
  template <int D, class Keys>
  void digit_pass(Keys keys, std::size_t n_max, const unsigned* d_n, std::size_t k, cudaStream_t stream) {
    using namespace topk_detail;
    const char* what = "launch of the gflow::cuda::topk_selector radix passes";
    kernel_detail::launch(histogram_kernel<D, Keys>, blocks_for(n_max), threads, stream, what, keys, n_max, d_n, state_.get(), hist_.get());
    kernel_detail::launch(choose_kernel<D>, 1u, choose_threads, stream, what, state_.get(), hist_.get(), k, n_max, d_n);
  }

  void check_n(std::size_t n) const {
    if (n > max_n_)
      throw invalid_argument("n", fmt::format("this topk_selector was sized for {} elements; select() got {}.", max_n_, n),
                             "build the selector with the largest unit it will see.");
  }

  std::size_t max_n_;
  device_array<topk_detail::select_state> state_;
  device_array<unsigned> hist_;
  device_array<unsigned long long> counts_, offsets_;
  device_array<unsigned char> temp_;
  std::size_t temp_bytes_ = 0;
  struct host_free {
    void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
  };
  std::unique_ptr<unsigned long long, host_free> host_;  // the candidate count's tile count and offset (pinned)
  device_array<unsigned> cand_pos_, cand_key_;        // the candidates (built on first use, grown for larger k)
  std::size_t cand_cap_ = 0;
  path_counts paths_{};
};

}  // namespace gflow::cuda
