#pragma once
// Host kernels of the Precision policy: fp32 <-> fp16 / bf16 conversion, scaling, the
// non-finite check and the 16-bit reduction ops of the host transports.
//
// Two implementations of every 16-bit kernel, with bitwise identical results:
//   - the scalar reference: to_half, to_bfloat16, to_float and the loops in namespace
//     kernels::reference. The CUDA twins in include/gflow/cuda/cast.cuh produce bit-identical
//     results (tests/test_cast.cpp checks these host versions against CUDA's own
//     __float2half_rn / __float2bfloat16_rn over ties, subnormals, overflow and NaN);
//   - namespace kernels::simd: AVX2 + F16C on x86-64 (GCC or Clang), compiled per function with
//     __attribute__((target("avx2,f16c"))), so no -march flag is needed. tests/test_cast_exhaustive
//     .cpp checks them against the reference over all 2^32 fp32 inputs (fp16 with scale 1 and 1/3,
//     bf16), tests/test_cast.cpp over every 16-bit pattern, edge pairs and random pairs. Where they
//     are not compiled (other targets, nvcc's device pass, GFLOW_NO_SIMD defined) they forward to
//     the reference and simd::available() is false.
// The dispatching kernels (scale_to_wire, wire_to_float, to_wire, add_to_wire_keep_error,
// combine_wire, accumulate_wire)
// choose once per process (simd::available(), a cached CPUID check) and never per element.
//
// Rounding is round-to-nearest-even. NaN converts to the canonical NaN 0x7fff (fp16 and bf16, any
// sign or payload), as CUDA does; F16C's vcvtps2ph would keep the sign and payload, so the SIMD
// path puts a NaN that converts to 0x7fff into NaN lanes first. Widening is exact and keeps a
// NaN's sign and payload (vcvtph2ps would quiet a signalling NaN: the SIMD path rebuilds NaN lanes
// from the bits). bf16 rounding is the integer (x + 0x7fff + ((x >> 16) & 1)) >> 16. The 16-bit
// conversions ignore the MXCSR's FTZ / DAZ on both paths; products and sums (in[i] * scale,
// x + y) are the same fp32 operations on both paths.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../dtype.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && !defined(GFLOW_NO_SIMD)
#define GFLOW_KERNELS_X86_SIMD 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define GFLOW_KERNELS_X86_SIMD 0
#endif

namespace gflow::kernels {

/// fp32 -> fp16, round to nearest even; the same algorithm as CUDA's host __float2half_rn.
constexpr half to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t u = x & 0x7fffffffu;
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t result;
  std::uint32_t remainder;
  if (u >= 0x7f800000u) {  // inf or NaN
    remainder = 0;
    result = (u == 0x7f800000u) ? (sign | 0x7c00u) : 0x7fffu;
  } else if (u > 0x477fefffu) {  // rounds to inf
    remainder = 0x80000000u;
    result = sign | 0x7bffu;
  } else if (u >= 0x38800000u) {  // normal
    remainder = u << 19;
    u -= 0x38000000u;
    result = sign | (u >> 13);
  } else if (u < 0x33000001u) {  // rounds to zero
    remainder = u;
    result = sign;
  } else {  // subnormal
    const std::uint32_t exponent = u >> 23;
    const std::uint32_t shift = 0x7eu - exponent;
    std::uint32_t mantissa = (u & 0x7fffffu) | 0x800000u;
    remainder = mantissa << (32u - shift);
    result = (sign | (mantissa >> shift)) & 0xffffu;
  }
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (result & 1u))) ++result;
  return half{static_cast<std::uint16_t>(result)};
}

/// fp16 -> fp32 (exact).
constexpr float to_float(half h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    out = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    out = sign | ((112u - static_cast<std::uint32_t>(e)) << 23) | ((man & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

/// fp32 -> bf16, round to nearest even; NaN -> 0x7fff as CUDA's __float2bfloat16_rn.
constexpr bfloat16 to_bfloat16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bfloat16{0x7fffu};
  std::uint32_t result = x >> 16;
  const std::uint32_t remainder = x << 16;
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (result & 1u))) ++result;
  return bfloat16{static_cast<std::uint16_t>(result)};
}

/// bf16 -> fp32 (exact).
constexpr float to_float(bfloat16 b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}

constexpr float to_float(float f) noexcept { return f; }

/// Wire conversion by target type: wire_cast<half>(x), wire_cast<bfloat16>(x), wire_cast<float>(x).
template <class W>
constexpr W wire_cast(float f) noexcept {
  if constexpr (std::is_same_v<W, half>) return to_half(f);
  else if constexpr (std::is_same_v<W, bfloat16>) return to_bfloat16(f);
  else return f;
}

/// The 16-bit wire types (the ones with a SIMD path).
template <class W>
inline constexpr bool is_wire16 = std::is_same_v<W, half> || std::is_same_v<W, bfloat16>;

/// The reduction ops of the 16-bit wire types, in fp32: x from the incoming buffer, y from the
/// accumulating one (MPI's inoutvec, the in-process transport's accumulator). max / min return
/// y unless x compares greater / less, so a NaN in x is ignored and a NaN in y is kept (as the
/// x86 maxps / minps instructions with operands (x, y) do).
template <reduce_op Op>
constexpr float combine(float x, float y) noexcept {
  if constexpr (Op == reduce_op::sum) return x + y;
  else if constexpr (Op == reduce_op::max) return x > y ? x : y;
  else return x < y ? x : y;
}

/// 1 when f is inf or NaN (all exponent bits set). Written on the bits, with the counts below
/// kept in 32-bit blocks, so the loops vectorise: counting costs ~0.5 ms over ResNet-50's pool
/// where std::isfinite into a size_t cost ~2 ms (a memory-bound pass of ~7 ms).
constexpr std::uint32_t nonfinite_bit(float f) noexcept {
  return (std::bit_cast<std::uint32_t>(f) & 0x7f800000u) == 0x7f800000u;
}

/// f, or +0 where f is inf or NaN; on the bits (a mask), so that loops vectorise.
constexpr float finite_or_zero(float f) noexcept {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) & (nonfinite_bit(f) - 1u));  // non-finite: & 0
}

namespace detail {
inline constexpr std::size_t count_block = std::size_t{1} << 30;  // < 2^32: a block's count fits 32 bits
// Applies out[i] = op(i) and returns how many results are non-finite.
template <class Op>
std::size_t map_count(float* out, std::size_t n, Op op) noexcept {
  std::size_t bad = 0;
  for (std::size_t base = 0; base < n; base += count_block) {
    const std::size_t end = n - base < count_block ? n : base + count_block;
    std::uint32_t c = 0;
    for (std::size_t i = base; i < end; ++i) {
      const float v = op(i);
      out[i] = v;
      c += nonfinite_bit(v);
    }
    bad += c;
  }
  return bad;
}
}  // namespace detail

// ---- the scalar reference loops ------------------------------------------------------------------
namespace reference {

/// out[i] = wire_cast<W>(in[i] * scale).
template <class W>
void scale_to_wire(const float* in, W* out, std::size_t n, float scale) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = wire_cast<W>(in[i] * scale);
}

/// out[i] = wire_cast<W>(in[i]) (no product: exact under FTZ / DAZ too).
template <class W>
void to_wire(const float* in, W* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = wire_cast<W>(in[i]);
}

/// out[i] = float(in[i]); returns how many are inf or NaN.
template <class W>
std::size_t wire_to_float(const W* in, float* out, std::size_t n) noexcept {
  return detail::map_count(out, n, [in](std::size_t i) { return to_float(in[i]); });
}

/// Error feedback around a 16-bit encoding: g = a[i] + hist[i]; out[i] = wire_cast<W>(g * scale);
/// hist[i] = g - to_float(out[i]) * unscale, the rounding error of the encoding, or 0 where that
/// is inf/NaN (g not finite, or its encoding overflowing). CSC's compaction of a selected chunk.
template <class W>
void add_to_wire_keep_error(const float* a, float* hist, W* out, std::size_t n, float scale, float unscale) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = a[i] + hist[i];
    out[i] = wire_cast<W>(g * scale);
    hist[i] = finite_or_zero(g - to_float(out[i]) * unscale);
  }
}

/// inout[i] = W(combine<Op>(float(in[i]), float(inout[i]))): the MPI user op of a 16-bit type.
template <reduce_op Op, class W>
void combine_wire(const W* in, W* inout, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) inout[i] = wire_cast<W>(combine<Op>(to_float(in[i]), to_float(inout[i])));
}

/// acc[i] = combine<Op>(float(in[i]), acc[i]): one rank of the in-process reduction, which
/// accumulates in fp32 and rounds once.
template <reduce_op Op, class W>
void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] = combine<Op>(to_float(in[i]), acc[i]);
}

}  // namespace reference

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
template <reduce_op Op, class W>
void combine_wire(const W* in, W* inout, std::size_t n) noexcept { reference::combine_wire<Op>(in, inout, n); }
template <reduce_op Op, class W>
void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept { reference::accumulate_wire<Op>(in, acc, n); }

#endif

}  // namespace simd

// ---- the kernels the exchanger and the transports call (SIMD where available) -------------------

/// out[i] = wire_cast<W>(in[i] * scale): the "divide before casting" step of a 16-bit exchange.
template <class W>
void scale_to_wire(const float* in, W* out, std::size_t n, float scale) noexcept {
  if constexpr (is_wire16<W>)
    if (simd::available()) return simd::scale_to_wire(in, out, n, scale);
  reference::scale_to_wire(in, out, n, scale);
}

/// out[i] = wire_cast<W>(in[i]).
template <class W>
void to_wire(const float* in, W* out, std::size_t n) noexcept {
  if constexpr (is_wire16<W>)
    if (simd::available()) return simd::to_wire(in, out, n);
  reference::to_wire(in, out, n);
}

/// out[i] = float(in[i]) after the reduction; returns how many results are inf or NaN.
template <class W>
std::size_t wire_to_float(const W* in, float* out, std::size_t n) noexcept {
  if constexpr (is_wire16<W>)
    if (simd::available()) return simd::wire_to_float(in, out, n);
  return reference::wire_to_float(in, out, n);
}

/// g = a[i] + hist[i]; out[i] = W(g * scale); hist[i] = the encoding's rounding error
/// g - float(out[i]) * unscale, 0 where not finite (reference::add_to_wire_keep_error).
template <class W>
void add_to_wire_keep_error(const float* a, float* hist, W* out, std::size_t n, float scale, float unscale) noexcept {
  static_assert(is_wire16<W>, "gflow::kernels::add_to_wire_keep_error: W must be gflow::half or gflow::bfloat16.");
  if (simd::available()) return simd::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
  reference::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
}

/// inout[i] = W(combine<Op>(float(in[i]), float(inout[i]))) for a 16-bit W: the MPI user ops.
template <reduce_op Op, class W>
void combine_wire(const W* in, W* inout, std::size_t n) noexcept {
  static_assert(is_wire16<W>, "gflow::kernels::combine_wire: W must be gflow::half or gflow::bfloat16.");
  if (simd::available()) return simd::combine_wire<Op>(in, inout, n);
  reference::combine_wire<Op>(in, inout, n);
}

/// acc[i] = combine<Op>(float(in[i]), acc[i]) for a 16-bit W: the in-process reduction.
template <reduce_op Op, class W>
void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept {
  static_assert(is_wire16<W>, "gflow::kernels::accumulate_wire: W must be gflow::half or gflow::bfloat16.");
  if (simd::available()) return simd::accumulate_wire<Op>(in, acc, n);
  reference::accumulate_wire<Op>(in, acc, n);
}

/// buf[i] *= scale in place; returns how many results are inf or NaN (the fp32 average path).
/// Out of line and 64-byte aligned: inlined into its callers, the loop's placement relative to the
/// fetch blocks moved with unrelated code and took 19 or 37 us for ResNet-20's 270 k elements
/// depending on the build (docs/BENCHMARKS.md, "Code placement"); one call per bucket costs nothing.
[[gnu::noinline, gnu::aligned(64)]] inline std::size_t scale_in_place(float* buf, std::size_t n, float scale) noexcept {
  return detail::map_count(buf, n, [buf, scale](std::size_t i) { return buf[i] * scale; });
}

/// Number of inf / NaN values in buf.
inline std::size_t count_nonfinite(const float* buf, std::size_t n) noexcept {
  std::size_t bad = 0;
  for (std::size_t base = 0; base < n; base += detail::count_block) {
    const std::size_t end = n - base < detail::count_block ? n : base + detail::count_block;
    std::uint32_t c = 0;
    for (std::size_t i = base; i < end; ++i) c += nonfinite_bit(buf[i]);
    bad += c;
  }
  return bad;
}

}  // namespace gflow::kernels
