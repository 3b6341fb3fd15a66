#pragma once
// The scalar half of kernels/cast.hpp: fp32 <-> fp16 / bf16 conversion one value at a time
// (to_half, to_bfloat16, to_float, wire_cast), the reduction combine, the non-finite test, and the
// reference loops (namespace kernels::reference) every SIMD kernel is checked against, bit for
// bit. The rounding rules are in kernels/cast.hpp's header comment.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../dtype.hpp"

namespace gflow::detail::kernels {

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

/// buf[i] *= scale in place; returns how many results are inf or NaN (the fp32 average).
inline std::size_t scale_in_place(float* buf, std::size_t n, float scale) noexcept {
  return detail::map_count(buf, n, [buf, scale](std::size_t i) { return buf[i] * scale; });
}

}  // namespace reference

}  // namespace gflow::detail::kernels
