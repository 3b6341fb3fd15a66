#pragma once
// The exact Top-k selection in about one pass (sampled threshold, one gathering pass, a radix
// select among the candidates, the full selection as the fallback): the same indices as
// select_topk (kernels/topk_select.hpp) for every input.
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(GFLOW_NO_AVX2)
#include <immintrin.h>
#define GFLOW_TOPK_AVX2 1
#endif

#include "cast.hpp"
#include "topk_select.hpp"

namespace gflow::detail::kernels {
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
// The sampled selection has no CUDA twin (the device selection is cuda::topk_selector, which
// equals select_topk and so these); accumulate_gather_above below has one, cuda/oktopk.cuh.

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

/// A threshold selection in one pass (OkTopK's, engines/oktopk/select.hpp): G = g + residual into
/// residual over the whole unit (g is only read) and, in increasing order, base + i and the key
/// of every element whose key is >= t (t >= 1: zeros are never gathered), at most cap of them.
/// Returns how many were gathered, or cap + 1 when there were more (then pos / keys hold the
/// first cap). The gathering pass (b) of accumulate_select_topk with the caller's threshold:
/// AVX2 where the CPU has it, the scalar twin elsewhere, the same float addition either way.
/// The device twin is cuda::threshold_gatherer (cuda/oktopk.cuh), the same bits (NaN + NaN aside).
inline std::size_t accumulate_gather_above(const float* g, float* residual, std::size_t n, std::uint32_t t, std::uint64_t base,
                                           std::uint64_t* pos, std::uint32_t* keys, std::size_t cap) noexcept {
  assert(t >= 1);
  return detail::gather<true>(g, residual, n, t, base, pos, keys, cap);
}

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

}  // namespace gflow::detail::kernels
