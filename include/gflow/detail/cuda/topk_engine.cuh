#pragma once
// The device kernels the Top-k engines (engines/topk.hpp) need beyond include/gflow/detail/cuda/topk.cuh,
// each the twin of a host kernel of include/gflow/detail/kernels/topk.hpp with the same output:
//
//   accumulate_into_residual(g, res, n, stream)             res = g + res (g only read)
//   take_selected_dropping(res, off, n, idx, count, out, s, u, stream)
//                                                           kernels::take_selected on res, and, when
//                                                           count < n and every selected G is inf/NaN,
//                                                           kernels::clear_nonfinite over the unit
//                                                           (the flag stays on the device)
//   restore_unselected(res, ai, av, na, fi, nf, u, stream)  Algorithm 4 line 10 (binary search in f)
//   restore_records_in(res, ri, rv, nr, fi, nf, u, stream)  merge records whose index is in f
//   message_checker<I, W>                                   kernels::unpack_checked on a device message:
//                                                           the verdict (sparse_message::unpack_result, no
//                                                           gradient value) is copied to the host, then
//                                                           the entries are copied on the device
//
// Messages (kernels/topk.hpp): a 24-byte header, k indices, k values; a message inside an
// all-gathered block may sit at any byte offset, so entries are read with memcpy.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "../kernels/topk.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "topk.cuh"

namespace gflow::detail::cuda {

namespace topk_engine_detail {

using kernel_detail::grid_for;
using kernel_detail::grid_stride;
using kernel_detail::thread_index;
inline constexpr unsigned threads = kernel_detail::block_threads;

__device__ __forceinline__ bool nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void accumulate_into_kernel(const float* __restrict__ g, float* __restrict__ res, std::size_t n) {
  for (std::size_t i = thread_index(); i < n; i += grid_stride()) res[i] = __fadd_rn(g[i], res[i]);
}

// flag = 1 when every selected G is non-finite (count > 0): kernels::selection_all_nonfinite.
template <class I>
__global__ void all_nonfinite_kernel(const float* G, const I* idx, std::size_t count, unsigned* flag) {
  for (std::size_t j = thread_index(); j < count; j += grid_stride())
    if (!nonfinite(G[static_cast<std::size_t>(idx[j])])) atomicExch(flag, 0u);
}

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void set_flag_kernel(unsigned* flag) { *flag = 1u; }

// static: a non-template kernel in a header has one definition per translation unit.
static __global__ void clear_if_kernel(float* res, std::size_t n, const unsigned* flag) {
  if (*flag == 0u) return;
  for (std::size_t i = thread_index(); i < n; i += grid_stride())
    if (nonfinite(res[i])) res[i] = 0.0f;
}

template <class I>
__device__ __forceinline__ bool contains(const I* f, std::size_t nf, I x) {
  std::size_t lo = 0, hi = nf;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (f[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo < nf && f[lo] == x;
}

template <class I, class W>
__global__ void restore_unselected_kernel(float* res, const I* ai, const kernel_detail::raw_t<W>* av, std::size_t na, const I* fi,
                                          std::size_t nf, float unscale) {
  for (std::size_t j = thread_index(); j < na; j += grid_stride()) {
    if (fi != nullptr && contains(fi, nf, ai[j])) continue;
    const float v = __fmul_rn(kernel_detail::wire_ops<W>::to_float(av[j]), unscale);
    if (!nonfinite(v)) {
      const std::size_t i = static_cast<std::size_t>(ai[j]);
      res[i] = __fadd_rn(res[i], v);  // indices distinct within a list: no race
    }
  }
}

template <class I>
__global__ void restore_records_kernel(float* res, const I* ri, const float* rv, std::size_t nr, const I* fi, std::size_t nf, float unscale) {
  for (std::size_t j = thread_index(); j < nr; j += grid_stride()) {
    if (!contains(fi, nf, ri[j])) continue;
    const float v = __fmul_rn(rv[j], unscale);
    if (!nonfinite(v)) {
      const std::size_t i = static_cast<std::size_t>(ri[j]);
      res[i] = __fadd_rn(res[i], v);  // a round's records have distinct indices
    }
  }
}

// The first faulty entry of a message (kernels::unpack_checked's order: index, order, value).
template <class I, class W>
__global__ void first_fault_kernel(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, unsigned long long* first) {
  sparse_message::header h;
  memcpy(&h, msg, sizeof h);
  if (h.status != 0 || h.count > k) return;
  const std::size_t count = static_cast<std::size_t>(h.count);
  const unsigned char* ip = msg + sparse_message::header_bytes;
  const unsigned char* vp = ip + k * sizeof(I);
  for (std::size_t j = thread_index(); j < count; j += grid_stride()) {
    I x;
    memcpy(&x, ip + j * sizeof(I), sizeof(I));
    const std::uint64_t i = static_cast<std::uint64_t>(x);
    bool bad = i < lo || i >= hi;
    if (!bad && j > 0) {
      I p;
      memcpy(&p, ip + (j - 1) * sizeof(I), sizeof(I));
      bad = i <= static_cast<std::uint64_t>(p);
    }
    if (!bad) {
      kernel_detail::raw_t<W> w;
      memcpy(&w, vp + j * sizeof(W), sizeof(W));
      const float f = kernel_detail::wire_ops<W>::to_float(w);
      bad = f != f;
    }
    if (bad) atomicMin(first, static_cast<unsigned long long>(j));
  }
}

// Fills the verdict as kernels::unpack_checked does (one thread).
template <class I, class W>
__global__ void verdict_kernel(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, const unsigned long long* first,
                               sparse_message::unpack_result* out) {
  sparse_message::unpack_result r;
  memcpy(&r.header, msg, sizeof r.header);
  if (r.header.status != 0) {
    r.fault = sparse_message::fault_code::status;
  } else if (r.header.count > k) {
    r.fault = sparse_message::fault_code::count;
    r.position = r.header.count;
  } else if (*first != ~0ull) {
    const std::size_t j = static_cast<std::size_t>(*first);
    const unsigned char* ip = msg + sparse_message::header_bytes;
    I x;
    memcpy(&x, ip + j * sizeof(I), sizeof(I));
    const std::uint64_t i = static_cast<std::uint64_t>(x);
    r.position = j;
    r.bad_index = i;
    if (i < lo || i >= hi) r.fault = sparse_message::fault_code::index;
    else if (j > 0) {
      I p;
      memcpy(&p, ip + (j - 1) * sizeof(I), sizeof(I));
      r.fault = i <= static_cast<std::uint64_t>(p) ? sparse_message::fault_code::order : sparse_message::fault_code::value;
    } else {
      r.fault = sparse_message::fault_code::value;
    }
  } else {
    r.count = static_cast<std::size_t>(r.header.count);
  }
  *out = r;
}

struct free_device {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
struct free_host {
  void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
};

}  // namespace topk_engine_detail

/// res = g + res over n elements (g only read): kernels::accumulate_into_residual.
inline void accumulate_into_residual(const float* g, float* res, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  using namespace topk_engine_detail;
  accumulate_into_kernel<<<grid_for(n), threads, 0, stream>>>(g, res, n);
  check_cuda(cudaGetLastError(), "launch of gflow::detail::cuda::accumulate_into_residual");
}

/// The engine's take step on a unit [off, off + n) whose residual holds G: kernels::take_selected
/// (G and residual the same array), and kernels::clear_nonfinite over the unit when count < n and
/// every selected G is inf/NaN (decided on G, before the take). `flag` is one device unsigned.
template <class I, class W>
void take_selected_dropping(float* res, std::size_t off, std::size_t n, const I* idx, std::size_t count, W* out, float scale, float unscale,
                            unsigned* flag, cudaStream_t stream) {
  using namespace topk_engine_detail;
  const bool may_drop = count > 0 && count < n;
  if (may_drop) {
    set_flag_kernel<<<1, 1, 0, stream>>>(flag);  // 1, then any finite selected G clears it
    all_nonfinite_kernel<I><<<grid_for(count), threads, 0, stream>>>(res, idx, count, flag);
    check_cuda(cudaGetLastError(), "launch of the top-k non-finite selection check");
  }
  take_selected(res, res, idx, count, out, scale, unscale, stream);
  if (may_drop) {
    clear_if_kernel<<<grid_for(n), threads, 0, stream>>>(res + off, n, flag);
    check_cuda(cudaGetLastError(), "launch of the top-k residual clear");
  }
}

/// kernels::restore_unselected on the device; fi == nullptr restores every entry.
template <class I, class W>
void restore_unselected(float* res, const I* ai, const W* av, std::size_t na, const I* fi, std::size_t nf, float unscale, cudaStream_t stream) {
  if (na == 0) return;
  using namespace topk_engine_detail;
  restore_unselected_kernel<I, W><<<grid_for(na), threads, 0, stream>>>(res, ai, reinterpret_cast<const kernel_detail::raw_t<W>*>(av), na, fi,
                                                                      nf, unscale);
  check_cuda(cudaGetLastError(), "launch of gflow::detail::cuda::restore_unselected");
}

/// kernels::restore_records_in on the device.
template <class I>
void restore_records_in(float* res, const I* ri, const float* rv, std::size_t nr, const I* fi, std::size_t nf, float unscale, cudaStream_t stream) {
  if (nr == 0 || nf == 0) return;
  using namespace topk_engine_detail;
  restore_records_kernel<I><<<grid_for(nr), threads, 0, stream>>>(res, ri, rv, nr, fi, nf, unscale);
  check_cuda(cudaGetLastError(), "launch of gflow::detail::cuda::restore_records_in");
}

/// kernels::unpack_checked for messages in device memory. check() validates on the device and
/// copies only the verdict to the host (one stream synchronisation: the engine decides on the
/// host whether to merge, forward a fault, or throw); the entries of a valid message are then
/// copied device to device.
class message_checker {
 public:
  message_checker() {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, sizeof(unsigned long long) + sizeof(sparse_message::unpack_result) + 16), "cudaMalloc of the message checker");
    dev_.reset(p);
    void* h = nullptr;
    check_cuda(cudaMallocHost(&h, sizeof(sparse_message::unpack_result)), "cudaMallocHost of the message verdict");
    host_.reset(h);
  }

  template <class I, class W>
  sparse_message::unpack_result check(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, I* idx, W* val, cudaStream_t stream) {
    using namespace topk_engine_detail;
    auto* first = static_cast<unsigned long long*>(dev_.get());
    auto* verdict = reinterpret_cast<sparse_message::unpack_result*>(static_cast<unsigned char*>(dev_.get()) + 16);
    check_cuda(cudaMemsetAsync(first, 0xff, sizeof *first, stream), "cudaMemsetAsync of the message checker");
    const std::size_t work = k ? k : 1;
    first_fault_kernel<I, W><<<grid_for(work), threads, 0, stream>>>(msg, k, lo, hi, first);
    check_cuda(cudaGetLastError(), "launch of the message check");
    verdict_kernel<I, W><<<1, 1, 0, stream>>>(msg, k, lo, hi, first, verdict);
    check_cuda(cudaGetLastError(), "launch of the message verdict");
    check_cuda(cudaMemcpyAsync(host_.get(), verdict, sizeof(sparse_message::unpack_result), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync of a message verdict");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize for a message verdict");
    sparse_message::unpack_result r;
    std::memcpy(&r, host_.get(), sizeof r);
    if (r.ok() && r.count != 0) {
      check_cuda(cudaMemcpyAsync(idx, msg + sparse_message::header_bytes, r.count * sizeof(I), cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync of a message's indices");
      check_cuda(cudaMemcpyAsync(val, msg + sparse_message::header_bytes + k * sizeof(I), r.count * sizeof(W), cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync of a message's values");
    }
    return r;
  }

 private:
  std::unique_ptr<void, topk_engine_detail::free_device> dev_;
  std::unique_ptr<void, topk_engine_detail::free_host> host_;
};

}  // namespace gflow::detail::cuda
