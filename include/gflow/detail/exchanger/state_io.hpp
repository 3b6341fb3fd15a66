#pragma once
// Exchanger::save_state / load_state (exchanger.hpp): the checkpoint sections in the order they
// are written (EXCH, TOPO, SPRS, TUNE for Fusion<Auto>), their checksum, and the all-or-nothing
// load (everything is read and validated before anything is applied). The byte format itself is
// support/checkpoint.hpp's; docs/DESIGN.md, "Checkpoints".
#include <cstdint>
#include <istream>
#include <ostream>
#include <utility>
#include <vector>

#include "../plan/pool.hpp"
#include "../support/checkpoint.hpp"
#include "sharding.hpp"
#include "training_loop.hpp"
#include "tuning.hpp"

namespace gflow::detail {

struct state_io {
  template <class Ex>
  static void save(const Ex& ex, std::ostream& out) {
    ex.between_iterations("save_state");
    ex.outside_accumulation("save_state");
    checkpoint_writer w(out);
    write_checkpoint_header(w, ex.identity_for_checkpoint());
    w.tag(section_tag("EXCH"));
    w.u64(ex.iteration_);
    w.u64(ex.threshold_);
    w.u64(ex.first_bucket_);
    ex.write_order(w, ex.pool_.tensor_at);
    w.tag(section_tag("TOPO"));
    if constexpr (Ex::topology_has_state) ex.engine_.save_state(w);
    w.tag(section_tag("SPRS"));
    ex.sparsifier_->save_state(w);
    if constexpr (Ex::autotuned) {  // only Fusion<Auto> compositions have this section
      w.tag(section_tag("TUNE"));
      ex.tuner_->save_state(w);
    }
    w.checksum();
    w.finish();
  }

  template <class Ex>
  static void load(Ex& ex, std::istream& in) {
    ex.between_iterations("load_state");
    ex.outside_accumulation("load_state");
    checkpoint_reader r(in);
    read_checkpoint_header(r, ex.identity_for_checkpoint(), ex.layout_);
    r.expect_tag(section_tag("EXCH"), "EXCH");
    const std::uint64_t iteration = r.u64("iteration");
    const std::uint64_t threshold = r.u64("threshold_bytes");
    const std::uint64_t first = r.u64("first_bucket_bytes");
    const auto saved = ex.read_order(r);
    r.expect_tag(section_tag("TOPO"), "TOPO");
    auto topo = [&] {
      if constexpr (Ex::topology_has_state) return ex.engine_.read_state(r);
      else return 0;
    }();
    r.expect_tag(section_tag("SPRS"), "SPRS");
    auto sparse = ex.sparsifier_->read_state(r);
    auto tuned = [&] {
      if constexpr (Ex::autotuned) {
        r.expect_tag(section_tag("TUNE"), "TUNE");
        return ex.tuner_->read_state(r);
      } else {
        return 0;
      }
    }();
    r.verify_checksum("payload");
    ex.check_order_option(saved);
    const std::vector<std::size_t> order = saved.order.empty() ? plan::reverse_order(ex.layout_.size()) : saved.order;
    // Everything is read and valid: apply it.
    if (threshold != ex.threshold_ || first != ex.first_bucket_ || order != ex.pool_.tensor_at) {
      ex.threshold_ = static_cast<std::size_t>(threshold);
      ex.first_bucket_ = static_cast<std::size_t>(first);
      training_loop::relayout(ex, order);
    }
    ex.learning_ = ex.opt_.learn_order && saved.order.empty();
    if constexpr (Ex::topology_has_state) ex.engine_.restore_state(topo);
    else (void)topo;
    ex.sparsifier_->restore_state(std::move(sparse));
    ex.iteration_ = iteration;
    if constexpr (Ex::autotuned) {
      ex.tuner_->restore_state(tuned);
      tuning::apply(ex, ex.tuner_->current());
    } else {
      (void)tuned;
    }
    if constexpr (Ex::sharded) sharding_steps::sync(ex);  // a restored Hybrid threshold moves the shards now, as the saver had them
  }
};

}  // namespace gflow::detail
