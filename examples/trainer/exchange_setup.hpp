#pragma once
// What a trainer sets on an exchanger before its first iteration, whichever framework computes
// the gradients (the Eigen MLP of train_loop.hpp, the libtorch CNN of examples/torch): the
// sparsifier's warm-up and the loss-scale rules of the composition.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <gflow/error.hpp>
#include <gflow/exchanger.hpp>
#include <gflow/optim/loss_scale.hpp>

#include "trainer.hpp"

namespace trainer {

template <class Ex>
struct composition_traits {
  using sparsifier_t = std::remove_cvref_t<decltype(std::declval<Ex&>().sparsifier())>;
  static constexpr bool is_csc = requires(sparsifier_t& e) { e.selected_chunks(); e.set_warmup(1, 1); };
  static constexpr bool is_topk = requires(sparsifier_t& e) { e.set_schedule(gflow::density_schedule::constant(1.0)); };
  static constexpr bool wide_wire = std::is_same_v<typename Ex::wire_type, float>;
  // Residual-keeping sparsifiers hold gradients across iterations in the units they were fed:
  // a scale that changes would mix units, so they accept only a constant scale.
  static constexpr bool keeps_residual = is_csc || is_topk;
};

/// CSC: momentum correction and a dense warm-up then a linear ramp; TopK/GTopK/OkTopK: gTop-k (Shi et al.)'s
/// warm-up densities compressed into the warm-up. `iters_per_epoch` sets the default warm-up.
template <class Ex>
void configure_sparsifier(Ex& ex, const options& o, std::size_t iters_per_epoch) {
  using tr = composition_traits<Ex>;
  const std::uint64_t warmup = o.warmup_iters >= 0 ? static_cast<std::uint64_t>(o.warmup_iters) : iters_per_epoch / 2;
  if constexpr (tr::is_csc) {
    ex.sparsifier().set_momentum(o.momentum);  // Algorithm 1's momentum correction
    ex.sparsifier().set_warmup(warmup, warmup);  // dense, then a linear ramp as long again
  }
  if constexpr (tr::is_topk) {
    const double final_d = ex.sparsifier().density();
    if (warmup >= 3) {
      std::vector<gflow::density_step> steps;
      for (double d : {0.25, 0.0725, 0.015})
        if (d > final_d) steps.push_back({(steps.size() + 1) * (warmup / 3), d});
      ex.sparsifier().set_schedule(gflow::density_schedule::per_iteration(steps, final_d));
    }
  }
}

/// The loss scale the options ask for on this composition (auto: dynamic on a 16-bit dense
/// wire, none otherwise); a dynamic scale with a residual-keeping sparsifier is refused.
template <class Ex>
gflow::optim::loss_scale_options loss_scale_for(const options& o) {
  using tr = composition_traits<Ex>;
  gflow::optim::loss_scale_options lso;
  lso.initial = 1.0f;
  lso.dynamic = false;
  switch (o.loss_scale) {
    case loss_scale_mode::automatic:
      if (!tr::wide_wire && !tr::keeps_residual) {
        lso.initial = o.loss_scale_value;
        lso.dynamic = true;
      }
      break;
    case loss_scale_mode::none: break;
    case loss_scale_mode::fixed: lso.initial = o.loss_scale_value; break;
    case loss_scale_mode::dynamic:
      if (tr::keeps_residual)
        throw gflow::invalid_argument("--loss-scale", "dynamic loss scaling with a sparsifier that keeps residuals (CSC, TopK, GTopK, OkTopK) "
                                                      "would add gradients of different scales.",
                                      "pass --loss-scale S (a constant scale, e.g. 1024) or --loss-scale none.");
      lso.initial = o.loss_scale_value;
      lso.dynamic = true;
      break;
  }
  lso.growth_interval = o.loss_scale_window;
  lso.max_scale = std::max(lso.max_scale, lso.initial);
  lso.min_scale = std::min(lso.min_scale, lso.initial);
  return lso;
}

/// After finish(): adds the iteration's bytes and collectives to `st` and updates the loss
/// scale. Returns the inverse of the scale the gradients were made with, or 0 when the step is
/// skipped (non-finite gradients: every rank saw the same status, so every rank skips).
inline float account_step(epoch_stats& st, const gflow::exchange_status& status, gflow::optim::dynamic_loss_scale& scaler) {
  st.wire_bytes += static_cast<double>(status.wire_bytes);
  st.collectives += static_cast<double>(status.collectives);
  const float inv = scaler.inverse();
  if (!scaler.update(status.finite())) {
    ++st.skipped;
    return 0.0f;
  }
  return inv;
}

}  // namespace trainer
