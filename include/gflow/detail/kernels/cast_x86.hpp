#pragma once
// The AVX2 + F16C half of kernels/cast.hpp (namespace kernels::simd): each kernel bitwise identical
// to its scalar reference (kernels/cast_scalar.hpp), compiled per function with
// __attribute__((target("avx2,f16c"))) so that no -march flag is needed. Where it is not compiled
// (other targets, nvcc's device pass, GFLOW_NO_SIMD) the kernels forward to the reference and
// simd::available() is false.
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && !defined(GFLOW_NO_SIMD)
#define GFLOW_KERNELS_X86_SIMD 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define GFLOW_KERNELS_X86_SIMD 0
#endif

#include "cast_scalar.hpp"

namespace gflow::detail::kernels {

// ---- the AVX2 + F16C twins ---------------------------------------------------------------------
// Call a simd:: kernel only where simd::available(); each is bitwise identical to its reference
// twin for every input, n and alignment (tails run the reference). Not compiled: they forward.
namespace simd {

#if GFLOW_KERNELS_X86_SIMD

/// True when this CPU runs AVX2 and F16C (and the OS saves the YMM registers). Evaluated once.
inline bool available() noexcept {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C)) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;  // checks OS support (XGETBV) as well
  }();
  return ok;
}

#define GFLOW_X86_AVX2 __attribute__((target("avx2,f16c")))
#define GFLOW_X86_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline))

namespace x86 {

// 8 fp32 -> 8 fp16, as to_half: NaN lanes are replaced by 0x7fffe000, which vcvtps2ph turns
// into 0x7fff; everything else is IEEE round-to-nearest-even (imm 0), as the reference.
GFLOW_X86_AVX2_INLINE inline __m128i narrow_half(__m256 v) noexcept {
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffe000)), nan);
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}

// 8 fp32 -> 8 bf16, as to_bfloat16: integer round to nearest even, NaN -> 0x7fff.
GFLOW_X86_AVX2_INLINE inline __m128i narrow_bf16(__m256 v) noexcept {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fff), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));  // 0..0xffff: no saturation
}

template <class W>
GFLOW_X86_AVX2_INLINE inline __m128i narrow(__m256 v) noexcept {
  if constexpr (std::is_same_v<W, half>) return narrow_half(v);
  else return narrow_bf16(v);
}

// 8 fp16 -> 8 fp32, as to_float; `bad` gets -1 in inf / NaN lanes. vcvtph2ps is exact except
// that it quiets a signalling NaN: inf / NaN lanes are rebuilt from the bits.
GFLOW_X86_AVX2_INLINE inline __m256 widen_half(__m128i h, __m256i& bad) noexcept {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256i x = _mm256_cvtepu16_epi32(h);
  bad = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7c00)), _mm256_set1_epi32(0x7c00));
  const __m256i special = _mm256_or_si256(
      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x8000)), 16), _mm256_set1_epi32(0x7f800000)),
      _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x3ff)), 13));
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(special), _mm256_castsi256_ps(bad));
}

// 8 bf16 -> 8 fp32 (a shift); `bad` gets -1 in inf / NaN lanes.
GFLOW_X86_AVX2_INLINE inline __m256 widen_bf16(__m128i h, __m256i& bad) noexcept {
  const __m256i x = _mm256_cvtepu16_epi32(h);
  bad = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7f80)), _mm256_set1_epi32(0x7f80));
  return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

template <class W>
GFLOW_X86_AVX2_INLINE inline __m256 widen(__m128i h, __m256i& bad) noexcept {
  if constexpr (std::is_same_v<W, half>) return widen_half(h, bad);
  else return widen_bf16(h, bad);
}

// Widening for the reduction ops, where a NaN's payload does not matter (every NaN result
// rounds to 0x7fff): fp16 uses vcvtph2ps alone.
template <class W>
GFLOW_X86_AVX2_INLINE inline __m256 widen_value(__m128i h) noexcept {
  if constexpr (std::is_same_v<W, half>) return _mm256_cvtph_ps(h);
  else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <reduce_op Op>
GFLOW_X86_AVX2_INLINE inline __m256 combine(__m256 x, __m256 y) noexcept {
  if constexpr (Op == reduce_op::sum) return _mm256_add_ps(x, y);
  else if constexpr (Op == reduce_op::max) return _mm256_max_ps(x, y);  // x > y ? x : y
  else return _mm256_min_ps(x, y);                                       // x < y ? x : y
}

GFLOW_X86_AVX2_INLINE inline __m128i load8(const void* p) noexcept { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
GFLOW_X86_AVX2_INLINE inline void store8(void* p, __m128i v) noexcept { _mm_storeu_si128(static_cast<__m128i*>(p), v); }

GFLOW_X86_AVX2_INLINE inline std::size_t lane_sum(__m256i c) noexcept {  // 8 lanes of negative counts
  alignas(32) std::uint32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), _mm256_sub_epi32(_mm256_setzero_si256(), c));
  std::size_t s = 0;
  for (std::uint32_t v : l) s += v;
  return s;
}

template <class W>
GFLOW_X86_AVX2 void scale_to_wire(const float* in, W* out, std::size_t n, float scale) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(in + i), s);
    const __m256 b = _mm256_mul_ps(_mm256_loadu_ps(in + i + 8), s);
    store8(out + i, narrow<W>(a));
    store8(out + i + 8, narrow<W>(b));
  }
  for (; i + 8 <= n; i += 8) store8(out + i, narrow<W>(_mm256_mul_ps(_mm256_loadu_ps(in + i), s)));
  reference::scale_to_wire(in + i, out + i, n - i, scale);
}

template <class W>
GFLOW_X86_AVX2 void to_wire(const float* in, W* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store8(out + i, narrow<W>(_mm256_loadu_ps(in + i)));
  reference::to_wire(in + i, out + i, n - i);
}

template <class W>
GFLOW_X86_AVX2 std::size_t wire_to_float(const W* in, float* out, std::size_t n) noexcept {
  std::size_t bad = 0, i = 0;
  while (n - i >= 8) {
    // Per-lane counters of at most count_block / 8 elements each: no 32-bit overflow.
    const std::size_t end = n - i > kernels::detail::count_block ? i + kernels::detail::count_block : n;
    __m256i c = _mm256_setzero_si256();
    for (; i + 16 <= end; i += 16) {
      __m256i b0, b1;
      _mm256_storeu_ps(out + i, widen<W>(load8(in + i), b0));
      _mm256_storeu_ps(out + i + 8, widen<W>(load8(in + i + 8), b1));
      c = _mm256_add_epi32(c, _mm256_add_epi32(b0, b1));
    }
    for (; i + 8 <= end; i += 8) {
      __m256i b0;
      _mm256_storeu_ps(out + i, widen<W>(load8(in + i), b0));
      c = _mm256_add_epi32(c, b0);
    }
    bad += lane_sum(c);
  }
  return bad + reference::wire_to_float(in + i, out + i, n - i);
}

// Out of line and 64-byte aligned, so that where its loop lands does not move with the code
// around its callers (docs/BENCHMARKS.md, "Code placement").
__attribute__((target("avx2,f16c"), noinline, aligned(64))) inline std::size_t scale_in_place(float* buf, std::size_t n,
                                                                                               float scale) noexcept {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  std::size_t bad = 0, i = 0;
  while (n - i >= 8) {
    // Per-lane counters of at most count_block / 8 elements each: no 32-bit overflow.
    const std::size_t end = n - i > kernels::detail::count_block ? i + kernels::detail::count_block : n;
    __m256i c = _mm256_setzero_si256();
    for (; i + 16 <= end; i += 16) {
      const __m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(buf + i), s);
      const __m256 v1 = _mm256_mul_ps(_mm256_loadu_ps(buf + i + 8), s);
      _mm256_storeu_ps(buf + i, v0);
      _mm256_storeu_ps(buf + i + 8, v1);
      const __m256i b0 = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v0), exp), exp);
      const __m256i b1 = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v1), exp), exp);
      c = _mm256_add_epi32(c, _mm256_add_epi32(b0, b1));
    }
    for (; i + 8 <= end; i += 8) {
      const __m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(buf + i), s);
      _mm256_storeu_ps(buf + i, v0);
      c = _mm256_add_epi32(c, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v0), exp), exp));
    }
    bad += lane_sum(c);
  }
  return bad + reference::scale_in_place(buf + i, n - i, scale);
}

template <class W>
GFLOW_X86_AVX2 void add_to_wire_keep_error(const float* a, float* hist, W* out, std::size_t n, float scale, float unscale) noexcept {
  const __m256 s = _mm256_set1_ps(scale), u = _mm256_set1_ps(unscale);
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(hist + i));
    const __m128i w = narrow<W>(_mm256_mul_ps(g, s));
    store8(out + i, w);
    // A NaN's payload does not matter here: the error is then NaN and becomes 0.
    const __m256 e = _mm256_sub_ps(g, _mm256_mul_ps(widen_value<W>(w), u));
    const __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(e), exp), exp);
    _mm256_storeu_ps(hist + i, _mm256_andnot_ps(_mm256_castsi256_ps(bad), e));
  }
  reference::add_to_wire_keep_error(a + i, hist + i, out + i, n - i, scale, unscale);
}

template <reduce_op Op, class W>
GFLOW_X86_AVX2 void combine_wire(const W* in, W* inout, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 r0 = combine<Op>(widen_value<W>(load8(in + i)), widen_value<W>(load8(inout + i)));
    const __m256 r1 = combine<Op>(widen_value<W>(load8(in + i + 8)), widen_value<W>(load8(inout + i + 8)));
    store8(inout + i, narrow<W>(r0));
    store8(inout + i + 8, narrow<W>(r1));
  }
  for (; i + 8 <= n; i += 8) store8(inout + i, narrow<W>(combine<Op>(widen_value<W>(load8(in + i)), widen_value<W>(load8(inout + i)))));
  reference::combine_wire<Op>(in + i, inout + i, n - i);
}

template <reduce_op Op, class W>
GFLOW_X86_AVX2 void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, combine<Op>(widen_value<W>(load8(in + i)), _mm256_loadu_ps(acc + i)));
  reference::accumulate_wire<Op>(in + i, acc + i, n - i);
}

#undef GFLOW_X86_AVX2_INLINE
#undef GFLOW_X86_AVX2

}  // namespace x86

inline void scale_to_wire(const float* in, half* out, std::size_t n, float scale) noexcept { x86::scale_to_wire(in, out, n, scale); }
inline void scale_to_wire(const float* in, bfloat16* out, std::size_t n, float scale) noexcept { x86::scale_to_wire(in, out, n, scale); }
inline void to_wire(const float* in, half* out, std::size_t n) noexcept { x86::to_wire(in, out, n); }
inline void to_wire(const float* in, bfloat16* out, std::size_t n) noexcept { x86::to_wire(in, out, n); }
inline std::size_t wire_to_float(const half* in, float* out, std::size_t n) noexcept { return x86::wire_to_float(in, out, n); }
inline std::size_t wire_to_float(const bfloat16* in, float* out, std::size_t n) noexcept { return x86::wire_to_float(in, out, n); }
inline void add_to_wire_keep_error(const float* a, float* hist, half* out, std::size_t n, float scale, float unscale) noexcept {
  x86::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
}
inline void add_to_wire_keep_error(const float* a, float* hist, bfloat16* out, std::size_t n, float scale, float unscale) noexcept {
  x86::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
}
inline std::size_t scale_in_place(float* buf, std::size_t n, float scale) noexcept { return x86::scale_in_place(buf, n, scale); }
template <reduce_op Op, class W>
void combine_wire(const W* in, W* inout, std::size_t n) noexcept {
  static_assert(is_wire16<W>);
  x86::combine_wire<Op>(in, inout, n);
}
template <reduce_op Op, class W>
void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept {
  static_assert(is_wire16<W>);
  x86::accumulate_wire<Op>(in, acc, n);
}

#else  // no SIMD path compiled: the reference, and available() is false

constexpr bool available() noexcept { return false; }
template <class W>
void scale_to_wire(const float* in, W* out, std::size_t n, float scale) noexcept { reference::scale_to_wire(in, out, n, scale); }
template <class W>
void to_wire(const float* in, W* out, std::size_t n) noexcept { reference::to_wire(in, out, n); }
template <class W>
std::size_t wire_to_float(const W* in, float* out, std::size_t n) noexcept { return reference::wire_to_float(in, out, n); }
template <class W>
void add_to_wire_keep_error(const float* a, float* hist, W* out, std::size_t n, float scale, float unscale) noexcept {
  reference::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
}
inline std::size_t scale_in_place(float* buf, std::size_t n, float scale) noexcept { return reference::scale_in_place(buf, n, scale); }
template <reduce_op Op, class W>
void combine_wire(const W* in, W* inout, std::size_t n) noexcept { reference::combine_wire<Op>(in, inout, n); }
template <reduce_op Op, class W>
void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept { reference::accumulate_wire<Op>(in, acc, n); }

#endif

}  // namespace simd

}  // namespace gflow::detail::kernels
