#pragma once
// The training-loop features of basic_exchanger (exchanger.hpp; docs/DESIGN.md, "Training
// loops"), written against its members (a friend): what finish() does with tensors that were not
// marked ready (find_unused's zeros, no_sync's held accumulations), the per-iteration count of
// the ranks still training and join()'s shadow iterations (uneven_inputs), the gather of the
// tensors no rank used (find_unused), and the re-layout of the pool in rank 0's observed order
// (learn_order). The bookkeeping they update is exchanger/iteration.hpp's.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../plan/pool.hpp"
#include "consistency.hpp"
#include "iteration.hpp"
#include "../../options.hpp"

namespace gflow::detail {

struct training_loop {
  // finish() with tensors not marked: held ones (no_sync) count as ready, find_unused zeros the
  // rest (in pool order, so the buckets they complete launch in order).
  template <class Ex>
  static void complete_missing(Ex& ex) {
    ex.check_missing(ex.layout_, ex.opt_.find_unused);
    begin_iteration(ex);
    for (std::size_t pos = 0; pos < ex.layout_.size(); ++pos) {
      const std::size_t i = ex.pool_.tensor_at[pos];
      if (ex.ready_[i]) continue;
      if (!ex.held_[i]) ex.kernels_.fill_zero(ex.grads_.data() + ex.pool_.offset[i], ex.layout_[i].numel);
      ex.mark(i, Ex::filled);
    }
  }

  // uneven_inputs: the iteration's first step on every rank, training or joined: one all_gather
  // of a flag per rank; the average divides by the ranks that train.
  template <class Ex>
  static void begin_iteration(Ex& ex) {
    if (!ex.opt_.uneven_inputs || ex.begun_) return;
    ex.begun_ = true;
    const std::uint64_t mine = ex.training_flag();
    ex.flags_.resize(static_cast<std::size_t>(ex.t_->size()));
    control_all_gather(*ex.t_, &mine, ex.flags_.data(), 1);
    ex.count_contributors();
  }

  // find_unused, after every bucket is exchanged: a bit per tensor this rank's trainer marked
  // (or accumulated), gathered from every rank; the tensors no rank marked are unused.
  template <class Ex>
  static void gather_unused(Ex& ex) {
    const auto P = static_cast<std::size_t>(ex.t_->size());
    const std::size_t words = ex.used_bits(P);
    if (words) control_all_gather(*ex.t_, ex.bits_.data(), ex.bits_.data() + words, words);
    ex.unused_from_bits(P);
  }

  // learn_order, at the first finish() (nothing launched yet): rank 0's observed order becomes
  // every rank's pool order, then every bucket launches.
  template <class Ex>
  static void learn_order(Ex& ex) {
    std::vector<std::uint64_t> seen(ex.order_.begin(), ex.order_.end());
    if (!seen.empty()) control_broadcast(*ex.t_, seen.data(), seen.size(), 0);
    relayout(ex, std::vector<std::size_t>(seen.begin(), seen.end()));
    ex.learning_ = false;
    ex.order_ = {};
    ex.advance();
  }

  // Lays the pool out in `order` (every layout index once), moving the gradients with their
  // tensors, and re-plans the buckets at the current fusion numbers.
  template <class Ex>
  static void relayout(Ex& ex, const std::vector<std::size_t>& order) {
    plan::pool_plan next = plan::plan_pool(ex.layout_, order);
    if (next.offset != ex.pool_.offset) {
      typename Ex::backend::template buffer<float> old(ex.pool_.total);
      ex.kernels_.order_after_producer();
      ex.kernels_.copy(old.data(), ex.grads_.data(), ex.pool_.total);
      for (std::size_t i = 0; i < ex.layout_.size(); ++i)
        ex.kernels_.copy(ex.grads_.data() + next.offset[i], old.data() + ex.pool_.offset[i], ex.layout_[i].numel);
      float first = 0.0f;  // a download synchronises (device): the copies are done before `old` goes
      if (ex.pool_.total) ex.kernels_.download(&first, ex.grads_.data(), 1);
      ex.pool_ = std::move(next);
      ++ex.generation_;
    }
    ex.plan(ex.threshold_, ex.first_bucket_);  // 0: no fusion, as planned before
    ex.sparsifier_->replan();
    ex.runner_->replan();
  }

  template <class Ex, class F>
  static join_status join(Ex& ex, F&& after_each) {
    static_assert(Ex::policies::sparsifier::dense,
                  "gflow::Exchanger::join(): a sparsifier keeps a residual per rank, and a joined rank could only shadow the "
                  "others' sparse exchange by sending that residual (not a zero contribution) or by dropping it (lost gradient). "
                  "Use join() with Sparsifier<None> (any Precision, Topology, Fusion and Overlap), or give every rank the same number of batches.");
    if (!ex.opt_.uneven_inputs) throw join_without_option_error();
    ex.between_iterations("join");
    ex.outside_accumulation("join");
    join_status js;
    ex.joined_ = true;
    struct rejoin {
      Ex& ex;
      ~rejoin() {
        ex.joined_ = false;
        ex.begun_ = false;
        ex.contributors_ = ex.ranks_;
      }
    } guard{ex};
    for (;;) {
      begin_iteration(ex);
      if (ex.contributors_ == 0) break;
      ex.kernels_.fill_zero(ex.grads_.data(), ex.pool_.total);
      for (std::size_t pos = 0; pos < ex.layout_.size(); ++pos) ex.mark(ex.pool_.tensor_at[pos], Ex::filled);
      const exchange_status st = ex.finish();
      ++js.shadowed;
      after_each(st);
    }
    js.last_rank = ex.last_rank_;
    return js;
  }
};

}  // namespace gflow::detail
