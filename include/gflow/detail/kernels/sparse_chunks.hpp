#pragma once
// Host kernels of coarse-grained sparse communication (CSC, GradientFlow (Sun et al.) section 3.2 and
// Algorithm 1). These are the references: the CUDA twins in include/gflow/detail/cuda/sparse_chunks.cuh
// have the same semantics (tests/cuda/test_csc.cu compares them) for the kernels they have (not
// yet compact_chunks_to_wire, scatter_chunks_counted, scatter_chunks_from_wire: the engine's
// device path does not exist).
//
// The pool of n elements is cut into chunks of C elements: chunk c covers
// [c * C, min((c + 1) * C, n)), so only the last chunk can be partial. Chunk lists are arrays of
// 32-bit chunk indices in ascending order (so that compacted chunk j starts at j * C in the buffer).
//
//   chunk_l1_norms(pool, n, C, list, count, norms, scale)   norms[c] = scale * sum |pool[i]|, i in chunk c
//   compact_chunks(pool, hist, n, C, list, count, out)      out = pool + hist over the listed chunks, back to
//                                                            back; hist = 0 there (Algorithm 1, selected;
//                                                            the fp32 wire)
//   compact_chunks_to_wire(pool, hist, n, C, list, count,   g = pool + hist; out = W(g * s) back to back;
//                          out, s, u)                        hist = g - float(out) * u there, the rounding
//                                                            error of the 16-bit encoding (0 where that is
//                                                            inf/NaN); s = 1/P, u = P when averaging, else 1
//   scatter_chunks(buf, pool, n, C, list, count, norms, s)  pool = buf over the listed chunks; optionally
//                                                            norms[c] = s * L1 of what was scattered
//   scatter_chunks_counted(buf, pool, ..., mul, v, norms, s) the same with pool = buf * v when mul (the fp32
//                                                            average), returning how many values written are
//                                                            inf/NaN
//   scatter_chunks_from_wire(wire, pool, ..., norms, s)     pool = float(wire) over the listed chunks, norms as
//                                                            above; returns how many are inf/NaN
//   defer_chunks(pool, hist, n, C, list, count, m, norms)   g = pool + hist; norms[c] = L1(g); hist = m * g
//                                                            (0 where g is inf/NaN); pool = 0 (Algorithm 1,
//                                                            unselected)
//   chunk_key(norm)                                          the order selection uses (NaN highest)
//   select_top_chunks(norms, chunks, k, out)                 out[0, k): the k chunks with the largest norms,
//                                                            ties to the lower index, ascending;
//                                                            out[k, chunks): the others, ascending
//
// L1 norms are accumulated in double, in one order for the host and the CUDA kernels (cuda/
// sparse_chunks.cuh: a block of 256 threads per chunk), so that host and device exchanges select
// the same chunks bit for bit and the device pays nothing to follow the host: 256 lanes, lane l
// adding |x_j| for the chunk's elements j = l, l + 256, l + 512, ... (j counted from the chunk's
// first element) in increasing j; then the lanes fold pairwise, lane l += lane l + h for l < h, h =
// 128, 64, ..., 1; lane 0's total is rounded to float once, then times the scale in float. Every
// rank runs the same order, so ranks agree. (The host kernels add a block of values to the lanes
// just after writing it, while it is in L1: one pass over memory.)

// The loops are written in groups of 8 with restrict-qualified pointers so that GCC and Clang
// vectorise them (SSE2 baseline; no target flags needed); the pointers of one call must not
// overlap. Kernels that convert to or from a 16-bit wire type go through kernels/cast.hpp (AVX2 +
// F16C where available, bitwise identical to the scalar reference).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "cast.hpp"

// GCC -O2 does not vectorise a loop whose trip count is unknown; a fully unrolled group of 8 it
// does (basic-block SLP), so the groups of 8 below are unrolled explicitly. Not under nvcc, whose
// front end does not know the pragma (warning 1675) even in host code.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define GFLOW_UNROLL8 _Pragma("GCC unroll 8")
#else
#define GFLOW_UNROLL8
#endif

namespace gflow::detail::kernels {

namespace detail {
inline constexpr std::size_t chunk_begin(std::size_t c, std::size_t C) noexcept { return c * C; }
inline constexpr std::size_t chunk_end(std::size_t c, std::size_t n, std::size_t C) noexcept {
  const std::size_t e = (c + 1) * C;
  return e < n ? e : n;
}

/// The norm's lanes (see the header comment).
inline constexpr std::size_t norm_lanes = 256;
struct l1_lanes {
  alignas(64) double s[norm_lanes] = {};
};

#if GFLOW_KERNELS_X86_SIMD
// The whole rows of l1_add / l1_add_sum with AVX2 (4 lanes per instruction), bitwise the scalar
// loops: each lane gets the same double additions in the same order (vcvtps2pd, the sign cleared
// by a mask as std::fabs does, vaddpd with the lane's sum as the first operand; l1_add_sum adds
// in float first, as the scalar loop). The scalar loops are compute-bound on SSE2 and ran at
// about 1.2x the 8-lane kernel's time on this project's VM; these run at the copy's.
__attribute__((target("avx2"))) inline void l1_rows_avx2(double* __restrict s, const float* __restrict v, const float* __restrict h, std::size_t rows) noexcept {
  const __m256d sign_off = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  for (std::size_t r = 0; r < rows; ++r, v += norm_lanes, h += (h != nullptr ? norm_lanes : 0))
    for (std::size_t k = 0; k < norm_lanes; k += 4) {
      __m128 x = _mm_loadu_ps(v + k);
      if (h != nullptr) x = _mm_add_ps(x, _mm_loadu_ps(h + k));
      const __m256d a = _mm256_and_pd(_mm256_cvtps_pd(x), sign_off);
      _mm256_store_pd(s + k, _mm256_add_pd(_mm256_load_pd(s + k), a));
    }
}
#endif

/// Lane k adds |v[j]| for j = k mod 256. v[0] must sit at a multiple of 256 from its chunk's start.
inline void l1_add(l1_lanes& acc, const float* __restrict v, std::size_t m) noexcept {
  double* __restrict s = acc.s;
  std::size_t j = 0;
#if GFLOW_KERNELS_X86_SIMD
  if (simd::available()) {
    l1_rows_avx2(s, v, nullptr, m / norm_lanes);
    j = m / norm_lanes * norm_lanes;
  }
#endif
  for (; j + norm_lanes <= m; j += norm_lanes)
    for (std::size_t k = 0; k < norm_lanes; ++k) s[k] += std::fabs(static_cast<double>(v[j + k]));
  for (std::size_t k = 0; j < m; ++j, ++k) s[k] += std::fabs(static_cast<double>(v[j]));
}

/// The same for the values p[j] + h[j] (rounded to float first, as the element-wise kernels add).
inline void l1_add_sum(l1_lanes& acc, const float* __restrict p, const float* __restrict h, std::size_t m) noexcept {
  double* __restrict s = acc.s;
  std::size_t j = 0;
#if GFLOW_KERNELS_X86_SIMD
  if (simd::available()) {
    l1_rows_avx2(s, p, h, m / norm_lanes);
    j = m / norm_lanes * norm_lanes;
  }
#endif
  for (; j + norm_lanes <= m; j += norm_lanes)
    for (std::size_t k = 0; k < norm_lanes; ++k) s[k] += std::fabs(static_cast<double>(p[j + k] + h[j + k]));
  for (std::size_t k = 0; j < m; ++j, ++k) s[k] += std::fabs(static_cast<double>(p[j] + h[j]));
}

/// The pairwise fold of the lanes, rounded to float once (consumes the lanes).
inline float l1_total(l1_lanes& acc) noexcept {
  double* s = acc.s;
  for (std::size_t h = norm_lanes / 2; h >= 1; h /= 2)
    for (std::size_t l = 0; l < h; ++l) s[l] += s[l + h];
  return static_cast<float>(s[0]);
}

/// Blocks the fused kernels write and then add to the lanes (a multiple of 256; 16 KB of fp32,
/// in L1 when read back).
inline constexpr std::size_t norm_block = 4096;

/// o = p + h; h = 0.
inline void add_and_clear(const float* __restrict p, float* __restrict h, float* __restrict o, std::size_t m) noexcept {
  std::size_t j = 0;
  for (; j + 8 <= m; j += 8)
    GFLOW_UNROLL8
    for (std::size_t k = 0; k < 8; ++k) {
      o[j + k] = p[j + k] + h[j + k];
      h[j + k] = 0.0f;
    }
  for (; j < m; ++j) {
    o[j] = p[j] + h[j];
    h[j] = 0.0f;
  }
}

/// out = in (times vs when Mul) over one range; returns how many values written are inf/NaN
/// (m < 2^32).
template <bool Mul>
std::size_t scatter_range(const float* __restrict in, float* __restrict out, std::size_t m, float vs) noexcept {
  std::uint32_t bad[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    float v[8];
    GFLOW_UNROLL8
    for (std::size_t l = 0; l < 8; ++l) v[l] = Mul ? in[i + l] * vs : in[i + l];
    GFLOW_UNROLL8
    for (std::size_t l = 0; l < 8; ++l) out[i + l] = v[l];
    GFLOW_UNROLL8
    for (std::size_t l = 0; l < 8; ++l) bad[l] += nonfinite_bit(v[l]);
  }
  for (std::size_t l = 0; i < m; ++i, ++l) {
    const float v = Mul ? in[i] * vs : in[i];
    out[i] = v;
    bad[l] += nonfinite_bit(v);
  }
  return std::size_t{bad[0]} + bad[1] + bad[2] + bad[3] + bad[4] + bad[5] + bad[6] + bad[7];
}

/// scatter_range over one chunk, block by block, each block's written values then added to the
/// norm's lanes (when acc is not null).
template <bool Mul>
std::size_t scatter_chunk(const float* __restrict in, float* __restrict out, std::size_t m, float vs, l1_lanes* acc) noexcept {
  std::size_t bad = 0;
  for (std::size_t o = 0; o < m; o += norm_block) {
    const std::size_t mb = m - o < norm_block ? m - o : norm_block;
    bad += scatter_range<Mul>(in + o, out + o, mb, vs);
    if (acc != nullptr) l1_add(*acc, out + o, mb);  // just written: in L1
  }
  return bad;
}

}  // namespace detail

/// norms[list[j]] = scale * (L1 norm of chunk list[j] of the pool), for j < count.
inline void chunk_l1_norms(const float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float* norms,
                           float scale = 1.0f) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    detail::l1_lanes s;
    detail::l1_add(s, pool + b, e - b);
    norms[c] = scale * detail::l1_total(s);
  }
}

/// Copies the listed chunks of pool + hist back to back into out (when hist is null, of pool
/// alone) and clears hist there. Returns the elements written.
inline std::size_t compact_chunks(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                  float* out) noexcept {
  std::size_t k = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    if (hist != nullptr) detail::add_and_clear(pool + b, hist + b, out + k, e - b);
    else if (e > b) std::memcpy(out + k, pool + b, (e - b) * sizeof(float));
    k += e - b;
  }
  return k;
}

/// compact_chunks for a 16-bit wire, with the cast fused in: per element of the listed chunks,
/// g = pool + hist, out = wire_cast<W>(g * scale) back to back, and hist keeps the rounding
/// error of that encoding, g - to_float(out) * unscale, or 0 where that is inf/NaN (g, or its
/// encoding, not finite: non-finite values never enter the history). With scale = 1/P and
/// unscale = P (averaging) or both 1 (sums), sum over ranks of (P or 1) * to_float(out) + hist
/// is the sum of g exactly, as far as the 16-bit sum itself is exact. Returns the elements written.
template <class W>
std::size_t compact_chunks_to_wire(const float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                   W* out, float scale, float unscale) noexcept {
  std::size_t k = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    add_to_wire_keep_error(pool + b, hist + b, out + k, e - b, scale, unscale);
    k += e - b;
  }
  return k;
}

/// The inverse of compact_chunks: the listed chunks of pool = buf, read back to back. When norms
/// is not null, norms[c] = scale * (L1 norm of the values written into chunk c). Returns the
/// elements read.
inline std::size_t scatter_chunks(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                  float* norms = nullptr, float scale = 1.0f) noexcept {
  std::size_t k = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    if (norms != nullptr) {
      detail::l1_lanes s;
      (void)detail::scatter_chunk<false>(buf + k, pool + b, e - b, 1.0f, &s);
      norms[c] = scale * detail::l1_total(s);
    } else if (e > b) {
      std::memcpy(pool + b, buf + k, (e - b) * sizeof(float));
    }
    k += e - b;
  }
  return k;
}

/// The end of an fp32 exchange of compacted chunks fused with the scatter: the listed chunks of
/// pool = buf * value_scale when `multiply` (the average), else a copy of buf (bits kept), read
/// back to back; norms as scatter_chunks. Returns how many values written are inf or NaN (what
/// scale_in_place / count_nonfinite would count over the buffer).
inline std::size_t scatter_chunks_counted(const float* buf, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                          bool multiply, float value_scale, float* norms, float norm_scale) noexcept {
  std::size_t k = 0, bad = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    detail::l1_lanes s;
    detail::l1_lanes* acc = norms != nullptr ? &s : nullptr;
    bad += multiply ? detail::scatter_chunk<true>(buf + k, pool + b, e - b, value_scale, acc)
                    : detail::scatter_chunk<false>(buf + k, pool + b, e - b, 1.0f, acc);
    if (norms != nullptr) norms[c] = norm_scale * detail::l1_total(s);
    k += e - b;
  }
  return bad;
}

/// The inverse of compact_chunks_to_wire after the exchange: the listed chunks of pool =
/// to_float(wire), read back to back; norms as scatter_chunks. Returns how many values are inf
/// or NaN.
template <class W>
std::size_t scatter_chunks_from_wire(const W* wire, float* pool, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count,
                                     float* norms, float norm_scale) noexcept {
  constexpr std::size_t block = detail::norm_block;  // a multiple of 256: the norm's lanes run on across blocks
  std::size_t k = 0, bad = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    detail::l1_lanes s;
    for (std::size_t o = b; o < e; o += block) {
      const std::size_t mb = e - o < block ? e - o : block;
      bad += wire_to_float(wire + k + (o - b), pool + o, mb);
      if (norms != nullptr) detail::l1_add(s, pool + o, mb);  // just written: in L1
    }
    if (norms != nullptr) norms[c] = norm_scale * detail::l1_total(s);
    k += e - b;
  }
  return bad;
}

/// Algorithm 1 for the chunks that are not exchanged this iteration: the accumulated gradient
/// g = pool + hist stays local, its L1 norm goes to norms[c] (when norms is not null), the
/// history keeps momentum * g, and the pool is cleared (the optimizer sees no gradient there).
/// A non-finite g is not kept (its history element becomes 0: an inf/NaN in the history would
/// poison every later exchange of the chunk); it still makes the chunk's norm inf/NaN, which is
/// how the engine reports it on every rank once the norms are allreduced.
inline void defer_chunks(float* pool, float* hist, std::size_t n, std::size_t C, const std::uint32_t* list, std::size_t count, float momentum,
                         float* norms) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const std::size_t c = list[j];
    const std::size_t b = detail::chunk_begin(c, C), e = detail::chunk_end(c, n, C);
    float* __restrict p = pool + b;
    float* __restrict h = hist + b;
    const std::size_t m = e - b;
    detail::l1_lanes s;
    for (std::size_t o = 0; o < m; o += detail::norm_block) {
      const std::size_t mb = m - o < detail::norm_block ? m - o : detail::norm_block;
      if (norms != nullptr) detail::l1_add_sum(s, p + o, h + o, mb);  // g = p + h, before the block is updated (then in L1)
      std::size_t i = o;
      for (; i + 8 <= o + mb; i += 8) {
        float g[8];
        GFLOW_UNROLL8
        for (std::size_t l = 0; l < 8; ++l) g[l] = p[i + l] + h[i + l];
        GFLOW_UNROLL8
        for (std::size_t l = 0; l < 8; ++l) h[i + l] = finite_or_zero(momentum * g[l]);
        GFLOW_UNROLL8
        for (std::size_t l = 0; l < 8; ++l) p[i + l] = 0.0f;
      }
      for (; i < o + mb; ++i) {
        const float g = p[i] + h[i];
        h[i] = finite_or_zero(momentum * g);
        p[i] = 0.0f;
      }
    }
    if (norms != nullptr) norms[c] = detail::l1_total(s);
  }
}

/// The order chunk selection uses, as an unsigned key: larger key = more important. Finite
/// values and infinities keep their order; every NaN ranks above +inf, so a chunk whose norm is
/// NaN is exchanged (and reported) rather than kept back forever.
constexpr std::uint32_t chunk_key(float norm) noexcept {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(norm);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);        // the usual float -> ordered uint map
}

/// Top-k chunk selection with a deterministic tie-break: out[0, k) holds the k chunks with the
/// largest chunk_key(norms[c]), equal keys going to the lower chunk index, in ascending index
/// order; out[k, chunks) holds every other chunk, ascending. k is clamped to [0, chunks].
/// Allocates nothing (out is the scratch). Every rank that passes the same norms gets the same
/// lists.
inline void select_top_chunks(const float* norms, std::size_t chunks, std::size_t k, std::uint32_t* out) {
  if (k > chunks) k = chunks;
  std::iota(out, out + chunks, std::uint32_t{0});
  if (k != 0 && k != chunks) {
    // A strict total order (key descending, then index ascending): nth_element is deterministic.
    auto more_important = [norms](std::uint32_t a, std::uint32_t b) {
      const std::uint32_t ka = chunk_key(norms[a]), kb = chunk_key(norms[b]);
      return ka != kb ? ka > kb : a < b;
    };
    std::nth_element(out, out + k, out + chunks, more_important);
    std::sort(out, out + k);
    std::sort(out + k, out + chunks);
  }
}

}  // namespace gflow::detail::kernels

#undef GFLOW_UNROLL8
