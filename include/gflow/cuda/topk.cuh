#pragma once
// CUDA twins of include/gflow/kernels/topk.hpp: the Top-k sparsifiers' kernels on device memory,
// with the same selections and the same bits as the host references.
//
//   accumulate_residual(g, res, n, stream)                          G = g + res into both
//   topk_selector sel(max_n);                                       device scratch, allocated once
//   sel.select(v, n, k, base, out, stream)                          exact top-k of |v|, ties to the
//                                                                   lower index, out = base + position,
//                                                                   increasing (min(k, n) entries)
//   take_selected(G, res, idx, count, out, scale, unscale, stream)  W(sanitize(G * scale)); residual keeps
//                                                                   G - float(W) * unscale (0 if not finite)
//   scatter_add(dst, idx, val, count, stream)                       dst[idx] += float(val)
//   decode_scatter(dst, idx, val, count, scale, counter, stream)    dst[idx] = float(val) * scale, counts inf/NaN
//   topk_merger<I, W> m(k_max);                                     Definition 1 of paper 003 (merge_topk):
//   m.merge(a, na, b, nb, k, out, records, d_counts, stream)        d_counts[0] = kept, d_counts[1] = records
//
// Every call only enqueues work on `stream` (no host synchronisation), takes device pointers of
// the current device, and throws gflow::transport_error if a launch fails. I is std::uint32_t or
// std::uint64_t; W is float, gflow::half or gflow::bfloat16.
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
// The merge uses cub::DeviceMerge::MergePairs (index order), a kernel that adds equal indices,
// cub::DeviceSelect::Flagged to compact, the same selector (on a device-side count) and Flagged
// again for the records. Messages are validated on the host (kernels::unpack_checked): the
// exchanger integration of these kernels on device memory is not done yet (see policies/topk.hpp).
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_merge.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "../dtype.hpp"
#include "../error.hpp"
#include "cast.cuh"
#include "check.cuh"

namespace gflow::cuda {

namespace topk_detail {

using kernel_detail::raw_t;
using kernel_detail::wire_ops;

inline constexpr unsigned threads = 256;
inline constexpr unsigned items = 8;                        // per thread, contiguous
inline constexpr std::size_t tile = std::size_t{threads} * items;  // elements per block in count / write
inline constexpr unsigned choose_threads = 1024;

/// Owning device array (current device), no initialisation.
template <class T>
class dev_array {
 public:
  dev_array() = default;
  explicit dev_array(std::size_t n, const char* what) : n_(n) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, (n ? n : 1) * sizeof(T)), what);
    p_ = static_cast<T*>(p);
  }
  dev_array(dev_array&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  dev_array& operator=(dev_array&& o) noexcept {
    if (this != &o) {
      if (p_) (void)cudaFree(p_);
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  dev_array(const dev_array&) = delete;
  dev_array& operator=(const dev_array&) = delete;
  ~dev_array() {
    if (p_) (void)cudaFree(p_);
  }
  [[nodiscard]] T* get() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

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

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void accumulate_kernel(float* __restrict__ g, float* __restrict__ res, std::size_t n) {
  for (std::size_t i = kernel_detail::thread_index(); i < n; i += kernel_detail::grid_stride()) {
    const float G = add_rn(g[i], res[i]);
    g[i] = G;
    res[i] = G;
  }
}

template <class I, class W>
__global__ void take_kernel(const float* __restrict__ G, float* __restrict__ res, const I* __restrict__ idx, std::size_t count,
                            raw_t<W>* __restrict__ out, float scale, float unscale) {
  using ops = wire_ops<W>;
  for (std::size_t j = kernel_detail::thread_index(); j < count; j += kernel_detail::grid_stride()) {
    const std::size_t i = static_cast<std::size_t>(idx[j]);
    const float v = G[i];
    const raw_t<W> w = ops::from_float(sanitize(mul_rn(v, scale)));
    out[j] = w;
    const float d = ops::to_float(w);
    res[i] = finite_bits(d) ? sub_rn(v, mul_rn(d, unscale)) : 0.0f;
  }
}

template <class I, class W>
__global__ void scatter_add_kernel(float* __restrict__ dst, const I* __restrict__ idx, const raw_t<W>* __restrict__ val, std::size_t count) {
  for (std::size_t j = kernel_detail::thread_index(); j < count; j += kernel_detail::grid_stride()) {
    const std::size_t i = static_cast<std::size_t>(idx[j]);
    dst[i] = add_rn(dst[i], wire_ops<W>::to_float(val[j]));
  }
}

template <class I, class W>
__global__ void decode_scatter_kernel(float* __restrict__ dst, const I* __restrict__ idx, const raw_t<W>* __restrict__ val, std::size_t count,
                                      float scale, unsigned long long* counter) {
  unsigned long long bad = 0;
  for (std::size_t j = kernel_detail::thread_index(); j < count; j += kernel_detail::grid_stride()) {
    const float v = mul_rn(wire_ops<W>::to_float(val[j]), scale);
    dst[static_cast<std::size_t>(idx[j])] = v;
    bad += !finite_bits(v);
  }
  if (counter != nullptr) kernel_detail::warp_add(counter, bad);
}

// ---- merge ---------------------------------------------------------------------------------------

/// Over the index-merged list (equal indices adjacent): the first of each index gets the sum of
/// its run (at most two entries, one per list) and flag 1; the second gets flag 0.
template <class I, class W>
__global__ void combine_kernel(const I* __restrict__ mi, const raw_t<W>* __restrict__ mv, std::size_t m, float* __restrict__ sums,
                               unsigned char* __restrict__ flags) {
  for (std::size_t p = kernel_detail::thread_index(); p < m; p += kernel_detail::grid_stride()) {
    const bool first = p == 0 || mi[p] != mi[p - 1];
    float s = wire_ops<W>::to_float(mv[p]);
    if (first && p + 1 < m && mi[p + 1] == mi[p]) s = sanitize(add_rn(s, wire_ops<W>::to_float(mv[p + 1])));
    sums[p] = s;
    flags[p] = first ? 1 : 0;
  }
}

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void keys_kernel(const float* __restrict__ sums, std::size_t m, const unsigned* d_n, unsigned* __restrict__ keys) {
  const std::size_t n = count_of(m, d_n);
  for (std::size_t p = kernel_detail::thread_index(); p < n; p += kernel_detail::grid_stride()) keys[p] = magnitude_key(sums[p]);
}

template <class I, class W>
struct emit_merge {
  const I* u_idx;
  const float* u_sum;
  I* out_idx;
  raw_t<W>* out_val;
  float* rec_val;           // per union entry: the record's value
  unsigned char* rec_flag;  // per union entry: 1 when it is a record
  __device__ __forceinline__ void operator()(std::size_t p, bool sel, unsigned long long pos) const {
    const float s = u_sum[p];
    if (sel) {
      const raw_t<W> w = wire_ops<W>::from_float(s);
      out_idx[pos] = u_idx[p];
      out_val[pos] = w;
      const float err = sub_rn(s, wire_ops<W>::to_float(w));
      rec_val[p] = err;
      rec_flag[p] = (err != 0.0f && finite_bits(err)) ? 1 : 0;
    } else {
      rec_val[p] = s;
      rec_flag[p] = 1;
    }
  }
};

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void kept_count_kernel(const unsigned* d_u, unsigned long long k, unsigned* d_counts) {
  const unsigned u = *d_u;
  d_counts[0] = static_cast<unsigned>(u < k ? u : k);
}

// Index order for cub::DeviceMerge (at namespace scope: kernel template arguments must be accessible).
struct index_less {
  template <class I>
  __host__ __device__ bool operator()(const I& a, const I& b) const { return a < b; }
};

inline unsigned blocks_for(std::size_t n) { return kernel_detail::grid_for(n); }
inline unsigned tiles_for(std::size_t n) { return static_cast<unsigned>((n + tile - 1) / tile); }

}  // namespace topk_detail

/// G = g + residual, written to both (before selection the residual holds G).
inline void accumulate_residual(float* g, float* residual, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  topk_detail::accumulate_kernel<<<topk_detail::blocks_for(n), topk_detail::threads, 0, stream>>>(g, residual, n);
  check_cuda(cudaGetLastError(), "launch of gflow::cuda::accumulate_residual");
}

/// Exact top-k selection on the device (see the header comment). Owns its scratch, sized for
/// units of up to max_n elements; select() enqueues work only.
class topk_selector {
 public:
  explicit topk_selector(std::size_t max_n) : max_n_(max_n) {
    if (max_n > std::numeric_limits<unsigned>::max())
      throw invalid_argument("max_n", "a device top-k selection handles at most 2^32 - 1 elements (got " + std::to_string(max_n) + ").",
                             "select over smaller units (Fusion buckets).");
    state_ = topk_detail::dev_array<topk_detail::select_state>(1, "cudaMalloc of the top-k selection state");
    hist_ = topk_detail::dev_array<unsigned>(4096, "cudaMalloc of the top-k histogram");
    check_cuda(cudaMemset(hist_.get(), 0, 4096 * sizeof(unsigned)), "cudaMemset of the top-k histogram");
    const std::size_t tiles = topk_detail::tiles_for(max_n ? max_n : 1);
    counts_ = topk_detail::dev_array<unsigned long long>(tiles, "cudaMalloc of the top-k tile counts");
    offsets_ = topk_detail::dev_array<unsigned long long>(tiles, "cudaMalloc of the top-k tile offsets");
    std::size_t bytes = 0;
    check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles)),
               "cub::DeviceScan::ExclusiveSum size query");
    temp_ = topk_detail::dev_array<unsigned char>(bytes, "cudaMalloc of the top-k scan scratch");
    temp_bytes_ = bytes;
  }

  [[nodiscard]] std::size_t max_n() const noexcept { return max_n_; }

  /// Writes base + position of the min(k, n) largest |v[0, n)| to out, increasing; ties to the
  /// lower index. Device pointers; enqueued on `stream`.
  template <class I>
  void select(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, cudaStream_t stream) {
    check_n(n);
    if (n == 0 || k == 0) return;
    if (k >= n) {
      topk_detail::iota_kernel<I><<<topk_detail::blocks_for(n), topk_detail::threads, 0, stream>>>(out, n, base);
      check_cuda(cudaGetLastError(), "launch of gflow::cuda::topk_selector (k >= n)");
      return;
    }
    run(topk_detail::float_keys{v}, n, nullptr, k, topk_detail::emit_index<I>{out, base}, stream);
  }

  /// The selection on precomputed keys with a device-side count (*d_n <= n_max): what the
  /// merge uses. emit(i, selected, position) is called for every element below *d_n.
  template <class Keys, class Emit>
  void run(Keys keys, std::size_t n_max, const unsigned* d_n, std::size_t k, Emit emit, cudaStream_t stream) {
    check_n(n_max);
    if (n_max == 0) return;
    using namespace topk_detail;
    const unsigned g = blocks_for(n_max);
    histogram_kernel<0><<<g, threads, 0, stream>>>(keys, n_max, d_n, state_.get(), hist_.get());
    choose_kernel<0><<<1, choose_threads, 0, stream>>>(state_.get(), hist_.get(), k, n_max, d_n);
    histogram_kernel<1><<<g, threads, 0, stream>>>(keys, n_max, d_n, state_.get(), hist_.get());
    choose_kernel<1><<<1, choose_threads, 0, stream>>>(state_.get(), hist_.get(), k, n_max, d_n);
    histogram_kernel<2><<<g, threads, 0, stream>>>(keys, n_max, d_n, state_.get(), hist_.get());
    choose_kernel<2><<<1, choose_threads, 0, stream>>>(state_.get(), hist_.get(), k, n_max, d_n);
    check_cuda(cudaGetLastError(), "launch of the gflow::cuda::topk_selector radix passes");
    const unsigned tiles = tiles_for(n_max);
    count_kernel<<<tiles, threads, 0, stream>>>(keys, n_max, d_n, state_.get(), counts_.get());
    check_cuda(cudaGetLastError(), "launch of the gflow::cuda::topk_selector count pass");
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceScan::ExclusiveSum(temp_.get(), bytes, counts_.get(), offsets_.get(), static_cast<int>(tiles), stream),
               "cub::DeviceScan::ExclusiveSum of the top-k tile counts");
    write_kernel<<<tiles, threads, 0, stream>>>(keys, n_max, d_n, state_.get(), offsets_.get(), emit);
    check_cuda(cudaGetLastError(), "launch of the gflow::cuda::topk_selector write pass");
  }

 private:
  void check_n(std::size_t n) const {
    if (n > max_n_)
      throw invalid_argument("n", "this topk_selector was sized for " + std::to_string(max_n_) + " elements; select() got " + std::to_string(n) + ".",
                             "build the selector with the largest unit it will see.");
  }

  std::size_t max_n_;
  topk_detail::dev_array<topk_detail::select_state> state_;
  topk_detail::dev_array<unsigned> hist_;
  topk_detail::dev_array<unsigned long long> counts_, offsets_;
  topk_detail::dev_array<unsigned char> temp_;
  std::size_t temp_bytes_ = 0;
};

/// out[j] = W(sanitize(G[idx[j]] * scale)); residual[idx[j]] = G - float(out[j]) * unscale, or 0
/// when that is not finite. Same bits as kernels::take_selected.
template <class I, class W>
void take_selected(const float* G, float* residual, const I* idx, std::size_t count, W* out, float scale, float unscale, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>, "gflow::cuda::take_selected<I, W>: W must be float, gflow::half or gflow::bfloat16.");
  if (count == 0) return;
  topk_detail::take_kernel<I, W><<<topk_detail::blocks_for(count), topk_detail::threads, 0, stream>>>(
      G, residual, idx, count, reinterpret_cast<topk_detail::raw_t<W>*>(out), scale, unscale);
  check_cuda(cudaGetLastError(), "launch of gflow::cuda::take_selected");
}

/// dst[idx[j]] += float(val[j]); the indices of one call must be distinct (one message).
template <class I, class W>
void scatter_add(float* dst, const I* idx, const W* val, std::size_t count, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>, "gflow::cuda::scatter_add<I, W>: W must be float, gflow::half or gflow::bfloat16.");
  if (count == 0) return;
  topk_detail::scatter_add_kernel<I, W><<<topk_detail::blocks_for(count), topk_detail::threads, 0, stream>>>(
      dst, idx, reinterpret_cast<const topk_detail::raw_t<W>*>(val), count);
  check_cuda(cudaGetLastError(), "launch of gflow::cuda::scatter_add");
}

/// dst[idx[j]] = float(val[j]) * scale; adds the number of inf / NaN results to *counter
/// (nullptr: no count).
template <class I, class W>
void decode_scatter(float* dst, const I* idx, const W* val, std::size_t count, float scale, unsigned long long* counter, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>, "gflow::cuda::decode_scatter<I, W>: W must be float, gflow::half or gflow::bfloat16.");
  if (count == 0) return;
  topk_detail::decode_scatter_kernel<I, W><<<topk_detail::blocks_for(count), topk_detail::threads, 0, stream>>>(
      dst, idx, reinterpret_cast<const topk_detail::raw_t<W>*>(val), count, scale, counter);
  check_cuda(cudaGetLastError(), "launch of gflow::cuda::decode_scatter");
}

/// Definition 1 of paper 003 on the device, with the records kernels::merge_topk produces.
/// Owns its scratch for lists of up to k_max entries each.
template <class I, class W>
class topk_merger {
  static_assert(std::is_same_v<I, std::uint32_t> || std::is_same_v<I, std::uint64_t>,
                "gflow::cuda::topk_merger<I, W>: indices are std::uint32_t or std::uint64_t.");
  static_assert(kernel_detail::is_wire_type<W>, "gflow::cuda::topk_merger<I, W>: W must be float, gflow::half or gflow::bfloat16.");

 public:
  using raw = topk_detail::raw_t<W>;  // the wire type's storage on the device

  explicit topk_merger(std::size_t k_max) : k_max_(k_max), sel_(2 * k_max) {
    const std::size_t m = 2 * (k_max ? k_max : 1);
    using topk_detail::dev_array;
    mi_ = dev_array<I>(m, "cudaMalloc of the merge keys");
    ui_ = dev_array<I>(m, "cudaMalloc of the merge union indices");
    mv_ = dev_array<raw>(m, "cudaMalloc of the merge values");
    sums_ = dev_array<float>(m, "cudaMalloc of the merge sums");
    usum_ = dev_array<float>(m, "cudaMalloc of the merge union sums");
    recv_ = dev_array<float>(m, "cudaMalloc of the merge record values");
    keys_ = dev_array<unsigned>(m, "cudaMalloc of the merge keys");
    flags_ = dev_array<unsigned char>(m, "cudaMalloc of the merge flags");
    rflags_ = dev_array<unsigned char>(m, "cudaMalloc of the merge record flags");
    counts_ = dev_array<unsigned>(3, "cudaMalloc of the merge counts");
    temp_bytes_ = std::max({merge_bytes(k_max, k_max), select_bytes<I>(m), select_bytes<float>(m)});
    temp_ = dev_array<unsigned char>(temp_bytes_, "cudaMalloc of the merge scratch");
  }

  /// a (na entries) and b (nb entries): index-sorted, distinct indices within each, na, nb <= k
  /// <= k_max. Writes the kept entries (index-sorted) to out_idx / out_val and the records to
  /// rec_idx / rec_val (2k capacity); d_counts[0] = kept, d_counts[1] = records (device).
  void merge(const I* ai, const W* av, std::size_t na, const I* bi, const W* bv, std::size_t nb, std::size_t k, I* out_idx, W* out_val,
             I* rec_idx, float* rec_val, unsigned* d_counts, cudaStream_t stream) {
    if (na > k || nb > k || k > k_max_)
      throw invalid_argument("k", "topk_merger sized for k <= " + std::to_string(k_max_) + " got lists of " + std::to_string(na) + " and " +
                                      std::to_string(nb) + " entries for k = " + std::to_string(k) + ".",
                             "pass lists of at most k entries and k within the merger's capacity.");
    using namespace topk_detail;
    const std::size_t m = na + nb;
    if (m == 0 || k == 0) {
      check_cuda(cudaMemsetAsync(d_counts, 0, 2 * sizeof(unsigned), stream), "cudaMemsetAsync of the merge counts");
      return;
    }
    std::size_t bytes = temp_bytes_;
    check_cuda(cub::DeviceMerge::MergePairs(temp_.get(), bytes, ai, reinterpret_cast<const raw*>(av), static_cast<std::int64_t>(na), bi,
                                            reinterpret_cast<const raw*>(bv), static_cast<std::int64_t>(nb), mi_.get(), mv_.get(), topk_detail::index_less{}, stream),
               "cub::DeviceMerge::MergePairs of two top-k lists");
    combine_kernel<I, W><<<blocks_for(m), threads, 0, stream>>>(mi_.get(), mv_.get(), m, sums_.get(), flags_.get());
    check_cuda(cudaGetLastError(), "launch of the merge combine kernel");
    unsigned* d_u = counts_.get();
    bytes = temp_bytes_;
    check_cuda(cub::DeviceSelect::Flagged(temp_.get(), bytes, mi_.get(), flags_.get(), ui_.get(), d_u, static_cast<std::int64_t>(m), stream),
               "cub::DeviceSelect::Flagged of the merge indices");
    bytes = temp_bytes_;
    check_cuda(cub::DeviceSelect::Flagged(temp_.get(), bytes, sums_.get(), flags_.get(), usum_.get(), counts_.get() + 2,
                                          static_cast<std::int64_t>(m), stream),
               "cub::DeviceSelect::Flagged of the merge sums");
    keys_kernel<<<blocks_for(m), threads, 0, stream>>>(usum_.get(), m, d_u, keys_.get());
    check_cuda(cudaMemsetAsync(rflags_.get(), 0, m, stream), "cudaMemsetAsync of the merge record flags");
    sel_.run(plain_keys{keys_.get()}, m, d_u, k,
             emit_merge<I, W>{ui_.get(), usum_.get(), out_idx, reinterpret_cast<raw*>(out_val), recv_.get(), rflags_.get()}, stream);
    kept_count_kernel<<<1, 1, 0, stream>>>(d_u, k, d_counts);
    check_cuda(cudaGetLastError(), "launch of the merge kept-count kernel");
    bytes = temp_bytes_;
    check_cuda(cub::DeviceSelect::Flagged(temp_.get(), bytes, ui_.get(), rflags_.get(), rec_idx, d_counts + 1, static_cast<std::int64_t>(m), stream),
               "cub::DeviceSelect::Flagged of the merge record indices");
    bytes = temp_bytes_;
    check_cuda(cub::DeviceSelect::Flagged(temp_.get(), bytes, recv_.get(), rflags_.get(), rec_val, counts_.get() + 2,
                                          static_cast<std::int64_t>(m), stream),
               "cub::DeviceSelect::Flagged of the merge record values");
  }

 private:
  static std::size_t merge_bytes(std::size_t na, std::size_t nb) {
    std::size_t bytes = 0;
    check_cuda(cub::DeviceMerge::MergePairs(nullptr, bytes, static_cast<const I*>(nullptr), static_cast<const raw*>(nullptr),
                                            static_cast<std::int64_t>(na), static_cast<const I*>(nullptr), static_cast<const raw*>(nullptr),
                                            static_cast<std::int64_t>(nb), static_cast<I*>(nullptr), static_cast<raw*>(nullptr), topk_detail::index_less{}),
               "cub::DeviceMerge::MergePairs size query");
    return bytes;
  }
  template <class V>
  static std::size_t select_bytes(std::size_t m) {
    std::size_t bytes = 0;
    check_cuda(cub::DeviceSelect::Flagged(nullptr, bytes, static_cast<const V*>(nullptr), static_cast<const unsigned char*>(nullptr),
                                          static_cast<V*>(nullptr), static_cast<unsigned*>(nullptr), static_cast<std::int64_t>(m)),
               "cub::DeviceSelect::Flagged size query");
    return bytes;
  }

  std::size_t k_max_;
  topk_selector sel_;
  topk_detail::dev_array<I> mi_, ui_;
  topk_detail::dev_array<raw> mv_;
  topk_detail::dev_array<float> sums_, usum_, recv_;
  topk_detail::dev_array<unsigned> keys_;
  topk_detail::dev_array<unsigned char> flags_, rflags_;
  topk_detail::dev_array<unsigned> counts_;  // [0] union size, [2] a second count CUB writes (discarded)
  topk_detail::dev_array<unsigned char> temp_;
  std::size_t temp_bytes_ = 0;
};

}  // namespace gflow::cuda
