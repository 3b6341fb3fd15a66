#pragma once
// The engine of Sharding<ReduceScatter> over Sparsifier<None> (policies/sharding.hpp): each
// bucket is reduce-scattered through the topology, in the packed blocks cx.shards cuts it into
// (its ways: P, or the group's g under Hierarchical<g> and Hybrid's small buckets), and this
// rank's block of the average lands in the pool at its own place (cx.shards->mine[b]); the rest
// of the bucket is left as the trainer wrote it (unspecified, documented).
//
// Bitwise: every element of this rank's block goes through exactly the steps Dense's
// dense_allreduce gives it (divide by P before a 16-bit cast, the sum, the cast back; or the fp32
// sum and one multiply by 1/P), so where the transport's reduce_scatter sums in the order of its
// all_reduce (the in-process transport always, MPI at 2 ranks) the shard holds the same bits as
// the unsharded exchange.
//
// gather(values): the in-place all-gather of ex.gather_shards(): this rank's blocks of `values`
// (laid out like the pool) to every rank, through the Precision's wire type (a 16-bit wire rounds
// every gathered value, this rank's own too, so that all ranks hold the same bits).
#include <cstddef>

#include "../../timeline.hpp"
#include "concepts.hpp"

namespace gflow::detail {

/// ex.gather_shards() for every sharded engine (this one and OkTopK's): in place over
/// values[0, pool total), bucket by bucket, this rank's block to every rank through the topology;
/// with a 16-bit wire through `wire` (pool-sized), every value rounded to it.
template <class Ctx, class WireBuffer>
void gather_shards_through(Ctx& cx, WireBuffer& wire, float* values) {
  const auto& sp = *cx.shards;
  for (std::size_t b = 0; b < cx.buckets->size(); ++b) {
    const auto& bk = (*cx.buckets)[b];
    if constexpr (Ctx::narrow) {
      const auto mine = sp.mine[b];
      cx.kernels->scale_to_wire(values + mine.begin, wire.data() + mine.begin, mine.size(), 1.0f);
      cx.topology->all_gather_shards(wire.data() + bk.offset, sp.counts_of(b), sp.ways[b]);
      cx.kernels->wire_to_float(wire.data() + bk.offset, values + bk.offset, bk.count);
    } else {
      (void)wire;
      cx.topology->all_gather_shards(values + bk.offset, sp.counts_of(b), sp.ways[b]);
    }
  }
  (void)cx.kernels->take_nonfinite();  // parameters, not gradients: nothing for the next finish() to report
}

template <class Ctx>
class sharded_dense_engine : public stateless_engine {
  using W = typename Ctx::wire_type;

 public:
  explicit sharded_dense_engine(Ctx& cx) : cx_(&cx) { replan(); }
  void replan() {
    recv_ = typename Ctx::backend::template buffer<W>(cx_->shards->scratch_total);
    if constexpr (Ctx::narrow) wire_ = typename Ctx::backend::template buffer<W>(cx_->pool->total);
  }

  void exchange(std::size_t b) {
    stage_clock sc(cx_->tracer());
    const W* send = cast(b, sc);
    cx_->topology->reduce_scatter(send, out(b), cx_->shards->counts_of(b), cx_->shards->ways[b]);
    finish_block(b, sc);
  }
  // Phases, for Overlap<Chained>.
  static constexpr bool phased = true;
  static constexpr bool independent_buckets = true;
  using request = typename Ctx::request;
  request start(std::size_t b) {
    stage_clock sc(cx_->tracer());
    const W* send = cast(b, sc);
    return cx_->topology->start_reduce_scatter(send, out(b), cx_->shards->counts_of(b), cx_->shards->ways[b]);
  }
  void complete(std::size_t b, request& r) {
    stage_clock sc(cx_->tracer());
    cx_->topology->wait(r);
    finish_block(b, sc);
  }
  void end_iteration() {}
  /// In Dense's units (its wire_bytes is the pool on the wire): half, as a reduce-scatter moves half of
  /// what a ring allreduce of the same buckets moves ((P-1)/P against 2(P-1)/P of them).
  [[nodiscard]] std::size_t wire_bytes() const { return cx_->pool->total * sizeof(W) / 2; }

  /// In place over values[0, pool total): this rank's blocks to every rank (see the header).
  void gather(float* values) { gather_shards_through(*cx_, wire_, values); }

  // Checkpoints: nothing crosses iterations (stateless_engine's members).

 private:
  // Bucket b as it goes on the wire: the pool itself (fp32) or its 16-bit cast, divided by P first.
  const W* cast(std::size_t b, stage_clock& sc) {
    const auto& bk = (*cx_->buckets)[b];
    if constexpr (Ctx::narrow) {
      cx_->kernels->scale_to_wire(cx_->grads + bk.offset, wire_.data() + bk.offset, bk.count, cx_->mean_scale());
      sc.lap(trace_kind::cast, 0, *cx_->iteration, bk.count * sizeof(W));
      return wire_.data() + bk.offset;
    } else {
      (void)sc;
      return cx_->grads + bk.offset;
    }
  }
  W* out(std::size_t b) { return recv_.data() + cx_->shards->scratch[b]; }
  // This rank's block from the scratch into the pool: widened (16-bit), or copied and averaged.
  void finish_block(std::size_t b, stage_clock& sc) {
    const auto mine = cx_->shards->mine[b];
    const std::uint64_t bytes = (*cx_->buckets)[b].count * sizeof(W);
    sc.lap(trace_kind::collective, 0, *cx_->iteration, bytes);
    float* dst = cx_->grads + mine.begin;
    if constexpr (Ctx::narrow) {
      cx_->kernels->wire_to_float(out(b), dst, mine.size());  // counts inf / NaN
    } else {
      cx_->kernels->copy(dst, out(b), mine.size());
      if (cx_->average) cx_->kernels->scale_in_place(dst, mine.size(), cx_->mean_scale());
      else cx_->kernels->count_nonfinite(dst, mine.size());
    }
    sc.lap(trace_kind::widen, 0, *cx_->iteration, bytes);
  }

  Ctx* cx_;
  typename Ctx::backend::template buffer<W> recv_;
  typename Ctx::backend::template buffer<W> wire_;
};

}  // namespace gflow::detail
