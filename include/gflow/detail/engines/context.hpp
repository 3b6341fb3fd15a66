#pragma once
// What a sparsifier engine works with: the transport, the topology engine, the kernel context of
// the memory space, the plan, the pool, and the dense allreduce with the Precision policy's
// handling (divide by P, cast, reduce, cast back, count inf/NaN), which every scheme uses for
// whatever it exchanges densely (Dense: each bucket; CSC: the compacted chunks and the norms).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../layout.hpp"
#include "../plan/buckets.hpp"
#include "../plan/pool.hpp"
#include "../plan/shards.hpp"
#include "../../timeline.hpp"

namespace gflow::detail {

template <class T, class Backend, class W, class Topo>
struct exchange_context {
  using transport_type = T;
  using backend = Backend;
  using wire_type = W;
  using topology_engine = Topo;
  static constexpr bool narrow = sizeof(W) < sizeof(float);

  T* transport;
  Topo* topology;
  typename Backend::context* kernels;
  const Layout* layout;
  const plan::pool_plan* pool;
  const std::vector<plan::bucket>* buckets;
  float* grads;  // the pool
  bool average;
  const std::uint64_t* iteration;        // the exchanger's iteration counter (warm-up schedules)
  const std::size_t* threshold_bytes;    // 0: no fusion (one bucket per tensor)
  timeline* const* trace = nullptr;     // the exchanger's timeline pointer (null: off)
  const int* contributors = nullptr;    // ranks in this iteration's sum (join()); null: every rank
  const plan::shard_plan* shards = nullptr;  // Sharding<ReduceScatter>: each bucket's blocks; null: not sharded

  /// The attached timeline, or null (one load and a branch per use).
  [[nodiscard]] timeline* tracer() const noexcept { return trace ? *trace : nullptr; }

  [[nodiscard]] bool fused() const { return *threshold_bytes != 0; }

  [[nodiscard]] int ranks() const { return transport->size(); }
  /// 1 / (ranks whose gradients are in the sum) when averaging: the job's size, fewer once ranks join().
  [[nodiscard]] float mean_scale() const {
    return average ? 1.0f / static_cast<float>(contributors ? *contributors : transport->size()) : 1.0f;
  }

  using request = typename Topo::request;

  /// dense_allreduce in two phases, for Overlap<Chained>: start() casts and starts the
  /// non-blocking collective; complete() waits for it, casts back and averages.
  request dense_start(float* g, std::size_t n, W* wire) {
    if constexpr (narrow) {
      stage_clock sc(tracer());
      kernels->scale_to_wire(g, wire, n, mean_scale());
      sc.lap(trace_kind::cast, 0, *iteration, n * sizeof(W));
      return topology->start(wire, n);
    } else {
      (void)wire;
      return topology->start(g, n);
    }
  }
  void dense_complete(float* g, std::size_t n, W* wire, request& r) {
    stage_clock sc(tracer());
    if constexpr (!Backend::stream_ordered) topology->wait(r);
    else (void)r;
    sc.lap(trace_kind::collective, 0, *iteration, n * sizeof(W));
    struct widen_lap {
      stage_clock& c;
      std::uint64_t it, bytes;
      ~widen_lap() { c.lap(trace_kind::widen, 0, it, bytes); }
    } wl{sc, *iteration, n * sizeof(W)};
    if constexpr (narrow) {
      kernels->wire_to_float(wire, g, n);
    } else {
      (void)wire;
      if (average) kernels->scale_in_place(g, n, mean_scale());
      else kernels->count_nonfinite(g, n);
    }
  }

  /// Sums g[0, n) over all ranks in place through the topology, in the wire precision, and
  /// averages it when asked; `wire` is scratch for n wire elements (unused with an fp32 wire).
  /// Host backends complete before returning; stream-ordered (CUDA) backends queue the work.
  void dense_allreduce(float* g, std::size_t n, W* wire) {
    const float inv = mean_scale();
    stage_clock sc(tracer());
    const std::uint64_t it = *iteration, bytes = n * sizeof(W);
    if constexpr (narrow) {
      kernels->scale_to_wire(g, wire, n, inv);  // divide before the cast: the sum cannot overflow where fp32's would not
      sc.lap(trace_kind::cast, 0, it, bytes);
      run(wire, n);
      sc.lap(trace_kind::collective, 0, it, bytes);
      kernels->wire_to_float(wire, g, n);       // counts inf / NaN
    } else {
      (void)wire;
      run(g, n);
      sc.lap(trace_kind::collective, 0, it, bytes);
      if (average) kernels->scale_in_place(g, n, inv);  // counts inf / NaN
      else kernels->count_nonfinite(g, n);
    }
    sc.lap(trace_kind::widen, 0, it, bytes);
  }

  /// Sums buf[0, n) over every rank in place through the topology, nothing else: host backends
  /// complete before returning; stream-ordered (CUDA) backends queue it on the stream, so the
  /// kernels enqueued next see the sum without a host wait (the sparse engines use this).
  template <class E>
  void sum(E* buf, std::size_t n) { run(buf, n); }

  /// A sparse wire: every rank's k (index, value) pairs to every rank, in rank order (all_idx and
  /// all_val hold k * ranks() entries; k must be the same on every rank). The values travel in
  /// the Precision policy's wire type: cast with round-to-nearest-even before the all_gather and
  /// widened after it (inf / NaN among the received values counted, as dense_allreduce counts
  /// them), so an fp16 composition sends k halves. Indices travel as they are. `wire` is scratch
  /// for (ranks() + 1) * k wire elements (unused with an fp32 wire). Not averaged: the caller sums
  /// what it receives and scales by mean_scale(). Goes straight to the transport (an all_gather
  /// has no topology); host backends complete before returning, stream-ordered ones queue it.
  template <class I>
  void all_gather_sparse(const I* idx, const float* val, std::size_t k, I* all_idx, float* all_val, W* wire) {
    transport->all_gather(idx, all_idx, k);
    if constexpr (narrow) {
      W* mine = wire + k * static_cast<std::size_t>(ranks());
      kernels->scale_to_wire(val, mine, k, 1.0f);
      transport->all_gather(mine, wire, k);
      kernels->wire_to_float(wire, all_val, k * static_cast<std::size_t>(ranks()));  // counts inf / NaN
    } else {
      (void)wire;
      transport->all_gather(val, all_val, k);
      kernels->count_nonfinite(all_val, k * static_cast<std::size_t>(ranks()));
    }
  }

 private:
  template <class E>
  void run(E* buf, std::size_t n) {
    if constexpr (Backend::stream_ordered) (void)topology->start(buf, n);
    else topology->run(buf, n);
  }
};

}  // namespace gflow::detail
