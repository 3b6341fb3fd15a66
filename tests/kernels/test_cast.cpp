// Host cast kernels (include/gflow/detail/kernels/cast.hpp): fp32 <-> fp16 / bf16 conversion, the
// wire kernels and non-finite counting.
//
// Three independent oracles:
//   1. hand-written bit patterns (ties to even at several exponents, the fp16 overflow
//      boundary, subnormals, signed zero, inf, NaN with payloads) — always checked;
//   2. a reference rounding written from the definition (nearest representable value by
//      binary search over the 16-bit patterns, ties to the even pattern) — always checked,
//      over hand-picked vectors, a strided sweep of all 2^32 patterns and tie-heavy sweeps
//      around the fp16 and bf16 boundaries;
//   3. CUDA's own host implementations __float2half_rn / __float2bfloat16_rn / __half2float /
//      __bfloat162float — when GFLOW_HAVE_CUDA_HEADERS is defined (the CUDA include directory
//      is then on the path; nothing is linked).
// The device kernels (include/gflow/detail/cuda/cast.cuh) are checked against these host kernels in
// tests/cuda/.
#include <doctest/doctest.h>

#include <gflow/detail/kernels/cast.hpp>

#include "test_values.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(GFLOW_HAVE_CUDA_HEADERS)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace {

// Aliases, not using-declarations: <cuda_fp16.h> declares a global ::half (typedef of __half).
using f16 = gflow::half;
using bf16 = gflow::bfloat16;
namespace k = gflow::detail::kernels;

float fb(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

bool is_nan16(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_nan_bf16(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// ---- oracle 2: rounding from the definition ---------------------------------------------------
// Magnitudes of the non-negative 16-bit patterns, as doubles (exact). The infinity pattern stands
// for the next power of two past the largest finite value, so the overflow boundary is the
// midpoint between that power and the largest finite value, with the tie going to the even
// pattern (infinity), as IEEE 754 prescribes.
const std::vector<double>& half_magnitudes() {
  static const std::vector<double> v = [] {
    std::vector<double> m(0x7c01);
    for (std::uint32_t p = 0; p < 0x7c00; ++p) {
      const int e = static_cast<int>(p >> 10);
      const double man = static_cast<double>(p & 0x3ffu);
      m[p] = e == 0 ? std::ldexp(man, -24) : std::ldexp(1024.0 + man, e - 25);
    }
    m[0x7c00] = 65536.0;
    return m;
  }();
  return v;
}
const std::vector<double>& bf16_magnitudes() {
  static const std::vector<double> v = [] {
    std::vector<double> m(0x7f81);
    for (std::uint32_t p = 0; p < 0x7f80; ++p) m[p] = static_cast<double>(fb(p << 16));
    m[0x7f80] = std::ldexp(1.0, 128);
    return m;
  }();
  return v;
}

std::uint16_t round_by_search(float f, const std::vector<double>& mag, std::uint32_t inf_pattern, std::uint32_t sign_shift_mask) {
  const std::uint32_t x = bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & sign_shift_mask);
  const double a = std::fabs(static_cast<double>(f));
  if (a >= mag[inf_pattern]) return static_cast<std::uint16_t>(sign | inf_pattern);
  std::uint32_t lo = 0, hi = inf_pattern;  // mag[lo] <= a < mag[hi]
  while (hi - lo > 1) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (mag[mid] <= a) lo = mid;
    else hi = mid;
  }
  const double m = (mag[lo] + mag[hi]) / 2;  // exact: both have few significant bits
  std::uint32_t r;
  if (a < m) r = lo;
  else if (a > m) r = hi;
  else r = (lo & 1u) ? hi : lo;
  return static_cast<std::uint16_t>(sign | r);
}

std::uint16_t ref_half(float f) {
  if (std::isnan(f)) return 0x7fff;
  return round_by_search(f, half_magnitudes(), 0x7c00u, 0x8000u);
}
std::uint16_t ref_bf16(float f) {
  if (std::isnan(f)) return 0x7fff;
  return round_by_search(f, bf16_magnitudes(), 0x7f80u, 0x8000u);
}

/// fp16 pattern -> value from the definition (sign * 2^(e-15) * 1.m, or 2^-14 * 0.m).
double half_value(std::uint16_t h) {
  const double s = (h & 0x8000u) ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1f;
  const double man = h & 0x3ffu;
  if (e == 0x1f) return man == 0 ? s * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return s * std::ldexp(man, -24);
  return s * std::ldexp(1024.0 + man, e - 25);
}

#if defined(GFLOW_HAVE_CUDA_HEADERS)
// ---- oracle 3: CUDA's host implementations --------------------------------------------------
std::uint16_t cuda_half(float f) {
  const __half_raw r = __float2half_rn(f);
  return r.x;
}
std::uint16_t cuda_bf16(float f) {
  const __nv_bfloat16_raw r = __float2bfloat16_rn(f);
  return r.x;
}
float cuda_half_to_float(std::uint16_t h) {
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
float cuda_bf16_to_float(std::uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}
#endif

// ---- test vectors -----------------------------------------------------------------------------

/// Hand-picked inputs (as fp32 bit patterns) around every rounding decision.
std::vector<std::uint32_t> hand_picked() {
  std::vector<std::uint32_t> v = {
      0x00000000u, 0x80000000u,                           // +-0
      0x7f800000u, 0xff800000u,                           // +-inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u,  // NaNs: quiet, negative, signalling, payloads
      0xff812345u, 0x7fffffffu, 0x7fbfffffu,
      0x3f800000u, 0xbf800000u,  // +-1
      0x3f801000u,               // 1 + 2^-11: fp16 tie, stays 1 (even)
      0x3f803000u,               // 1 + 3*2^-11: fp16 tie, up to 1 + 2^-9
      0x3f801001u, 0x3f800fffu,  // just above / below that tie
      0x45001000u, 0x45003000u,  // 2049, 2051: fp16 ties at 2^11
      0x477fe000u,               // 65504, largest fp16
      0x477fefffu,               // 65519.996: rounds down to 65504
      0x477ff000u,               // 65520: tie at the overflow boundary -> inf
      0xc77ff000u, 0xc77fefffu,  // negative boundary
      0x47800000u,               // 65536
      0x7f7fffffu, 0xff7fffffu,  // largest float
      0x38800000u,               // 2^-14, smallest normal fp16
      0x387fc000u,               // 1023 * 2^-24, largest subnormal fp16
      0x387fe000u,               // 1023.5 * 2^-24: tie -> 2^-14 (even)
      0x387fa000u,               // 1022.5 * 2^-24: tie -> 1022 * 2^-24
      0x33800000u,               // 2^-24, smallest subnormal fp16
      0x33000000u,               // 2^-25: tie between 0 and 2^-24 -> 0
      0x33000001u,               // just above: -> 2^-24
      0xb3000000u,               // -2^-25 -> -0
      0x32ffffffu,               // just below 2^-25 -> 0
      0x33c00000u,               // 1.5 * 2^-24: tie -> 2 * 2^-24
      0x34200000u,               // 2.5 * 2^-24: tie -> 2 * 2^-24
      0x34600000u,               // 3.5 * 2^-24: tie -> 4 * 2^-24
      0x00000001u, 0x80000001u,  // smallest fp32 subnormal
      0x007fffffu,               // largest fp32 subnormal
      0x00008000u,               // bf16 tie at 0 -> 0
      0x00018000u,               // bf16 tie -> 0x0002
      0x3f808000u,               // 1 + 2^-8: bf16 tie -> 1
      0x3f818000u,               // 1 + 3*2^-8: bf16 tie -> 1 + 2^-6
      0x3f808001u, 0x3f807fffu,  // around that tie
      0x7f7f8000u,               // bf16 tie at the top: rounds to inf (even)
      0x7f7f7fffu,               // just below: largest finite bf16
      0x40490fdbu,               // pi
      0x3dcccccdu,               // 0.1
      0xc2f6e979u,               // -123.456
  };
  return v;
}

/// Tie-heavy patterns for one exponent field: for every count s of dropped bits, a few kept
/// values (even and odd) times dropped bits just below, at and just above the half-way point.
void add_tie_patterns(std::vector<std::uint32_t>& out, std::uint32_t exponent) {
  static constexpr std::array<std::uint32_t, 8> kept = {0, 1, 2, 3, 0x1ff, 0x200, 0x3fe, 0x3ff};
  for (std::uint32_t s = 1; s <= 23; ++s) {
    const std::uint32_t halfway = 1u << (s - 1);
    const std::uint32_t lows[] = {0u, 1u, halfway - 1, halfway, halfway + 1, (1u << s) - 1};
    for (std::uint32_t hi : kept)
      for (std::uint32_t lo : lows) {
        const std::uint32_t m = ((hi << s) | (lo & ((1u << s) - 1))) & 0x7fffffu;
        out.push_back((exponent << 23) | m);
        out.push_back(0x80000000u | (exponent << 23) | m);
      }
  }
}

/// Every 4099th 32-bit pattern, tie-heavy patterns at the exponents where fp16 / bf16 rounding
/// changes regime, and a dense (stride 7) sweep of the two fp16 boundary octaves.
std::vector<std::uint32_t> sweep() {
  std::vector<std::uint32_t> v;
  v.reserve(1u << 22);
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 4099) v.push_back(static_cast<std::uint32_t>(u));
  // fp16: flush-to-zero side (2^-26 .. 2^-24), subnormal/normal boundary (2^-15 .. 2^-13),
  // the top octave and overflow (2^15 .. 2^17). bf16: fp32 subnormals, the top exponent.
  for (std::uint32_t e : {0x64u, 0x65u, 0x66u, 0x67u, 0x68u, 0x6fu, 0x70u, 0x71u, 0x72u, 0x8du, 0x8eu, 0x8fu, 0x00u, 0x01u, 0xfdu, 0xfeu})
    add_tie_patterns(v, e);
  for (std::uint32_t e : {0x66u, 0x8eu})
    for (std::uint32_t m = 0; m < (1u << 23); m += 7) v.push_back((e << 23) | m);
  return v;
}

struct mismatch_log {
  std::size_t count = 0;
  std::string first;
  void add(const std::string& what) {
    if (count++ < 8) first += what + "\n";
  }
};

std::string hex(std::uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

}  // namespace

// ---- oracle 1: known answers, always checked --------------------------------------------------

static_assert(k::to_half(1.0f).bits == 0x3c00);
static_assert(k::to_half(65504.0f).bits == 0x7bff);
static_assert(k::to_half(65520.0f).bits == 0x7c00);
static_assert(k::to_bfloat16(1.0f).bits == 0x3f80);

TEST_CASE("cast: fp32 -> fp16 known bit patterns (ties to even, overflow, subnormals, zero, inf, NaN)") {
  struct row {
    std::uint32_t in;
    std::uint16_t out;
  };
  const row rows[] = {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // signed zeros
      {0x7f800000u, 0x7c00}, {0xff800000u, 0xfc00},  // inf
      {0x7fc00000u, 0x7fff}, {0xffc00000u, 0x7fff},  // NaN -> canonical, sign dropped
      {0x7f800001u, 0x7fff}, {0xff812345u, 0x7fff},  // signalling / payload NaNs
      {0x3f800000u, 0x3c00}, {0xbf800000u, 0xbc00},  // +-1
      {0x3f801000u, 0x3c00},                         // 1 + 2^-11: tie -> even (down)
      {0x3f803000u, 0x3c02},                         // 1 + 3*2^-11: tie -> even (up)
      {0x3f801001u, 0x3c01}, {0x3f800fffu, 0x3c00},  // around the tie
      {0x45001000u, 0x6800},                         // 2049 -> 2048
      {0x45003000u, 0x6802},                         // 2051 -> 2052
      {0x477fe000u, 0x7bff},                         // 65504
      {0x477fefffu, 0x7bff},                         // 65519.996 -> 65504
      {0x477ff000u, 0x7c00},                         // 65520 -> inf (tie, even)
      {0xc77ff000u, 0xfc00}, {0xc77fefffu, 0xfbff},  // negative side
      {0x47800000u, 0x7c00}, {0x7f7fffffu, 0x7c00},  // beyond
      {0x38800000u, 0x0400},                         // 2^-14 smallest normal
      {0x387fc000u, 0x03ff},                         // largest subnormal
      {0x387fe000u, 0x0400},                         // 1023.5 * 2^-24 -> 1024 (even)
      {0x387fa000u, 0x03fe},                         // 1022.5 * 2^-24 -> 1022 (even)
      {0x33800000u, 0x0001},                         // 2^-24 smallest subnormal
      {0x33000000u, 0x0000},                         // 2^-25: tie -> 0
      {0x33000001u, 0x0001},                         // just above -> 2^-24
      {0xb3000000u, 0x8000},                         // -2^-25 -> -0
      {0x33c00000u, 0x0002},                         // 1.5 * 2^-24 -> 2
      {0x34200000u, 0x0002},                         // 2.5 * 2^-24 -> 2
      {0x34600000u, 0x0004},                         // 3.5 * 2^-24 -> 4
      {0x00000001u, 0x0000}, {0x80000001u, 0x8000},  // fp32 subnormals vanish, keeping the sign
      {0x40490fdbu, 0x4248},                         // pi
      {0x3dcccccdu, 0x2e66},                         // 0.1
  };
  for (const auto& r : rows) {
    CAPTURE(hex(r.in));
    CHECK(k::to_half(fb(r.in)).bits == r.out);
    CHECK(ref_half(fb(r.in)) == r.out);  // the reference agrees with the table too
  }
}

TEST_CASE("cast: fp32 -> bf16 known bit patterns") {
  struct row {
    std::uint32_t in;
    std::uint16_t out;
  };
  const row rows[] = {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000}, {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
      {0x7fc00000u, 0x7fff}, {0xffc00000u, 0x7fff}, {0x7f800001u, 0x7fff}, {0xff812345u, 0x7fff},
      {0x3f800000u, 0x3f80},
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: tie -> even (down)
      {0x3f818000u, 0x3f82},  // 1 + 3*2^-8: tie -> even (up)
      {0x3f808001u, 0x3f81}, {0x3f807fffu, 0x3f80},
      {0x7f7f8000u, 0x7f80},  // tie at the top -> inf
      {0x7f7f7fffu, 0x7f7f},  // largest finite bf16
      {0x7f7fffffu, 0x7f80},  // largest float -> inf
      {0x00008000u, 0x0000},  // subnormal tie -> 0 (even)
      {0x00018000u, 0x0002},  // subnormal tie -> up (even)
      {0x00000001u, 0x0000}, {0x80000001u, 0x8000},
      {0x007fffffu, 0x0080},  // largest fp32 subnormal rounds up to the smallest normal
      {0x40490fdbu, 0x4049},  // pi
      {0x3dcccccdu, 0x3dcd},  // 0.1
  };
  for (const auto& r : rows) {
    CAPTURE(hex(r.in));
    CHECK(k::to_bfloat16(fb(r.in)).bits == r.out);
    CHECK(ref_bf16(fb(r.in)) == r.out);
  }
}

TEST_CASE("cast: fp16 / bf16 -> fp32 known values") {
  CHECK(bits(k::to_float(f16{0x0001})) == bits(std::ldexp(1.0f, -24)));
  CHECK(k::to_float(f16{0x03ff}) == std::ldexp(1023.0f, -24));
  CHECK(k::to_float(f16{0x0400}) == std::ldexp(1.0f, -14));
  CHECK(k::to_float(f16{0x7bff}) == 65504.0f);
  CHECK(k::to_float(f16{0x3c00}) == 1.0f);
  CHECK(bits(k::to_float(f16{0x8000})) == 0x80000000u);  // -0 keeps its sign
  CHECK(bits(k::to_float(f16{0x7c00})) == 0x7f800000u);
  CHECK(bits(k::to_float(f16{0xfc00})) == 0xff800000u);
  CHECK(std::isnan(k::to_float(f16{0x7e00})));
  CHECK(bits(k::to_float(f16{0xfd01})) == 0xffa02000u);  // NaN keeps sign and payload
  CHECK(bits(k::to_float(bf16{0x3f80})) == 0x3f800000u);
  CHECK(bits(k::to_float(bf16{0x8001})) == 0x80010000u);
  CHECK(bits(k::to_float(bf16{0xffc1})) == 0xffc10000u);
}

// ---- oracle 2 over large sweeps ------------------------------------------------------------

TEST_CASE("cast: to_half and to_bfloat16 agree with rounding from the definition over large sweeps") {
  std::vector<std::uint32_t> v = hand_picked();
  const auto s = sweep();
  v.insert(v.end(), s.begin(), s.end());
  mismatch_log h, b;
  for (std::uint32_t x : v) {
    const float f = fb(x);
    const std::uint16_t gh = k::to_half(f).bits, rh = ref_half(f);
    if (gh != rh) h.add(hex(x) + ": to_half " + hex(gh) + ", reference " + hex(rh));
    const std::uint16_t gb = k::to_bfloat16(f).bits, rb = ref_bf16(f);
    if (gb != rb) b.add(hex(x) + ": to_bfloat16 " + hex(gb) + ", reference " + hex(rb));
  }
  MESSAGE(v.size(), " fp32 patterns checked");
  INFO(h.first);
  CHECK(h.count == 0);
  INFO(b.first);
  CHECK(b.count == 0);
}

TEST_CASE("cast: every fp16 pattern survives fp16 -> fp32 -> fp16; values match the definition") {
  mismatch_log log;
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float f = k::to_float(f16{h});
    if (is_nan16(h)) {
      // NaN widens keeping sign and payload, and narrows to the canonical NaN.
      if (bits(f) != ((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13)))
        log.add(hex(h) + ": NaN widened to " + hex(bits(f)));
      if (k::to_half(f).bits != 0x7fff) log.add(hex(h) + ": NaN narrowed to " + hex(k::to_half(f).bits));
      continue;
    }
    if (k::to_half(f).bits != h) log.add(hex(h) + ": round trip gave " + hex(k::to_half(f).bits));
    const double want = half_value(h);
    if (static_cast<double>(f) != want || std::signbit(f) != std::signbit(want)) log.add(hex(h) + ": to_float gave " + hex(bits(f)));
  }
  INFO(log.first);
  CHECK(log.count == 0);
}

TEST_CASE("cast: every bf16 pattern survives bf16 -> fp32 -> bf16") {
  mismatch_log log;
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) {
    const auto b = static_cast<std::uint16_t>(p);
    const float f = k::to_float(bf16{b});
    if (bits(f) != (p << 16)) log.add(hex(b) + ": to_float gave " + hex(bits(f)));
    const std::uint16_t back = k::to_bfloat16(f).bits;
    if (is_nan_bf16(b) ? back != 0x7fff : back != b) log.add(hex(b) + ": round trip gave " + hex(back));
  }
  INFO(log.first);
  CHECK(log.count == 0);
}

// ---- oracle 3: CUDA's host conversions -------------------------------------------------------

#if defined(GFLOW_HAVE_CUDA_HEADERS)
TEST_CASE("cast: bit-identical to CUDA's __float2half_rn / __float2bfloat16_rn") {
  std::vector<std::uint32_t> v = hand_picked();
  const auto s = sweep();
  v.insert(v.end(), s.begin(), s.end());
  mismatch_log h, b;
  for (std::uint32_t x : v) {
    const float f = fb(x);
    const std::uint16_t gh = k::to_half(f).bits, ch = cuda_half(f);
    if (gh != ch) h.add(hex(x) + ": to_half " + hex(gh) + ", __float2half_rn " + hex(ch));
    const std::uint16_t gb = k::to_bfloat16(f).bits, cb = cuda_bf16(f);
    if (gb != cb) b.add(hex(x) + ": to_bfloat16 " + hex(gb) + ", __float2bfloat16_rn " + hex(cb));
  }
  MESSAGE(v.size(), " fp32 patterns compared with CUDA");
  INFO(h.first);
  CHECK(h.count == 0);
  INFO(b.first);
  CHECK(b.count == 0);
}

TEST_CASE("cast: to_float bit-identical to CUDA's __half2float / __bfloat162float (NaN: both NaN)") {
  mismatch_log log;
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float g = k::to_float(f16{h}), c = cuda_half_to_float(h);
    // CUDA's host __half2float returns the canonical NaN 0x7fffffff; gflow keeps sign and payload.
    if (is_nan16(h) ? !(std::isnan(g) && std::isnan(c)) : bits(g) != bits(c))
      log.add("fp16 " + hex(h) + ": gflow " + hex(bits(g)) + ", CUDA " + hex(bits(c)));
    const float gb = k::to_float(bf16{h}), cb = cuda_bf16_to_float(h);
    if (bits(gb) != bits(cb)) log.add("bf16 " + hex(h) + ": gflow " + hex(bits(gb)) + ", CUDA " + hex(bits(cb)));
  }
  INFO(log.first);
  CHECK(log.count == 0);
}
#endif

// ---- the wire kernels -----------------------------------------------------------------------

TEST_CASE("cast: scale_to_wire divides before casting, element by element") {
  const std::vector<float> in = {1.0f, -3.0f, 60000.0f, 65504.0f * 4, 1e-6f, 0.1f, -0.0f, fb(0x7f800000u), fb(0x7fc00000u), 123.456f};
  const float s = 0.25f;
  SUBCASE("fp16") {
    std::vector<f16> out(in.size());
    k::scale_to_wire(in.data(), out.data(), in.size(), s);
    for (std::size_t i = 0; i < in.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i].bits == ref_half(in[i] * s));
    }
    // Four ranks' 60000 would overflow fp16 as a sum; divided first, each share is finite.
    CHECK(out[2].bits == k::to_half(15000.0f).bits);
    CHECK(out[3].bits == 0x7bff);  // 4 * 65504 / 4
    CHECK(out[6].bits == 0x8000);
    CHECK(out[7].bits == 0x7c00);
    CHECK(out[8].bits == 0x7fff);
  }
  SUBCASE("bf16") {
    std::vector<bf16> out(in.size());
    k::scale_to_wire(in.data(), out.data(), in.size(), s);
    for (std::size_t i = 0; i < in.size(); ++i) {
      CAPTURE(i);
      CHECK(out[i].bits == ref_bf16(in[i] * s));
    }
  }
  SUBCASE("fp32 is a scaled copy") {
    std::vector<float> out(in.size());
    k::scale_to_wire(in.data(), out.data(), in.size(), s);
    for (std::size_t i = 0; i < in.size(); ++i) {
      CAPTURE(i);
      CHECK(bits(out[i]) == bits(in[i] * s));
    }
  }
  SUBCASE("subnormal products are kept, not flushed") {
    const float tiny[] = {1e-38f, -3e-38f};  // times 0.01: fp32 subnormals, bf16 subnormals too
    std::vector<bf16> out(2);
    k::scale_to_wire(tiny, out.data(), 2, 0.01f);
    CHECK(out[0].bits == ref_bf16(1e-38f * 0.01f));
    CHECK(out[0].bits != 0);
    CHECK(out[1].bits == ref_bf16(-3e-38f * 0.01f));
    CHECK(out[1].bits != 0x8000);
  }
  SUBCASE("n = 0 touches nothing") {
    f16 sentinel{0x1234};
    k::scale_to_wire(in.data(), &sentinel, 0, s);
    CHECK(sentinel.bits == 0x1234);
  }
}

TEST_CASE("cast: wire_to_float widens and counts inf / NaN") {
  SUBCASE("fp16") {
    const std::vector<f16> in = {{0x3c00}, {0x7c00}, {0xfc00}, {0x7e01}, {0x0001}, {0x8000}, {0x7bff}};
    std::vector<float> out(in.size(), -1.0f);
    CHECK(k::wire_to_float(in.data(), out.data(), in.size()) == 3);
    CHECK(out[0] == 1.0f);
    CHECK(bits(out[1]) == 0x7f800000u);
    CHECK(bits(out[2]) == 0xff800000u);
    CHECK(std::isnan(out[3]));
    CHECK(out[4] == std::ldexp(1.0f, -24));
    CHECK(bits(out[5]) == 0x80000000u);
    CHECK(out[6] == 65504.0f);
  }
  SUBCASE("bf16") {
    const std::vector<bf16> in = {{0x3f80}, {0x7f80}, {0xff80}, {0x7fff}, {0x0001}};
    std::vector<float> out(in.size());
    CHECK(k::wire_to_float(in.data(), out.data(), in.size()) == 3);
    CHECK(bits(out[4]) == 0x00010000u);
  }
  SUBCASE("fp32") {
    const std::vector<float> in = {1.0f, fb(0x7f800000u), fb(0xffc00000u), 2.0f};
    std::vector<float> out(in.size());
    CHECK(k::wire_to_float(in.data(), out.data(), in.size()) == 2);
    CHECK(out[3] == 2.0f);
  }
  SUBCASE("n = 0") {
    float o = 7.0f;
    CHECK(k::wire_to_float(static_cast<const f16*>(nullptr), &o, 0) == 0);
    CHECK(o == 7.0f);
  }
}

TEST_CASE("cast: scale_in_place counts what overflows, and what was already inf / NaN") {
  std::vector<float> buf = {1.0f, 3e38f, -3e38f, fb(0x7fc00000u), fb(0xff800000u), 2.0f, fb(0x7f7fffffu)};
  CHECK(k::scale_in_place(buf.data(), buf.size(), 2.0f) == 5);  // 3e38*2, -3e38*2, NaN, -inf, max*2
  CHECK(buf[0] == 2.0f);
  CHECK(bits(buf[1]) == 0x7f800000u);
  CHECK(bits(buf[2]) == 0xff800000u);
  CHECK(std::isnan(buf[3]));
  CHECK(buf[5] == 4.0f);
  std::vector<float> ok = {fb(0x7f7fffffu), -1.0f, 1e-45f};
  CHECK(k::scale_in_place(ok.data(), ok.size(), 0.5f) == 0);
  CHECK(ok[0] == fb(0x7f7fffffu) * 0.5f);
  CHECK(k::scale_in_place(ok.data(), 0, 1e30f) == 0);
}

TEST_CASE("cast: count_nonfinite") {
  const std::vector<float> buf = {0.0f, fb(0x7f800000u), fb(0xff800000u), fb(0x7fc00000u), fb(0xffa00001u), fb(0x7f7fffffu), fb(0x00000001u)};
  CHECK(k::count_nonfinite(buf.data(), buf.size()) == 4);
  CHECK(k::count_nonfinite(buf.data(), 1) == 0);
  CHECK(k::count_nonfinite(buf.data(), 0) == 0);
}

TEST_CASE("cast: wire_cast picks the conversion by type") {
  CHECK(k::wire_cast<f16>(1.5f).bits == 0x3e00);
  CHECK(k::wire_cast<bf16>(1.5f).bits == 0x3fc0);
  CHECK(k::wire_cast<float>(1.5f) == 1.5f);
}


// ---- the SIMD kernels against their scalar reference twins --------------------------------------
// kernels::simd (AVX2 + F16C) must give the bits of kernels::reference for every input, length
// and alignment. All 2^32 fp32 inputs of the casts, and every 16-bit pattern against the edge
// values in the reduction ops: tests/test_cast_exhaustive.cpp (ctest unit_exhaustive). Here:
// every 16-bit pattern for widening, the sweeps above for the casts, edge pairs and a few million
// random pairs for the reduction ops, odd lengths at offset pointers.

namespace {

using gflow::reduce_op;

// Without AVX2 + F16C (or on a non-x86-64 / non-GCC-Clang build) the SIMD cases report themselves
// skipped (doctest::skip; the run's summary counts them), never passed.


/// Random pairs: half uniform over all patterns, half close in magnitude (the low bits of a
/// flipped), where sums round and tie.
template <class W>
void random_pairs(std::mt19937_64& rng, std::size_t n, std::vector<W>& a, std::vector<W>& b) {
  a.resize(n);
  b.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = rng();
    const auto x = static_cast<std::uint16_t>(r);
    auto y = static_cast<std::uint16_t>(r >> 16);
    if (r >> 63) y = static_cast<std::uint16_t>((x ^ (y & 0x0fffu)) ^ ((r >> 62) & 1u ? 0x8000u : 0u));
    a[i] = W{x};
    b[i] = W{y};
  }
}

template <class W>
std::vector<std::uint16_t> raw(const std::vector<W>& v) {
  std::vector<std::uint16_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = v[i].bits;
  return r;
}

std::vector<std::uint32_t> raw(const std::vector<float>& v) {
  std::vector<std::uint32_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = bits(v[i]);
  return r;
}

/// Index of the first difference, or -1.
template <class T>
long first_diff(const std::vector<T>& x, const std::vector<T>& y) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return static_cast<long>(i);
  return -1;
}

template <reduce_op Op, class W>
void check_combine(const std::vector<W>& a, const std::vector<W>& b, std::size_t off, std::size_t n) {
  std::vector<W> want = b, got = b;
  k::reference::combine_wire<Op>(a.data() + off, want.data() + off, n);
  k::simd::combine_wire<Op>(a.data() + off, got.data() + off, n);
  const long d = first_diff(raw(want), raw(got));
  INFO("op " << gflow::to_string(Op) << ", offset " << off << ", n " << n << ", first difference at " << d
             << (d >= 0 ? ": a " + hex(a[std::size_t(d)].bits) + ", b " + hex(b[std::size_t(d)].bits) + ", reference " +
                              hex(want[std::size_t(d)].bits) + ", simd " + hex(got[std::size_t(d)].bits)
                        : std::string()));
  CHECK(d == -1);
}

/// NaN with NaN compares equal whatever the payloads (the in-process accumulator rounds every
/// NaN to 0x7fff; which payload x86 propagates from a sum of two NaNs depends on the operand
/// order the compiler picked), everything else bitwise.
bool same_acc(float x, float y) { return (std::isnan(x) && std::isnan(y)) || bits(x) == bits(y); }

template <reduce_op Op, class W>
void check_accumulate(const std::vector<W>& a, const std::vector<float>& acc, std::size_t off, std::size_t n) {
  std::vector<float> want = acc, got = acc;
  k::reference::accumulate_wire<Op>(a.data() + off, want.data() + off, n);
  k::simd::accumulate_wire<Op>(a.data() + off, got.data() + off, n);
  long d = -1;
  for (std::size_t i = 0; i < acc.size() && d < 0; ++i)
    if (!same_acc(want[i], got[i])) d = static_cast<long>(i);
  INFO("op " << gflow::to_string(Op) << ", offset " << off << ", n " << n << ", first difference at " << d);
  CHECK(d == -1);
}

template <class W>
void check_scale_to_wire(const std::vector<float>& in, std::size_t off, std::size_t n, float s) {
  std::vector<W> want(in.size(), W{0x5555}), got(in.size(), W{0x5555});
  k::reference::scale_to_wire(in.data() + off, want.data() + off, n, s);
  k::simd::scale_to_wire(in.data() + off, got.data() + off, n, s);
  const long d = first_diff(raw(want), raw(got));
  INFO("scale " << s << ", offset " << off << ", n " << n << ", first difference at " << d
                << (d >= 0 ? ": input " + hex(bits(in[std::size_t(d)])) : std::string()));
  CHECK(d == -1);
  std::vector<W> want2(in.size(), W{0x5555}), got2(in.size(), W{0x5555});
  k::reference::to_wire(in.data() + off, want2.data() + off, n);
  k::simd::to_wire(in.data() + off, got2.data() + off, n);
  CHECK(first_diff(raw(want2), raw(got2)) == -1);
}

template <class W>
void check_wire_to_float(const std::vector<W>& in, std::size_t off, std::size_t n) {
  std::vector<float> want(in.size(), 7.0f), got(in.size(), 7.0f);
  const std::size_t cw = k::reference::wire_to_float(in.data() + off, want.data() + off, n);
  const std::size_t cg = k::simd::wire_to_float(in.data() + off, got.data() + off, n);
  const long d = first_diff(raw(want), raw(got));
  INFO("offset " << off << ", n " << n << ", first difference at " << d << (d >= 0 ? ": input " + hex(in[std::size_t(d)].bits) : std::string()));
  CHECK(d == -1);
  CHECK(cw == cg);
}

template <class W>
void check_keep_error(const std::vector<float>& a, const std::vector<float>& hist, std::size_t off, std::size_t n, float s, float u) {
  std::vector<float> hw = hist, hg = hist;
  std::vector<W> want(a.size(), W{0x5555}), got(a.size(), W{0x5555});
  k::reference::add_to_wire_keep_error(a.data() + off, hw.data() + off, want.data() + off, n, s, u);
  k::simd::add_to_wire_keep_error(a.data() + off, hg.data() + off, got.data() + off, n, s, u);
  const long d = first_diff(raw(want), raw(got)), e = first_diff(raw(hw), raw(hg));
  INFO("scale " << s << ", unscale " << u << ", offset " << off << ", n " << n << ", first differences at " << d << " (wire), " << e << " (history)");
  CHECK(d == -1);
  CHECK(e == -1);
}

template <class W>
std::vector<W> every_pattern() {
  std::vector<W> v(0x10000);
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) v[p] = W{static_cast<std::uint16_t>(p)};
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE("cast SIMD: wire_to_float equals the reference on every 16-bit pattern, count included" * doctest::skip(!k::simd::available()), W, f16, bf16) {
  const auto all = every_pattern<W>();
  check_wire_to_float(all, 0, all.size());
  check_wire_to_float(all, 1, all.size() - 1);  // unaligned start, odd length
  check_wire_to_float(all, 3, all.size() - 8);
  std::size_t bad = k::simd::wire_to_float(all.data(), std::vector<float>(all.size()).data(), all.size());
  CHECK(bad == (std::is_same_v<W, f16> ? 2u * 1024u : 2u * 128u));  // every inf / NaN pattern
}

TEST_CASE_TEMPLATE("cast SIMD: scale_to_wire and to_wire equal the reference over the sweeps, for several scales" * doctest::skip(!k::simd::available()), W, f16, bf16) {
  std::vector<std::uint32_t> v = hand_picked();
  const auto s = sweep();
  v.insert(v.end(), s.begin(), s.end());
  std::vector<float> in(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) in[i] = fb(v[i]);
  for (float scale : {1.0f, 1.0f / 3.0f, 0.25f, 0.125f / 3.0f, 3.0f, 65536.0f, fb(0x00000001u), fb(0x7f800000u)}) {
    CAPTURE(scale);
    check_scale_to_wire<W>(in, 0, in.size(), scale);
  }
}

TEST_CASE_TEMPLATE("cast SIMD: add_to_wire_keep_error (CSC's compaction) equals the reference" * doctest::skip(!k::simd::available()), W, f16, bf16) {
  std::vector<std::uint32_t> v = hand_picked();
  const auto s = sweep();
  v.insert(v.end(), s.begin(), s.end());
  std::mt19937_64 rng(9);
  std::vector<float> a(v.size()), h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    a[i] = fb(v[i]);
    // histories: zero, a small error-sized value, or another sweep pattern (inf / NaN included)
    const auto r = rng() % 4;
    h[i] = r == 0 ? 0.0f : r == 1 ? a[i] * 1e-4f : fb(v[rng() % v.size()]);
  }
  for (float P : {1.0f, 2.0f, 3.0f, 7.0f}) check_keep_error<W>(a, h, 0, a.size(), 1.0f / P, P);
  check_keep_error<W>(a, h, 1, a.size() - 1, 0.25f, 1.0f);
}

TEST_CASE_TEMPLATE("cast SIMD: the reduction ops equal the reference on edge pairs and random pairs" * doctest::skip(!k::simd::available()), W, f16, bf16) {
  const auto e = gflow_test::edge_patterns16<W>();
  std::vector<W> a, b;
  for (auto x : e)
    for (auto y : e) {
      a.push_back(W{x});
      b.push_back(W{y});
    }
  check_combine<reduce_op::sum>(a, b, 0, a.size());
  check_combine<reduce_op::max>(a, b, 0, a.size());
  check_combine<reduce_op::min>(a, b, 0, a.size());
  std::mt19937_64 rng(std::is_same_v<W, f16> ? 11 : 12);
  random_pairs(rng, std::size_t{1} << 20, a, b);
  check_combine<reduce_op::sum>(a, b, 0, a.size());
  check_combine<reduce_op::max>(a, b, 0, a.size());
  check_combine<reduce_op::min>(a, b, 0, a.size());
  check_combine<reduce_op::sum>(a, b, 1, a.size() - 1);
  // The in-process accumulator: fp32 partial sums of widened values, and raw fp32 bits.
  std::vector<float> acc(a.size());
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = (i % 4 == 3) ? fb(static_cast<std::uint32_t>(rng())) : k::to_float(b[i]) + k::to_float(a[(i * 7) % a.size()]);
  check_accumulate<reduce_op::sum>(a, acc, 0, a.size());
  check_accumulate<reduce_op::max>(a, acc, 0, a.size());
  check_accumulate<reduce_op::min>(a, acc, 1, a.size() - 1);
}

TEST_CASE_TEMPLATE("cast SIMD: odd lengths and offset pointers (tails run the reference, nothing outside the range is touched)" * doctest::skip(!k::simd::available()), W, f16, bf16) {
  std::mt19937_64 rng(5);
  std::vector<W> a, b;
  random_pairs(rng, 80, a, b);
  std::vector<float> f(80), acc(80);
  for (auto& x : f) x = fb(static_cast<std::uint32_t>(rng()) & 0xbfffffffu);  // random signs, magnitudes up to 2
  for (std::size_t i = 0; i < 80; ++i) acc[i] = k::to_float(b[i]);
  for (std::size_t off : {0u, 1u, 2u, 7u})
    for (std::size_t n = 0; n + off <= 80 && n <= 41; ++n) {
      check_scale_to_wire<W>(f, off, n, 1.0f / 3.0f);
      check_wire_to_float(a, off, n);
      check_combine<reduce_op::sum>(a, b, off, n);
      check_combine<reduce_op::max>(a, b, off, n);
      check_combine<reduce_op::min>(a, b, off, n);
      check_accumulate<reduce_op::sum>(a, acc, off, n);
      check_keep_error<W>(f, acc, off, n, 1.0f / 3.0f, 3.0f);
    }
}

TEST_CASE("cast SIMD: the dispatching kernels pick the SIMD path once and match the reference") {
  const std::vector<float> in = {1.0f, fb(0x7f800001u), fb(0xffc00000u), 65520.0f, -1e-7f, 3.0f, 0.1f, -0.0f, fb(0x387fe000u), 2.0f};
  std::vector<f16> got(in.size()), want(in.size());
  k::scale_to_wire(in.data(), got.data(), in.size(), 0.5f);
  k::reference::scale_to_wire(in.data(), want.data(), in.size(), 0.5f);
  CHECK(raw(got) == raw(want));
  std::vector<f16> c = got;
  k::combine_wire<reduce_op::sum>(want.data(), c.data(), c.size());
  std::vector<f16> cr = got;
  k::reference::combine_wire<reduce_op::sum>(want.data(), cr.data(), cr.size());
  CHECK(raw(c) == raw(cr));
}

TEST_CASE("cast SIMD: scale_in_place (the fp32 average) equals the reference, values and count, every offset and tail" * doctest::skip(!k::simd::available())) {
  std::vector<std::uint32_t> v = hand_picked();
  const auto s = sweep();
  v.insert(v.end(), s.begin(), s.end());
  std::vector<float> in(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) in[i] = fb(v[i]);
  // 1/P for several P, a scale that overflows finite values to inf, one that flushes to subnormals / 0
  for (float scale : {1.0f, 0.5f, 1.0f / 3.0f, 0.25f, 1.0f / 7.0f, 3e38f, fb(0x00000001u), fb(0x7f800000u)}) {
    for (std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
      for (std::size_t n : {in.size() - off, std::size_t{0}, std::size_t{7}, std::size_t{8}, std::size_t{23}, std::size_t{100}}) {
        std::vector<float> want = in, got = in;
        const std::size_t cw = k::reference::scale_in_place(want.data() + off, n, scale);
        const std::size_t cg = k::simd::scale_in_place(got.data() + off, n, scale);
        const long d = first_diff(raw(want), raw(got));
        INFO("scale " << scale << ", offset " << off << ", n " << n << ", first difference at " << d);
        CHECK(d == -1);  // also: nothing outside [off, off + n) touched
        CHECK(cw == cg);
      }
    }
  }
  // The dispatcher gives the same bits.
  std::vector<float> a = in, b = in;
  CHECK(k::scale_in_place(a.data(), a.size(), 0.125f) == k::reference::scale_in_place(b.data(), b.size(), 0.125f));
  CHECK(raw(a) == raw(b));
}
