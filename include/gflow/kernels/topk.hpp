#pragma once
// Host kernels of the Top-k sparsifiers (policies/topk.hpp): the references for the CUDA twins
// in include/gflow/cuda/topk.cuh, which produce the same selections and the same bits.
//
//   accumulate_residual(g, res, n)            G = g + res, written to both (res = G until selection)
//   radix_threshold(v, n, k, scratch)          the k-th largest |v| as a key, and how many of the
//                                              elements equal to it are taken (lowest indices first)
//   select_topk(v, n, k, base, out, scratch)   exact top-k by |v|, ties to the lower index,
//                                              indices (base + position) in increasing order
//   accumulate_select_topk(g, res, n, k, base, out, ws)
//                                              res = G = g + res (g only read), then exactly what
//                                              select_topk(G) selects, in about one pass: a sampled
//                                              threshold, one gathering pass, a radix select among
//                                              the candidates, the full selection as the fallback
//                                              (host only: no CUDA twin yet, see below)
//   select_topk_sampled(v, n, k, base, out, ws) the same without the accumulation
//   accumulate_into_residual(g, res, n)         res = g + res, g only read (host only)
//   take_selected(G, res, idx, count, out, s)  wire values W(G * s); residual keeps G - W / s
//                                              (G and res may be the same array)
//   clear_nonfinite(res, n)                    res = 0 where res is inf / NaN (more non-finite values
//                                              than a selection holds)
//   unpack_checked(msg, k, lo, hi, idx, val)   a sparse message (support/sparse_message.hpp) checked
//                                              before anything is used
//   scatter_add(dst, idx, val, count)          dst[idx] += float(val)
//   scale_at / gather_at(dst, idx, count, ...)  dst[idx] *= s / read dst[idx] into a list (host only)
//   merge_topk(a, b, k, out, records)          Definition 1 (paper 003): add equal indices, keep
//                                              the k largest |sum| (ties: lower index)
//   restore_unselected / restore_records_in    Algorithm 4 line 10 and its exact completion
//
// Ordering. |v| is compared through the key bits(v) & 0x7fffffff, an unsigned integer that
// orders magnitudes exactly like the floats do (and -0 like +0); NaN keys sort above inf, so a
// NaN is always selected and reported rather than silently left in a residual. Equal keys are
// taken lowest index first, so a selection depends only on the values, never on the algorithm.
//
// Non-finite values. NaN never travels: sanitize() turns it into +inf before a value is
// encoded, so a received NaN always means a corrupt message (unpack_checked rejects it), while
// a genuine overflow still arrives as inf and is reported by Exchanger::finish(). Non-finite
// values are never put into a residual (a residual that held inf would poison every later
// iteration); the exchange that carried them is reported non-finite instead. They rank above
// every finite value, so a rank with more than k of them in a unit sends k (the result is then
// non-finite on every rank) and the engine clears the rest (clear_nonfinite). A finite value
// whose wire encoding overflows (fp16 above 65504 after the 1/P scaling) travels as inf: it is
// reported, and not kept in the residual either.

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(GFLOW_NO_AVX2)
#include <immintrin.h>
#define GFLOW_TOPK_AVX2 1
#endif

#include "../dtype.hpp"
#include "cast.hpp"
#include "../support/sparse_message.hpp"

namespace gflow::kernels {

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

// ---- exact top-k in about one pass ------------------------------------------------------------
//
// accumulate_select_topk(g, res, n, k, base, out, ws) stores G = g + res into res (g is only
// read) and selects exactly what select_topk(G, n, k, base, out, ...) selects: the same
// indices in the same order, for every input (ties to the lower index, NaN above inf).
// select_topk_sampled(v, ...) does the same on values already accumulated. Mostly in one pass:
//   (a) a threshold key t is estimated from a sample of G (plan_topk_sample: up to 4096 runs of
//       8 consecutive elements, one run at a fixed pseudo-random offset in each stride of
//       n / runs elements, so the sample depends on n only; t is the r-th largest sampled key,
//       r chosen so that about 1.25 k plus five standard deviations of the unit's elements are
//       expected to reach it);
//   (b) one pass computes and stores G and appends every position whose key is >= t to a
//       candidate list of bounded capacity, in increasing order (AVX2 compare + movemask where
//       the CPU has it, chosen once per process; the scalar twin elsewhere, or everywhere when
//       GFLOW_NO_AVX2 is defined; the same float addition g + res either way);
//   (c) radix_threshold_keys over the candidates' keys; the candidates above the threshold and
//       the first `take` at it are emitted in index order.
// Why (c) equals the full selection: the list holds EVERY element with key >= t (the pass never
// hit the capacity) and at least k of them. Then the k-th largest key K of the whole unit is
// >= t (k elements have a key >= t), so every element with key >= K (the selected ones and all
// those tied with the k-th) is a candidate, and K is also the k-th largest key among the
// candidates. The candidates are in index order, so the first `take` of those equal to K are
// the same lower-index elements the full selection takes.
//   (d) When the sample misjudged, the exact full selection (select_topk, three passes) runs on
//       the stored G instead: fewer than k candidates (t too high), or more than the capacity
//       (t too low; the pass stops appending and only finishes storing G). The result is the
//       same on every path, only the time differs. Units below 16384 elements, and densities at
//       which the candidates would be most of the unit, take the full selection directly.
// NaN + NaN: x86 returns one operand's payload, and which one depends on the operand order the
// compiler chose for the addition (accumulate_residual's own vector body and tail differ), so
// where g[i] and res[i] are both NaN the stored NaN's payload, and with it its order among other
// NaNs, is not pinned down; the selection is still exactly select_topk over the G these kernels
// store. An engine never meets the case: its residual never holds NaN.
// These kernels have no CUDA twin yet (the device engine is future work); the device selection
// is cuda::select_topk, which equals select_topk and so these.

/// The sample of the one-pass top-k for a unit of n elements with k selected (plan_topk_sample).
struct topk_sample_plan {
  static constexpr std::size_t run = 8;  // consecutive elements per sampled run
  std::size_t runs = 0;                  // 0: no sampling, the full selection runs
  std::size_t stride = 0;                // run s lies in [s * stride, (s + 1) * stride)
  std::size_t rank = 0;                  // t is the rank-th largest sampled key (1-based)
  std::size_t capacity = 0;              // candidates the pass collects at most
  [[nodiscard]] std::size_t samples() const noexcept { return runs * run; }
  /// First position of run s (s < runs).
  [[nodiscard]] std::size_t run_start(std::size_t s) const noexcept {
    std::uint64_t x = (static_cast<std::uint64_t>(s) + 1) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return s * stride + static_cast<std::size_t>(x % (stride - run + 1));
  }
};

/// Whether and how the one-pass top-k samples a unit of n elements with k selected.
inline topk_sample_plan plan_topk_sample(std::size_t n, std::size_t k) noexcept {
  constexpr std::size_t min_n = 16384, max_runs = 4096;
  topk_sample_plan p;
  if (k == 0 || k >= n || n < min_n) return p;
  const std::size_t runs = std::min(max_runs, n / 64);
  const double m = static_cast<double>(runs * topk_sample_plan::run);
  const double mu = static_cast<double>(k) * m / static_cast<double>(n);  // sampled elements expected in the top k
  const double r = std::ceil(1.25 * mu + 5.0 * std::sqrt(mu) + 8.0);
  if (2.0 * r > m) return p;  // the candidates would be most of the unit
  const double expect = r * static_cast<double>(n) / m;  // elements expected at or above t
  const double cap = expect + 12.0 * expect / std::sqrt(r) + 1024.0;
  p.runs = runs;
  p.stride = n / runs;
  p.rank = static_cast<std::size_t>(r);
  p.capacity = cap >= static_cast<double>(n) ? n : static_cast<std::size_t>(cap);
  return p;
}

/// Buffers of accumulate_select_topk / select_topk_sampled. reserve() allocates; the kernels
/// never do.
struct topk_workspace {
  std::vector<std::uint32_t> keys;      // n: the full selection's scratch, and the candidates' radix scratch
  std::vector<std::uint64_t> cand;      // candidate positions (from the unit's start)
  std::vector<std::uint32_t> cand_key;  // their keys
  std::vector<std::uint32_t> sample;    // sampled keys

  /// Grows the buffers for units of up to n elements with up to k selected (any k' <= k too).
  /// Call it for every unit size used; it only grows.
  void reserve(std::size_t n, std::size_t k) {
    k = std::min(k, n);
    // Sampling stops above some k (the candidates would be most of the unit); a smaller k may
    // still sample, and the capacity grows with k: size for the largest k' <= k that samples.
    std::size_t lo = 0, hi = k;  // the largest k' in [1, k] that samples (the ones that do are 1..K); 0: none
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo + 1) / 2;
      if (plan_topk_sample(n, mid).runs != 0) lo = mid;
      else hi = mid - 1;
    }
    const topk_sample_plan p = plan_topk_sample(n, lo);
    grow(keys, n);
    grow(cand, p.capacity);
    grow(cand_key, p.capacity);
    grow(sample, p.samples());
  }
  void release() { *this = topk_workspace{}; }

 private:
  template <class E>
  static void grow(std::vector<E>& v, std::size_t n) {
    if (v.size() < n) v.assign(n, E{});
  }
};

/// How accumulate_select_topk / select_topk_sampled found their selection (the result is the
/// same on every path).
enum class topk_path : std::uint8_t {
  full,        // not sampled (k == 0, k >= n, a small unit or a large density): select_topk
  candidates,  // sampled, selected among the candidates: about one pass
  too_few,     // the sampled threshold was too high (fewer than k candidates): select_topk
  overflow,    // too low (more candidates than the capacity): select_topk
};

struct topk_result {
  std::size_t count = 0;       // indices written (min(k, n))
  topk_path path = topk_path::full;
  std::size_t candidates = 0;  // candidates gathered (capacity + 1 on overflow)
};

/// res[i] = g[i] + res[i] (the addition of accumulate_residual; g is only read).
inline void accumulate_into_residual(const float* g, float* residual, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) residual[i] = g[i] + residual[i];
}

/// Selects among candidates (positions increasing, with their keys; k <= c): what select_topk
/// selects over the unit when the candidates are every element whose key is >= some t and
/// number at least k (see above). Writes base + position to out; returns k.
template <class I>
std::size_t select_candidates(const std::uint64_t* pos, const std::uint32_t* key, std::size_t c, std::size_t k, std::uint64_t base, I* out,
                              std::uint32_t* scratch) noexcept {
  const threshold t = radix_threshold_keys(key, c, k, scratch);
  std::size_t take = t.take;
  std::size_t o = 0;
  for (std::size_t j = 0; j < c; ++j) {
    const std::uint32_t kk = key[j];
    if (kk > t.key || (kk == t.key && take > 0)) {
      if (kk == t.key) --take;
      out[o++] = static_cast<I>(base + pos[j]);
    }
  }
  return o;
}

namespace detail {

// The gathering pass over [0, n): with Acc, v[i] = g[i] + v[i] (g only read; without Acc, g is
// not read, pass any valid pointer such as v, and v is only read). Appends (pos0 + i, key) for every key(v[i]) >= t (t >= 1) to
// cand / ckey while fewer than cap are there. Returns how many it appended, or cap + 1 when
// there were more (with Acc the rest of the pass still stores G).
template <bool Acc>
std::size_t gather_scalar(const float* g, float* v, std::size_t n, std::uint32_t t, std::uint64_t pos0, std::uint64_t* cand,
                          std::uint32_t* ckey, std::size_t cap) noexcept {
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float x = v[i];
    if constexpr (Acc) {
      x = g[i] + x;
      v[i] = x;
    }
    const std::uint32_t key = magnitude_key(x);
    if (key >= t) [[unlikely]] {
      if (c == cap) {
        if constexpr (Acc) accumulate_into_residual(g + i + 1, v + i + 1, n - i - 1);
        return cap + 1;
      }
      cand[c] = pos0 + i;
      ckey[c++] = key;
    }
  }
  return c;
}

#if defined(GFLOW_TOPK_AVX2)
// The AVX2 twin: 16 elements a step, one predictable branch unless a candidate is among them.
template <bool Acc>
__attribute__((target("avx2"))) std::size_t gather_avx2(const float* g, float* v, std::size_t n, std::uint32_t t, std::uint64_t pos0,
                                                        std::uint64_t* cand, std::uint32_t* ckey, std::size_t cap) noexcept {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(static_cast<int>(t - 1));  // keys < 2^31: key >= t <=> key > t - 1, signed
  std::size_t c = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(v + i);
    __m256 b = _mm256_loadu_ps(v + i + 8);
    if constexpr (Acc) {
      a = _mm256_add_ps(_mm256_loadu_ps(g + i), a);
      b = _mm256_add_ps(_mm256_loadu_ps(g + i + 8), b);
      _mm256_storeu_ps(v + i, a);
      _mm256_storeu_ps(v + i + 8, b);
    }
    const __m256i ka = _mm256_and_si256(_mm256_castps_si256(a), abs_mask);
    const __m256i kb = _mm256_and_si256(_mm256_castps_si256(b), abs_mask);
    const __m256i ha = _mm256_cmpgt_epi32(ka, below);
    const __m256i hb = _mm256_cmpgt_epi32(kb, below);
    const __m256i any = _mm256_or_si256(ha, hb);
    if (!_mm256_testz_si256(any, any)) [[unlikely]] {
      alignas(32) std::uint32_t keys[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(keys), ka);
      _mm256_store_si256(reinterpret_cast<__m256i*>(keys + 8), kb);
      unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(ha))) |
                   (static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hb))) << 8);
      while (m != 0) {
        const unsigned j = static_cast<unsigned>(std::countr_zero(m));
        m &= m - 1;
        if (c == cap) {
          if constexpr (Acc) accumulate_into_residual(g + i + 16, v + i + 16, n - i - 16);
          return cap + 1;
        }
        cand[c] = pos0 + i + j;
        ckey[c++] = keys[j];
      }
    }
  }
  const std::size_t tail = gather_scalar<Acc>(g + i, v + i, n - i, t, pos0 + i, cand + c, ckey + c, cap - c);
  return tail > cap - c ? cap + 1 : c + tail;
}

inline bool cpu_has_avx2() noexcept {
  static const bool has = [] {
    __builtin_cpu_init();  // in case the first call comes from a static constructor
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#endif

template <bool Acc>
std::size_t gather(const float* g, float* v, std::size_t n, std::uint32_t t, std::uint64_t pos0, std::uint64_t* cand, std::uint32_t* ckey,
                   std::size_t cap) noexcept {
#if defined(GFLOW_TOPK_AVX2)
  if (cpu_has_avx2()) return gather_avx2<Acc>(g, v, n, t, pos0, cand, ckey, cap);
#endif
  return gather_scalar<Acc>(g, v, n, t, pos0, cand, ckey, cap);
}

// The rank-th largest key of the sample of G (g + v with Acc, else v).
template <bool Acc>
std::uint32_t sample_threshold(const float* g, const float* v, const topk_sample_plan& p, std::uint32_t* sample) noexcept {
  std::size_t m = 0;
  for (std::size_t s = 0; s < p.runs; ++s) {
    const std::size_t st = p.run_start(s);
    for (std::size_t j = st; j < st + topk_sample_plan::run; ++j) {
      float x = v[j];
      if constexpr (Acc) x = g[j] + x;
      sample[m++] = magnitude_key(x);
    }
  }
  std::nth_element(sample, sample + (p.rank - 1), sample + m, [](std::uint32_t a, std::uint32_t b) { return a > b; });
  return sample[p.rank - 1];
}

template <bool Acc, class I>
topk_result sampled_topk(const float* g, float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, topk_workspace& ws) noexcept {
  assert(ws.keys.size() >= n || k == 0 || k >= n);  // topk_workspace::reserve(n, k)
  topk_result r;
  const topk_sample_plan p = plan_topk_sample(n, k);
  const std::size_t cap = std::min(p.capacity, ws.cand.size());
  if (p.runs != 0 && cap >= k && ws.cand_key.size() >= cap && ws.sample.size() >= p.samples()) {
    const std::uint32_t t = sample_threshold<Acc>(g, v, p, ws.sample.data());
    if (t != 0) {  // t = 0 would make every element a candidate
      const std::size_t c = gather<Acc>(g, v, n, t, 0, ws.cand.data(), ws.cand_key.data(), cap);
      r.candidates = c;
      if (c >= k && c <= cap) {
        r.path = topk_path::candidates;
        r.count = select_candidates(ws.cand.data(), ws.cand_key.data(), c, k, base, out, ws.keys.data());
        return r;
      }
      r.path = c > cap ? topk_path::overflow : topk_path::too_few;
      r.count = select_topk(v, n, k, base, out, ws.keys.data());
      return r;
    }
  }
  if constexpr (Acc) accumulate_into_residual(g, v, n);
  r.count = select_topk(v, n, k, base, out, ws.keys.data());
  return r;
}

}  // namespace detail

/// G = g + residual into residual (g is only read), then exactly select_topk(G, n, k, base, out):
/// the k largest |G| (ties to the lower index, NaN above inf), base + position in increasing
/// order, min(k, n) of them. ws: reserve(n, k) (or larger) beforehand; nothing is allocated here.
template <class I>
topk_result accumulate_select_topk(const float* g, float* residual, std::size_t n, std::size_t k, std::uint64_t base, I* out,
                                   topk_workspace& ws) noexcept {
  return detail::sampled_topk<true>(g, residual, n, k, base, out, ws);
}

/// Exactly select_topk(v, n, k, base, out), by the same sample-and-gather method (v is only read).
template <class I>
topk_result select_topk_sampled(const float* v, std::size_t n, std::size_t k, std::uint64_t base, I* out, topk_workspace& ws) noexcept {
  float* w = const_cast<float*>(v);  // only read: without accumulation nothing is stored
  return detail::sampled_topk<false>(w, w, n, k, base, out, ws);
}

/// For each selected pool index: out[j] = W(sanitize(G[idx] * scale)); the residual keeps
/// G - float(out[j]) * unscale (0 when the wire value is not finite). G and residual are indexed
/// absolutely and may be the same array (the engine's residual holds G until selection). With an fp32 wire and scale 1 the residual of a
/// selected element is exactly 0; with a 16-bit wire it keeps the rounding error.
template <class I, class W>
void take_selected(const float* G, float* residual, const I* idx, std::size_t count, W* out, float scale, float unscale) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t i = static_cast<std::size_t>(idx[j]);
    const float v = G[i];
    const W w = wire_cast<W>(sanitize(v * scale));
    out[j] = w;
    const float d = to_float(w);
    residual[i] = !nonfinite_bit(d) ? v - d * unscale : 0.0f;
  }
}

/// True when every selected G[idx[j]] (count > 0) is inf / NaN: non-finite values rank above
/// every finite one, so only then can the residual still hold a non-finite value.
template <class I>
bool selection_all_nonfinite(const float* G, const I* idx, std::size_t count) noexcept {
  for (std::size_t j = 0; j < count; ++j)
    if (!nonfinite_bit(G[static_cast<std::size_t>(idx[j])])) return false;
  return count != 0;
}

/// res[i] = 0 where res[i] is inf / NaN; returns how many were cleared.
inline std::size_t clear_nonfinite(float* res, std::size_t n) noexcept {
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (nonfinite_bit(res[i])) {
      res[i] = 0.0f;
      ++c;
    }
  return c;
}

// ---- validating a received message (the format: support/sparse_message.hpp) -------------------

/// Reads a message of capacity k and checks it before anything is used: status 0, count <= k,
/// every index in [lo, hi) and strictly increasing (so no duplicates), no NaN value. Copies the
/// entries to idx / val only when the whole message is valid; never writes past k entries.
template <class I, class W>
sparse_message::unpack_result unpack_checked(const unsigned char* msg, std::size_t k, std::uint64_t lo, std::uint64_t hi, I* idx, W* val) noexcept {
  sparse_message::unpack_result r;
  r.header = sparse_message::read_header(msg);
  if (r.header.status != 0) {
    r.fault = sparse_message::fault_code::status;
    return r;
  }
  if (r.header.count > k) {
    r.fault = sparse_message::fault_code::count;
    r.position = r.header.count;
    return r;
  }
  const std::size_t count = static_cast<std::size_t>(r.header.count);
  const unsigned char* ip = msg + sparse_message::header_bytes;
  const unsigned char* vp = msg + sparse_message::header_bytes + k * sizeof(I);
  std::uint64_t prev = 0;
  for (std::size_t j = 0; j < count; ++j) {
    I x;
    std::memcpy(&x, ip + j * sizeof(I), sizeof(I));
    const std::uint64_t i = static_cast<std::uint64_t>(x);
    if (i < lo || i >= hi) {
      r.fault = sparse_message::fault_code::index;
      r.position = j;
      r.bad_index = i;
      return r;
    }
    if (j > 0 && i <= prev) {
      r.fault = sparse_message::fault_code::order;
      r.position = j;
      r.bad_index = i;
      return r;
    }
    prev = i;
    W w;
    std::memcpy(&w, vp + j * sizeof(W), sizeof(W));
    if (std::isnan(to_float(w))) {
      r.fault = sparse_message::fault_code::value;
      r.position = j;
      r.bad_index = i;
      return r;
    }
  }
  if (count) {
    std::memcpy(idx, ip, count * sizeof(I));
    std::memcpy(val, vp, count * sizeof(W));
  }
  r.count = count;
  return r;
}

/// dst[idx[j]] += float(val[j]) (indices distinct within one call).
template <class I, class W>
void scatter_add(float* dst, const I* idx, const W* val, std::size_t count) noexcept {
  for (std::size_t j = 0; j < count; ++j) dst[static_cast<std::size_t>(idx[j])] += to_float(val[j]);
}

/// out[j] = float(val[j]) * scale (the decoded values of a list, e.g. to scatter or count them).
template <class W>
void decode_scaled(const W* val, std::size_t count, float scale, float* out) noexcept {
  for (std::size_t j = 0; j < count; ++j) out[j] = to_float(val[j]) * scale;
}

/// dst[idx[j]] = v[j].
template <class I>
void scatter_set(float* dst, const I* idx, const float* v, std::size_t count) noexcept {
  for (std::size_t j = 0; j < count; ++j) dst[static_cast<std::size_t>(idx[j])] = v[j];
}

/// dst[idx[j]] *= scale, and out[j] = the result (to count inf / NaN among them).
template <class I>
void scale_at(float* dst, const I* idx, std::size_t count, float scale, float* out) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    float& x = dst[static_cast<std::size_t>(idx[j])];
    x = x * scale;
    out[j] = x;
  }
}

/// out[j] = dst[idx[j]].
template <class I>
void gather_at(const float* dst, const I* idx, std::size_t count, float* out) noexcept {
  for (std::size_t j = 0; j < count; ++j) out[j] = dst[static_cast<std::size_t>(idx[j])];
}

/// Scratch of merge_topk for lists of capacity k: 2k union entries.
template <class I>
struct merge_scratch {
  I* idx;              // 2k
  float* sum;          // 2k
  std::uint32_t* key;  // 2k
};

/// Definition 1 (paper 003) on two index-sorted lists a and b of at most k entries each:
/// values at equal indices are added (in fp32, after decoding; NaN from inf + -inf becomes
/// +inf), and the k largest |sum| are kept (ties: lower index), index-sorted, encoded to W in
/// out. Every other union entry is reported in `records` as (index, sum), and every kept entry
/// whose encoding rounded as (index, sum - float(W(sum))), all in index order: what the
/// merging rank must put back into its residual if the index is in the final global top-k
/// (restore_records_in). Returns the number kept; *records_count receives the records'.
template <class I, class W>
std::size_t merge_topk(const I* ai, const W* av, std::size_t na, const I* bi, const W* bv, std::size_t nb, std::size_t k, I* oi, W* ov,
                       I* ri, float* rv, std::size_t* records_count, merge_scratch<I> s) noexcept {
  // Union, index order.
  std::size_t a = 0, b = 0, u = 0;
  while (a < na || b < nb) {
    if (b == nb || (a < na && ai[a] < bi[b])) {
      s.idx[u] = ai[a];
      s.sum[u++] = to_float(av[a++]);
    } else if (a == na || bi[b] < ai[a]) {
      s.idx[u] = bi[b];
      s.sum[u++] = to_float(bv[b++]);
    } else {
      s.idx[u] = ai[a];
      s.sum[u++] = sanitize(to_float(av[a++]) + to_float(bv[b++]));
    }
  }
  std::size_t nrec = 0;
  std::size_t kept = 0;
  // Keeps union entry j: encodes it, and records its rounding error when the encoding rounded.
  auto keep = [&](std::size_t j) {
    const W w = wire_cast<W>(s.sum[j]);
    oi[kept] = s.idx[j];
    ov[kept++] = w;
    const float err = s.sum[j] - to_float(w);
    if (err != 0.0f && !nonfinite_bit(err)) {
      ri[nrec] = s.idx[j];
      rv[nrec++] = err;
    }
  };
  if (u <= k) {
    for (std::size_t j = 0; j < u; ++j) keep(j);
    *records_count = nrec;
    return kept;
  }
  const threshold t = radix_threshold(s.sum, u, k, s.key);
  std::size_t take = t.take;
  for (std::size_t j = 0; j < u; ++j) {
    const std::uint32_t key = magnitude_key(s.sum[j]);
    if (key > t.key || (key == t.key && take > 0)) {
      if (key == t.key) --take;
      keep(j);
    } else {
      ri[nrec] = s.idx[j];
      rv[nrec++] = s.sum[j];
    }
  }
  *records_count = nrec;
  return kept;
}

/// Algorithm 4 line 10: for each entry of this rank's own list (index-sorted) whose index is
/// not in the final list f (index-sorted), residual[idx] += float(val) * unscale (finite only).
template <class I, class W>
void restore_unselected(float* residual, const I* ai, const W* av, std::size_t na, const I* fi, std::size_t nf, float unscale) noexcept {
  std::size_t p = 0;
  for (std::size_t j = 0; j < na; ++j) {
    while (p < nf && fi[p] < ai[j]) ++p;
    if (p < nf && fi[p] == ai[j]) continue;
    const float v = to_float(av[j]) * unscale;
    if (!nonfinite_bit(v)) residual[static_cast<std::size_t>(ai[j])] += v;
  }
}

/// The completion of line 10 that keeps gTop-k lossless: a merge record (index, value) whose
/// index IS in the final list f goes back into this rank's residual (value * unscale, finite
/// only). Records of indices outside f are dropped here, because their owners restore the
/// whole original values (restore_unselected).
template <class I>
void restore_records_in(float* residual, const I* ri, const float* rv, std::size_t nr, const I* fi, std::size_t nf, float unscale) noexcept {
  std::size_t p = 0;
  for (std::size_t j = 0; j < nr; ++j) {
    while (p < nf && fi[p] < ri[j]) ++p;
    if (p < nf && fi[p] == ri[j]) {
      const float v = rv[j] * unscale;
      if (!nonfinite_bit(v)) residual[static_cast<std::size_t>(ri[j])] += v;
    }
  }
}

}  // namespace gflow::kernels
