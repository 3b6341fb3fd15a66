// Sparsifier<CSC<chunk_elems, percent>> (paper 000 section 3.2, Algorithm 1): chunk planning,
// warm-up schedule, host kernels, what goes on the wire (mock transport), shared selection and
// the accounting identity on in-process ranks, Algorithm 1's history and update step, bad input.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/kernels/sparse_chunks.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/plan/chunks.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_mock;
using gflow_test::on_inproc;

namespace {

std::vector<std::uint8_t> mask_of(std::span<const std::uint32_t> chunks, std::size_t count) {
  std::vector<std::uint8_t> m(count, 0);
  for (auto c : chunks) m[c] = 1;
  return m;
}

std::uint64_t hash_chunks(std::span<const std::uint32_t> chunks) {
  std::uint64_t h = 1469598103934665603ull ^ chunks.size();
  for (auto c : chunks) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

// ---- planning --------------------------------------------------------------------------------

TEST_CASE("CSC chunk geometry: last chunk partial, chunk larger than the pool, complete chunks per bucket end") {
  plan::chunk_geometry g(100, 32);
  CHECK(g.count() == 4);
  CHECK(g.begin(3) == 96);
  CHECK(g.end(3) == 100);
  CHECK(g.size(3) == 4);
  CHECK(g.size(0) == 32);
  CHECK(g.complete_before(0) == 0);
  CHECK(g.complete_before(31) == 0);
  CHECK(g.complete_before(32) == 1);
  CHECK(g.complete_before(99) == 3);
  CHECK(g.complete_before(100) == 4);  // the partial chunk completes with the pool
  const std::vector<std::uint32_t> all{0, 1, 2, 3};
  CHECK(g.elements(all.begin(), all.end()) == 100);

  plan::chunk_geometry big(10, 1000);
  CHECK(big.count() == 1);
  CHECK(big.size(0) == 10);
  CHECK(big.complete_before(9) == 0);
  CHECK(big.complete_before(10) == 1);

  plan::chunk_geometry exact(96, 32);
  CHECK(exact.count() == 3);
  CHECK(exact.size(2) == 32);

  try {
    plan::chunk_geometry bad(100, 0);
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "chunk_elems");
    CHECK(std::string(e.what()).find("must be positive") != std::string::npos);
  }
}

TEST_CASE("CSC chunk ranges: each chunk goes with the bucket whose end first covers it") {
  // pool order sizes 11, 7, 5, 3 (26 elements); chunks of 8: [0,8) [8,16) [16,24) [24,26)
  auto l = Layout::from_sizes({3, 5, 7, 11});
  auto p = plan::plan_pool(l);
  auto b = plan::plan_buckets(l, p, {4, 0, 0});  // one bucket per tensor: ends 11, 18, 23, 26
  plan::chunk_geometry g(p.total, 8);
  auto r = plan::plan_chunk_ranges(g, b);
  REQUIRE(r.size() == 4);
  CHECK(r[0] == plan::chunk_range{0, 1});  // end 11 completes chunk 0
  CHECK(r[1] == plan::chunk_range{1, 2});  // end 18 completes chunk 1
  CHECK(r[2] == plan::chunk_range{2, 2});  // end 23: chunk 2 ends at 24, not yet
  CHECK(r[3] == plan::chunk_range{2, 4});  // end 26: chunk 2 and the partial chunk 3
  // A chunk larger than the pool completes with the last bucket.
  auto r2 = plan::plan_chunk_ranges(plan::chunk_geometry(p.total, 1000), b);
  CHECK(r2.back() == plan::chunk_range{0, 1});
  CHECK(r2[0] == plan::chunk_range{0, 0});
  // Buckets that do not cover the pool are rejected.
  std::vector<plan::bucket> part(b.begin(), b.end() - 1);
  CHECK_THROWS_AS(plan::plan_chunk_ranges(g, part), gflow::invalid_argument);
}

TEST_CASE("CSC schedule: dense warm-up, linear ramp, then percent (boundaries)") {
  SUBCASE("warm-up 3, no ramp") {
    plan::csc_schedule s{3, 0, 15};
    CHECK(s.selected(0, 100) == 100);
    CHECK(s.selected(2, 100) == 100);
    CHECK(s.selected(3, 100) == 15);
    CHECK(s.selected(1000000, 100) == 15);
    CHECK(s.selected(3, 101) == 16);  // ceil(15.15)
    CHECK(s.selected(3, 1) == 1);     // at least one chunk
  }
  SUBCASE("warm-up 0: iteration 0 is still dense (no norms yet)") {
    plan::csc_schedule s{0, 0, 10};
    CHECK(s.selected(0, 50) == 50);
    CHECK(s.selected(1, 50) == 5);
  }
  SUBCASE("ramp 3 from 100% to 15%: 78.75%, 57.5%, 36.25%, then 15%") {
    plan::csc_schedule s{2, 3, 15};
    CHECK(s.selected(1, 100) == 100);
    CHECK(s.selected(2, 100) == 79);
    CHECK(s.selected(3, 100) == 58);
    CHECK(s.selected(4, 100) == 37);
    CHECK(s.selected(5, 100) == 15);
    CHECK(s.selected(6, 100) == 15);
    // monotone over a long ramp
    plan::csc_schedule t{1, 997, 3};
    std::size_t prev = 1000;
    for (std::uint64_t i = 1; i < 1100; ++i) {
      const std::size_t k = t.selected(i, 1000);
      CHECK(k <= prev);
      CHECK(k >= 30);
      prev = k;
    }
    CHECK(prev == 30);
  }
  SUBCASE("percent 100 is always every chunk") {
    plan::csc_schedule s{0, 7, 100};
    for (std::uint64_t i = 0; i < 20; ++i) CHECK(s.selected(i, 37) == 37);
  }
}

// ---- host kernels ----------------------------------------------------------------------------

TEST_CASE("CSC kernels: compaction and scatter round trip with a partial last chunk; history cleared") {
  const std::size_t n = 23, C = 5;  // chunks 0..4, the last has 3 elements
  std::vector<float> pool(n), hist(n), out(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    pool[i] = float(i) + 0.5f;
    hist[i] = 100.0f * float(i);
  }
  const std::vector<std::uint32_t> list{1, 4};
  const std::size_t k = kernels::compact_chunks(pool.data(), hist.data(), n, C, list.data(), list.size(), out.data());
  REQUIRE(k == 8);
  for (std::size_t j = 0; j < 5; ++j) CHECK(out[j] == pool[5 + j] + 100.0f * float(5 + j));
  for (std::size_t j = 0; j < 3; ++j) CHECK(out[5 + j] == pool[20 + j] + 100.0f * float(20 + j));
  for (std::size_t i = 0; i < n; ++i) CHECK(hist[i] == ((i >= 5 && i < 10) || i >= 20 ? 0.0f : 100.0f * float(i)));

  std::vector<float> back(n, 7.0f), norms(5, -1.0f);
  for (std::size_t j = 0; j < k; ++j) out[j] = (j % 2 ? -1.0f : 1.0f) * float(j);
  CHECK(kernels::scatter_chunks(out.data(), back.data(), n, C, list.data(), list.size(), norms.data(), 0.5f) == 8);
  for (std::size_t j = 0; j < 5; ++j) CHECK(back[5 + j] == out[j]);
  for (std::size_t j = 0; j < 3; ++j) CHECK(back[20 + j] == out[5 + j]);
  CHECK(back[0] == 7.0f);
  CHECK(back[19] == 7.0f);
  CHECK(norms[1] == 0.5f * (0 + 1 + 2 + 3 + 4));
  CHECK(norms[4] == 0.5f * (5 + 6 + 7));
  CHECK(norms[0] == -1.0f);  // untouched

  std::vector<float> l1(5, -1.0f);
  const std::vector<std::uint32_t> every{0, 1, 2, 3, 4};
  kernels::chunk_l1_norms(back.data(), n, C, every.data(), every.size(), l1.data());
  CHECK(l1[0] == 35.0f);
  CHECK(l1[4] == 18.0f);
}

TEST_CASE("CSC kernels: Algorithm 1 for kept-back chunks (g += hg; hg = m g; pool cleared; norm of g)") {
  const std::size_t n = 10, C = 4;
  std::vector<float> pool{1, -2, 3, -4, 5, 6, 7, 8, 9, 10}, hist{1, 1, 1, 1, 1, 1, 1, 1, 0.5f, 0.5f}, norms(3, -1.0f);
  const std::vector<std::uint32_t> list{0, 2};
  kernels::defer_chunks(pool.data(), hist.data(), n, C, list.data(), list.size(), 0.5f, norms.data());
  CHECK(norms[0] == 2 + 1 + 4 + 3);  // |2| + |-1| + |4| + |-3|
  CHECK(norms[1] == -1.0f);
  CHECK(norms[2] == 9.5f + 10.5f);
  const std::vector<float> h{1, -0.5f, 2, -1.5f, 1, 1, 1, 1, 4.75f, 5.25f};
  CHECK(hist == h);
  const std::vector<float> p{0, 0, 0, 0, 5, 6, 7, 8, 0, 0};
  CHECK(pool == p);
}

namespace {
// The documented norm order: 8 partial sums in double, lane j mod 8 of the chunk, combined
// ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), rounded to float once.
float l1_documented(const float* v, std::size_t m) {
  double s[8] = {};
  for (std::size_t j = 0; j < m; ++j) s[j % 8] += std::fabs(double(v[j]));
  return float(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
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

TEST_CASE("CSC kernels: norms in the documented order (8 partial sums), in every kernel that computes them") {
  std::mt19937_64 rng(3);
  for (std::size_t C : {1u, 5u, 8u, 13u, 64u, 1000u, 4099u}) {
    const std::size_t n = 3 * C + C / 2 + 1, chunks = (n + C - 1) / C;
    CAPTURE(C);
    const auto pool = random_values(rng, n, false), hist = random_values(rng, n, false);
    std::vector<std::uint32_t> all(chunks);
    std::iota(all.begin(), all.end(), 0u);
    std::vector<float> want(chunks), got(chunks, -1.0f);
    for (std::size_t c = 0; c < chunks; ++c) want[c] = 0.5f * l1_documented(pool.data() + c * C, std::min(C, n - c * C));
    kernels::chunk_l1_norms(pool.data(), n, C, all.data(), chunks, got.data(), 0.5f);
    CHECK(got == want);
    std::vector<float> back(n, 0.0f);
    std::fill(got.begin(), got.end(), -1.0f);
    kernels::scatter_chunks(pool.data(), back.data(), n, C, all.data(), chunks, got.data(), 0.5f);
    CHECK(got == want);
    CHECK(back == pool);
    std::fill(got.begin(), got.end(), -1.0f);
    CHECK(kernels::scatter_chunks_counted(pool.data(), back.data(), n, C, all.data(), chunks, false, 3.0f, got.data(), 0.5f) == 0);
    CHECK(got == want);
    // defer: the norm of g = pool + hist
    std::vector<float> p = pool, h = hist, g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = pool[i] + hist[i];
    for (std::size_t c = 0; c < chunks; ++c) want[c] = l1_documented(g.data() + c * C, std::min(C, n - c * C));
    kernels::defer_chunks(p.data(), h.data(), n, C, all.data(), chunks, 0.9f, got.data());
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
      const std::size_t k = kernels::compact_chunks(pool.data(), h.data(), n, C, list.data(), list.size(), out.data());
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
      const std::size_t got_bad = kernels::scatter_chunks_counted(buf.data(), p.data(), n, C, list.data(), list.size(), mul, 0.25f, nullptr, 1.0f);
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
      kernels::defer_chunks(p.data(), h.data(), n, C, list.data(), list.size(), 0.5f, nullptr);
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
        const std::size_t k = kernels::compact_chunks_to_wire(pool.data(), h.data(), n, C, list.data(), list.size(), w.data(), s, P);
        std::size_t j = 0, bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (in_list[i]) {
            const float g = pool[i] + hist[i];
            const wt e = kernels::wire_cast<wt>(g * s);
            const float err = g - kernels::to_float(e) * P;
            bad += (w[j++].bits != e.bits) + !same_bits(h[i], std::isfinite(err) ? err : 0.0f);
          } else {
            bad += !same_bits(h[i], hist[i]);
          }
        }
        CHECK(k == j);
        CHECK(bad == 0);
        const std::size_t nonfinite = kernels::scatter_chunks_from_wire(w.data(), p.data(), n, C, list.data(), list.size(), norms.data(), 0.5f);
        std::size_t want_nonfinite = 0;
        j = 0;
        for (std::size_t i = 0; i < n; ++i) {
          if (in_list[i]) {
            const float v = kernels::to_float(w[j++]);
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
    kernels::select_top_chunks(norms.data(), 6, 3, out.data());
    CHECK(out == std::vector<std::uint32_t>{1, 3, 5, 0, 2, 4});
    kernels::select_top_chunks(norms.data(), 6, 1, out.data());
    CHECK(out == std::vector<std::uint32_t>{1, 0, 2, 3, 4, 5});  // tie 1 vs 3: the lower index
  }
  SUBCASE("all equal (all-zero gradients): the first k chunks") {
    const std::vector<float> norms(6, 0.0f);
    kernels::select_top_chunks(norms.data(), 6, 2, out.data());
    CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
  }
  SUBCASE("inf and NaN") {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> norms{1, inf, std::nanf(""), 7, inf, 2};
    kernels::select_top_chunks(norms.data(), 6, 2, out.data());
    CHECK(out == std::vector<std::uint32_t>{1, 2, 0, 3, 4, 5});
    kernels::select_top_chunks(norms.data(), 6, 1, out.data());
    CHECK(out[0] == 2);
  }
  SUBCASE("k = 0 and k = all") {
    const std::vector<float> norms{3, 2, 1, 0, 9, 8};
    kernels::select_top_chunks(norms.data(), 6, 6, out.data());
    CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
    kernels::select_top_chunks(norms.data(), 6, 0, out.data());
    CHECK(out == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5});
  }
  SUBCASE("against a full sort on random norms with many ties") {
    std::mt19937 rng(5);
    for (int rep = 0; rep < 200; ++rep) {
      const std::size_t nc = 1 + rng() % 300, k = rng() % (nc + 1);
      std::vector<float> norms(nc);
      for (auto& x : norms) x = float(rng() % 17);
      std::vector<std::uint32_t> got(nc), ref(nc);
      kernels::select_top_chunks(norms.data(), nc, k, got.data());
      std::iota(ref.begin(), ref.end(), 0u);
      std::stable_sort(ref.begin(), ref.end(), [&](auto a, auto b) { return norms[a] > norms[b]; });
      std::sort(ref.begin(), ref.begin() + long(k));
      std::sort(ref.begin() + long(k), ref.end());
      CHECK(got == ref);
    }
  }
}

// ---- the exchanger over the mock transport: what goes on the wire ------------------------------

namespace {
// Runs `iters` iterations on the mock and checks every iteration's collectives: chunk allreduces
// in the wire type whose element counts add up to the selected chunks' elements, then exactly
// one fp32 norm allreduce of `chunks` elements when the norms are needed, and the byte count.
template <class E>
void check_wire(const Layout& l, std::uint64_t warmup, int iters, unsigned percent) {
  mock::transport m(4);
  on_mock<E> ex(m, l);
  auto& s = ex.sparsifier();
  s.set_warmup(warmup, 0);
  s.set_percent(percent);
  using W = typename on_mock<E>::wire_type;
  const std::size_t nc = s.chunk_count();
  const std::size_t threshold = ex.threshold_bytes();
  const auto ranges = plan::plan_chunk_ranges(s.geometry(), ex.buckets());
  std::mt19937 rng(11);
  for (int it = 0; it < iters; ++it) {
    CAPTURE(it);
    m.calls().clear();
    const std::vector<std::uint32_t> sel(s.upcoming_chunks().begin(), s.upcoming_chunks().end());
    const std::size_t expect_k = plan::csc_schedule{warmup, 0, percent}.selected(std::uint64_t(it), nc);
    CHECK(sel.size() == expect_k);
    for (std::size_t i = 0; i < l.size(); ++i)
      for (auto& x : ex.view(i)) x = std::uniform_real_distribution<float>(-1, 1)(rng) * float(1 + i % 3);
    for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);  // generation order: buckets go out as they complete
    auto st = ex.finish();
    CHECK(st.finite());
    auto ar = m.calls().of(mock::op::all_reduce);
    const bool norms_expected = plan::csc_schedule{warmup, 0, percent}.selected(std::uint64_t(it) + 1, nc) < nc || sel.size() < nc;
    REQUIRE(ar.size() >= (norms_expected ? 1u : 0u));
    const std::size_t nchunk_ar = ar.size() - (norms_expected ? 1 : 0);
    std::size_t elems = 0, bytes = 0;
    for (std::size_t k = 0; k < nchunk_ar; ++k) {
      CHECK(ar[k].type == dtype_of_v<W>);
      CHECK_FALSE(ar[k].async);
      elems += ar[k].count;
      bytes += ar[k].bytes;
      if (threshold != 0 && k + 1 < nchunk_ar) CHECK(ar[k].bytes >= threshold);  // fused: only the last may be short
    }
    if (norms_expected) {
      CHECK(ar.back().type == dtype::f32);
      CHECK(ar.back().count == nc);
      bytes += ar.back().bytes;
    }
    const auto done = s.selected_chunks();
    CHECK(std::vector<std::uint32_t>(done.begin(), done.end()) == sel);
    CHECK(elems == s.geometry().elements(sel.begin(), sel.end()));  // partial last chunk counted as it is
    CHECK(st.wire_bytes == bytes);
    CHECK(s.wire_bytes() == elems * sizeof(W) + (norms_expected ? nc * 4 : 0));
    CHECK(s.collectives() == ar.size());
    if (threshold == 0) {
      // Without Fusion: one allreduce per bucket that completed at least one selected chunk.
      const auto mask = mask_of(sel, nc);
      std::size_t buckets_with_selected = 0;
      for (const auto& r : ranges) {
        bool any = false;
        for (std::size_t c = r.first; c < r.end; ++c) any = any || mask[c];
        buckets_with_selected += any;
      }
      CHECK(nchunk_ar == buckets_with_selected);
    }
  }
}
}  // namespace

TEST_CASE("CSC on the mock: one norm allreduce per sparse iteration, chunk allreduces total the selected chunks") {
  // 68 elements, chunks of 8: 9 chunks, the last with 4 elements.
  auto l = Layout::from_sizes({10, 20, 5, 30, 3});
  SUBCASE("fp32, no Fusion, warm-up 2") { check_wire<Exchanger<Sparsifier<CSC<8, 25>>>>(l, 2, 12, 25); }
  SUBCASE("fp16, no Fusion, warm-up 0") { check_wire<Exchanger<Precision<wire::fp16>, Sparsifier<CSC<8, 25>>>>(l, 0, 12, 40); }
  SUBCASE("fp16, Fusion 40 B") { check_wire<Exchanger<Fusion<40>, Precision<wire::fp16>, Sparsifier<CSC<8, 25>>>>(l, 1, 12, 60); }
  SUBCASE("fp32, Fusion larger than the pool: one chunk allreduce at the end") {
    check_wire<Exchanger<Fusion<1 << 20>, Sparsifier<CSC<8, 25>>>>(l, 3, 10, 25);
  }
  SUBCASE("bf16, chunk larger than the pool: one chunk, never sparse, no norm collective") {
    check_wire<Exchanger<Precision<wire::bf16>, Sparsifier<CSC<1000, 10>>>>(l, 0, 5, 10);
  }
  SUBCASE("chunk of one element") { check_wire<Exchanger<Sparsifier<CSC<1, 5>>, Fusion<64>>>(l, 1, 8, 5); }
}

TEST_CASE("CSC on the mock: dense warm-up iterations issue no norm collective") {
  auto l = Layout::from_sizes({64, 64});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<16, 50>>>> ex(m, l);
  ex.sparsifier().set_warmup(3, 0);
  std::vector<std::size_t> per_iter;
  for (int it = 0; it < 5; ++it) {
    m.calls().clear();
    ex.ready(0);
    ex.ready(1);
    (void)ex.finish();
    per_iter.push_back(m.calls().of(mock::op::all_reduce).size());
  }
  // iterations 0, 1: dense, 2 buckets each; 2: dense + norms for iteration 3; 3, 4: sparse + norms
  CHECK(per_iter[0] == 2);
  CHECK(per_iter[1] == 2);
  CHECK(per_iter[2] == 3);
  CHECK(ex.sparsifier().selected_chunks().size() == 4);
  CHECK(ex.sparsifier().upcoming_chunks().size() == 4);
}

// ---- in-process ranks: exact values, shared selection -------------------------------------------

TEST_CASE("CSC in-process: norms, selection and views on a hand-computed example (P = 2)") {
  // 16 elements, chunks of 4; warm-up 1, 50%: two chunks per sparse iteration; momentum 1.
  auto l = Layout::from_sizes({16});
  const float vals[3][4][2] = {
      {{1, 1}, {3, -3}, {0.5f, 0.5f}, {2, 0}},   // it 0 (dense): sums 2, 0, 1, 2 -> L1 8, 0, 4, 8
      {{0, 0}, {1, 1}, {-1, 1}, {0.25f, 0.25f}},  // it 1: selected {0, 3}; kept-back norms 4+4, 4+4
      {{0, 0}, {0, 0}, {0, 0}, {0, 0}},          // it 2: selected {1, 2}: the histories go out
  };
  // Averaged or summed, the norms are on the scale of the sum (the paper's allreduce sums).
  for (const bool average : {true, false}) {
  CAPTURE(average);
  const float f = average ? 1.0f : 2.0f;  // what the views hold: the mean, or the sum of 2 ranks
  exchange_options o;
  o.average = average;
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<CSC<4, 50>>>> ex(t, l, o);
    auto& s = ex.sparsifier();
    s.set_warmup(1, 0);
    s.set_momentum(1.0f);
    auto fill = [&](int it) {
      auto v = ex.view(0);
      for (std::size_t i = 0; i < 16; ++i) v[i] = vals[it][i / 4][t.rank()];
      ex.ready(0);
      (void)ex.finish();
    };
    fill(0);
    CHECK(s.selected_chunks().size() == 4);
    CHECK(std::vector<float>(s.norms().begin(), s.norms().end()) == std::vector<float>{8, 0, 4, 8});
    CHECK(std::vector<std::uint32_t>(s.upcoming_chunks().begin(), s.upcoming_chunks().end()) == std::vector<std::uint32_t>{0, 3});
    fill(1);
    CHECK(std::vector<std::uint32_t>(s.selected_chunks().begin(), s.selected_chunks().end()) == std::vector<std::uint32_t>{0, 3});
    auto v = ex.view(0);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(v[i] == 0.0f);
      CHECK(v[4 + i] == 0.0f);   // kept back: zero for the optimizer
      CHECK(v[8 + i] == 0.0f);
      CHECK(v[12 + i] == 0.25f * f);
      CHECK(s.residual()[4 + i] == 1.0f);
      CHECK(s.residual()[8 + i] == (t.rank() == 0 ? -1.0f : 1.0f));
      CHECK(s.residual()[12 + i] == 0.0f);
    }
    // chunk 0: 0; chunk 3: L1(sum 0.5 x 4) = 2; kept-back chunks: local norms added, 8 and 8
    CHECK(std::vector<float>(s.norms().begin(), s.norms().end()) == std::vector<float>{0, 8, 8, 2});
    CHECK(std::vector<std::uint32_t>(s.upcoming_chunks().begin(), s.upcoming_chunks().end()) == std::vector<std::uint32_t>{1, 2});
    fill(2);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(v[4 + i] == 1.0f * f);  // mean (sum) of the histories 1 and 1
      CHECK(v[8 + i] == 0.0f);  // mean of -1 and 1
      CHECK(s.residual()[4 + i] == 0.0f);
    }
  });
  }
}

namespace {
struct rank_record {
  std::vector<double> fed, fed_abs, applied, decayed, hist;
  std::vector<std::uint64_t> selections;
  std::vector<std::vector<float>> views;  // when kept
  std::size_t nonzero_unselected = 0;
};

struct run_config {
  int P = 2;
  unsigned percent = 15;
  std::uint64_t warmup = 0, ramp = 0;
  float momentum = 1.0f;
  bool average = true;
  bool zero_gradients = false;
};

// One run of E on cfg.P in-process ranks; gradients random per rank and iteration (scaled per
// tensor so the norms differ), ready() in a random order per rank.
template <class E>
std::vector<rank_record> run_csc(const Layout& l, const run_config& cfg, int iters, std::uint64_t seed, bool keep_views = false) {
  const std::size_t n = l.total_numel();
  std::vector<rank_record> rec(static_cast<std::size_t>(cfg.P));
  inproc::run(cfg.P, [&](inproc::transport& t) {
    auto& me = rec[static_cast<std::size_t>(t.rank())];
    me.fed.assign(n, 0);
    me.fed_abs.assign(n, 0);
    me.applied.assign(n, 0);
    me.decayed.assign(n, 0);
    exchange_options o;
    o.average = cfg.average;
    on_inproc<E> ex(t, l, o);
    auto& s = ex.sparsifier();
    s.set_percent(cfg.percent);
    s.set_warmup(cfg.warmup, cfg.ramp);
    s.set_momentum(cfg.momentum);
    std::mt19937_64 rng(seed * 131 + std::uint64_t(t.rank()));
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> scale(l.size());
    for (int it = 0; it < iters; ++it) {
      for (auto& x : scale) x = std::ldexp(1.0f, int(rng() % 9) - 4) * float(rng() % 4 != 0);
      for (std::size_t i = 0; i < l.size(); ++i)
        for (auto& x : ex.view(i)) x = cfg.zero_gradients ? 0.0f : u(rng) * scale[i];
      const float* g = ex.pool_data();
      for (std::size_t k = 0; k < n; ++k) {
        me.fed[k] += g[k];
        me.fed_abs[k] += std::fabs(g[k]);
      }
      std::vector<std::size_t> order(l.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (auto i : order) ex.ready(i);
      auto st = ex.finish();
      CHECK(st.finite());
      const auto mask = mask_of(s.selected_chunks(), s.chunk_count());
      const auto hist = s.residual();
      for (std::size_t k = 0; k < n; ++k) {
        me.applied[k] += g[k];
        if (!mask[k / s.chunk_elems()]) {
          if (g[k] != 0.0f) ++me.nonzero_unselected;
          if (cfg.momentum > 0) me.decayed[k] += (1.0 - double(cfg.momentum)) / double(cfg.momentum) * double(hist[k]);
        }
      }
      me.selections.push_back(hash_chunks(s.selected_chunks()) ^ (hash_chunks(s.upcoming_chunks()) << 1));
      if (keep_views) me.views.emplace_back(g, g + n);
    }
    me.hist.assign(s.residual().begin(), s.residual().end());
  });
  return rec;
}

// fed (all ranks, all iterations) == factor * applied + held + decayed, per element, fp64.
double check_accounting(const std::vector<rank_record>& rec, bool average) {
  const std::size_t n = rec[0].fed.size();
  const double P = double(rec.size());
  double worst = 0;
  std::size_t bad = 0;
  for (std::size_t k = 0; k < n; ++k) {
    double fed = 0, abs = 0, rest = 0;
    for (const auto& r : rec) {
      fed += r.fed[k];
      abs += r.fed_abs[k];
      rest += r.hist[k] + r.decayed[k];
    }
    const double applied = (average ? P : 1.0) * rec[0].applied[k];
    const double err = std::fabs(fed - applied - rest) / std::max(abs, 1e-30);
    worst = std::max(worst, err);
    if (err > 1e-5 && std::fabs(fed - applied - rest) > 1e-30) ++bad;
  }
  CHECK(bad == 0);
  for (const auto& r : rec) {
    CHECK(r.applied == rec[0].applied);  // bitwise identical views on every rank
    CHECK(r.selections == rec[0].selections);
    CHECK(r.nonzero_unselected == 0);
  }
  return worst;
}

Layout random_layout(std::mt19937_64& rng) {
  std::vector<std::size_t> sizes(1 + rng() % 10);
  for (auto& s : sizes) s = 1 + rng() % (rng() % 4 == 0 ? 1500 : 200);
  return Layout::from_sizes(sizes);
}

template <class E>
int conservation_batch(std::uint64_t seed, int runs, int iters, double& worst_all) {
  std::mt19937_64 rng(seed);
  int done = 0;
  for (int r = 0; r < runs; ++r) {
    auto l = random_layout(rng);
    run_config cfg;
    cfg.P = 1 + int(rng() % 8);
    cfg.percent = 1 + unsigned(rng() % 100);
    cfg.warmup = rng() % 4;
    cfg.ramp = rng() % 6;
    const float ms[] = {1.0f, 1.0f, 0.9f, 0.5f};
    cfg.momentum = ms[rng() % 4];
    cfg.average = rng() % 3 != 0;
    CAPTURE(seed);
    CAPTURE(r);
    CAPTURE(cfg.P);
    CAPTURE(cfg.percent);
    CAPTURE(cfg.momentum);
    CAPTURE(l.total_numel());
    auto rec = run_csc<E>(l, cfg, iters, seed * 7 + std::uint64_t(r));
    const double worst = check_accounting(rec, cfg.average);
    CHECK(worst <= 1e-5);
    worst_all = std::max(worst_all, worst);
    done += iters;
  }
  return done;
}
}  // namespace

TEST_CASE("CSC conservation: fed == applied + held + decayed over 1000+ random iterations (fp64, rel err <= 1e-5)") {
  // "applied": what the views hold after finish(), times P when averaged (zero on kept-back
  // chunks); "held": the residual (Algorithm 1's hg) at the end; "decayed": (1 - m) g of every
  // kept-back accumulated gradient g, which is (1 - m) / m * hg right after that iteration.
  // With m = 1 (half of the runs) decayed is zero: plain conservation.
  int iterations = 0;
  double worst = 0;
  iterations += conservation_batch<Exchanger<Sparsifier<CSC<7, 15>>>>(1, 5, 60, worst);
  iterations += conservation_batch<Exchanger<Sparsifier<CSC<64, 15>>, Fusion<256>>>(2, 5, 60, worst);
  iterations += conservation_batch<Exchanger<Fusion<4096, 512>, Sparsifier<CSC<100, 15>>>>(3, 5, 60, worst);
  iterations += conservation_batch<Exchanger<Sparsifier<CSC<1, 15>>>>(4, 3, 60, worst);
  iterations += conservation_batch<Exchanger<Sparsifier<CSC<5000, 15>>, Fusion<1 << 20>>>(5, 3, 40, worst);
  CHECK(iterations >= 1000);
  INFO("worst per-element relative error " << worst);  // measured: 3.7e-8
  CHECK(worst <= 1e-5);
}

TEST_CASE_TEMPLATE("CSC with a 16-bit wire keeps the encoding's rounding error in the history (issue 10's reproduction)", W, wire::fp16, wire::bf16) {
  // Two ranks each feed four copies of 1 + 2^-11, which neither fp16 nor bf16 represents: the
  // wire carries 1 (a tie, to even), and the 2^-11 stays in each rank's history instead of
  // being lost (applied 8, held 0, fed 8 + 2^-8 before the fix).
  auto l = Layout::from_sizes({4});
  const float x = 1.0f + std::ldexp(1.0f, -11);
  for (bool average : {false, true}) {
    CAPTURE(average);
    std::vector<double> held(2);
    std::vector<float> view(4);
    inproc::run(2, [&](inproc::transport& t) {
      exchange_options o;
      o.average = average;
      on_inproc<Exchanger<Sparsifier<CSC<2, 50>>, Precision<W>>> ex(t, l, o);
      std::fill(ex.view(0).begin(), ex.view(0).end(), x);
      ex.ready(0);
      CHECK(ex.finish().finite());
      for (float h : ex.sparsifier().residual()) held[std::size_t(t.rank())] += h;
      if (t.rank() == 0) std::copy(ex.view(0).begin(), ex.view(0).end(), view.begin());
    });
    double applied = 0;
    for (float v : view) applied += (average ? 2.0 : 1.0) * v;
    CHECK(applied == 8.0);
    CHECK(held[0] == 4 * std::ldexp(1.0, -11));
    CHECK(held[1] == held[0]);
    CHECK(applied + held[0] + held[1] == 8 * double(x));  // fed, exactly
  }
}

namespace {
// Exact accounting with a 16-bit wire: every rank's values are multiples of 2^-24 in
// [2^-8, 2^-7) (17 significant bits: neither fp16 nor bf16 holds them), so that every fp32 step
// of the engine is exact (sums stay below 1, the histories and encodings are multiples of 2^-24)
// and only the 16-bit encoding rounds. The 16-bit sum itself must be exact too, or its rounding
// (which no rank can keep) would show: P = 2 ranks feed equal values (the sum doubles), P = 3 feed
// x, y and -y (the sum is x's encoding). Then fed == applied + held to the last bit.
template <class W>
void exact_16bit_conservation(int P, bool average, std::uint64_t seed) {
  CAPTURE(P);
  CAPTURE(average);
  auto l = Layout::from_sizes({37, 200, 5, 91});
  const std::size_t n = l.total_numel();
  const int iters = 30;
  std::vector<std::vector<double>> fed(std::size_t(P), std::vector<double>(n, 0.0)), held(fed);
  std::vector<double> applied(n, 0.0);
  std::vector<std::uint64_t> selections(std::size_t(P), 0);
  double kept_back = 0;
  std::size_t errors_kept = 0;
  inproc::run(P, [&](inproc::transport& t) {
    const auto r = std::size_t(t.rank());
    exchange_options o;
    o.average = average;
    on_inproc<Exchanger<Sparsifier<CSC<16, 30>>, Precision<W>, Fusion<256>>> ex(t, l, o);
    auto& s = ex.sparsifier();
    s.set_warmup(2, 5);
    std::mt19937_64 rng(seed + (P == 3 && r != 0 ? 1 : 0));  // P = 2: equal values; P = 3: x, y, -y
    const float sign = r == 2 ? -1.0f : 1.0f;
    for (int it = 0; it < iters; ++it) {
      float* g = ex.pool_data();
      for (std::size_t k = 0; k < n; ++k) {
        g[k] = sign * std::ldexp(float((1u << 16) + rng() % (1u << 16)), -24);
        fed[r][k] += g[k];
      }
      for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
      CHECK(ex.finish().finite());
      selections[r] = selections[r] * 31 + hash_chunks(s.selected_chunks());
      if (it == 0 && r == 0)  // dense warm-up: every chunk exchanged, the history holds only rounding errors
        for (float h : s.residual()) errors_kept += h != 0.0f;
      if (r == 0)
        for (std::size_t k = 0; k < n; ++k) applied[k] += (average ? double(P) : 1.0) * g[k];
    }
    for (std::size_t k = 0; k < n; ++k) held[r][k] = s.residual()[k];
    if (r == 0)
      for (float h : s.residual()) kept_back += std::fabs(h);
  });
  std::size_t lost = 0, first = n;
  for (std::size_t k = 0; k < n; ++k) {
    double f = 0, h = 0;
    for (int q = 0; q < P; ++q) {
      f += fed[std::size_t(q)][k];
      h += held[std::size_t(q)][k];
    }
    if (f != applied[k] + h) {
      ++lost;
      if (first == n) first = k;
    }
  }
  INFO("first element where fed != applied + held: " << first);
  CHECK(lost == 0);
  CHECK(errors_kept > n / 2);  // the values do not round-trip: most elements keep an error
  CHECK(kept_back > 0);
  for (auto x : selections) CHECK(x == selections[0]);
}
}  // namespace

TEST_CASE_TEMPLATE("CSC with a 16-bit wire: fed == applied + held exactly, P = 2 and 3, averaging on and off", W, wire::fp16, wire::bf16) {
  for (bool average : {false, true}) {
    exact_16bit_conservation<W>(2, average, 21);
    exact_16bit_conservation<W>(3, average, 22);
  }
}

TEST_CASE("CSC selection is identical on every rank for P = 2..8 (non-powers of two included)") {
  auto l = Layout::from_sizes({300, 17, 1024, 5, 999, 64});
  for (int P : {2, 3, 5, 6, 7, 8}) {
    CAPTURE(P);
    run_config cfg;
    cfg.P = P;
    cfg.percent = 20;
    cfg.momentum = 0.9f;
    auto rec = run_csc<Exchanger<Sparsifier<CSC<50, 20>>, Fusion<512>>>(l, cfg, 12, std::uint64_t(P), true);
    for (const auto& r : rec) {
      CHECK(r.selections == rec[0].selections);
      REQUIRE(r.views.size() == rec[0].views.size());
      for (std::size_t it = 0; it < r.views.size(); ++it)
        CHECK(std::memcmp(r.views[it].data(), rec[0].views[it].data(), r.views[it].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("CSC momentum correction: the history follows hg = m (g + hg) on kept-back chunks, 0 on exchanged ones") {
  auto l = Layout::from_sizes({40, 13, 70});
  const int P = 3;
  const float m = 0.5f;
  std::vector<std::vector<double>> ref(P);  // fp64 reference of every rank's history
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<CSC<10, 30>>>> ex(t, l);
    auto& s = ex.sparsifier();
    s.set_warmup(1, 2);
    s.set_momentum(m);
    auto& h = ref[std::size_t(t.rank())];
    h.assign(ex.pool_size(), 0);
    std::mt19937 rng(unsigned(t.rank()) + 40);
    std::vector<double> fed(ex.pool_size());
    for (int it = 0; it < 25; ++it) {
      for (std::size_t i = 0; i < l.size(); ++i)
        for (auto& x : ex.view(i)) x = std::uniform_real_distribution<float>(-2, 2)(rng);
      std::copy(ex.pool_data(), ex.pool_data() + ex.pool_size(), fed.begin());
      for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);
      (void)ex.finish();
      const auto mask = mask_of(s.selected_chunks(), s.chunk_count());
      std::size_t bad = 0;
      for (std::size_t k = 0; k < ex.pool_size(); ++k) {
        h[k] = mask[k / 10] ? 0.0 : double(m) * (fed[k] + h[k]);
        if (std::fabs(double(s.residual()[k]) - h[k]) > 1e-5 * (1 + std::fabs(h[k]))) ++bad;
      }
      CHECK(bad == 0);
      if (it >= 3) CHECK(s.selected_chunks().size() == 4);  // ceil(30% of 13)
    }
  });
}

// ---- edge cases --------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("CSC with percent 100 equals the Dense exchange bit for bit", W, wire::fp32, wire::fp16, wire::bf16) {
  // With a 16-bit wire CSC keeps the encoding's rounding error in its history and sends it with
  // the next iteration: Dense is fed the same accumulated gradient (pool + history, added in fp32
  // as CSC's compaction does). With fp32 the history stays 0 and both are fed the same values.
  using wt = typename W::type;
  constexpr bool narrow = sizeof(wt) < sizeof(float);
  auto l = Layout::from_sizes({1000, 3, 257, 4096, 1, 77});
  for (int P : {1, 3, 4}) {
    for (bool average : {true, false}) {
      CAPTURE(P);
      CAPTURE(average);
      std::vector<std::size_t> dense_bytes(static_cast<std::size_t>(P)), csc_bytes(static_cast<std::size_t>(P));
      inproc::run(P, [&](inproc::transport& t) {
        exchange_options o;
        o.average = average;
        on_inproc<Exchanger<Precision<W>, Fusion<2048>>> a(t, l, o);
        on_inproc<Exchanger<Precision<W>, Fusion<2048>, Sparsifier<CSC<100, 100>>>> b(t, l, o);
        b.sparsifier().set_warmup(0, 0);
        std::mt19937 rng(unsigned(t.rank()));
        const std::size_t n = a.pool_size();
        const float scale = average ? 1.0f / float(P) : 1.0f, unscale = average ? float(P) : 1.0f;
        std::size_t kept = 0;
        for (int it = 0; it < 4; ++it) {
          for (std::size_t i = 0; i < l.size(); ++i)
            for (auto& x : b.view(i)) x = std::uniform_real_distribution<float>(-3, 3)(rng);
          std::vector<float> g(n);
          for (std::size_t k = 0; k < n; ++k) g[k] = b.pool_data()[k] + b.sparsifier().residual()[k];
          std::copy(g.begin(), g.end(), a.pool_data());
          for (std::size_t i = 0; i < l.size(); ++i) {
            a.ready(i);
            b.ready(i);
          }
          auto sa = a.finish();
          auto sb = b.finish();
          CHECK(sa.nonfinite == sb.nonfinite);
          CHECK(std::memcmp(a.pool_data(), b.pool_data(), n * sizeof(float)) == 0);
          CHECK(b.sparsifier().selected_chunks().size() == b.sparsifier().chunk_count());
          dense_bytes[std::size_t(t.rank())] = sa.wire_bytes;
          csc_bytes[std::size_t(t.rank())] = sb.wire_bytes;
          // The history: 0 with fp32; the rounding error of this iteration's encoding otherwise.
          std::size_t bad = 0;
          for (std::size_t k = 0; k < n; ++k) {
            float want = 0.0f;
            if constexpr (narrow) {
              want = g[k] - kernels::to_float(kernels::wire_cast<wt>(g[k] * scale)) * unscale;
              kept += want != 0.0f;
            }
            bad += std::memcmp(&want, &b.sparsifier().residual()[k], sizeof(float)) != 0;
          }
          CHECK(bad == 0);
        }
        if constexpr (narrow) CHECK(kept > 0);  // the random values do not round-trip
      });
      CHECK(dense_bytes == csc_bytes);  // no norm collective when every chunk is always exchanged
    }
  }
}

TEST_CASE("CSC with all-zero gradients: zero views, zero residual, the first chunks selected") {
  auto l = Layout::from_sizes({100, 50});
  run_config cfg;
  cfg.P = 3;
  cfg.percent = 10;
  cfg.zero_gradients = true;
  auto rec = run_csc<Exchanger<Sparsifier<CSC<9, 10>>>>(l, cfg, 6, 1, true);
  for (const auto& r : rec) {
    for (const auto& v : r.views)
      for (float x : v) CHECK(x == 0.0f);
    for (double x : r.hist) CHECK(x == 0.0);
    CHECK(r.selections == rec[0].selections);
  }
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<CSC<9, 10>>>> ex(t, l);
    ex.sparsifier().set_warmup(0, 0);
    for (int it = 0; it < 2; ++it) {
      for (std::size_t i = 0; i < l.size(); ++i) {
        std::fill(ex.view(i).begin(), ex.view(i).end(), 0.0f);
        ex.ready(i);
      }
      (void)ex.finish();
    }
    // 17 chunks, 10%: 2 chunks, ties to the lowest indices
    CHECK(std::vector<std::uint32_t>(ex.sparsifier().selected_chunks().begin(), ex.sparsifier().selected_chunks().end()) ==
          std::vector<std::uint32_t>{0, 1});
  });
}

TEST_CASE("CSC: a NaN in a kept-back chunk is reported on every rank, kept out of the history, and the chunk exchanged next") {
  auto l = Layout::from_sizes({40});
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<CSC<10, 25>>>> ex(t, l);  // 4 chunks, 1 per sparse iteration
    auto& s = ex.sparsifier();
    s.set_warmup(0, 0);
    s.set_momentum(1.0f);
    auto step = [&](int nan_at) {
      auto v = ex.view(0);
      for (std::size_t i = 0; i < 40; ++i) v[i] = (i < 10 ? 5.0f : 1.0f);
      if (nan_at >= 0 && t.rank() == 1) v[std::size_t(nan_at)] = std::nanf("");
      ex.ready(0);
      return ex.finish();
    };
    CHECK(step(-1).finite());  // dense; chunk 0 has the largest norm
    CHECK(std::vector<std::uint32_t>(s.upcoming_chunks().begin(), s.upcoming_chunks().end()) == std::vector<std::uint32_t>{0});
    auto st = step(25);  // NaN on rank 1 in chunk 2, which is kept back
    CHECK(st.nonfinite == 1);  // one kept-back chunk with a non-finite summed norm, on every rank
    CHECK(std::vector<std::uint32_t>(s.upcoming_chunks().begin(), s.upcoming_chunks().end()) == std::vector<std::uint32_t>{2});
    for (std::size_t i = 0; i < 40; ++i) CHECK(std::isfinite(s.residual()[i]));  // the NaN is not kept (history 0 there)
    CHECK(s.residual()[25] == (t.rank() == 1 ? 0.0f : 1.0f));
    auto st2 = step(-1);
    CHECK(st2.nonfinite == 0);  // chunk 2 exchanged without the dropped NaN
    CHECK(ex.view(0)[25] == 5.0f * (1.0f / 3.0f));  // (2 + 1 + 2) / 3: rank 1 lost its iteration-1 value there
    CHECK(ex.view(0)[24] == 2.0f);
  });
}

// ---- Algorithm 1's update step --------------------------------------------------------------------

TEST_CASE("momentum SGD (Algorithm 1): updates exchanged chunks only; per-tensor calls equal the whole-pool call") {
  const std::size_t n = 50, C = 8;  // 7 chunks, the last has 2 elements
  std::vector<float> g(n), w0(n);
  std::mt19937 rng(3);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
    w0[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  }
  const std::vector<std::uint32_t> sel{1, 4, 6};
  optim::momentum_sgd a(n, 0.1f, 0.9f), b(n, 0.1f, 0.9f);
  std::vector<float> wa = w0, wb = w0;
  std::vector<double> hu(n, 0), wref(w0.begin(), w0.end());
  for (int step = 0; step < 3; ++step) {
    a.step(wa, g, sel, C);
    // b: per "tensor" ranges [0, 13), [13, 40), [40, 50)
    for (auto [o, len] : {std::pair<std::size_t, std::size_t>{0, 13}, {13, 27}, {40, 10}})
      b.step(std::span<float>(wb).subspan(o, len), std::span<const float>(g).subspan(o, len), o, sel, C);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t c = i / C;
      if (c == 1 || c == 4 || c == 6) {
        hu[i] = 0.9 * hu[i] + 0.1 * double(g[i]);
        wref[i] -= hu[i];
      }
    }
  }
  CHECK(wa == wb);
  CHECK(std::vector<float>(a.velocity().begin(), a.velocity().end()) == std::vector<float>(b.velocity().begin(), b.velocity().end()));
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(wa[i] == doctest::Approx(wref[i]).epsilon(1e-6));
    if (hu[i] == 0) {
      CHECK(wa[i] == w0[i]);  // kept-back chunk: weight and velocity untouched
      CHECK(a.velocity()[i] == 0.0f);
    }
  }
  std::vector<float> wd = w0;
  optim::momentum_sgd d(n, 0.1f, 0.0f);
  d.step_all(wd, g);
  for (std::size_t i = 0; i < n; ++i) CHECK(wd[i] == w0[i] - 0.1f * g[i]);

  SUBCASE("bad input") {
    CHECK_THROWS_AS(optim::momentum_sgd(n, -1.0f, 0.9f), gflow::invalid_argument);
    CHECK_THROWS_AS(optim::momentum_sgd(n, 0.1f, 1.0f), gflow::invalid_argument);
    CHECK_THROWS_AS(optim::momentum_sgd(n, std::nanf(""), 0.5f), gflow::invalid_argument);
    const std::vector<std::uint32_t> out_of_range{7};
    CHECK_THROWS_AS(a.step(wa, g, out_of_range, C), gflow::invalid_argument);
    const std::vector<std::uint32_t> unsorted{4, 1};
    CHECK_THROWS_AS(a.step(wa, g, unsorted, C), gflow::invalid_argument);
    CHECK_THROWS_AS(a.step(wa, g, sel, 0), gflow::invalid_argument);
    CHECK_THROWS_AS(a.step(std::span<float>(wa).subspan(0, 10), std::span<const float>(g).subspan(0, 10), 45, sel, C),
                    gflow::invalid_argument);
    CHECK_THROWS_AS(a.step(std::span<float>(wa).subspan(0, 10), std::span<const float>(g).subspan(0, 9), 0, sel, C),
                    gflow::invalid_argument);
  }
}

TEST_CASE("CSC with the momentum SGD step: a kept-back chunk's weights wait, its gradient arrives later") {
  auto l = Layout::from_sizes({8, 8});  // pool: t1 [0, 8), t0 [8, 16); chunks of 8
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<CSC<8, 50>>>> ex(t, l);
    auto& s = ex.sparsifier();
    s.set_warmup(1, 0);
    s.set_momentum(1.0f);
    optim::momentum_sgd opt(ex.pool_size(), 1.0f, 0.5f);
    std::vector<float> w(16, 0.0f);
    auto step = [&](float g0, float g1) {
      std::fill(ex.view(1).begin(), ex.view(1).end(), g0);  // pool chunk 0
      std::fill(ex.view(0).begin(), ex.view(0).end(), g1);  // pool chunk 1
      ex.ready(1);
      ex.ready(0);
      (void)ex.finish();
      opt.step(w, {ex.pool_data(), ex.pool_size()}, s.selected_chunks(), s.chunk_elems());
    };
    step(2, 1);  // dense: hu = 2 | 1, w = -2 | -1; chunk 0 larger -> next selects chunk 0
    CHECK(w[0] == -2.0f);
    CHECK(w[8] == -1.0f);
    step(1, 3);  // chunk 1 kept back (history 3): w0 -= 0.5*2+1 = 2 -> -4; w1 unchanged
    CHECK(w[0] == -4.0f);
    CHECK(w[8] == -1.0f);
    CHECK(opt.velocity()[8] == 1.0f);
    step(0, 0);  // chunk 1 (norm 2*3*8 > chunk 0's) now exchanged with g = 3: hu = 0.5 + 3
    CHECK(s.selected_chunks()[0] == 1);
    CHECK(w[8] == -4.5f);
    CHECK(w[0] == -4.0f);
  });
}

// ---- bad input -----------------------------------------------------------------------------------

TEST_CASE("CSC setters reject bad values with typed errors naming the parameter, and refuse mid-iteration changes") {
  auto l = Layout::from_sizes({30, 30});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<8, 15>>>> ex(m, l);
  auto& s = ex.sparsifier();
  auto expect = [](auto&& f, const char* subject, const char* text) {
    try {
      f();
      FAIL("expected an error");
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == subject);
      CHECK(std::string(e.what()).find(text) != std::string::npos);
      CHECK(std::string(e.what()).find("Fix:") != std::string::npos);
    }
  };
  expect([&] { s.set_percent(0); }, "percent", "must lie in (0, 100] (got 0)");
  expect([&] { s.set_percent(101); }, "percent", "must lie in (0, 100] (got 101)");
  expect([&] { s.set_momentum(-0.1f); }, "momentum", "must lie in [0, 1]");
  expect([&] { s.set_momentum(1.5f); }, "momentum", "must lie in [0, 1]");
  expect([&] { s.set_momentum(std::nanf("")); }, "momentum", "must lie in [0, 1]");
  expect([&] { s.set_warmup(0, (std::uint64_t{1} << 32) + 1); }, "ramp", "longer than supported");
  CHECK(s.percent() == 15);
  CHECK(s.momentum() == doctest::Approx(1.0f));  // default: nothing lost
  CHECK(s.warmup_iterations() == 100);
  s.set_percent(100);
  s.set_momentum(0.0f);
  s.set_warmup(0, 0);
  CHECK(s.percent() == 100);
  ex.ready(1);  // pool bucket 0 goes out: the iteration has started
  CHECK_THROWS_AS(s.set_percent(20), gflow::usage_error);
  CHECK_THROWS_AS(s.set_momentum(0.5f), gflow::usage_error);
  CHECK_THROWS_AS(ex.set_fusion(64), gflow::usage_error);
  ex.ready(0);
  (void)ex.finish();
  s.set_percent(20);  // fine again between iterations
  ex.set_fusion(64);  // re-plans the chunk ranges
  for (int it = 0; it < 3; ++it) {
    ex.ready(0);
    ex.ready(1);
    (void)ex.finish();
  }
  CHECK(s.selected_chunks().size() == 2);  // ceil(20% of 8)
}

TEST_CASE("CSC policy tag: concept, defaults, composition") {
  static_assert(sparsifier_policy<Sparsifier<CSC<>>>);
  static_assert(CSC<>::chunk_elems == 32768 && CSC<>::percent == 15);
  static_assert(std::is_same_v<Exchanger<Sparsifier<CSC<32768, 15>>, Fusion<1024>>::policies::sparsifier::scheme, CSC<32768, 15>>);
  auto l = Layout::from_sizes({100000});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<>>>> ex(m, l);
  CHECK(ex.sparsifier().chunk_count() == 4);  // 100000 / 32768, ceil
  CHECK(ex.sparsifier().geometry().size(3) == 100000 - 3 * 32768);
  CHECK(ex.sparsifier().upcoming_chunks().size() == 4);
  CHECK(ex.sparsifier().selected_chunks().empty());
}

TEST_CASE("CSC under Overlap<Funneled> (exchange on the issuing thread) equals Overlap<None> bit for bit") {
  auto l = Layout::from_sizes({300, 17, 1024, 5, 999, 64});
  const int P = 3;
  std::vector<std::vector<float>> a(std::size_t{P}), b(std::size_t{P});
  std::vector<std::uint64_t> sa(std::size_t{P}), sb(std::size_t{P});
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<CSC<50, 20>>, Fusion<512>>> x(t, l);
    on_inproc<Exchanger<Sparsifier<CSC<50, 20>>, Fusion<512>, Overlap<Funneled>>> y(t, l);
    x.sparsifier().set_warmup(1, 2);
    y.sparsifier().set_warmup(1, 2);
    std::mt19937 rng(unsigned(t.rank()) + 1);
    const auto r = std::size_t(t.rank());
    for (int it = 0; it < 8; ++it) {
      for (std::size_t i = 0; i < l.size(); ++i) {
        for (auto& v : x.view(i)) v = std::uniform_real_distribution<float>(-1, 1)(rng) * float(1 + (i + std::size_t(it)) % 4);
        std::copy(x.view(i).begin(), x.view(i).end(), y.view(i).begin());
      }
      // One exchanger at a time: both use the same transport (y from its issuing thread).
      for (std::size_t i = l.size(); i-- > 0;) x.ready(i);
      (void)x.finish();
      for (std::size_t i = l.size(); i-- > 0;) y.ready(i);
      (void)y.finish();
      a[r].insert(a[r].end(), x.pool_data(), x.pool_data() + x.pool_size());
      b[r].insert(b[r].end(), y.pool_data(), y.pool_data() + y.pool_size());
      sa[r] = sa[r] * 31 + hash_chunks(x.sparsifier().selected_chunks());
      sb[r] = sb[r] * 31 + hash_chunks(y.sparsifier().selected_chunks());
    }
  });
  for (int r = 0; r < P; ++r) {
    CHECK(a[std::size_t(r)] == b[std::size_t(r)]);
    CHECK(sa[std::size_t(r)] == sb[std::size_t(r)]);
    CHECK(sa[std::size_t(r)] == sa[0]);
  }
}
