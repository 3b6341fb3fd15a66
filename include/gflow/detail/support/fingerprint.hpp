#pragma once
// Fingerprints: 64-bit FNV-1a hashes of what every rank (and every checkpoint) must agree on.
//   tensor_fingerprint   one tensor's name, shape and element count
//   layout_fingerprint   the sequence of tensor fingerprints (order matters)
//   composition_name<S>  the resolved policy set, one family per line, as the compiler spells it
//   values_fingerprint   the bits of n floats (replicas.hpp: verify_replicas)
// Used by the cross-rank consistency check at construction and by checkpoint headers. The
// composition name comes from the compiler's function signature, so ranks built by different
// compilers would see different names; gflow assumes one binary (or one toolchain) per job.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "../../layout.hpp"

namespace gflow::detail {

inline constexpr std::uint64_t fnv_offset = 14695981039346656037ull;
inline constexpr std::uint64_t fnv_prime = 1099511628211ull;

constexpr std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = fnv_offset) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= fnv_prime;
  }
  return h;
}
inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = fnv_offset) noexcept { return fnv1a(s.data(), s.size(), h); }
inline std::uint64_t fnv1a_u64(std::uint64_t v, std::uint64_t h = fnv_offset) noexcept { return fnv1a(&v, sizeof v, h); }

inline std::uint64_t tensor_fingerprint(const tensor_desc& t) noexcept {
  std::uint64_t h = fnv1a(t.name);
  h = fnv1a_u64(t.numel, h);
  h = fnv1a_u64(t.shape.size(), h);
  for (std::size_t d : t.shape) h = fnv1a_u64(d, h);
  return h;
}

inline std::uint64_t layout_fingerprint(const Layout& layout) noexcept {
  std::uint64_t h = fnv1a_u64(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) h = fnv1a_u64(tensor_fingerprint(layout[i]), h);
  return h;
}

/// The bits of n floats: FNV-1a over 32-bit words, in 4 interleaved lanes (element i feeds lane
/// i % 4; independent chains, so the multiplies overlap), the lanes then folded in order with n.
/// Bitwise: -0.0 and +0.0, or two NaN payloads, fingerprint differently. One changed element
/// always changes its lane (each step h -> (h ^ w) * prime is a bijection of h for a fixed w and
/// of w for a fixed h); several can collide only by chance (about 2^-64).
inline std::uint64_t values_fingerprint(const float* v, std::size_t n) noexcept {
  std::uint64_t lane[4] = {fnv_offset, fnv_offset ^ 1u, fnv_offset ^ 2u, fnv_offset ^ 3u};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (std::size_t k = 0; k < 4; ++k) {
      std::uint32_t w;
      std::memcpy(&w, v + i + k, sizeof w);
      lane[k] = (lane[k] ^ w) * fnv_prime;
    }
  for (; i < n; ++i) {
    std::uint32_t w;
    std::memcpy(&w, v + i, sizeof w);
    lane[i % 4] = (lane[i % 4] ^ w) * fnv_prime;
  }
  std::uint64_t h = fnv1a_u64(n);
  for (std::uint64_t l : lane) h = fnv1a_u64(l, h);
  return h;
}

/// The type's name as the compiler prints it in a function signature.
template <class T>
std::string_view type_name() noexcept {
#if defined(__clang__) || defined(__GNUC__)
  std::string_view s = __PRETTY_FUNCTION__;
  const std::size_t b = s.find("T = ");
  if (b == std::string_view::npos) return s;
  s.remove_prefix(b + 4);
  const std::size_t e = s.find_first_of(";]");
  return e == std::string_view::npos ? s : s.substr(0, e);
#else
  return __FUNCSIG__;
#endif
}

/// The resolved composition (defaults filled in, families in a fixed order), readable in errors.
template <class Set>
std::string composition_name() {
  std::string s;
  for (std::string_view part : {type_name<typename Set::precision>(), type_name<typename Set::fusion>(),
                                type_name<typename Set::sparsifier>(), type_name<typename Set::topology>(),
                                type_name<typename Set::overlap>()}) {
    if (!s.empty()) s += ", ";
    s += part;
  }
  // Sharding<None> (the default) adds nothing: the names, and the checkpoints and consistency
  // checks that hash them, stay what they were before the family existed.
  if constexpr (requires { requires Set::sharding::sharded; }) {
    s += ", ";
    s += type_name<typename Set::sharding>();
  }
  return s;
}

}  // namespace gflow::detail
