#pragma once
// What basic_exchanger (exchanger.hpp) does for Fusion<Auto>: it starts the tuner (tuner.hpp) with
// a timeline of its own unless the trainer attached one, feeds it each iteration's measurements
// after finish(), and applies the plan it answers with (the same on every rank) between
// iterations: at once, or with Sharding at the next iteration's first ready(). A friend of the exchanger, like training_loop and state_io.
#include <cstddef>
#include <memory>
#include <optional>

#include "../../timeline.hpp"
#include "../engines/concepts.hpp"
#include "../plan/fusion_model.hpp"
#include "tuner.hpp"

namespace gflow::detail {

struct tuning {
  template <class Ex>
  static void start(Ex& ex) {
    // 4 events per tensor and 8 per bucket (at most one bucket per tensor) for one iteration
    ex.own_timeline_ = std::make_unique<timeline>(12 * ex.layout_.size() + 64);
    if (!ex.trace_) ex.trace_ = ex.own_timeline_.get();
    std::size_t hybrid_switch = 0;  // Topology<Hybrid>: the tuner tunes its switch too
    if constexpr (switched_topology<typename Ex::engine_t>) hybrid_switch = ex.engine_.threshold();
    ex.tuner_.emplace(ex.layout_, ex.pool_, sizeof(typename Ex::wire_type), ex.threshold_, tuner_settings{}, hybrid_switch);
    apply(ex, ex.tuner_->current());
  }

  // After finish(): this rank's measurements of the iteration (from the timeline) to the tuner,
  // which answers with the plan every rank uses next (collective, identical on every rank).
  template <class Ex>
  static void step(Ex& ex) {
    sample_iteration(*ex.trace_, ex.tuned_mark_, ex.iteration_ - 1, ex.layout_.size(), ex.buckets_.size(), ex.sample_);
    if (ex.trace_ == ex.own_timeline_.get()) ex.trace_->clear();
    ex.tuned_mark_ = ex.trace_->size();
    const fusion_plan p = ex.tuner_->step(*ex.t_, ex.sample_, ex.buckets_.size());
    // Sharded: the shards stay where this iteration's averages are until the trainer has stepped
    // them and gathered the parameters; the new plan applies at the next iteration's first ready().
    if constexpr (Ex::sharded) ex.pending_plan_ = p;
    else apply(ex, p);
  }
  template <class Ex>
  static void apply_pending(Ex& ex) {
    if (!ex.pending_plan_) return;
    const fusion_plan p = *ex.pending_plan_;  // a copy: apply() resets the optional before it reads the plan
    apply(ex, p);
  }

  template <class Ex>
  static void apply(Ex& ex, const fusion_plan& p) {
    ex.pending_plan_.reset();
    if (p.threshold != ex.threshold_ || p.first != ex.first_bucket_) ex.replan_fusion(p.threshold, p.first);
    if constexpr (switched_topology<typename Ex::engine_t>)
      if (p.hybrid_switch != ex.engine_.threshold()) ex.engine_.set_threshold(p.hybrid_switch);
  }
};

}  // namespace gflow::detail
