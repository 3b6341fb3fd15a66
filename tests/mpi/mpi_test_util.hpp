#pragma once
// Helpers shared by the MPI tests: value conversion for every wire element, a cheap
// counter-based generator (every rank can regenerate every other rank's values, so expected
// results need no communication), and a cross-rank "same bits everywhere" check.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <gflow/dtype.hpp>
#include <gflow/detail/kernels/cast.hpp>
#include <gflow/transport/mpi.hpp>

namespace gflow_test {

template <class T>
inline constexpr bool is16 = std::is_same_v<T, gflow::half> || std::is_same_v<T, gflow::bfloat16>;

template <class T>
T from_double(double v) {
  if constexpr (is16<T>) return gflow::detail::kernels::wire_cast<T>(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T>
double to_double(T v) {
  if constexpr (is16<T>) return static_cast<double>(gflow::detail::kernels::to_float(v));
  else return static_cast<double>(v);
}

/// splitmix64 finaliser.
inline std::uint64_t mix(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Uniform in [-1, 1) with 24 random bits, from a stream seed and an index.
inline float uniform(std::uint64_t seed, std::uint64_t i) noexcept {
  const std::uint64_t h = mix(seed + i);
  return static_cast<float>(static_cast<double>(h >> 40) * (1.0 / 8388608.0) - 1.0);
}

/// FNV-1a over the bytes of a buffer.
inline std::uint64_t hash_bytes(const void* p, std::size_t bytes) noexcept {
  const auto* b = static_cast<const unsigned char*>(p);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

/// True when every rank of t passed the same value.
inline bool same_on_all_ranks(gflow::mpi::transport& t, std::uint64_t v) {
  std::uint64_t lo = v, hi = v;
  t.all_reduce(&lo, 1, gflow::reduce_op::min);
  t.all_reduce(&hi, 1, gflow::reduce_op::max);
  return lo == hi;
}

}  // namespace gflow_test
