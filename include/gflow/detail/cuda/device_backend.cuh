#pragma once
// Memory and kernels of the exchanger for device-memory transports (NCCL): the twin of
// include/gflow/detail/engines/host_backend.hpp, with the same members.
//
//   buffer<E>                  owning, zero-filled cudaMalloc'd array (current device)
//   context(transport&)        per-exchanger kernel context on the transport's stream
//     scale_to_wire(in, out, n, s)   out = W(in * s)
//     wire_to_float(in, out, n)      out = float(in); counts non-finite results
//     scale_in_place(buf, n, s)      buf *= s; counts non-finite results
//     count_nonfinite(buf, n)        counts non-finite results
//     add(dst, src, n)               dst += src
//     copy(dst, src, n)              device to device, on the stream
//     take_nonfinite()               the count since the last call (synchronises the stream)
//   chunked sparse kernels (CSC), the twins of host_backend's, bitwise identical to them
//   (cuda/sparse_chunks.cuh: the norms in the one order host and device share):
//     compact_chunks, compact_chunks_to_wire, defer_chunks, scatter_chunks_counted,
//     scatter_chunks_from_wire, count_nonfinite_at, select_top_chunks (device chunk lists)
//   top-k kernels (TopK / GTopK), the twins of host_backend's (cuda/topk.cuh, cuda/topk_engine.cuh);
//   what reaches the host: each message's verdict (unpack_checked) and each merge's two counts
//   (merge_topk), one stream synchronisation each, because the engine's host logic decides from
//   them (merge or forward a fault, what the next message holds, whether to throw)
//   OkTopK's kernels (cuda/oktopk.cuh), the twins of host_backend's: accumulate_gather_above
//   (its count reaches the host: one stream synchronisation, because the engine decides from it
//   whether the threshold held), gather_keys, add_at
//   download(host_dst, src, n)     device -> host on the stream, then waits for the stream
//   upload(dst, host_src, n)       host -> device on the stream, then waits for the stream
// The contract is gflow::detail::backend (engines/concepts.hpp), asserted below.
//
// Everything is enqueued on the transport's stream (t.stream()), in order with its collectives.
// What that asks of a trainer:
//   - Build the exchanger with the transport's device current (cudaSetDevice(t.device())): the
//     pool and wire buffers are allocated on the current device.
//   - A gradient must be complete, as seen from the transport's stream, when ready(i) is
//     called: compute it on that stream, or make the stream wait for the producing stream
//     (cudaEventRecord + cudaStreamWaitEvent) before ready(i). The copying ready(i, source)
//     reads `source` on the stream as well.
//   - finish() returns once the averaged gradients are in the pool (take_nonfinite
//     synchronises the stream), so they can be read from any stream afterwards.
//
// Include <gflow/cuda/exchanger.cuh> from a .cu file rather than this header directly.
#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <string>
#include <utility>

#include "../../dtype.hpp"
#include "../engines/concepts.hpp"
#include "cast.cuh"
#include "check.cuh"
#include "memory.cuh"
#include "oktopk.cuh"
#include "sparse_chunks.cuh"
#include "topk.cuh"
#include "topk_engine.cuh"
#include "../../error.hpp"

namespace gflow::detail {

using cuda::cuda_free;  // cuda/memory.cuh

/// Owning, zero-filled device array on the device current at construction.
template <class E>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(E);
    void* p = nullptr;
    cuda::check_cuda(cudaMalloc(&p, bytes), fmt::format("cudaMalloc of a {}-byte gflow device buffer", bytes));
    p_.reset(static_cast<E*>(p));
    // Zero-fill and wait, so the buffer is zero for every stream of the device.
    cuda::check_cuda(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync of a gflow device buffer");
    cuda::check_cuda(cudaStreamSynchronize(0), "cudaStreamSynchronize after zero-filling a gflow device buffer");
  }
  [[nodiscard]] E* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  std::unique_ptr<E, cuda_free> p_;
  std::size_t n_ = 0;
};

/// The Top-k engines' device scratch: the selector, the mergers and the message checker, built
/// on first use on the context's device for the largest unit reserved.
template <class W>
struct device_topk_scratch {
  std::size_t max_n = 0, max_k = 0;
  std::unique_ptr<cuda::topk_selector> selector;
  std::unique_ptr<cuda::topk_merger<std::uint32_t, W>> merger32;
  std::unique_ptr<cuda::topk_merger<std::uint64_t, W>> merger64;
  std::unique_ptr<cuda::message_checker> checker;
  device_buffer<unsigned> words;  // [0, 2): merge counts, [2]: the non-finite selection flag

  void reserve(std::size_t n, std::size_t k) {
    max_n = n > max_n ? n : max_n;
    max_k = k > max_k ? k : max_k;
  }
  void release() {
    max_n = max_k = 0;
    selector.reset();
    merger32.reset();
    merger64.reset();
  }
  unsigned* counts() {
    if (words.size() == 0) words = device_buffer<unsigned>(4);
    return words.data();
  }
  template <class I>
  auto& merger() {
    if constexpr (std::is_same_v<I, std::uint32_t>) {
      if (!merger32) merger32 = std::make_unique<cuda::topk_merger<std::uint32_t, W>>(max_k);
      return *merger32;
    } else {
      if (!merger64) merger64 = std::make_unique<cuda::topk_merger<std::uint64_t, W>>(max_k);
      return *merger64;
    }
  }
};

struct device_backend {
  // Kernels run on the transport's stream, after every collective started on it: the exchanger
  // starts a bucket's collective and enqueues the cast-back behind it without waiting;
  // take_nonfinite() in finish() is Dense's one host synchronisation per iteration (the sparse
  // engines' others are listed in docs/DESIGN.md, "Device memory").
  static constexpr bool stream_ordered = true;
  template <class E>
  using buffer = device_buffer<E>;
  template <class W>
  using topk_scratch = device_topk_scratch<W>;

  class context {
   public:
    /// T provides stream() (a cudaStream_t) and, optionally, device() (the CUDA device its
    /// stream and communicator belong to; otherwise the current device is used).
    template <class T>
    explicit context(T& t) : stream_(t.stream()) {
      if constexpr (requires { { t.device() } -> std::convertible_to<int>; }) {
        device_ = t.device();
      } else {
        cuda::check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
      }
      cuda::device_guard g(device_);
      void* c = nullptr;
      cuda::check_cuda(cudaMalloc(&c, sizeof(unsigned long long)), "cudaMalloc of the non-finite counter");
      counter_.reset(static_cast<unsigned long long*>(c));
      void* h = nullptr;
      cuda::check_cuda(cudaMallocHost(&h, sizeof(unsigned long long)), "cudaMallocHost of the non-finite counter's host copy");
      host_.reset(static_cast<unsigned long long*>(h));
      *host_ = 0;
      cuda::check_cuda(cudaMemsetAsync(c, 0, sizeof(unsigned long long), stream_), "cudaMemsetAsync of the non-finite counter");
    }

    template <class W>
    void scale_to_wire(const float* in, W* out, std::size_t n, float s) {
      cuda::device_guard g(device_);
      cuda::scale_to_wire(in, out, n, s, stream_);
    }
    template <class W>
    void wire_to_float(const W* in, float* out, std::size_t n) {
      cuda::device_guard g(device_);
      cuda::wire_to_float(in, out, n, counter_.get(), stream_);
    }
    void scale_in_place(float* buf, std::size_t n, float s) {
      cuda::device_guard g(device_);
      cuda::scale_in_place(buf, n, s, counter_.get(), stream_);
    }
    void count_nonfinite(const float* buf, std::size_t n) {
      cuda::device_guard g(device_);
      cuda::count_nonfinite(buf, n, counter_.get(), stream_);
    }
    void copy(float* dst, const float* src, std::size_t n) {
      if (n == 0 || dst == src) return;
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                       "cudaMemcpyAsync of a gradient into the pool");
    }
    void add(float* dst, const float* src, std::size_t n) {
      cuda::device_guard g(device_);
      cuda::add_in_place(dst, src, n, stream_);
    }
    /// The non-finite count since the last call. Synchronises the stream (all work enqueued so
    /// far is complete when it returns) and resets the counter.
    std::size_t take_nonfinite() {
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaMemcpyAsync(host_.get(), counter_.get(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync of the non-finite counter");
      cuda::check_cuda(cudaMemsetAsync(counter_.get(), 0, sizeof(unsigned long long), stream_), "cudaMemsetAsync of the non-finite counter");
      cuda::check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize in Exchanger::finish");
      return static_cast<std::size_t>(*host_);
    }

    // ---- chunked sparse kernels (CSC): cuda/sparse_chunks.cuh, on the stream ----
    void compact_chunks(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float* out) {
      cuda::device_guard g(device_);
      cuda::compact_chunks(pool, hist, n, C, list, count, out, stream_);
    }
    template <class W>
    void compact_chunks_to_wire(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                W* out, float scale, float unscale) {
      cuda::device_guard g(device_);
      cuda::compact_chunks_to_wire(pool, hist, n, C, list, count, out, scale, unscale, stream_);
    }
    void defer_chunks(float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float momentum,
                      float* norms) {
      cuda::device_guard g(device_);
      cuda::defer_chunks_exact(pool, hist, n, C, list, count, momentum, norms, stream_);
    }
    void scatter_chunks_counted(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                bool multiply, float value_scale, float* norms, float norm_scale) {
      cuda::device_guard g(device_);
      cuda::scatter_chunks_counted(buf, pool, n, C, list, count, multiply, value_scale, norms, norm_scale, counter_.get(), stream_);
    }
    template <class W>
    void scatter_chunks_from_wire(const W* wire, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                  float* norms, float norm_scale) {
      cuda::device_guard g(device_);
      cuda::scatter_chunks_from_wire(wire, pool, n, C, list, count, norms, norm_scale, counter_.get(), stream_);
    }
    void count_nonfinite_at(const float* v, const std::uint32_t* list, std::size_t count) {
      cuda::device_guard g(device_);
      cuda::count_nonfinite_at(v, list, count, counter_.get(), stream_);
    }
    /// The selector's scratch is allocated on the first call (and again only for more chunks).
    void select_top_chunks(const float* norms, std::size_t chunks, std::size_t k, std::uint32_t* out) {
      cuda::device_guard g(device_);
      if (!selector_ || selector_->max_chunks() < chunks) selector_ = std::make_unique<cuda::chunk_selector>(chunks);
      selector_->select(norms, chunks, k, out, stream_);
    }

    // ---- top-k kernels (TopK / GTopK): cuda/topk.cuh, cuda/topk_engine.cuh, on the stream ----
    /// res = g + res, then the exact top-k of |res| (the host's selection; no sampling on the
    /// device: the path is always `full`).
    template <class I, class W>
    kernels::topk_result accumulate_select_topk(const float* g, float* res, std::size_t n, std::size_t k, std::uint64_t base, I* out,
                                                device_topk_scratch<W>& ws) {
      cuda::device_guard gd(device_);
      cuda::accumulate_into_residual(g, res, n, stream_);
      if (!ws.selector || ws.selector->max_n() < n) ws.selector = std::make_unique<cuda::topk_selector>(ws.max_n > n ? ws.max_n : n);
      const std::size_t before = ws.selector->paths().candidates;
      ws.selector->select(res, n, k, base, out, stream_);
      return {k < n ? k : n, ws.selector->paths().candidates > before ? kernels::topk_path::candidates : kernels::topk_path::full};
    }
    template <class I, class W, class Ws>
    void take_selected_dropping(float* res, std::size_t off, std::size_t n, const I* idx, std::size_t count, W* out, float scale, float unscale,
                                Ws& ws) {
      cuda::device_guard gd(device_);
      cuda::take_selected_dropping(res, off, n, idx, count, out, scale, unscale, ws.counts() + 2, stream_);
    }
    /// The header comes from the host (it holds no gradient value); the entries are copied on the device.
    template <class I, class W>
    void pack(unsigned char* msg, std::size_t k, const I* idx, const W* val, std::size_t count, sparse_message::header h = {}) {
      cuda::device_guard gd(device_);
      h.count = count;
      header_ = h;
      cuda::check_cuda(cudaMemcpyAsync(msg, &header_, sizeof header_, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync of a message header");
      if (count != 0) {
        cuda::check_cuda(cudaMemcpyAsync(msg + sparse_message::header_bytes, idx, count * sizeof(I), cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync of a message's indices");
        cuda::check_cuda(cudaMemcpyAsync(msg + sparse_message::header_bytes + k * sizeof(I), val, count * sizeof(W), cudaMemcpyDeviceToDevice,
                                         stream_),
                         "cudaMemcpyAsync of a message's values");
      }
      // header_ is pageable: cudaMemcpyAsync has staged it before returning, so the next pack may
      // overwrite it without a stream synchronisation.
    }
    template <class I, class W, class Ws>
    sparse_message::unpack_result unpack_checked(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, I* idx, W* val, Ws& ws) {
      cuda::device_guard gd(device_);
      if (!ws.checker) ws.checker = std::make_unique<cuda::message_checker>();
      return ws.checker->check(msg, k, lo, hi, idx, val, stream_);
    }
    void fill_zero(float* p, std::size_t n) {
      if (n == 0) return;
      cuda::device_guard gd(device_);
      cuda::check_cuda(cudaMemsetAsync(p, 0, n * sizeof(float), stream_), "cudaMemsetAsync of a top-k unit");
    }
    template <class I, class W>
    void scatter_add(float* dst, const I* idx, const W* val, std::size_t count) {
      cuda::device_guard gd(device_);
      cuda::scatter_add(dst, idx, val, count, stream_);
    }
    /// Definition 1 of gTop-k (Shi et al.); the two counts (kept, records) come to the host.
    template <class I, class W, class Ws>
    std::size_t merge_topk(const I* ai, const W* av, std::size_t na, const I* bi, const W* bv, std::size_t nb, std::size_t k, I* oi, W* ov, I* ri,
                           float* rv, std::size_t* records, kernels::merge_scratch<I>, Ws& ws) {
      cuda::device_guard gd(device_);
      unsigned* d = ws.counts();
      ws.template merger<I>().merge(ai, av, na, bi, bv, nb, k, oi, ov, ri, rv, d, stream_);
      unsigned h[2] = {0, 0};
      download(h, d, 2);
      *records = h[1];
      return h[0];
    }
    template <class I, class W>
    void decode_scatter_counted(float* dst, const I* idx, const W* val, std::size_t count, float scale, float*) {
      cuda::device_guard gd(device_);
      cuda::decode_scatter(dst, idx, val, count, scale, counter_.get(), stream_);
    }
    template <class I, class W>
    void restore_unselected(float* res, const I* ai, const W* av, std::size_t na, const I* fi, std::size_t nf, float unscale) {
      cuda::device_guard gd(device_);
      cuda::restore_unselected(res, ai, av, na, fi, nf, unscale, stream_);
    }
    template <class I>
    void restore_records_in(float* res, const I* ri, const float* rv, std::size_t nr, const I* fi, std::size_t nf, float unscale) {
      cuda::device_guard gd(device_);
      cuda::restore_records_in(res, ri, rv, nr, fi, nf, unscale, stream_);
    }
    template <class E>
    void copy_n(E* dst, const E* src, std::size_t n) {
      if (n == 0 || dst == src) return;
      cuda::device_guard gd(device_);
      cuda::check_cuda(cudaMemcpyAsync(dst, src, n * sizeof(E), cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync of a top-k list");
    }

    // ---- OkTopK's kernels (engines/oktopk/): cuda/oktopk.cuh, on the stream ----
    /// kernels::accumulate_gather_above, bit for bit: res = g + res over the unit, then base + i
    /// and the key of every key >= t, increasing, at most cap (returns cap + 1 when there were
    /// more). The count reaches the host: one stream synchronisation. The gatherer's scratch is
    /// allocated on the first call and again only for a larger unit (none once warm).
    std::size_t accumulate_gather_above(const float* g, float* res, std::size_t n, std::uint32_t t, std::uint64_t base, std::uint64_t* pos,
                                        std::uint32_t* keys, std::size_t cap) {
      cuda::device_guard gd(device_);
      if (!gatherer_ || gatherer_->max_n() < n) gatherer_ = std::make_unique<cuda::threshold_gatherer>(n);
      return gatherer_->gather(g, res, n, t, base, pos, keys, cap, stream_);
    }
    /// keys[j] = bits(v[idx[j]]) & 0x7fffffff.
    template <class I>
    void gather_keys(const float* v, const I* idx, std::size_t count, std::uint32_t* keys) {
      cuda::device_guard gd(device_);
      cuda::gather_keys(v, idx, count, keys, stream_);
    }
    /// dst[idx[j]] += v[j] (indices distinct), rounded to nearest, NaN bits as the host's.
    template <class I>
    void add_at(float* dst, const I* idx, const float* v, std::size_t count) {
      cuda::device_guard gd(device_);
      cuda::add_at(dst, idx, v, count, stream_);
    }
    /// The exact top-k of v (only read): the same selector as accumulate_select_topk; the count.
    template <class I, class W>
    std::size_t select_topk(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, device_topk_scratch<W>& ws) {
      cuda::device_guard gd(device_);
      if (!ws.selector || ws.selector->max_n() < n) ws.selector = std::make_unique<cuda::topk_selector>(ws.max_n > n ? ws.max_n : n);
      ws.selector->select(v, n, k, base, out, stream_);
      return k < n ? k : n;
    }

    // ---- transfers (each one is a host synchronisation; the engines say where and why) ----
    template <class E>
    void download(E* host_dst, const E* src, std::size_t n) { copy_and_sync(host_dst, src, n * sizeof(E), cudaMemcpyDeviceToHost, "cudaMemcpyAsync device to host",
                                                                                  "cudaStreamSynchronize after a device-to-host copy");
    }
    template <class E>
    void upload(E* dst, const E* host_src, std::size_t n) { copy_and_sync(dst, host_src, n * sizeof(E), cudaMemcpyHostToDevice, "cudaMemcpyAsync host to device",
                                                                            "cudaStreamSynchronize after a host-to-device copy");
    }

    [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
    [[nodiscard]] int device() const noexcept { return device_; }

    /// The stream the trainer's backward produces gradients on. Once set, every bucket's work on
    /// the transport's stream is ordered after everything enqueued on the producer so far, by an
    /// event: no host synchronisation in ready().
    void set_producer(cudaStream_t producer) {
      cuda::device_guard g(device_);
      if (!producer_event_) {
        cudaEvent_t e = nullptr;
        cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags for the producer event");
        producer_event_.reset(e);
      }
      producer_ = producer;
      has_producer_ = true;
    }
    /// Called by the exchanger right before a bucket's work is enqueued.
    void order_after_producer() {
      if (!has_producer_ || producer_ == stream_) return;
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaEventRecord(producer_event_.get(), producer_), "cudaEventRecord on the producer stream");
      cuda::check_cuda(cudaStreamWaitEvent(stream_, producer_event_.get(), 0), "cudaStreamWaitEvent of the exchange stream");
    }

   private:
    // One synchronous transfer; what_copy / what_sync name it in an error (literals: nothing is
    // allocated on the way, it runs every GTopK merge round and every CSC iteration).
    void copy_and_sync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, const char* what_copy, const char* what_sync) {
      if (bytes == 0) return;
      cuda::device_guard g(device_);
      cuda::check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream_), what_copy);
      cuda::check_cuda(cudaStreamSynchronize(stream_), what_sync);
    }
    struct host_free {
      void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
    };
    struct event_destroy {
      void operator()(cudaEvent_t e) const noexcept { (void)cudaEventDestroy(e); }
    };
    cudaStream_t stream_;
    int device_ = 0;
    cudaStream_t producer_ = nullptr;
    bool has_producer_ = false;
    std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_destroy> producer_event_;
    std::unique_ptr<unsigned long long, cuda_free> counter_;
    std::unique_ptr<unsigned long long, host_free> host_;
    std::unique_ptr<cuda::chunk_selector> selector_;
    std::unique_ptr<cuda::threshold_gatherer> gatherer_;
    sparse_message::header header_{};  // the source of pack's header copy
  };
};

// Both contexts have an unconstrained template constructor from T&, so the meaningful
// backend_for_transport check is the exchanger's, against nccl::transport.
static_assert(backend<device_backend> && topk_backend<device_backend> && oktopk_backend<device_backend>,
              "gflow::detail::device_backend must meet gflow::detail::backend, topk_backend and oktopk_backend (engines/concepts.hpp)");

template <>  // the primary template: engines/concepts.hpp
struct backend_for<device_memory> {
  using type = device_backend;
};

}  // namespace gflow::detail
