#pragma once
// CUDA twins of include/gflow/detail/kernels/topk.hpp: the Top-k sparsifiers' kernels on device memory,
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
//   topk_merger<I, W> m(k_max);                                     Definition 1 of gTop-k (Shi et al.) (merge_topk):
//   m.merge(a, na, b, nb, k, out, records, d_counts, stream)        d_counts[0] = kept, d_counts[1] = records
//
// Every call only enqueues work on `stream` (no host synchronisation), takes device pointers of
// the current device, and throws gflow::transport_error if a launch fails. I is std::uint32_t or
// std::uint64_t; W is float, gflow::half or gflow::bfloat16.
//
// The parts: topk_select.cuh (topk_selector: the radix select) over topk_radix.cuh (its kernels
// and the device helpers the other kernels share), topk_merge.cuh (topk_merger); this file has
// the element-wise kernels and
// includes both. Messages are validated on the host (kernels::unpack_checked) or, on device
// memory, by the message_checker of cuda/topk_engine.cuh.
#include <cuda_runtime.h>

#include <cstddef>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "launch.cuh"
#include "topk_merge.cuh"
#include "topk_select.cuh"

namespace gflow::detail::cuda {

namespace topk_detail {

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

}  // namespace topk_detail

/// G = g + residual, written to both (before selection the residual holds G).
inline void accumulate_residual(float* g, float* residual, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  kernel_detail::launch(topk_detail::accumulate_kernel, topk_detail::blocks_for(n), topk_detail::threads, stream,
                        "launch of gflow::detail::cuda::accumulate_residual", g, residual, n);
}

/// out[j] = W(sanitize(G[idx[j]] * scale)); residual[idx[j]] = G - float(out[j]) * unscale, or 0
/// when that is not finite. Same bits as kernels::take_selected.
template <class I, class W>
void take_selected(const float* G, float* residual, const I* idx, std::size_t count, W* out, float scale, float unscale, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>, "gflow::detail::cuda::take_selected<I, W>: W must be float, gflow::half or gflow::bfloat16.");
  if (count == 0) return;
  kernel_detail::launch(topk_detail::take_kernel<I, W>, topk_detail::blocks_for(count), topk_detail::threads, stream,
                        "launch of gflow::detail::cuda::take_selected", G, residual, idx, count, reinterpret_cast<topk_detail::raw_t<W>*>(out), scale,
                        unscale);
}

/// dst[idx[j]] += float(val[j]); the indices of one call must be distinct (one message).
template <class I, class W>
void scatter_add(float* dst, const I* idx, const W* val, std::size_t count, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>, "gflow::detail::cuda::scatter_add<I, W>: W must be float, gflow::half or gflow::bfloat16.");
  if (count == 0) return;
  kernel_detail::launch(topk_detail::scatter_add_kernel<I, W>, topk_detail::blocks_for(count), topk_detail::threads, stream,
                        "launch of gflow::detail::cuda::scatter_add", dst, idx, reinterpret_cast<const topk_detail::raw_t<W>*>(val), count);
}

/// dst[idx[j]] = float(val[j]) * scale; adds the number of inf / NaN results to *counter
/// (nullptr: no count).
template <class I, class W>
void decode_scatter(float* dst, const I* idx, const W* val, std::size_t count, float scale, unsigned long long* counter, cudaStream_t stream) {
  static_assert(kernel_detail::is_wire_type<W>, "gflow::detail::cuda::decode_scatter<I, W>: W must be float, gflow::half or gflow::bfloat16.");
  if (count == 0) return;
  kernel_detail::launch(topk_detail::decode_scatter_kernel<I, W>, topk_detail::blocks_for(count), topk_detail::threads, stream,
                        "launch of gflow::detail::cuda::decode_scatter", dst, idx, reinterpret_cast<const topk_detail::raw_t<W>*>(val), count, scale,
                        counter);
}

}  // namespace gflow::detail::cuda
