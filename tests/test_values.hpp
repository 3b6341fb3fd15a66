#pragma once
// Deterministic test gradients shared by the host tests.
#include <cstddef>
#include <cstdint>

namespace gflow_test {

/// A pseudo-random value in [-1, 1) that depends on (rank, tensor, element, iteration) only, so
/// every rank can recompute every other rank's gradient for a reference.
inline float uniform_value(int rank, std::size_t tensor, std::size_t j, int iter) {
  std::uint64_t x = (std::uint64_t(rank) * 0x9E3779B97F4A7C15ull) ^ (tensor * 0xBF58476D1CE4E5B9ull) ^ (j * 0x94D049BB133111EBull) ^
                    (std::uint64_t(iter) << 40);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

}  // namespace gflow_test
