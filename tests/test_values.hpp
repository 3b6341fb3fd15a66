#pragma once
// Deterministic test gradients shared by the host tests.
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <gflow/dtype.hpp>

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

/// Edge bit patterns of a 16-bit wire type (gflow::half or gflow::bfloat16): signed zeros,
/// subnormals, the normal boundary, 1 and its neighbours, values half an ulp of 1 (sums with 1
/// are ties), the largest finite values, inf, NaNs. Shared by the cast tests and their
/// exhaustive twin.
template <class W>
std::vector<std::uint16_t> edge_patterns16() {
  if constexpr (std::is_same_v<W, gflow::half>)
    return {0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x1000, 0x1400, 0x1800, 0x3c00, 0xbc00,
            0x3c01, 0x3c03, 0xbc01, 0x4000, 0x6800, 0x6801, 0x3bff, 0x7bff, 0xfbff, 0x7bfe, 0x7800, 0x7c00, 0xfc00, 0x7e00,
            0xfe00, 0x7c01, 0xfd55, 0x7fff};
  else
    return {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x8080, 0x3b80, 0x3b00, 0x3c00, 0x3f80, 0xbf80, 0x3f81, 0x3f83,
            0xbf81, 0x4000, 0x4380, 0x4381, 0x3f7f, 0x7f7f, 0xff7f, 0x7f7e, 0x7f00, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81,
            0xffaa, 0x7fff};
}

}  // namespace gflow_test
