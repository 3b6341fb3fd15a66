#pragma once
// Host kernels of the Precision policy: fp32 <-> fp16 / bf16 conversion, scaling, the
// non-finite check and the 16-bit reduction ops of the host transports.
//
// Two implementations of every 16-bit kernel, with bitwise identical results:
//   - the scalar reference: to_half, to_bfloat16, to_float and the loops in namespace
//     kernels::reference. The CUDA twins in include/gflow/detail/cuda/cast.cuh produce bit-identical
//     results (tests/kernels/test_cast.cpp checks these host versions against CUDA's own
//     __float2half_rn / __float2bfloat16_rn over ties, subnormals, overflow and NaN);
//   - namespace kernels::simd: AVX2 + F16C on x86-64 (GCC or Clang), compiled per function with
//     __attribute__((target("avx2,f16c"))), so no -march flag is needed. tests/kernels/test_cast_exhaustive
//     .cpp checks them against the reference over all 2^32 fp32 inputs (fp16 with scale 1 and 1/3,
//     bf16), tests/kernels/test_cast.cpp over every 16-bit pattern, edge pairs and random pairs. Where they
//     are not compiled (other targets, nvcc's device pass, GFLOW_NO_SIMD defined) they forward to
//     the reference and simd::available() is false.
// The dispatching kernels (scale_to_wire, wire_to_float, to_wire, add_to_wire_keep_error,
// combine_wire, accumulate_wire, scale_in_place) choose once per process (simd::available(), a cached CPUID check) and never per element.
//
// Rounding is round-to-nearest-even. NaN converts to the canonical NaN 0x7fff (fp16 and bf16, any
// sign or payload), as CUDA does; F16C's vcvtps2ph would keep the sign and payload, so the SIMD
// path puts a NaN that converts to 0x7fff into NaN lanes first. Widening is exact and keeps a
// NaN's sign and payload (vcvtph2ps would quiet a signalling NaN: the SIMD path rebuilds NaN lanes
// from the bits). bf16 rounding is the integer (x + 0x7fff + ((x >> 16) & 1)) >> 16. The 16-bit
// conversions ignore the MXCSR's FTZ / DAZ on both paths; products and sums (in[i] * scale,
// x + y) are the same fp32 operations on both paths.
//
// Parts: kernels/cast_scalar.hpp (the scalar conversions and the reference loops),
// kernels/cast_x86.hpp (the AVX2 + F16C twins); this header adds the dispatching kernels and gives
// all three.
#include <cstddef>
#include <cstdint>

#include "../../dtype.hpp"
#include "cast_scalar.hpp"
#include "cast_x86.hpp"

namespace gflow::detail::kernels {

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
  static_assert(is_wire16<W>, "gflow::detail::kernels::add_to_wire_keep_error: W must be gflow::half or gflow::bfloat16.");
  if (simd::available()) return simd::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
  reference::add_to_wire_keep_error(a, hist, out, n, scale, unscale);
}

/// inout[i] = W(combine<Op>(float(in[i]), float(inout[i]))) for a 16-bit W: the MPI user ops.
template <reduce_op Op, class W>
void combine_wire(const W* in, W* inout, std::size_t n) noexcept {
  static_assert(is_wire16<W>, "gflow::detail::kernels::combine_wire: W must be gflow::half or gflow::bfloat16.");
  if (simd::available()) return simd::combine_wire<Op>(in, inout, n);
  reference::combine_wire<Op>(in, inout, n);
}

/// acc[i] = combine<Op>(float(in[i]), acc[i]) for a 16-bit W: the in-process reduction.
template <reduce_op Op, class W>
void accumulate_wire(const W* in, float* acc, std::size_t n) noexcept {
  static_assert(is_wire16<W>, "gflow::detail::kernels::accumulate_wire: W must be gflow::half or gflow::bfloat16.");
  if (simd::available()) return simd::accumulate_wire<Op>(in, acc, n);
  reference::accumulate_wire<Op>(in, acc, n);
}

/// buf[i] *= scale in place; returns how many results are inf or NaN (the fp32 average path).
/// AVX2 where available (8 lanes, the count from the exponent bits), else the reference loop; the
/// same bits either way (one IEEE product per element). Out of line and 64-byte aligned: inlined
/// into its callers, the loop's placement relative to the fetch blocks moved with unrelated code
/// and took 19 or 37 us for ResNet-20's 270 k elements depending on the build (docs/BENCHMARKS.md,
/// "Code placement"); one call per bucket costs nothing.
[[gnu::noinline, gnu::aligned(64)]] inline std::size_t scale_in_place(float* buf, std::size_t n, float scale) noexcept {
  if (simd::available()) return simd::scale_in_place(buf, n, scale);
  return reference::scale_in_place(buf, n, scale);
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

}  // namespace gflow::detail::kernels
