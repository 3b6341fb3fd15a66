// Device cast kernels (include/gflow/detail/cuda/cast.cuh) against the host kernels
// (include/gflow/detail/kernels/cast.hpp), which tests/test_cast.cpp checks against CUDA's own host
// conversions and a reference rounding. Bitwise, except where fp32 arithmetic makes a NaN: the
// GPU returns the canonical NaN, x86 propagates the operand's payload, so there both must be NaN.
#include <gflow/detail/cuda/cast.cuh>
#include <gflow/detail/kernels/cast.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness.cuh"
#include "util.cuh"

namespace {

using gflow_cuda_test::ok;

// Aliases, not using-declarations: <cuda_fp16.h> declares a global ::half (typedef of __half).
using f16 = gflow::half;
using bf16 = gflow::bfloat16;
namespace k = gflow::detail::kernels;
namespace gc = gflow::detail::cuda;

float fb(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

std::string hex(std::uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}


/// Owning device array.
template <class T>
struct dvec {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dvec(std::size_t count) : n(count) {
    void* q = nullptr;
    ok(cudaMalloc(&q, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
    p = static_cast<T*>(q);
  }
  ~dvec() { (void)cudaFree(p); }
  dvec(const dvec&) = delete;
  dvec& operator=(const dvec&) = delete;
  void upload(const T* h, std::size_t count, std::size_t at = 0) {
    ok(cudaMemcpy(p + at, h, count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void download(T* h, std::size_t count, std::size_t at = 0) const {
    ok(cudaMemcpy(h, p + at, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
};

struct counter {
  dvec<unsigned long long> d{1};
  counter() { reset(); }
  void reset() { ok(cudaMemset(d.p, 0, sizeof(unsigned long long)), "cudaMemset"); }
  unsigned long long get() const {
    unsigned long long h = 0;
    d.download(&h, 1);
    return h;
  }
};

std::uint16_t raw(f16 h) { return h.bits; }
std::uint16_t raw(bf16 b) { return b.bits; }
std::uint32_t raw(float f) { return bits(f); }

bool same_result(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }

std::vector<std::uint32_t> hand_picked() {
  return {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,
          0x7fffffffu, 0x3f800000u, 0x3f801000u, 0x3f803000u, 0x3f801001u, 0x3f800fffu, 0x45001000u, 0x45003000u,
          0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u, 0xc77fefffu, 0x47800000u, 0x7f7fffffu, 0x38800000u,
          0x387fc000u, 0x387fe000u, 0x387fa000u, 0x33800000u, 0x33000000u, 0x33000001u, 0xb3000000u, 0x32ffffffu,
          0x33c00000u, 0x34200000u, 0x34600000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00008000u, 0x00018000u,
          0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x7f7f8000u, 0x7f7f7fffu, 0x40490fdbu, 0x3dcccccdu};
}

/// Converts `in` on the device (scale 1) to fp16 and bf16 and compares with the host kernels.
void compare_conversions(const std::vector<std::uint32_t>& patterns, long long& mismatches, std::string& first) {
  const std::size_t n = patterns.size();
  std::vector<float> in(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = fb(patterns[i]);
  dvec<float> din(n);
  dvec<f16> dh(n);
  dvec<bf16> db(n);
  din.upload(in.data(), n);
  gc::scale_to_wire(din.p, dh.p, n, 1.0f, nullptr);
  gc::scale_to_wire(din.p, db.p, n, 1.0f, nullptr);
  std::vector<f16> h(n);
  std::vector<bf16> b(n);
  dh.download(h.data(), n);
  db.download(b.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t wh = k::to_half(in[i]).bits, wb = k::to_bfloat16(in[i]).bits;
    if (h[i].bits != wh || b[i].bits != wb) {
      if (mismatches++ < 8)
        first += hex(patterns[i]) + ": device fp16 " + hex(h[i].bits) + " host " + hex(wh) + ", device bf16 " + hex(b[i].bits) + " host " +
                 hex(wb) + "\n";
    }
  }
}

}  // namespace

GFLOW_CUDA_TEST("kernels", conversions_match_host_on_hand_picked_vectors_and_sweeps) {
  long long bad = 0;
  std::string first;
  compare_conversions(hand_picked(), bad, first);
  // Every 257th 32-bit pattern (16.7 M), in chunks.
  std::vector<std::uint32_t> chunk;
  chunk.reserve(1u << 22);
  long long total = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 257) {
    chunk.push_back(static_cast<std::uint32_t>(u));
    if (chunk.size() == chunk.capacity()) {
      compare_conversions(chunk, bad, first);
      total += static_cast<long long>(chunk.size());
      chunk.clear();
    }
  }
  // Every mantissa, both signs, of the exponents where fp16 rounding changes regime: 2^-26..2^-24
  // (flush to zero / smallest subnormal), 2^-15..2^-14 (subnormal / normal), 2^15..2^16
  // (largest finite, overflow), plus fp32 subnormals (bf16 subnormals).
  for (std::uint32_t e : {0x65u, 0x66u, 0x67u, 0x70u, 0x71u, 0x8eu, 0x8fu, 0x00u, 0xfeu})
    for (std::uint32_t sign : {0u, 0x80000000u})
      for (std::uint32_t m = 0; m < (1u << 23); ++m) {
        chunk.push_back(sign | (e << 23) | m);
        if (chunk.size() == chunk.capacity()) {
          compare_conversions(chunk, bad, first);
          total += static_cast<long long>(chunk.size());
          chunk.clear();
        }
      }
  if (!chunk.empty()) {
    total += static_cast<long long>(chunk.size());
    compare_conversions(chunk, bad, first);
  }
  std::printf("  %lld fp32 patterns converted on the device\n", total);
  EXPECT_MSG(bad == 0, std::to_string(bad) + " mismatches:\n" + first);
}

GFLOW_CUDA_TEST("kernels", widening_every_16_bit_pattern_matches_host_and_counts_nonfinite) {
  const std::size_t n = 1u << 16;
  std::vector<f16> h(n);
  std::vector<bf16> b(n);
  for (std::size_t i = 0; i < n; ++i) {
    h[i].bits = static_cast<std::uint16_t>(i);
    b[i].bits = static_cast<std::uint16_t>(i);
  }
  dvec<f16> dh(n);
  dvec<bf16> db(n);
  dvec<float> out(n);
  dh.upload(h.data(), n);
  db.upload(b.data(), n);
  counter c;
  std::vector<float> got(n), want(n);

  gc::wire_to_float(dh.p, out.p, n, c.d.p, nullptr);
  out.download(got.data(), n);
  const std::size_t want_bad_h = k::wire_to_float(h.data(), want.data(), n);
  long long bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += bits(got[i]) != bits(want[i]);  // NaN payloads included
  EXPECT_MSG(bad == 0, std::to_string(bad) + " fp16 patterns widen differently");
  EXPECT(want_bad_h == 2048);
  EXPECT(c.get() == want_bad_h);

  c.reset();
  gc::wire_to_float(db.p, out.p, n, c.d.p, nullptr);
  out.download(got.data(), n);
  const std::size_t want_bad_b = k::wire_to_float(b.data(), want.data(), n);
  bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += bits(got[i]) != bits(want[i]);
  EXPECT_MSG(bad == 0, std::to_string(bad) + " bf16 patterns widen differently");
  EXPECT(want_bad_b == 256);
  EXPECT(c.get() == want_bad_b);

  // Without a counter the kernel only converts.
  gc::wire_to_float(dh.p, out.p, n, nullptr, nullptr);
  ok(cudaDeviceSynchronize(), "sync");
}

namespace {

/// Random floats over all magnitudes (subnormals to near-overflow), with some inf / NaN.
std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const auto r = static_cast<std::uint32_t>(s >> 32);
    switch (r % 16) {
      case 0: x = fb(r & 0x807fffffu); break;                      // fp32 subnormal
      case 1: x = fb((r & 0x80000000u) | 0x7f800000u); break;        // inf
      case 2: x = fb(0x7f800000u | (r & 0x807fffffu) | 1u); break;   // NaN
      default: x = fb(r); if (std::isnan(x)) x = 1.0f; break;      // anything finite-ish
    }
  }
  return v;
}

template <class W>
void check_scale_to_wire(const std::vector<float>& in, std::size_t offset, std::size_t n, float s, const char* label) {
  // Guard elements around [offset, offset + n) must stay untouched.
  const std::size_t total = offset + n + 5;
  dvec<float> din(total);
  dvec<W> dout(total);
  std::vector<float> hin(total, 3.0f);
  std::copy(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n), hin.begin() + static_cast<std::ptrdiff_t>(offset));
  din.upload(hin.data(), total);
  std::vector<W> sentinel(total);
  std::memset(static_cast<void*>(sentinel.data()), 0x5a, total * sizeof(W));
  dout.upload(sentinel.data(), total);
  gc::scale_to_wire(din.p + offset, dout.p + offset, n, s, nullptr);
  std::vector<W> got(total), want(n);
  dout.download(got.data(), total);
  k::scale_to_wire(hin.data() + offset, want.data(), n, s);
  long long bad = 0;
  std::string first;
  for (std::size_t i = 0; i < total; ++i) {
    bool good;
    if (i < offset || i >= offset + n) good = std::memcmp(&got[i], &sentinel[i], sizeof(W)) == 0;
    else if constexpr (std::is_same_v<W, float>) good = same_result(got[i], want[i - offset]);
    else good = raw(got[i]) == raw(want[i - offset]);
    if (!good && bad++ < 4) first += " [" + std::to_string(i) + "] in " + hex(bits(hin[i])) + " got " + hex(raw(got[i]));
  }
  EXPECT_MSG(bad == 0, std::string(label) + " offset " + std::to_string(offset) + " n " + std::to_string(n) + " scale " +
                           std::to_string(s) + ": " + std::to_string(bad) + " bad:" + first);
}

template <class W>
void check_wire_to_float(std::size_t offset, std::size_t n, const char* label) {
  const std::vector<float> src = random_floats(n + 8, 1234 + n + offset);
  std::vector<W> win(offset + n + 3);
  k::scale_to_wire(src.data(), win.data(), win.size(), 1.0f);
  const std::size_t total = win.size();
  dvec<W> din(total);
  dvec<float> dout(total);
  din.upload(win.data(), total);
  std::vector<float> sentinel(total, -7.0f);
  dout.upload(sentinel.data(), total);
  counter c;
  gc::wire_to_float(din.p + offset, dout.p + offset, n, c.d.p, nullptr);
  std::vector<float> got(total), want(n);
  dout.download(got.data(), total);
  const std::size_t want_bad = k::wire_to_float(win.data() + offset, want.data(), n);
  long long bad = 0;
  for (std::size_t i = 0; i < total; ++i) {
    const bool inside = i >= offset && i < offset + n;
    bad += inside ? bits(got[i]) != bits(want[i - offset]) : got[i] != -7.0f;
  }
  EXPECT_MSG(bad == 0, std::string(label) + " offset " + std::to_string(offset) + " n " + std::to_string(n));
  EXPECT_MSG(c.get() == want_bad, std::string(label) + " counted " + std::to_string(c.get()) + ", host " + std::to_string(want_bad));
}

}  // namespace

GFLOW_CUDA_TEST("kernels", scale_to_wire_matches_host_for_any_alignment_length_and_scale) {
  const std::size_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 1000, 4097, (1u << 20) + 3};
  const float scales[] = {1.0f, 0.25f, 1.0f / 3.0f, 1.0f / 7.0f, 1e-3f, 1e-30f, 1e30f, -0.5f};
  const std::vector<float> in = random_floats((1u << 20) + 16, 42);
  for (std::size_t n : sizes)
    for (std::size_t offset = 0; offset < 4; ++offset)
      for (float s : scales) {
        check_scale_to_wire<f16>(in, offset, n, s, "fp16");
        check_scale_to_wire<bf16>(in, offset, n, s, "bf16");
        check_scale_to_wire<float>(in, offset, n, s, "fp32");
      }
}

GFLOW_CUDA_TEST("kernels", subnormal_products_are_not_flushed) {
  // 1e-38 * 0.01 and -3e-38 * 0.01 are fp32 subnormals and bf16 subnormals.
  const std::vector<float> in = {1e-38f, -3e-38f, 1e-40f, -1e-45f};
  dvec<float> din(in.size());
  dvec<bf16> dout(in.size());
  dvec<float> dscaled(in.size());
  din.upload(in.data(), in.size());
  gc::scale_to_wire(din.p, dout.p, in.size(), 0.01f, nullptr);
  dscaled.upload(in.data(), in.size());
  gc::scale_in_place(dscaled.p, in.size(), 0.5f, nullptr, nullptr);
  std::vector<bf16> got(in.size());
  std::vector<float> scaled(in.size());
  dout.download(got.data(), in.size());
  dscaled.download(scaled.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_MSG(got[i].bits == k::to_bfloat16(in[i] * 0.01f).bits, hex(bits(in[i])));
    EXPECT_MSG(bits(scaled[i]) == bits(in[i] * 0.5f), hex(bits(in[i])));
  }
  EXPECT(got[0].bits != 0);
  EXPECT(bits(scaled[2]) != 0);
}

GFLOW_CUDA_TEST("kernels", wire_to_float_matches_host_for_any_alignment) {
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 63u, 64u, 65u, 4099u, 300001u})
    for (std::size_t offset = 0; offset < 4; ++offset) {
      check_wire_to_float<f16>(offset, n, "fp16");
      check_wire_to_float<bf16>(offset, n, "bf16");
      check_wire_to_float<float>(offset, n, "fp32");
    }
}

GFLOW_CUDA_TEST("kernels", scale_in_place_and_count_nonfinite_match_host_counts) {
  for (std::size_t n : {0u, 1u, 5u, 1000u, 1u << 22})
    for (std::size_t offset : {0u, 1u, 3u}) {
      std::vector<float> h = random_floats(n + offset, 99 + n);
      dvec<float> d(n + offset);
      d.upload(h.data(), n + offset);
      counter c;
      gc::count_nonfinite(d.p + offset, n, c.d.p, nullptr);
      const std::size_t want_count = k::count_nonfinite(h.data() + offset, n);
      EXPECT_MSG(c.get() == want_count, "count_nonfinite n " + std::to_string(n) + ": " + std::to_string(c.get()) + " vs " + std::to_string(want_count));
      // The counter accumulates until reset.
      gc::count_nonfinite(d.p + offset, n, c.d.p, nullptr);
      EXPECT(c.get() == 2 * want_count);

      c.reset();
      gc::scale_in_place(d.p + offset, n, 3.5f, c.d.p, nullptr);
      const std::size_t want_scaled = k::scale_in_place(h.data() + offset, n, 3.5f);
      EXPECT_MSG(c.get() == want_scaled, "scale_in_place n " + std::to_string(n));
      std::vector<float> got(n + offset);
      d.download(got.data(), n + offset);
      long long bad = 0;
      for (std::size_t i = 0; i < n + offset; ++i) bad += !same_result(got[i], h[i]);
      EXPECT_MSG(bad == 0, "scale_in_place values n " + std::to_string(n) + ": " + std::to_string(bad) + " differ");
    }
}

GFLOW_CUDA_TEST("kernels", count_nonfinite_needs_a_counter) {
  dvec<float> d(4);
  EXPECT_THROWS_AS(gc::count_nonfinite(d.p, 4, nullptr, nullptr), gflow::invalid_argument);
}

GFLOW_CUDA_TEST("kernels", counting_is_exact_when_every_element_is_nonfinite) {
  // Every lane of every warp adds: checks the warp aggregation and the 64-bit atomics.
  const std::size_t n = (1u << 24) + 7;
  dvec<float> d(n);
  ok(cudaMemset(d.p, 0xff, n * sizeof(float)), "cudaMemset");  // 0xffffffff: NaN
  counter c;
  gc::count_nonfinite(d.p, n, c.d.p, nullptr);
  EXPECT(c.get() == n);
  c.reset();
  gc::scale_in_place(d.p + 1, n - 1, 2.0f, c.d.p, nullptr);
  EXPECT(c.get() == n - 1);
}
