#pragma once
// The run-time settings every engine of the Top-k family shares (TopK, GTopK: topk/engine.hpp;
// OkTopK: oktopk/engine.hpp): the density or its schedule, and the index width. One CRTP base,
// so that the checks and their texts are written once. The engine supplies two hooks, called after
// a change: replan() (the schedule changed: buffers follow its largest density) and
// index_width_changed() (TopK / GTopK size their lists for the width; OkTopK its buffers). The
// checkpoint head that holds the same settings is in state.hpp.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "../../../error.hpp"
#include "../../plan/density.hpp"

namespace gflow::detail {

template <class Engine>
class topk_settings {
 public:
  // ---- run-time settings (between iterations; the same on every rank) ----------------------
  /// A constant density from now on. Throws invalid_argument("density") unless 0 < d <= 1.
  void set_density(double d) {
    plan::check_density(d);
    set_schedule(plan::density_schedule::constant(d));
  }
  /// A warm-up schedule (already validated when built); buffers grow to its largest density.
  void set_schedule(plan::density_schedule s) {
    schedule_ = std::move(s);
    self().replan();
  }
  [[nodiscard]] const plan::density_schedule& schedule() const noexcept { return schedule_; }
  /// The density of the current (or, between iterations, the last) iteration.
  [[nodiscard]] double density() const noexcept { return density_; }

  /// 4 (u32 indices; only when the pool has at most 2^32 elements) or 8 (u64).
  void set_index_bytes(std::size_t bytes) {
    if (bytes != 4 && bytes != 8)
      throw invalid_argument("index_bytes", fmt::format("indices travel as 4 or 8 bytes (got {}).", bytes), "pass 4 or 8.");
    if (bytes == 4 && pool_elements_ > (std::uint64_t{1} << 32))
      throw invalid_argument("index_bytes", fmt::format("the pool has {} elements; 32-bit indices address at most 2^32.", pool_elements_),
                             "keep 8-byte indices for this layout.");
    wide_ = bytes == 8;
    self().index_width_changed();
  }
  [[nodiscard]] std::size_t index_bytes() const noexcept { return wide_ ? 8 : 4; }

 protected:
  /// A constant density `density`; indices are 8 bytes when the pool needs them, else 4.
  topk_settings(double density, std::uint64_t pool_elements)
      : schedule_(plan::density_schedule::constant(density)), density_(density), wide_(pool_elements > (std::uint64_t{1} << 32)),
        pool_elements_(pool_elements) {}

  plan::density_schedule schedule_;
  double density_;
  bool wide_;

 private:
  Engine& self() noexcept { return static_cast<Engine&>(*this); }
  std::uint64_t pool_elements_;
};

}  // namespace gflow::detail
