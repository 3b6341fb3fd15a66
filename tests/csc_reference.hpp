#pragma once
// Helpers of the Sparsifier<CSC<...>> engine tests (wire and results): a selection as a mask, and a
// hash of a chunk list (to compare selections across ranks and iterations).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gflow_test {

inline std::vector<std::uint8_t> mask_of(std::span<const std::uint32_t> chunks, std::size_t count) {
  std::vector<std::uint8_t> m(count, 0);
  for (auto c : chunks) m[c] = 1;
  return m;
}

inline std::uint64_t hash_chunks(std::span<const std::uint32_t> chunks) {
  std::uint64_t h = 1469598103934665603ull ^ chunks.size();
  for (auto c : chunks) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace gflow_test
