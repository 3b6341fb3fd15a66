#pragma once
// The merge of two top-k lists on the device: gflow::detail::cuda::topk_merger, Definition 1 of gTop-k (Shi et al.)
// with the records kernels::merge_topk produces (the gTop-k tree's step), and its kernels.
// (cuda/topk.cuh includes it with the rest of the top-k kernels; include that one.)
//
// The merge uses cub::DeviceMerge::MergePairs (index order), a kernel that adds equal indices,
// cub::DeviceSelect::Flagged to compact, the same selector (on a device-side count) and Flagged
// again for the records.
#include <cuda_runtime.h>

#include <cub/device/device_merge.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../../error.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "launch.cuh"
#include "memory.cuh"
#include "topk_select.cuh"

namespace gflow::detail::cuda {

namespace topk_detail {

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

}  // namespace topk_detail

/// Definition 1 of gTop-k (Shi et al.) on the device, with the records kernels::merge_topk produces.
/// Owns its scratch for lists of up to k_max entries each.
template <class I, class W>
class topk_merger {
  static_assert(std::is_same_v<I, std::uint32_t> || std::is_same_v<I, std::uint64_t>,
                "gflow::detail::cuda::topk_merger<I, W>: indices are std::uint32_t or std::uint64_t.");
  static_assert(kernel_detail::is_wire_type<W>, "gflow::detail::cuda::topk_merger<I, W>: W must be float, gflow::half or gflow::bfloat16.");

 public:
  using raw = topk_detail::raw_t<W>;  // the wire type's storage on the device

  explicit topk_merger(std::size_t k_max) : k_max_(k_max), sel_(2 * k_max) {
    const std::size_t m = 2 * (k_max ? k_max : 1);
    mi_ = device_array<I>(m, "cudaMalloc of the merge keys");
    ui_ = device_array<I>(m, "cudaMalloc of the merge union indices");
    mv_ = device_array<raw>(m, "cudaMalloc of the merge values");
    sums_ = device_array<float>(m, "cudaMalloc of the merge sums");
    usum_ = device_array<float>(m, "cudaMalloc of the merge union sums");
    recv_ = device_array<float>(m, "cudaMalloc of the merge record values");
    keys_ = device_array<unsigned>(m, "cudaMalloc of the merge keys");
    flags_ = device_array<unsigned char>(m, "cudaMalloc of the merge flags");
    rflags_ = device_array<unsigned char>(m, "cudaMalloc of the merge record flags");
    counts_ = device_array<unsigned>(3, "cudaMalloc of the merge counts");
    temp_bytes_ = std::max({merge_bytes(k_max, k_max), select_bytes<I>(m), select_bytes<float>(m)});
    temp_ = device_array<unsigned char>(temp_bytes_, "cudaMalloc of the merge scratch");
  }

  /// a (na entries) and b (nb entries): index-sorted, distinct indices within each, na, nb <= k
  /// <= k_max. Writes the kept entries (index-sorted) to out_idx / out_val and the records to
  /// rec_idx / rec_val (2k capacity); d_counts[0] = kept, d_counts[1] = records (device).
  void merge(const I* ai, const W* av, std::size_t na, const I* bi, const W* bv, std::size_t nb, std::size_t k, I* out_idx, W* out_val,
             I* rec_idx, float* rec_val, unsigned* d_counts, cudaStream_t stream) {
    if (na > k || nb > k || k > k_max_)
      throw invalid_argument("k", fmt::format("topk_merger sized for k <= {} got lists of {} and "
                                      "{} entries for k = {}.", k_max_, na, nb, k),
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
    kernel_detail::launch(combine_kernel<I, W>, blocks_for(m), threads, stream, "launch of the merge combine kernel", mi_.get(), mv_.get(), m,
                          sums_.get(), flags_.get());
    unsigned* d_u = counts_.get();
    bytes = temp_bytes_;
    check_cuda(cub::DeviceSelect::Flagged(temp_.get(), bytes, mi_.get(), flags_.get(), ui_.get(), d_u, static_cast<std::int64_t>(m), stream),
               "cub::DeviceSelect::Flagged of the merge indices");
    bytes = temp_bytes_;
    check_cuda(cub::DeviceSelect::Flagged(temp_.get(), bytes, sums_.get(), flags_.get(), usum_.get(), counts_.get() + 2,
                                          static_cast<std::int64_t>(m), stream),
               "cub::DeviceSelect::Flagged of the merge sums");
    kernel_detail::launch(keys_kernel, blocks_for(m), threads, stream, "launch of the merge keys kernel", usum_.get(), m, d_u, keys_.get());
    check_cuda(cudaMemsetAsync(rflags_.get(), 0, m, stream), "cudaMemsetAsync of the merge record flags");
    sel_.run(plain_keys{keys_.get()}, m, d_u, k,
             emit_merge<I, W>{ui_.get(), usum_.get(), out_idx, reinterpret_cast<raw*>(out_val), recv_.get(), rflags_.get()}, stream);
    kernel_detail::launch(kept_count_kernel, 1u, 1u, stream, "launch of the merge kept-count kernel", d_u, k, d_counts);
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
  device_array<I> mi_, ui_;
  device_array<raw> mv_;
  device_array<float> sums_, usum_, recv_;
  device_array<unsigned> keys_;
  device_array<unsigned char> flags_, rflags_;
  device_array<unsigned> counts_;  // [0] union size, [2] a second count CUB writes (discarded)
  device_array<unsigned char> temp_;
  std::size_t temp_bytes_ = 0;
};

}  // namespace gflow::detail::cuda
