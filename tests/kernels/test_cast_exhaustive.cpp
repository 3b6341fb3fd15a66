// Exhaustive checks of the SIMD cast kernels (include/gflow/detail/kernels/cast.hpp, namespace
// kernels::simd) against their scalar reference twins (kernels::reference), bit for bit:
//   - scale_to_wire over all 2^32 fp32 inputs: fp16 and bf16, each with scale 1 and with scale
//     1/3 (to_wire runs the same rounding code without the product; at scale 1 the product is
//     the input itself, a NaN aside, which rounds to 0x7fff either way: covered here);
//   - the 16-bit reduction ops (sum, max, min) of every 16-bit pattern against every edge value,
//     in both operand orders, fp16 and bf16.
// Its own executable and ctest (unit_exhaustive, label "exhaustive"): it takes seconds, not
// milliseconds, and stays out of the sanitizer builds. The 2^32 range is split over
// std::thread::hardware_concurrency() threads. Skipped (with a message) where the CPU lacks
// AVX2 / F16C.
#include <doctest/doctest.h>

#include <gflow/detail/kernels/cast.hpp>

#include "test_values.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

namespace k = gflow::detail::kernels;
using gflow::reduce_op;

// Without AVX2 + F16C (or on a non-x86-64 / non-GCC-Clang build) the SIMD cases report themselves
// skipped (doctest::skip; the run's summary counts them), never passed.

std::string hex(std::uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

struct failures {
  std::atomic<std::uint64_t> count{0};
  std::mutex m;
  std::string first;
  void add(const std::string& what) {
    if (count++ < 8) {
      std::lock_guard<std::mutex> lock(m);
      first += what + "\n";
    }
  }
};

/// Runs body(lo, hi) over [0, 2^32) in blocks, on every hardware thread.
template <class Body>
void over_all_u32(Body body) {
  constexpr std::uint64_t total = std::uint64_t{1} << 32, block = std::uint64_t{1} << 16;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<std::uint64_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (std::uint64_t lo; (lo = next.fetch_add(block)) < total;) body(static_cast<std::uint32_t>(lo), block);
    });
  for (auto& th : pool) th.join();
}

template <class W>
void every_fp32(float scale) {
  failures f;
  const auto t0 = std::chrono::steady_clock::now();
  over_all_u32([&](std::uint32_t lo, std::uint64_t n) {
    thread_local std::vector<float> in;
    thread_local std::vector<W> want, got;
    in.resize(n);
    want.resize(n);
    got.resize(n);
    for (std::uint64_t i = 0; i < n; ++i) in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(lo + i));
    k::reference::scale_to_wire(in.data(), want.data(), n, scale);
    k::simd::scale_to_wire(in.data(), got.data(), n, scale);
    if (std::memcmp(want.data(), got.data(), n * sizeof(W)) == 0) return;
    for (std::uint64_t i = 0; i < n; ++i)
      if (want[i].bits != got[i].bits)
        f.add(hex(lo + static_cast<std::uint32_t>(i)) + ": reference " + hex(want[i].bits) + ", simd " + hex(got[i].bits));
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE((std::is_same_v<W, gflow::half> ? "fp16" : "bf16") << " scale_to_wire, scale " << scale << ": 2^32 inputs in " << s << " s");
  INFO(f.first);
  CHECK(f.count == 0);
}


template <reduce_op Op, class W>
std::uint64_t pattern_by_edges() {
  std::uint64_t bad = 0;
  std::vector<W> all(0x10000), e(0x10000), want, got;
  for (std::uint32_t p = 0; p <= 0xffffu; ++p) all[p] = W{static_cast<std::uint16_t>(p)};
  for (std::uint16_t x : gflow_test::edge_patterns16<W>()) {
    std::fill(e.begin(), e.end(), W{x});
    // every pattern as the incoming operand, the edge value accumulating, and the other way round
    want = e;
    got = e;
    k::reference::combine_wire<Op>(all.data(), want.data(), all.size());
    k::simd::combine_wire<Op>(all.data(), got.data(), all.size());
    for (std::size_t i = 0; i < all.size(); ++i) bad += want[i].bits != got[i].bits;
    want = all;
    got = all;
    k::reference::combine_wire<Op>(e.data(), want.data(), all.size());
    k::simd::combine_wire<Op>(e.data(), got.data(), all.size());
    for (std::size_t i = 0; i < all.size(); ++i) bad += want[i].bits != got[i].bits;
  }
  return bad;
}

}  // namespace

TEST_CASE("cast exhaustive: fp32 -> fp16, all 2^32 inputs, scale 1 and 1/3, SIMD == reference" * doctest::skip(!k::simd::available())) {
  every_fp32<gflow::half>(1.0f);
  every_fp32<gflow::half>(1.0f / 3.0f);
}

TEST_CASE("cast exhaustive: fp32 -> bf16, all 2^32 inputs, scale 1 and 1/3, SIMD == reference" * doctest::skip(!k::simd::available())) {
  every_fp32<gflow::bfloat16>(1.0f);
  every_fp32<gflow::bfloat16>(1.0f / 3.0f);
}

TEST_CASE("cast exhaustive: 16-bit sum / max / min of every pattern against every edge value, both orders" * doctest::skip(!k::simd::available())) {
  CHECK(pattern_by_edges<reduce_op::sum, gflow::half>() == 0);
  CHECK(pattern_by_edges<reduce_op::max, gflow::half>() == 0);
  CHECK(pattern_by_edges<reduce_op::min, gflow::half>() == 0);
  CHECK(pattern_by_edges<reduce_op::sum, gflow::bfloat16>() == 0);
  CHECK(pattern_by_edges<reduce_op::max, gflow::bfloat16>() == 0);
  CHECK(pattern_by_edges<reduce_op::min, gflow::bfloat16>() == 0);
}
