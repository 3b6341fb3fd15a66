#pragma once
// Dynamic loss scaling for a 16-bit gradient exchange (Jia et al. section 4.1; Micikevicius et al.).
//
// Small gradients underflow to zero in fp16 (below 6e-8) and large ones overflow (above 65504).
// The trainer multiplies the loss by scale() before backward, so the gradients it writes into the
// exchanger are scaled; after finish() it multiplies them by inverse() before the fp32 optimizer
// step. The exchanger counts inf/NaN in the exchanged gradients (identically on every rank), and
//
//   gflow::optim::dynamic_loss_scale ls;             // 2^15, x2 after 2000 good steps
//   auto st = ex.finish();
//   if (ls.update(st.finite())) { unscale(ls.inverse()); opt.step(...); }   // else: step skipped
//
// update(false) skips the step and halves the scale; after `growth_interval` finite steps in a
// row the scale doubles. Every rank sees the same status, so every rank keeps the same scale.
// With `dynamic = false` the scale stays at `initial` and a non-finite step is still skipped.
#include <cmath>
#include <cstdint>
#include <string>

#include "../error.hpp"

namespace gflow::optim {

struct loss_scale_options {
  float initial = 32768.0f;             // 2^15
  float factor = 2.0f;                  // halve on overflow, double on growth
  std::uint32_t growth_interval = 2000;  // finite steps in a row before the scale grows
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;  // 2^24
  bool dynamic = true;
};

class dynamic_loss_scale {
 public:
  explicit dynamic_loss_scale(loss_scale_options o = {}) : o_(o) {
    auto positive = [](float v) { return std::isfinite(v) && v > 0.0f; };
    if (!positive(o.min_scale) || !positive(o.max_scale) || o.min_scale > o.max_scale)
      throw invalid_argument("min_scale", fmt::format("the loss-scale bounds must be finite, positive and min <= max (got min "
                                              "{:f}, max {:f}).", o.min_scale, o.max_scale),
                             "pass e.g. min_scale = 1, max_scale = 2^24.");
    if (!positive(o.initial) || o.initial < o.min_scale || o.initial > o.max_scale)
      throw invalid_argument("initial", fmt::format("the initial loss scale {:f} is not finite or lies outside ["
                                            "{:f}, {:f}].", o.initial, o.min_scale, o.max_scale),
                             "pass a scale inside the bounds, e.g. 32768 for fp16 gradients.");
    if (!(std::isfinite(o.factor) && o.factor > 1.0f))
      throw invalid_argument("factor", fmt::format("the loss-scale factor must be finite and greater than 1 (got {:f}).", o.factor),
                             "pass e.g. 2 (halve on overflow, double on growth).");
    if (o.dynamic && o.growth_interval == 0)
      throw invalid_argument("growth_interval", "a dynamic loss scale needs at least one good step before it grows (got 0).",
                             "pass e.g. 2000 steps.");
    scale_ = o.initial;
  }

  [[nodiscard]] float scale() const noexcept { return scale_; }
  [[nodiscard]] float inverse() const noexcept { return 1.0f / scale_; }

  /// One iteration's verdict (exchange_status::finite()). Returns whether to apply the step.
  bool update(bool finite) noexcept {
    if (!finite) {
      ++skipped_;
      good_ = 0;
      if (o_.dynamic) scale_ = std::fmax(scale_ / o_.factor, o_.min_scale);
      return false;
    }
    if (o_.dynamic && ++good_ >= o_.growth_interval) {
      scale_ = std::fmin(scale_ * o_.factor, o_.max_scale);
      good_ = 0;
    }
    return true;
  }

  /// Steps skipped so far (non-finite gradients).
  [[nodiscard]] std::uint64_t skipped() const noexcept { return skipped_; }
  /// Finite steps since the last change of scale (or the last overflow).
  [[nodiscard]] std::uint32_t good_steps() const noexcept { return good_; }
  [[nodiscard]] const loss_scale_options& options() const noexcept { return o_; }

  /// Restores what scale(), good_steps() and skipped() returned (a trainer's checkpoint).
  void restore(float scale, std::uint32_t good_steps, std::uint64_t skipped) {
    if (!(std::isfinite(scale) && scale >= o_.min_scale && scale <= o_.max_scale))
      throw invalid_argument("scale", fmt::format("the restored loss scale {:f} is not finite or lies outside [{:f}, {:f}].", scale, o_.min_scale, o_.max_scale),
                             "restore the values this loss scale (with these options) returned when it was saved.");
    scale_ = scale;
    good_ = good_steps;
    skipped_ = skipped;
  }

 private:
  loss_scale_options o_;
  float scale_ = 1.0f;
  std::uint32_t good_ = 0;
  std::uint64_t skipped_ = 0;
};

}  // namespace gflow::optim
