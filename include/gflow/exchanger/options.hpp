#pragma once
// What a trainer passes to an exchanger at construction (exchange_options) and what finish()
// returns (exchange_status), for gflow::Exchanger (exchanger.hpp).
#include <cstddef>
#include <cstdint>
#include <optional>

namespace gflow {

/// Run-time settings. Fusion numbers given here override the Fusion policy's (auto-tuning).
struct exchange_options {
  std::optional<std::size_t> threshold_bytes;
  std::optional<std::size_t> first_bucket_bytes;
  bool average = true;  // false: leave the sum of the ranks' gradients
  // Compare layout, policies and the options above across ranks at construction (one small
  // all_gather); a difference raises mismatch_error on every rank instead of a hang. Must be
  // the same on every rank (a rank that skips the check would leave the others waiting).
  bool verify = true;
};

/// What finish() reports about one iteration. The result is bitwise identical on every rank,
/// so every rank reports the same status.
struct exchange_status {
  std::uint64_t iteration = 0;
  std::size_t nonfinite = 0;    // inf / NaN elements in the exchanged gradients
  std::size_t collectives = 0;  // allreduces issued
  std::size_t wire_bytes = 0;   // bytes this rank handed to those allreduces
  [[nodiscard]] bool finite() const noexcept { return nonfinite == 0; }
};

}  // namespace gflow
