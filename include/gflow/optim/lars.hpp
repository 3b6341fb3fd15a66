#pragma once
// LARS: layer-wise adaptive rate scaling (You et al. 2017; Jia et al. section 4.1, which keeps it
// in fp32 because the local learning rate underflows in fp16).
//
// Per layer l, the local learning rate (trust ratio) is
//     trust_l = coefficient * ||w_l|| / (||g_l|| + weight_decay * ||w_l||)
// and the layer's gradient becomes trust_l * (g_l + weight_decay * w_l); the optimizer (momentum
// SGD, or CSC's Algorithm 1 step in optim/momentum_sgd.hpp) then applies it with the global
// learning rate. When ||w_l|| or the denominator is zero (a layer initialised to zero, a zero
// gradient) the trust ratio is 1, so such layers still move.
//
//   gflow::optim::lars lars({.coefficient = 0.001f, .weight_decay = 5e-4f});
//   for (std::size_t i = 0; i < layout.size(); ++i) lars.apply(weights_of(i), ex.view(i));
//
// Norms are accumulated in double and the update is written in fp32: the computation never
// happens in 16 bits, whatever the wire precision.
#include <cmath>
#include <cstddef>
#include <span>
#include <string>

#include "../error.hpp"

namespace gflow::optim {

struct lars_options {
  float coefficient = 0.001f;  // eta in You et al.; Jia et al. uses 0.001
  float weight_decay = 0.0f;
};

/// The L2 norm of a tensor, accumulated in double.
inline double l2_norm(std::span<const float> x) noexcept {
  double s = 0.0;
  for (float v : x) s += static_cast<double>(v) * static_cast<double>(v);
  return std::sqrt(s);
}

/// The trust ratio for weights w and gradient g (see the header comment).
inline float lars_trust_ratio(double w_norm, double g_norm, const lars_options& o) noexcept {
  const double denom = g_norm + static_cast<double>(o.weight_decay) * w_norm;
  if (!(w_norm > 0.0) || !(denom > 0.0)) return 1.0f;
  return static_cast<float>(static_cast<double>(o.coefficient) * w_norm / denom);
}

class lars {
 public:
  explicit lars(lars_options o = {}) : o_(o) {
    if (!(std::isfinite(o.coefficient) && o.coefficient > 0.0f))
      throw invalid_argument("lars_coefficient", fmt::format("the LARS coefficient must be finite and positive (got {:f}).", o.coefficient),
                             "pass e.g. 0.001 (Jia et al.); raise the global learning rate to match.");
    if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0f))
      throw invalid_argument("weight_decay", fmt::format("the weight decay must be finite and non-negative (got {:f}).", o.weight_decay),
                             "pass e.g. 0.0005, or 0 for none.");
  }

  /// In place: g = trust * (g + weight_decay * w). Returns the trust ratio.
  float apply(std::span<const float> w, std::span<float> g) const { return apply(w, g, o_.weight_decay); }

  /// The same with a per-layer weight decay (e.g. 0 for biases, as Jia et al. does).
  float apply(std::span<const float> w, std::span<float> g, float weight_decay) const {
    if (w.size() != g.size())
      throw invalid_argument("gradients", fmt::format("LARS got {} weights and {} gradients.", w.size(), g.size()),
                             "pass the weights and the gradient of the same layer.");
    lars_options o = o_;
    o.weight_decay = weight_decay;
    const float trust = lars_trust_ratio(l2_norm(w), l2_norm(g), o);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = trust * (g[i] + weight_decay * w[i]);
    return trust;
  }

  [[nodiscard]] const lars_options& options() const noexcept { return o_; }

 private:
  lars_options o_;
};

}  // namespace gflow::optim
