#pragma once
// The exact Top-k selection (the reference every faster path must equal, bit for bit): the
// magnitude key, the three-digit radix select of the k-th largest key, and select_topk. The
// ordering rules are in kernels/topk.hpp's header comment.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace gflow::detail::kernels {

/// |v| as an unsigned key with the same order (NaN above inf).
constexpr std::uint32_t magnitude_key(float v) noexcept { return std::bit_cast<std::uint32_t>(v) & 0x7fffffffu; }

/// NaN -> +inf; every other value unchanged. Applied before a value is encoded for the wire.
constexpr float sanitize(float v) noexcept {
  return magnitude_key(v) > 0x7f800000u ? std::bit_cast<float>(0x7f800000u) : v;
}

/// G = g + residual, stored into both g (the pool) and residual.
inline void accumulate_residual(float* g, float* residual, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float G = g[i] + residual[i];
    g[i] = G;
    residual[i] = G;
  }
}

/// Where the k-th largest key lies: every element with key > `key` is selected, and the first
/// `take` elements (in index order) with key == `key`.
struct threshold {
  std::uint32_t key = 0;
  std::size_t take = 0;
};

namespace detail {
// Radix digits of the 31-bit key, most significant first: 11 + 10 + 10 bits.
inline constexpr int digit_shift[3] = {20, 10, 0};
inline constexpr std::uint32_t digit_bins[3] = {2048, 1024, 1024};
}  // namespace detail

namespace detail {
/// The radix select of radix_threshold over any key source: key_at(i) is the key of element i.
template <class KeyAt>
threshold radix_threshold_by(KeyAt key_at, std::size_t n, std::size_t k, std::uint32_t* scratch) noexcept {
  std::size_t hist[2048];
  std::size_t remaining = k;  // how many of the candidates are still to be selected
  std::uint32_t prefix = 0;
  std::size_t cand = 0;
  for (int d = 0; d < 3; ++d) {
    const int sh = digit_shift[d];
    const std::uint32_t bins = digit_bins[d];
    std::fill(hist, hist + bins, std::size_t{0});
    if (d == 0) {
      for (std::size_t i = 0; i < n; ++i) ++hist[key_at(i) >> sh];
    } else {
      for (std::size_t i = 0; i < cand; ++i) ++hist[(scratch[i] >> sh) & (bins - 1)];
    }
    // Walk from the largest digit down until the remaining count is covered.
    std::uint32_t b = bins;
    std::size_t above = 0;
    while (b-- > 0) {
      if (above + hist[b] >= remaining) break;
      above += hist[b];
    }
    remaining -= above;
    prefix |= b << sh;
    if (d == 2) break;
    // Keep only the candidates in bin b (their higher digits already match the prefix).
    std::size_t kept = 0;
    const int next_sh = sh;
    if (d == 0) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t key = key_at(i);
        if ((key >> next_sh) == b) scratch[kept++] = key;
      }
    } else {
      for (std::size_t i = 0; i < cand; ++i)
        if (((scratch[i] >> sh) & (bins - 1)) == b) scratch[kept++] = scratch[i];
    }
    cand = kept;
  }
  return {prefix, remaining};
}
}  // namespace detail

/// Exact threshold of the k largest |v[i]| (1 <= k <= n). `scratch` holds n keys.
/// MSD radix select: a histogram of the top 11 bits over all n values, then 10-bit digits over
/// the candidates that share the chosen prefix (compacted into scratch), three passes in all.
inline threshold radix_threshold(const float* v, std::size_t n, std::size_t k, std::uint32_t* scratch) noexcept {
  return detail::radix_threshold_by([v](std::size_t i) { return magnitude_key(v[i]); }, n, k, scratch);
}

/// The same on keys already computed (magnitude_key values): keys[0, n), 1 <= k <= n. `scratch`
/// holds n keys and must not overlap `keys`.
inline threshold radix_threshold_keys(const std::uint32_t* keys, std::size_t n, std::size_t k, std::uint32_t* scratch) noexcept {
  return detail::radix_threshold_by([keys](std::size_t i) { return keys[i]; }, n, k, scratch);
}

/// Exact top-k of |v[0, n)|: writes base + position of the selected elements to out, in
/// increasing order, and returns the count (min(k, n)). Ties at the threshold go to the lower
/// index. `scratch` holds n keys (unused when k >= n).
template <class I>
std::size_t select_topk(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, std::uint32_t* scratch) noexcept {
  if (k == 0 || n == 0) return 0;
  if (k >= n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<I>(base + i);
    return n;
  }
  const threshold t = radix_threshold(v, n, k, scratch);
  std::size_t take = t.take;
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = magnitude_key(v[i]);
    if (key > t.key || (key == t.key && take > 0)) {
      if (key == t.key) --take;
      out[c++] = static_cast<I>(base + i);
    }
  }
  return c;
}

}  // namespace gflow::detail::kernels
