#pragma once
// Density schedules (pure): which fraction of a selection unit the Top-k sparsifiers
// (engines/topk.hpp) exchange at a given iteration, and k for a unit of n elements.
//
// Sparse training warms up with denser exchanges (gTop-k (Shi et al.) section IV-A, after Lin et al.:
// the first 4 epochs use 0.25, 0.0725, 0.015, 0.004, then 0.001 for CNNs). A schedule is a list
// of warm-up steps, each covering a range of iterations, followed by a final density:
//
//   density_schedule::constant(0.001)
//   density_schedule::per_iteration({{100, 0.25}, {300, 0.01}}, 0.001)   // [0,100) [100,300) then 0.001
//   density_schedule::per_epoch({0.25, 0.0725, 0.015, 0.004}, 0.001, iterations_per_epoch)
//   density_schedule::gtopk_warmup(iterations_per_epoch)                        // the line above
//
// Iterations are the exchanger's counter (0 for the first finish()). Every value is validated
// on construction (density in (0, 1], step ends strictly increasing), so at() cannot fail.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"

namespace gflow::detail::plan {

/// Throws gflow::invalid_argument naming `what` unless 0 < d <= 1 (NaN is rejected).
inline void check_density(double d, const std::string& what = "density") {
  if (!(d > 0.0 && d <= 1.0))
    throw invalid_argument(what, fmt::format("the density must lie in (0, 1] (got {:f}).", d),
                           "pass the fraction of gradients to exchange, e.g. 0.001 for 0.1%; 1 exchanges everything.");
}

/// k = ceil(density * n), at least 1 and at most n (n > 0). A product that is an integer up to
/// double rounding counts as that integer (0.1 * 30 = 3.0000000000000004 gives k = 3, not 4),
/// so k does not depend on how the density's decimal literal happened to round.
inline std::size_t k_for(double density, std::size_t n) {
  check_density(density);
  if (n == 0) return 0;
  const double x = density * static_cast<double>(n);
  const double r = std::nearbyint(x);
  double k = (std::fabs(x - r) <= 1e-9 * (r > 1.0 ? r : 1.0)) ? r : std::ceil(x);
  if (k < 1.0) k = 1.0;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<std::size_t>(k);
}

/// One warm-up step: `density` for the iterations before `until` (and after the previous step).
struct density_step {
  std::uint64_t until = 0;
  double density = 1.0;
};

class density_schedule {
 public:
  /// The same density at every iteration.
  static density_schedule constant(double d) { return density_schedule({}, d); }

  /// Warm-up steps over iteration ranges, then `final_density`. Step `i` covers
  /// [steps[i-1].until, steps[i].until); the ends must be strictly increasing and positive.
  static density_schedule per_iteration(std::vector<density_step> steps, double final_density) {
    return density_schedule(std::move(steps), final_density);
  }

  /// Warm-up densities per epoch (epoch e covers iterations [e * ipe, (e + 1) * ipe)), then
  /// `final_density`.
  static density_schedule per_epoch(const std::vector<double>& warmup, double final_density, std::uint64_t iterations_per_epoch) {
    if (iterations_per_epoch == 0)
      throw invalid_argument("iterations_per_epoch", "an epoch must hold at least one iteration (got 0).",
                             "pass the number of exchanger iterations (finish() calls) per epoch.");
    if (!warmup.empty() && iterations_per_epoch > std::numeric_limits<std::uint64_t>::max() / warmup.size())
      throw invalid_argument("iterations_per_epoch", "the warm-up would end past 2^64 iterations.", "pass a smaller number of iterations per epoch.");
    std::vector<density_step> steps;
    steps.reserve(warmup.size());
    for (std::size_t e = 0; e < warmup.size(); ++e) steps.push_back({(e + 1) * iterations_per_epoch, warmup[e]});
    return density_schedule(std::move(steps), final_density);
  }

  /// gTop-k (Shi et al.)'s warm-up: 0.25, 0.0725, 0.015, 0.004 for the first four epochs, then
  /// `final_density` (0.001 for CNNs; the paper uses 0.005 for its LSTM).
  static density_schedule gtopk_warmup(std::uint64_t iterations_per_epoch, double final_density = 0.001) {
    return per_epoch({0.25, 0.0725, 0.015, 0.004}, final_density, iterations_per_epoch);
  }

  /// The density at `iteration`.
  [[nodiscard]] double at(std::uint64_t iteration) const noexcept {
    for (const auto& s : steps_)
      if (iteration < s.until) return s.density;
    return final_;
  }
  /// The largest density the schedule ever uses (buffers are sized for it).
  [[nodiscard]] double max() const noexcept {
    double m = final_;
    for (const auto& s : steps_) m = s.density > m ? s.density : m;
    return m;
  }
  [[nodiscard]] const std::vector<density_step>& steps() const noexcept { return steps_; }
  [[nodiscard]] double final_density() const noexcept { return final_; }

  friend bool operator==(const density_schedule& a, const density_schedule& b) {
    if (a.final_ != b.final_ || a.steps_.size() != b.steps_.size()) return false;
    for (std::size_t i = 0; i < a.steps_.size(); ++i)
      if (a.steps_[i].until != b.steps_[i].until || a.steps_[i].density != b.steps_[i].density) return false;
    return true;
  }

 private:
  density_schedule(std::vector<density_step> steps, double final_density) : steps_(std::move(steps)), final_(final_density) {
    check_density(final_, "final_density");
    std::uint64_t prev = 0;
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      check_density(steps_[i].density, fmt::format("steps[{}].density", i));
      if (steps_[i].until <= prev)
        throw invalid_argument(fmt::format("steps[{}].until", i),
                               fmt::format("warm-up step {} ends at iteration {}"
                                   ", not after the previous step's end ({}).", i, steps_[i].until, prev),
                               "give each step an end iteration strictly greater than the one before (the first > 0).");
      prev = steps_[i].until;
    }
  }

  std::vector<density_step> steps_;
  double final_ = 1.0;
};

}  // namespace gflow::detail::plan
