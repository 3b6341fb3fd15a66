#pragma once
// Memory and kernels of the exchanger for host-memory transports (MPI, in-process, mock).
// The device twin (include/gflow/detail/cuda/device_backend.cuh) has the same members and runs the
// CUDA kernels on the transport's stream.
//
//   stream_ordered             true when kernels queue behind started collectives (CUDA stream)
//   buffer<E>                  owning, zero-filled array (malloc'd)
//   context(transport&)        per-exchanger kernel context
//     scale_to_wire(in, out, n, s)   out = W(in * s)
//     wire_to_float(in, out, n)      out = float(in); counts non-finite results
//     scale_in_place(buf, n, s)      buf *= s; counts non-finite results
//     count_nonfinite(buf, n)        counts non-finite results
//     add_nonfinite(k)               adds k to the count (host only: for engines that count while
//                                    they scatter, CSC)
//     copy(dst, src, n)              src lives in the same memory space
//     add(dst, src, n)               dst += src (gradient accumulation through ready(i, source))
//     take_nonfinite()               the count since the last call (device: synchronises)
//     order_after_producer()         before a bucket's work: device contexts make their stream
//                                    wait for the trainer's producer stream (set_producer)
//   chunked sparse kernels (CSC; kernels/sparse_chunks.hpp, the counting ones add to the count):
//     compact_chunks, compact_chunks_to_wire, defer_chunks, scatter_chunks_counted,
//     scatter_chunks_from_wire, count_nonfinite_at(v, list, count), select_top_chunks
//   top-k kernels (TopK / GTopK; kernels/topk.hpp), over the scratch topk_scratch<W>:
//     accumulate_select_topk, take_selected_dropping, pack, unpack_checked, fill_zero, scatter_add,
//     merge_topk, decode_scatter_counted, restore_unselected, restore_records_in, copy_n
//   OkTopK's kernels (engines/oktopk/; kernels/topk_sampled.hpp, kernels/topk.hpp):
//     accumulate_gather_above, gather_keys(v, idx, count, keys), add_at(dst, idx, v, count)
//   download(host_dst, src, n) / upload(dst, host_src, n)   transfers to / from the host (here: copies)
// The contract is gflow::detail::backend (engines/concepts.hpp), asserted below.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "../kernels/cast.hpp"
#include "../kernels/sparse_chunks.hpp"
#include "../kernels/topk.hpp"
#include "../../transport/archetype.hpp"
#include "concepts.hpp"

namespace gflow::detail {

// Allocated with malloc, like std::vector: a 64-byte aligned pool (operator new with
// align_val_t) made Open MPI's in-place allreduce of ResNet-50 ~20% slower than the same
// hand-written loop on a malloc'd buffer (bench/run exchange, 2 ranks; see docs/BENCHMARKS.md).
struct malloc_free {
  void operator()(void* p) const noexcept { std::free(p); }
};

template <class E>
class host_buffer {
 public:
  host_buffer() = default;
  explicit host_buffer(std::size_t n) : n_(n) {
    if (n) {
      p_.reset(static_cast<E*>(std::malloc(n * sizeof(E))));
      if (!p_) throw std::bad_alloc();
      std::memset(static_cast<void*>(p_.get()), 0, n * sizeof(E));
    }
  }
  [[nodiscard]] E* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  std::unique_ptr<E, malloc_free> p_;
  std::size_t n_ = 0;
};

struct host_backend {
  // Host kernels run on the caller's thread: a collective must complete before its result is read.
  static constexpr bool stream_ordered = false;
  template <class E>
  using buffer = host_buffer<E>;
  /// The Top-k engines' selection scratch (reserve(n, k), release()).
  template <class W>
  using topk_scratch = kernels::topk_workspace;

  class context {
   public:
    template <class T>
    explicit context(T&) {}
    template <class W>
    void scale_to_wire(const float* in, W* out, std::size_t n, float s) { kernels::scale_to_wire(in, out, n, s); }
    template <class W>
    void wire_to_float(const W* in, float* out, std::size_t n) { bad_ += kernels::wire_to_float(in, out, n); }
    void scale_in_place(float* buf, std::size_t n, float s) { bad_ += kernels::scale_in_place(buf, n, s); }
    void count_nonfinite(const float* buf, std::size_t n) { bad_ += kernels::count_nonfinite(buf, n); }
    void add_nonfinite(std::size_t k) { bad_ += k; }
    void copy(float* dst, const float* src, std::size_t n) { if (n && dst != src) std::memmove(dst, src, n * sizeof(float)); }
    void add(float* dst, const float* src, std::size_t n) {
      for (std::size_t j = 0; j < n; ++j) dst[j] += src[j];
    }
    std::size_t take_nonfinite() { const std::size_t b = bad_; bad_ = 0; return b; }
    void order_after_producer() {}  // host gradients are complete when ready() is called

    // ---- chunked sparse kernels (CSC): kernels/sparse_chunks.hpp ----
    void compact_chunks(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float* out) {
      (void)kernels::compact_chunks(pool, hist, n, C, list, count, out);
    }
    template <class W>
    void compact_chunks_to_wire(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                W* out, float scale, float unscale) {
      (void)kernels::compact_chunks_to_wire(pool, hist, n, C, list, count, out, scale, unscale);
    }
    void defer_chunks(float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float momentum,
                      float* norms) {
      kernels::defer_chunks(pool, hist, n, C, list, count, momentum, norms);
    }
    void scatter_chunks_counted(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                bool multiply, float value_scale, float* norms, float norm_scale) {
      bad_ += kernels::scatter_chunks_counted(buf, pool, n, C, list, count, multiply, value_scale, norms, norm_scale);
    }
    template <class W>
    void scatter_chunks_from_wire(const W* wire, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                  float* norms, float norm_scale) {
      bad_ += kernels::scatter_chunks_from_wire(wire, pool, n, C, list, count, norms, norm_scale);
    }
    void count_nonfinite_at(const float* v, const std::uint32_t* list, std::size_t count) {
      for (std::size_t j = 0; j < count; ++j) bad_ += !std::isfinite(v[list[j]]);
    }
    void select_top_chunks(const float* norms, std::size_t chunks, std::size_t k, std::uint32_t* out) {
      kernels::select_top_chunks(norms, chunks, k, out);
    }

    // ---- top-k kernels (TopK / GTopK): kernels/topk.hpp ----
    template <class I>
    kernels::topk_result accumulate_select_topk(const float* g, float* res, std::size_t n, std::size_t k, std::uint64_t base, I* out,
                                                kernels::topk_workspace& ws) {
      return kernels::accumulate_select_topk(g, res, n, k, base, out, ws);
    }
    std::size_t accumulate_gather_above(const float* g, float* res, std::size_t n, std::uint32_t t, std::uint64_t base, std::uint64_t* pos,
                                        std::uint32_t* keys, std::size_t cap) {
      return kernels::accumulate_gather_above(g, res, n, t, base, pos, keys, cap);
    }
    // ---- OkTopK's kernels (engines/oktopk/): accumulate_gather_above above, and ----
    template <class I>
    void gather_keys(const float* v, const I* idx, std::size_t count, std::uint32_t* keys) { kernels::gather_keys(v, idx, count, keys); }
    /// dst[idx[j]] += v[j] (indices distinct): scatter_add with a float wire.
    template <class I>
    void add_at(float* dst, const I* idx, const float* v, std::size_t count) { kernels::scatter_add(dst, idx, v, count); }
    /// kernels::select_topk of v (only read), with the workspace's key scratch (reserve(n, k)).
    template <class I>
    std::size_t select_topk(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, kernels::topk_workspace& ws) {
      return kernels::select_topk(v, n, k, base, out, ws.keys.data());
    }
    /// On a unit [off, off + n) whose residual holds G: take the selection into `out` (the
    /// residual keeps what was not sent); should every selected G be inf/NaN with count < n,
    /// the unit's other inf/NaN are dropped from the residual (decided before the take).
    template <class I, class W>
    void take_selected_dropping(float* res, std::size_t off, std::size_t n, const I* idx, std::size_t count, W* out, float scale, float unscale,
                                kernels::topk_workspace&) {
      const bool drop = count < n && kernels::selection_all_nonfinite(res, idx, count);
      kernels::take_selected(res, res, idx, count, out, scale, unscale);
      if (drop) kernels::clear_nonfinite(res + off, n);
    }
    template <class I, class W>
    void pack(unsigned char* msg, std::size_t k, const I* idx, const W* val, std::size_t count, sparse_message::header h = {}) {
      sparse_message::pack(msg, k, idx, val, count, h);
    }
    template <class I, class W>
    sparse_message::unpack_result unpack_checked(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, I* idx, W* val,
                                          kernels::topk_workspace&) {
      return kernels::unpack_checked(msg, k, lo, hi, idx, val);
    }
    void fill_zero(float* p, std::size_t n) { std::fill(p, p + n, 0.0f); }
    template <class I, class W>
    void scatter_add(float* dst, const I* idx, const W* val, std::size_t count) { kernels::scatter_add(dst, idx, val, count); }
    template <class I, class W>
    std::size_t merge_topk(const I* ai, const W* av, std::size_t na, const I* bi, const W* bv, std::size_t nb, std::size_t k, I* oi, W* ov, I* ri,
                           float* rv, std::size_t* records, kernels::merge_scratch<I> s, kernels::topk_workspace&) {
      return kernels::merge_topk(ai, av, na, bi, bv, nb, k, oi, ov, ri, rv, records, s);
    }
    /// dst[idx[j]] = float(val[j]) * scale, counting inf/NaN results; `decoded` is count floats of scratch.
    template <class I, class W>
    void decode_scatter_counted(float* dst, const I* idx, const W* val, std::size_t count, float scale, float* decoded) {
      kernels::decode_scaled(val, count, scale, decoded);
      bad_ += kernels::count_nonfinite(decoded, count);
      kernels::scatter_set(dst, idx, decoded, count);
    }
    template <class I, class W>
    void restore_unselected(float* res, const I* ai, const W* av, std::size_t na, const I* fi, std::size_t nf, float unscale) {
      kernels::restore_unselected(res, ai, av, na, fi, nf, unscale);
    }
    template <class I>
    void restore_records_in(float* res, const I* ri, const float* rv, std::size_t nr, const I* fi, std::size_t nf, float unscale) {
      kernels::restore_records_in(res, ri, rv, nr, fi, nf, unscale);
    }
    template <class E>
    void copy_n(E* dst, const E* src, std::size_t n) { if (n && dst != src) std::memmove(dst, src, n * sizeof(E)); }

    // ---- transfers: host memory already ----
    template <class E>
    void download(E* host_dst, const E* src, std::size_t n) { if (n && host_dst != src) std::memmove(host_dst, src, n * sizeof(E)); }
    template <class E>
    void upload(E* dst, const E* host_src, std::size_t n) { if (n && dst != host_src) std::memmove(dst, host_src, n * sizeof(E)); }

   private:
    std::size_t bad_ = 0;
  };
};

static_assert(backend<host_backend> && topk_backend<host_backend> && backend_for_transport<host_backend, transport_archetype<>>,
              "gflow::detail::host_backend must meet gflow::detail::backend (engines/concepts.hpp)");
static_assert(oktopk_backend<host_backend>, "gflow::detail::host_backend must meet gflow::detail::oktopk_backend (engines/concepts.hpp)");

template <>
struct backend_for<host_memory> { using type = host_backend; };
// backend_for<device_memory> lives in include/gflow/detail/cuda/device_backend.cuh.

// The backend, or the host one where none exists, so a missing CUDA backend is reported by the
// exchanger's static_assert alone rather than by a cascade of incomplete-type errors.
template <class Space>
struct backend_or_host { using type = host_backend; };
template <has_backend Space>
struct backend_or_host<Space> { using type = typename backend_for<Space>::type; };

}  // namespace gflow::detail
