// The host CSC kernels (gflow/detail/kernels/sparse_chunks.hpp): compaction and scatter, Algorithm 1 for
// kept-back chunks, the documented norm order, every kernel against its element-wise definition,
// top-percent selection.
#include <doctest/doctest.h>

#include <gflow/detail/kernels/sparse_chunks.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace gflow;

// ---- host kernels ----------------------------------------------------------------------------

TEST_CASE("CSC kernels: compaction and scatter round trip with a partial last chunk; history cleared") {
  const std::size_t n = 23, C = 5;  // chunks 0..4, the last has 3 elements
  std::vector<float> pool(n), hist(n), out(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    pool[i] = float(i) + 0.5f;
    hist[i] = 100.0f * float(i);
  }
  const std::vector<std::uint32_t> list{1, 4};
  const std::size_t k = gflow::detail::kernels::compact_chunks(pool.data(), hist.data(), n, C, list.data(), list.size(), out.data());
  REQUIRE(k == 8);
  for (std::size_t j = 0; j < 5; ++j) CHECK(out[j] == pool[5 + j] + 100.0f * float(5 + j));
  for (std::size_t j = 0; j < 3; ++j) CHECK(out[5 + j] == pool[20 + j] + 100.0f * float(20 + j));
  for (std::size_t i = 0; i < n; ++i) CHECK(hist[i] == ((i >= 5 && i < 10) || i >= 20 ? 0.0f : 100.0f * float(i)));

  std::vector<float> back(n, 7.0f), norms(5, -1.0f);
  for (std::size_t j = 0; j < k; ++j) out[j] = (j % 2 ? -1.0f : 1.0f) * float(j);
  CHECK(gflow::detail::kernels::scatter_chunks(out.data(), back.data(), n, C, list.data(), list.size(), norms.data(), 0.5f) == 8);
  for (std::size_t j = 0; j < 5; ++j) CHECK(back[5 + j] == out[j]);
  for (std::size_t j = 0; j < 3; ++j) CHECK(back[20 + j] == out[5 + j]);
  CHECK(back[0] == 7.0f);
  CHECK(back[19] == 7.0f);
  CHECK(norms[1] == 0.5f * (0 + 1 + 2 + 3 + 4));
  CHECK(norms[4] == 0.5f * (5 + 6 + 7));
  CHECK(norms[0] == -1.0f);  // untouched

  std::vector<float> l1(5, -1.0f);
  const std::vector<std::uint32_t> every{0, 1, 2, 3, 4};
  gflow::detail::kernels::chunk_l1_norms(back.data(), n, C, every.data(), every.size(), l1.data());
  CHECK(l1[0] == 35.0f);
  CHECK(l1[4] == 18.0f);
}

TEST_CASE("CSC kernels: Algorithm 1 for kept-back chunks (g += hg; hg = m g; pool cleared; norm of g)") {
  const std::size_t n = 10, C = 4;
  std::vector<float> pool{1, -2, 3, -4, 5, 6, 7, 8, 9, 10}, hist{1, 1, 1, 1, 1, 1, 1, 1, 0.5f, 0.5f}, norms(3, -1.0f);
  const std::vector<std::uint32_t> list{0, 2};
  gflow::detail::kernels::defer_chunks(pool.data(), hist.data(), n, C, list.data(), list.size(), 0.5f, norms.data());
  CHECK(norms[0] == 2 + 1 + 4 + 3);  // |2| + |-1| + |4| + |-3|
  CHECK(norms[1] == -1.0f);
  CHECK(norms[2] == 9.5f + 10.5f);
  const std::vector<float> h{1, -0.5f, 2, -1.5f, 1, 1, 1, 1, 4.75f, 5.25f};
  CHECK(hist == h);
  const std::vector<float> p{0, 0, 0, 0, 5, 6, 7, 8, 0, 0};
  CHECK(pool == p);
}

namespace {
// The documented norm order (the CUDA kernels' block order): 256 partial sums in double, lane
// j mod 256 of the chunk in increasing j, folded pairwise (lane l += lane l + h for h = 128, ..., 1),
// rounded to float once. Written as a recursion over the fold, independently of the kernels' loops.
double fold(const std::vector<double>& s, std::size_t l, std::size_t width) {
  // Lane l's value once the lanes are folded down to `width`: lane l plus lane l + width as they
  // were at twice the width; at 256, the lane's own sum.
  if (width == 256) return s[l];
  return fold(s, l, 2 * width) + fold(s, l + width, 2 * width);
}
float l1_documented(const float* v, std::size_t m) {
  std::vector<double> s(256, 0.0);
  for (std::size_t j = 0; j < m; ++j) s[j % 256] += std::fabs(double(v[j]));
  return float(fold(s, 0, 1));
}

std::vector<float> random_values(std::mt19937_64& rng, std::size_t n, bool specials) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> u(-4, 4);
  for (auto& x : v) {
    x = u(rng) * std::ldexp(1.0f, int(rng() % 24) - 12);
    if (specials && rng() % 50 == 0) {
      const float sp[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::nanf(""), 70000.0f, -1e30f,
                          3.4e38f, 1e-30f, -0.0f};
      x = sp[rng() % 8];
    }
  }
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }
}  // namespace

TEST_CASE("CSC kernels: norms in the documented order (256 lanes, folded pairwise), in every kernel that computes them") {
  std::mt19937_64 rng(3);
  for (std::size_t C : {1u, 5u, 8u, 13u, 64u, 255u, 256u, 1000u, 4099u, 9000u}) {
    const std::size_t n = 3 * C + C / 2 + 1, chunks = (n + C - 1) / C;
    CAPTURE(C);
    const auto pool = random_values(rng, n, false), hist = random_values(rng, n, false);
    std::vector<std::uint32_t> all(chunks);
    std::iota(all.begin(), all.end(), 0u);
    std::vector<float> want(chunks), got(chunks, -1.0f);
    for (std::size_t c = 0; c < chunks; ++c) want[c] = 0.5f * l1_documented(pool.data() + c * C, std::min(C, n - c * C));
    gflow::detail::kernels::chunk_l1_norms(pool.data(), n, C, all.data(), chunks, got.data(), 0.5f);
    CHECK(got == want);
    std::vector<float> back(n, 0.0f);
    std::fill(got.begin(), got.end(), -1.0f);
    gflow::detail::kernels::scatter_chunks(pool.data(), back.data(), n, C, all.data(), chunks, got.data(), 0.5f);
    CHECK(got == want);
    CHECK(back == pool);
    std::fill(got.begin(), got.end(), -1.0f);
    CHECK(gflow::detail::kernels::scatter_chunks_counted(pool.data(), back.data(), n, C, all.data(), chunks, false, 3.0f, got.data(), 0.5f) == 0);
    CHECK(got == want);
    // defer: the norm of g = pool + hist
    std::vector<float> p = pool, h = hist, g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = pool[i] + hist[i];
    for (std::size_t c = 0; c < chunks; ++c) want[c] = l1_documented(g.data() + c * C, std::min(C, n - c * C));
    gflow::detail::kernels::defer_chunks(p.data(), h.data(), n, C, all.data(), chunks, 0.9f, got.data());
    CHECK(got == want);
  }
}

TEST_CASE("CSC kernels: every kernel equals its element-wise definition (random values, inf, NaN, partial chunks, sublists)") {
  std::mt19937_64 rng(4);
  for (int rep = 0; rep < 40; ++rep) {
    const std::size_t C = 1 + rng() % 300, n = 1 + rng() % 3000, chunks = (n + C - 1) / C;
    CAPTURE(C);
    CAPTURE(n);
    std::vector<std::uint32_t> list;
    for (std::uint32_t c = 0; c < chunks; ++c)
      if (rng() % 3 == 0) list.push_back(c);
    const auto pool = random_values(rng, n, true), hist = random_values(rng, n, true), buf = random_values(rng, n, true);
    std::vector<std::uint8_t> in_list(n, 0);
    for (auto c : list)
      for (std::size_t i = c * C; i < std::min(n, (c + 1) * C); ++i) in_list[i] = 1;
    // compact_chunks
    {
      std::vector<float> h = hist, out(n, 9.0f);
      const std::size_t k = gflow::detail::kernels::compact_chunks(pool.data(), h.data(), n, C, list.data(), list.size(), out.data());
      std::size_t j = 0, bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (in_list[i]) bad += !same_bits(out[j++], pool[i] + hist[i]) + !same_bits(h[i], 0.0f);
        else bad += !same_bits(h[i], hist[i]);
      }
      CHECK(k == j);
      CHECK(bad == 0);
    }
    // scatter_chunks_counted, with and without the average
    for (bool mul : {false, true}) {
      std::vector<float> p(n, 7.0f);
      std::size_t want_bad = 0, j = 0, bad = 0;
      const std::size_t got_bad = gflow::detail::kernels::scatter_chunks_counted(buf.data(), p.data(), n, C, list.data(), list.size(), mul, 0.25f, nullptr, 1.0f);
      for (std::size_t i = 0; i < n; ++i) {
        if (in_list[i]) {
          const float v = mul ? buf[j] * 0.25f : buf[j];
          ++j;
          want_bad += !std::isfinite(v);
          bad += !same_bits(p[i], v);
        } else {
          bad += !same_bits(p[i], 7.0f);
        }
      }
      CHECK(bad == 0);
      CHECK(got_bad == want_bad);
    }
    // defer_chunks
    {
      std::vector<float> p = pool, h = hist;
      gflow::detail::kernels::defer_chunks(p.data(), h.data(), n, C, list.data(), list.size(), 0.5f, nullptr);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (in_list[i]) {
          const float g = pool[i] + hist[i];
          bad += !same_bits(h[i], std::isfinite(g) ? 0.5f * g : 0.0f) + !same_bits(p[i], 0.0f);
        } else {
          bad += !same_bits(h[i], hist[i]) + !same_bits(p[i], pool[i]);
        }
      }
      CHECK(bad == 0);
    }
    // compact_chunks_to_wire and scatter_chunks_from_wire, fp16 and bf16
    auto wire_round_trip = [&](auto tag) {
      using wt = decltype(tag);
      for (float P : {1.0f, 2.0f, 3.0f}) {
        const float s = 1.0f / P;
        std::vector<float> h = hist, p(n, 7.0f), norms(chunks, -1.0f);
        std::vector<wt> w(n, wt{0x1234});
        const std::size_t k = gflow::detail::kernels::compact_chunks_to_wire(pool.data(), h.data(), n, C, list.data(), list.size(), w.data(), s, P);
        std::size_t j = 0, bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (in_list[i]) {
            const float g = pool[i] + hist[i];
            const wt e = gflow::detail::kernels::wire_cast<wt>(g * s);
            const float err = g - gflow::detail::kernels::to_float(e) * P;
            bad += (w[j++].bits != e.bits) + !same_bits(h[i], std::isfinite(err) ? err : 0.0f);
          } else {
            bad += !same_bits(h[i], hist[i]);
          }
        }
        CHECK(k == j);
        CHECK(bad == 0);
        const std::size_t nonfinite = gflow::detail::kernels::scatter_chunks_from_wire(w.data(), p.data(), n, C, list.data(), list.size(), norms.data(), 0.5f);
        std::size_t want_nonfinite = 0;
        j = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (in_list[i]) {
            const float v = gflow::detail::kernels::to_float(w[j++]);
            want_nonfinite += !std::isfinite(v);
            bad += !same_bits(p[i], v);
          } else {
            bad += !same_bits(p[i], 7.0f);
          }
        }
        for (auto c : list) bad += !same_bits(norms[c], 0.5f * l1_documented(p.data() + c * C, std::min(C, n - c * C)));
        CHECK(bad == 0);
        CHECK(nonfinite == want_nonfinite);
      }
    };
    wire_round_trip(half{});
    wire_round_trip(bfloat16{});
  }
}

TEST_CASE("CSC kernels: top-percent selection, ties to the lower index, NaN ranks highest") {
  std::vector<std::uint32_t> out(6);
  SUBCASE("plain") {
    const std::vector<float> norms{1, 5, 3, 5, 0, 4};
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 3, out.data());
    CHECK(out == std::vector<std::uint32_t>{1, 3, 5, 0, 2, 4});
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 1, out.data());
    CHECK(out == std::vector<std::uint32_t>{1, 0, 2, 3, 4, 5});  // tie 1 vs 3: the lower index
  }
  SUBCASE("all equal (all-zero gradients): the first k chunks") {
    const std::vector<float> norms(6, 0.0f);
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 2, out.data());
    CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
  }
  SUBCASE("inf and NaN") {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> norms{1, inf, std::nanf(""), 7, inf, 2};
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 2, out.data());
    CHECK(out == std::vector<std::uint32_t>{1, 2, 0, 3, 4, 5});
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 1, out.data());
    CHECK(out[0] == 2);
  }
  SUBCASE("k = 0 and k = all") {
    const std::vector<float> norms{3, 2, 1, 0, 9, 8};
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 6, out.data());
    CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
    gflow::detail::kernels::select_top_chunks(norms.data(), 6, 0, out.data());
    CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
  }
  SUBCASE("against a full sort on random norms with many ties") {
    std::mt19937 rng(5);
    for (int rep = 0; rep < 200; ++rep) {
      const std::size_t nc = 1 + rng() % 300, k = rng() % (nc + 1);
      std::vector<float> norms(nc);
      for (auto& x : norms) x = float(rng() % 17);
      std::vector<std::uint32_t> got(nc), ref(nc);
      gflow::detail::kernels::select_top_chunks(norms.data(), nc, k, got.data());
      std::iota(ref.begin(), ref.end(), 0u);
      std::stable_sort(ref.begin(), ref.end(), [&](auto a, auto b) { return norms[a] > norms[b]; });
      std::sort(ref.begin(), ref.begin() + long(k));
      std::sort(ref.begin() + long(k), ref.end());
      CHECK(got == ref);
    }
  }
}
