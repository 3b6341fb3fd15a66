// Sparsifier<TopK<d>> and Sparsifier<GTopK<d>>: density schedules, the gTop-k tree, Table I,
// the host kernels against brute force, what goes on the wire (mock), results against
// brute-force references of the same semantics on 1..16 in-process ranks, conservation over
// 1000+ random iterations, edge cases and bad input (including malformed received messages);
// the one-pass selection (accumulate_select_topk) against the composition it replaces.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/kernels/topk.hpp>
#include <gflow/plan/density.hpp>
#include <gflow/plan/tree.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_mock;
using gflow_test::on_inproc;
namespace k_ = gflow::kernels;

namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

/// Gradient of rank r at pool index i in iteration it. mode 0: uniform in [-1, 1); mode 1: few
/// distinct values (many ties); mode 2: zeros.
float grad(int mode, int r, std::size_t i, int it, std::uint64_t seed = 0) {
  if (mode == 2) return 0.0f;
  std::uint64_t x = seed ^ (std::uint64_t(r + 1) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(i) * 0xBF58476D1CE4E5B9ull) ^
                    (std::uint64_t(it + 1) * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  if (mode == 1) return static_cast<float>(static_cast<int>(x % 5) - 2);  // -2..2
  return static_cast<float>(static_cast<double>(x >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

/// Brute-force top-k: sort positions by (|v| desc, position asc), take k, return sorted.
std::vector<std::size_t> brute_topk(const float* v, std::size_t n, std::size_t k) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::sort(p.begin(), p.end(), [&](std::size_t a, std::size_t b) {
    const auto ka = k_::magnitude_key(v[a]), kb = k_::magnitude_key(v[b]);
    return ka != kb ? ka > kb : a < b;
  });
  p.resize(std::min(k, n));
  std::sort(p.begin(), p.end());
  return p;
}

// ---- brute-force reference of both schemes (std::map lists, one thread, P ranks) ---------------
template <class W>
struct reference {
  int P;
  bool global;
  bool average;
  std::vector<std::pair<std::size_t, std::size_t>> units;  // (offset, count)
  std::vector<std::vector<float>> res;                     // per rank, pool order
  std::vector<float> result;

  reference(int ranks, bool g, bool avg, std::vector<std::pair<std::size_t, std::size_t>> u, std::size_t n)
      : P(ranks), global(g), average(avg), units(std::move(u)), res(static_cast<std::size_t>(ranks), std::vector<float>(n, 0.0f)), result(n) {}

  static constexpr bool narrow = sizeof(W) < sizeof(float);

  void step(const std::vector<std::vector<float>>& g, double density) {
    const float Pf = static_cast<float>(P);
    const float scale = (narrow && average) ? 1.0f / Pf : 1.0f;
    const float unscale = (narrow && average) ? Pf : 1.0f;
    std::vector<std::vector<float>> G = g;
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < G[q].size(); ++i) G[q][i] = g[q][i] + res[q][i];
    for (int q = 0; q < P; ++q) res[q] = G[q];
    for (auto [off, n] : units) {
      const std::size_t k = plan::k_for(density, n);
      std::vector<std::map<std::size_t, W>> mine(static_cast<std::size_t>(P));
      for (int q = 0; q < P; ++q)
        for (std::size_t p : brute_topk(G[q].data() + off, n, k)) {
          const std::size_t i = off + p;
          const W w = k_::wire_cast<W>(k_::sanitize(G[q][i] * scale));
          mine[q][i] = w;
          res[q][i] = G[q][i] - k_::to_float(w) * unscale;
        }
      std::fill(result.begin() + static_cast<std::ptrdiff_t>(off), result.begin() + static_cast<std::ptrdiff_t>(off + n), 0.0f);
      if (!global) {
        for (int q = 0; q < P; ++q)
          for (auto [i, w] : mine[q]) result[i] += k_::to_float(w);
        if (!narrow && average)
          for (std::size_t i = off; i < off + n; ++i) result[i] = result[i] * (1.0f / Pf);
        continue;
      }
      // tree
      std::vector<std::map<std::size_t, W>> list = mine;
      std::vector<std::vector<std::pair<std::size_t, float>>> records(static_cast<std::size_t>(P));
      const int rounds = plan::gtopk_rounds(P);
      for (int j = 0; j < rounds; ++j) {
        const int half = 1 << j;
        for (int r = 0; r < P; r += 2 * half) {
          if (r + half >= P) continue;
          std::map<std::size_t, float> sum;
          for (auto [i, w] : list[r + half]) sum[i] = k_::to_float(w);
          for (auto [i, w] : list[r]) {
            auto it = sum.find(i);
            if (it == sum.end()) sum[i] = k_::to_float(w);
            else it->second = k_::sanitize(it->second + k_::to_float(w));
          }
          std::vector<std::size_t> idx;
          std::vector<float> vals;
          for (auto [i, v] : sum) {
            idx.push_back(i);
            vals.push_back(v);
          }
          auto keep = brute_topk(vals.data(), vals.size(), k);
          std::set<std::size_t> kept(keep.begin(), keep.end());
          std::map<std::size_t, W> out;
          for (std::size_t p = 0; p < idx.size(); ++p) {
            if (kept.count(p)) {
              const W w = k_::wire_cast<W>(vals[p]);
              out[idx[p]] = w;
              const float err = vals[p] - k_::to_float(w);
              if (err != 0.0f) records[r].push_back({idx[p], err});
            } else {
              records[r].push_back({idx[p], vals[p]});
            }
          }
          list[r] = out;
        }
      }
      const auto& F = list[0];
      const float post = (!narrow && average) ? 1.0f / Pf : 1.0f;
      for (auto [i, w] : F) result[i] = k_::to_float(w) * post;
      for (int q = 0; q < P; ++q)
        for (auto [i, w] : mine[q])
          if (!F.count(i)) res[q][i] += k_::to_float(w) * unscale;
      for (int r = 0; r < P; ++r)
        for (auto [i, v] : records[r])
          if (F.count(i)) res[r][i] += v * unscale;
    }
  }
};

/// Per iteration and rank: the pool after finish() and the residual.
struct rank_trace {
  std::vector<std::vector<std::vector<float>>> result, residual;  // [iter][rank][i]
  std::vector<std::vector<std::vector<std::uint64_t>>> exchanged;
  std::vector<std::vector<std::size_t>> nonfinite;
};

/// Runs E on P in-process ranks for `iters` iterations with gradients gfn(rank, pool index, iter)
/// written straight into the pool; ready() in a rank-dependent order.
template <class E>
rank_trace run_ranks(int P, const Layout& l, int iters, const std::function<float(int, std::size_t, int)>& gfn,
                     const std::function<void(typename E::template on<inproc::transport>&)>& setup = {}, exchange_options o = {}) {
  rank_trace tr;
  const std::size_t total = l.total_numel();
  tr.result.assign(static_cast<std::size_t>(iters), std::vector<std::vector<float>>(static_cast<std::size_t>(P)));
  tr.residual = tr.result;
  tr.exchanged.assign(static_cast<std::size_t>(iters), std::vector<std::vector<std::uint64_t>>(static_cast<std::size_t>(P)));
  tr.nonfinite.assign(static_cast<std::size_t>(iters), std::vector<std::size_t>(static_cast<std::size_t>(P)));
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l, o);
    if (setup) setup(ex);
    const auto r = static_cast<std::size_t>(t.rank());
    std::mt19937 rng(static_cast<unsigned>(t.rank() * 31 + 7));
    std::vector<std::size_t> order(l.size());
    std::iota(order.begin(), order.end(), 0);
    for (int it = 0; it < iters; ++it) {
      float* pool = ex.pool_data();
      for (std::size_t i = 0; i < total; ++i) pool[i] = gfn(t.rank(), i, it);
      std::shuffle(order.begin(), order.end(), rng);
      for (auto i : order) ex.ready(i);
      const auto st = ex.finish();
      tr.result[it][r].assign(pool, pool + total);
      auto res = ex.sparsifier().residual();
      tr.residual[it][r].assign(res.begin(), res.end());
      auto xs = ex.sparsifier().exchanged();
      tr.exchanged[it][r].assign(xs.begin(), xs.end());
      tr.nonfinite[it][r] = st.nonfinite;
    }
  });
  return tr;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<std::pair<std::size_t, std::size_t>> units_of(const Layout& l, std::size_t threshold_bytes, std::size_t wire_bytes) {
  const auto pool = plan::plan_pool(l);
  if (threshold_bytes == 0) return {{0, pool.total}};
  std::vector<std::pair<std::size_t, std::size_t>> u;
  for (const auto& b : plan::plan_buckets(l, pool, {wire_bytes, threshold_bytes, 0})) u.push_back({b.offset, b.count});
  return u;
}

/// Checks E on P ranks against the reference, bitwise, over `iters` iterations.
template <class E>
void check_against_reference(int P, const Layout& l, int iters, int mode, double density, std::size_t threshold = 0) {
  using W = typename E::template on<inproc::transport>::wire_type;
  using S = typename E::policies::sparsifier::scheme;
  exchange_options o;
  if (threshold) o.threshold_bytes = threshold;
  auto gfn = [mode](int r, std::size_t i, int it) { return grad(mode, r, i, it); };
  auto tr = run_ranks<E>(
      P, l, iters, gfn, [density](auto& ex) { ex.sparsifier().set_density(density); }, o);
  const std::size_t total = l.total_numel();
  reference<W> ref(P, S::global, true, units_of(l, threshold, sizeof(W)), total);
  for (int it = 0; it < iters; ++it) {
    std::vector<std::vector<float>> g(static_cast<std::size_t>(P), std::vector<float>(total));
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < total; ++i) g[q][i] = gfn(q, i, it);
    ref.step(g, density);
    for (int q = 0; q < P; ++q) {
      CAPTURE(q);
      CAPTURE(it);
      CHECK(same_bits(tr.result[it][q], ref.result));
      CHECK(same_bits(tr.residual[it][q], ref.res[q]));
      CHECK(tr.exchanged[it][q] == tr.exchanged[it][0]);
    }
  }
}

}  // namespace

// ---- plan: densities ---------------------------------------------------------------------------

TEST_CASE("k_for: ceil(density * n), integer products exact, clamped to [1, n]") {
  CHECK(plan::k_for(0.1, 30) == 3);  // 0.1 * 30 = 3.0000000000000004 in double
  CHECK(plan::k_for(0.001, 25'557'032) == 25'558);
  CHECK(plan::k_for(0.001, 1000) == 1);
  CHECK(plan::k_for(0.001, 10) == 1);  // at least one
  CHECK(plan::k_for(0.5, 7) == 4);
  CHECK(plan::k_for(1.0, 7) == 7);
  CHECK(plan::k_for(0.9999, 3) == 3);
  CHECK(plan::k_for(0.25, 0) == 0);
  CHECK_THROWS_AS(plan::k_for(0.0, 10), gflow::invalid_argument);
}

TEST_CASE("density schedules: warm-up by iteration range or epoch, paper 003's values, boundaries") {
  auto s = plan::density_schedule::per_iteration({{100, 0.25}, {300, 0.01}}, 0.001);
  CHECK(s.at(0) == 0.25);
  CHECK(s.at(99) == 0.25);
  CHECK(s.at(100) == 0.01);
  CHECK(s.at(299) == 0.01);
  CHECK(s.at(300) == 0.001);
  CHECK(s.at(std::numeric_limits<std::uint64_t>::max()) == 0.001);
  CHECK(s.max() == 0.25);

  auto p = plan::density_schedule::paper003(10);
  const double want[] = {0.25, 0.0725, 0.015, 0.004, 0.001};
  for (int e = 0; e < 5; ++e) {
    CHECK(p.at(std::uint64_t(e) * 10) == want[e]);
    CHECK(p.at(std::uint64_t(e) * 10 + 9) == want[e]);
  }
  CHECK(p.at(1'000'000) == 0.001);
  CHECK(plan::density_schedule::paper003(10, 0.005).final_density() == 0.005);
  CHECK(plan::density_schedule::constant(0.3).at(12345) == 0.3);
  CHECK(plan::density_schedule::per_epoch({}, 0.5, 1).max() == 0.5);
}

TEST_CASE("density schedules reject bad values with the parameter named") {
  auto expect = [](auto fn, const std::string& subject) {
    try {
      fn();
      FAIL("expected gflow::invalid_argument for " << subject);
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == subject);
      CHECK(std::string(e.what()).find("Fix:") != std::string::npos);
    }
  };
  expect([] { (void)plan::density_schedule::constant(0.0); }, "final_density");
  expect([] { (void)plan::density_schedule::constant(1.5); }, "final_density");
  expect([] { (void)plan::density_schedule::constant(std::nan("")); }, "final_density");
  expect([] { (void)plan::density_schedule::constant(-0.1); }, "final_density");
  expect([] { (void)plan::density_schedule::per_iteration({{10, 0.5}, {10, 0.1}}, 0.01); }, "steps[1].until");
  expect([] { (void)plan::density_schedule::per_iteration({{0, 0.5}}, 0.01); }, "steps[0].until");
  expect([] { (void)plan::density_schedule::per_iteration({{10, 2.0}}, 0.01); }, "steps[0].density");
  expect([] { (void)plan::density_schedule::per_epoch({0.1}, 0.01, 0); }, "iterations_per_epoch");
  expect([] { plan::check_density(0.0); }, "density");
}

// ---- plan: the tree and Table I ----------------------------------------------------------------

TEST_CASE("gTop-k tree: ceil(log2 P) rounds; every list reaches rank 0 exactly once, for any P") {
  CHECK(plan::gtopk_rounds(1) == 0);
  CHECK(plan::gtopk_rounds(2) == 1);
  CHECK(plan::gtopk_rounds(3) == 2);
  CHECK(plan::gtopk_rounds(8) == 3);
  CHECK(plan::gtopk_rounds(9) == 4);
  CHECK(plan::gtopk_rounds(16) == 4);
  CHECK(plan::gtopk_rounds(17) == 5);
  // P = 6 spelled out: round 0: 1->0 3->2 5->4; round 1: 2->0 (4 idle: 6 does not exist); round 2: 4->0.
  using R = plan::tree_role;
  CHECK(plan::gtopk_step(0, 6, 0).role == R::receive);
  CHECK(plan::gtopk_step(0, 6, 0).peer == 1);
  CHECK(plan::gtopk_step(3, 6, 0).role == R::send);
  CHECK(plan::gtopk_step(3, 6, 0).peer == 2);
  CHECK(plan::gtopk_step(4, 6, 1).role == R::idle);
  CHECK(plan::gtopk_step(2, 6, 1).role == R::send);
  CHECK(plan::gtopk_step(4, 6, 2).role == R::send);
  CHECK(plan::gtopk_step(4, 6, 2).peer == 0);
  CHECK(plan::gtopk_step(0, 6, 2).peer == 4);
  CHECK(plan::gtopk_step(3, 6, 1).role == R::idle);

  for (int P = 1; P <= 70; ++P) {
    CAPTURE(P);
    std::vector<std::set<int>> holds(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) holds[r] = {r};
    std::vector<int> sent(static_cast<std::size_t>(P), 0);
    const int rounds = plan::gtopk_rounds(P);
    for (int j = 0; j < rounds; ++j) {
      for (int r = 0; r < P; ++r) {
        const auto s = plan::gtopk_step(r, P, j);
        if (s.role == R::send) {
          const auto back = plan::gtopk_step(s.peer, P, j);
          REQUIRE(back.role == R::receive);
          REQUIRE(back.peer == r);
          CHECK(sent[r] == 0);  // a sender sends once, then is idle
          ++sent[r];
        }
        if (sent[r] && s.role != R::send) CHECK(s.role == R::idle);
      }
      for (int r = 0; r < P; ++r) {
        const auto s = plan::gtopk_step(r, P, j);
        if (s.role == R::receive) {
          for (int x : holds[s.peer]) CHECK(holds[r].insert(x).second);  // never twice
          holds[s.peer].clear();
        }
      }
    }
    CHECK(holds[0].size() == static_cast<std::size_t>(P));
    CHECK(plan::gtopk_schedule(0, P).size() == static_cast<std::size_t>(rounds));
  }
  CHECK_THROWS_AS(plan::gtopk_rounds(0), gflow::invalid_argument);
  CHECK_THROWS_AS(plan::gtopk_step(6, 6, 0), gflow::invalid_argument);
  CHECK_THROWS_AS(plan::gtopk_step(0, 6, 3), gflow::invalid_argument);
}

TEST_CASE("Table I cost formulas") {
  const std::size_t m = 25'000'000, k = 25'000;
  auto d = plan::table1_cost(plan::aggregation::dense_allreduce, 8, m, k);
  CHECK(d.latency_terms == 14.0);
  CHECK(d.elements == doctest::Approx(2.0 * 7.0 / 8.0 * m));
  auto t = plan::table1_cost(plan::aggregation::topk_allreduce, 8, m, k);
  CHECK(t.latency_terms == 3.0);
  CHECK(t.elements == 2.0 * 7 * k);
  auto g = plan::table1_cost(plan::aggregation::gtopk_allreduce, 8, m, k);
  CHECK(g.latency_terms == 6.0);
  CHECK(g.elements == 4.0 * k * 3);
  CHECK(g.time(1e-5, 1e-9) == doctest::Approx(6e-5 + 12.0 * k * 1e-9));
  CHECK(plan::table1_bytes(plan::aggregation::dense_allreduce, 8, m, k, 4, 4) == 2 * 7 * m * 4 / 8);
  CHECK(plan::table1_bytes(plan::aggregation::topk_allreduce, 8, m, k, 4, 4) == 7 * k * 8);
  CHECK(plan::table1_bytes(plan::aggregation::gtopk_allreduce, 8, m, k, 4, 2) == 2 * 3 * k * 6);
  CHECK(plan::table1_bytes(plan::aggregation::gtopk_allreduce, 6, m, k, 8, 4) == 2 * 3 * k * 12);  // ceil(log2 6) = 3
}

// ---- host kernels ------------------------------------------------------------------------------

TEST_CASE("select_topk equals brute force: random, ties, zeros, signs, NaN, k = 1 and k >= n") {
  std::mt19937_64 rng(42);
  std::vector<float> v;
  std::vector<std::uint32_t> scratch;
  std::vector<std::uint64_t> out;
  for (int trial = 0; trial < 600; ++trial) {
    const std::size_t n = 1 + rng() % (trial < 300 ? 64 : 5000);
    const int mode = trial % 4;
    v.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      switch (mode) {
        case 0: v[i] = std::ldexp(static_cast<float>(rng() % 100000) - 50000.0f, -static_cast<int>(rng() % 40)); break;
        case 1: v[i] = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;  // many ties, +-
        case 2: v[i] = (rng() % 3 == 0) ? -0.0f : 0.0f; break;                          // all zero
        default: v[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng())); break; // any bits: NaN, inf, subnormal
      }
    }
    const std::size_t k = trial % 10 == 0 ? 1 : trial % 10 == 1 ? n + static_cast<std::size_t>(rng() % 3) : 1 + rng() % n;
    scratch.assign(n, 0);
    out.assign(std::min(k, n), 0);
    const std::uint64_t base = rng() % 1000;
    const std::size_t c = k_::select_topk(v.data(), n, k, base, out.data(), scratch.data());
    auto want = brute_topk(v.data(), n, k);
    REQUIRE(c == want.size());
    bool same = true;
    for (std::size_t j = 0; j < c; ++j) same = same && out[j] == base + want[j];
    CAPTURE(trial);
    CHECK(same);
  }
  // NaN sorts above inf: it is selected, never left behind
  std::vector<float> w{1.0f, std::numeric_limits<float>::infinity(), std::nanf(""), -5.0f};
  std::uint32_t s[4];
  std::uint32_t o[1];
  CHECK(k_::select_topk(w.data(), 4, 1, 0, o, s) == 1);
  CHECK(o[0] == 2);
}

TEST_CASE("take_selected: fp32 residual exactly 0; 16-bit residual keeps the rounding error; non-finite never kept") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> G{1.0f, 0.1f, 3.0f, inf, std::nanf(""), 70000.0f};
  std::vector<float> res(G.size(), 9.0f);
  const std::uint32_t idx[] = {0, 1, 3, 4, 5};
  float out32[5];
  k_::take_selected(G.data(), res.data(), idx, 5, out32, 1.0f, 1.0f);
  CHECK(out32[0] == 1.0f);
  CHECK(out32[2] == inf);
  CHECK(out32[3] == inf);  // NaN travels as +inf
  CHECK(out32[4] == 70000.0f);
  CHECK(res == std::vector<float>{0.0f, 0.0f, 9.0f, 0.0f, 0.0f, 0.0f});  // index 2 not selected: untouched

  std::fill(res.begin(), res.end(), 9.0f);
  half out16[5];
  k_::take_selected(G.data(), res.data(), idx, 5, out16, 0.5f, 2.0f);  // 16-bit wire, averaging over 2 ranks
  CHECK(k_::to_float(out16[0]) == 0.5f);
  CHECK(res[0] == 0.0f);
  CHECK(res[1] == 0.1f - k_::to_float(out16[1]) * 2.0f);
  CHECK(res[1] != 0.0f);
  CHECK(k_::to_float(out16[2]) == inf);
  CHECK(k_::to_float(out16[3]) == inf);
  CHECK(res[3] == 0.0f);
  CHECK(res[4] == 0.0f);
  CHECK(k_::to_float(out16[4]) == 35008.0f);  // 35000 rounds to the fp16 grid (spacing 32)
  CHECK(res[5] == -16.0f);                    // 70000 - 2 * 35008: the rounding error is kept
}

// ---- the one-pass top-k (accumulate_select_topk) ------------------------------------------------

namespace {
/// accumulate_select_topk on copies of (g, r) against the composition it replaces (accumulate_residual
/// into pool and residual, then select_topk over the pool): the same indices, the same residual
/// bits, g untouched; select_topk_sampled over G agrees too. Returns the path taken.
template <class I = std::uint64_t>
k_::topk_path check_onepass(const std::vector<float>& g, const std::vector<float>& r, std::size_t k, std::uint64_t base, k_::topk_workspace& ws) {
  const std::size_t n = g.size();
  std::vector<float> pool = g, res_old = r;
  k_::accumulate_residual(pool.data(), res_old.data(), n);
  std::vector<std::uint32_t> scratch(n);
  std::vector<I> want(std::min(k, n) + 1, I{7}), got = want, got2 = want;
  const std::size_t wc = k_::select_topk(pool.data(), n, k, base, want.data(), scratch.data());
  std::vector<float> gin = g, res = r;
  const auto sel = k_::accumulate_select_topk(gin.data(), res.data(), n, k, base, got.data(), ws);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(static_cast<int>(sel.path));
  CHECK(sel.count == wc);
  CHECK(got == want);  // same indices, same order, nothing written past the count
  CHECK(same_bits(res, res_old));
  CHECK(same_bits(gin, g));
  const auto sel2 = k_::select_topk_sampled(res.data(), n, k, base, got2.data(), ws);
  CHECK(sel2.count == wc);
  CHECK(got2 == want);
  CHECK(same_bits(res, res_old));  // only read
  return sel.path;
}

/// n values of one kind: 0 spread magnitudes, 1 a tiny set (many ties), 2 all equal, 3 signed zeros,
/// 4 random with inf / -inf / NaN mixed in, 5 any bits. `res` makes the residual's share (finite:
/// an engine's residual never holds inf / NaN).
std::vector<float> onepass_values(std::mt19937_64& rng, std::size_t n, int mode, bool res) {
  std::vector<float> v(n);
  const float inf = std::numeric_limits<float>::infinity();
  for (auto& x : v) {
    switch (mode) {
      case 0: x = std::ldexp(static_cast<float>(rng() % 200001) - 100000.0f, -static_cast<int>(rng() % 24) - (res ? 3 : 0)); break;
      case 1: x = res ? 0.5f * static_cast<float>(static_cast<int>(rng() % 3) - 1) : static_cast<float>(static_cast<int>(rng() % 5) - 2); break;
      case 2: x = res ? 0.0f : 0.75f; break;
      case 3: x = (rng() % 2) ? -0.0f : 0.0f; break;
      case 4: {
        const auto u = rng() % 1000;
        x = (!res && u == 0) ? inf : (!res && u == 1) ? -inf : (!res && u == 2) ? std::nanf("") : static_cast<float>(static_cast<std::int64_t>(rng() % 2001) - 1000) / 64.0f;
        break;
      }
      default: {  // any bits; the residual finite, as the engine's always is (see below for NaN + NaN)
        x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
        if (res && !std::isfinite(x)) x = 0.0f;
        break;
      }
    }
  }
  return v;
}

/// Marks the positions plan_topk_sample(n, k) samples.
std::vector<char> sampled_positions(std::size_t n, std::size_t k) {
  const auto p = k_::plan_topk_sample(n, k);
  std::vector<char> s(n, 0);
  for (std::size_t r = 0; r < p.runs; ++r)
    for (std::size_t j = 0; j < k_::topk_sample_plan::run; ++j) s[p.run_start(r) + j] = 1;
  return s;
}
}  // namespace

TEST_CASE("plan_topk_sample: runs inside their strides, rank and capacity in range, full selection where sampling does not pay") {
  for (std::size_t n : {std::size_t{16384}, std::size_t{20000}, std::size_t{262147}, std::size_t{25'600'000}}) {
    for (double d : {0.0001, 0.001, 0.01, 0.1, 0.3}) {
      const std::size_t k = plan::k_for(d, n);
      const auto p = k_::plan_topk_sample(n, k);
      CAPTURE(n);
      CAPTURE(d);
      REQUIRE(p.runs > 0);
      CHECK(p.samples() <= 32768);
      CHECK(p.rank >= 1);
      CHECK(2 * p.rank <= p.samples());
      CHECK(p.capacity > k);
      CHECK(p.capacity <= n);
      for (std::size_t r = 0; r < p.runs; ++r) {
        CHECK(p.run_start(r) >= r * p.stride);
        CHECK(p.run_start(r) + k_::topk_sample_plan::run <= (r + 1) * p.stride);
      }
    }
  }
  CHECK(k_::plan_topk_sample(16383, 100).runs == 0);      // small unit
  CHECK(k_::plan_topk_sample(1 << 20, 1 << 19).runs == 0);  // density 0.5: the candidates would be most of it
  CHECK(k_::plan_topk_sample(1 << 20, 1 << 20).runs == 0);  // k = n
  CHECK(k_::plan_topk_sample(1 << 20, 0).runs == 0);
}

TEST_CASE("accumulate_select_topk equals accumulate_residual + select_topk bit for bit: densities, k = 1, n - 1, n, ties, zeros, non-finite") {
  std::mt19937_64 rng(2024);
  k_::topk_workspace ws;
  std::map<k_::topk_path, int> seen;
  // small units (the full selection), every k
  ws.reserve(100, 100);
  for (std::size_t n = 1; n <= 100; ++n) {
    const int mode = static_cast<int>(n % 6);
    const auto g = onepass_values(rng, n, mode, false), r = onepass_values(rng, n, mode, true);
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, n / 2 + 1, n - 1, n, n + 3}) ++seen[check_onepass(g, r, k, n * 3, ws)];
  }
  CHECK(seen[k_::topk_path::candidates] == 0);
  // units where sampling pays, every kind of value, densities 0.001 .. 0.5, k = 1, n - 1, n
  for (std::size_t n : {std::size_t{16384}, std::size_t{50021}, std::size_t{262147}}) {
    ws.reserve(n, n);
    for (int mode = 0; mode < 6; ++mode) {
      const auto g = onepass_values(rng, n, mode, false), r = onepass_values(rng, n, mode, true);
      for (double d : {0.001, 0.01, 0.1, 0.5}) ++seen[check_onepass(g, r, plan::k_for(d, n), 1000, ws)];
      for (std::size_t k : {std::size_t{1}, n - 1, n}) ++seen[check_onepass(g, r, k, 0, ws)];
      ++seen[check_onepass<std::uint32_t>(g, r, plan::k_for(0.01, n), 5, ws)];
    }
  }
  // a few million elements
  {
    const std::size_t n = 3'000'017;
    ws.reserve(n, n);
    for (int mode : {0, 1, 4}) {
      const auto g = onepass_values(rng, n, mode, false), r = onepass_values(rng, n, mode, true);
      for (double d : {0.001, 0.01}) {
        CAPTURE(mode);
        const auto path = check_onepass(g, r, plan::k_for(d, n), 0, ws);
        ++seen[path];
        if (mode != 1) CHECK(path == k_::topk_path::candidates);
      }
    }
  }
  CHECK(seen[k_::topk_path::candidates] > 20);
  CHECK(seen[k_::topk_path::full] > 0);
}

TEST_CASE("accumulate_select_topk: NaN + NaN (never in an engine) still selects exactly on the G it stores") {
  // Which operand's payload x86 returns for NaN + NaN depends on the operand order the compiler
  // picked (accumulate_residual's own vector body and tail differ), so only self-consistency holds.
  std::mt19937_64 rng(5);
  const std::size_t n = 70001;
  k_::topk_workspace ws;
  ws.reserve(n, n);
  for (double d : {0.001, 0.01, 0.6}) {
    std::vector<float> g(n), r(n);
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
      r[i] = (i % 97 == 0) ? std::bit_cast<float>(0xffc00000u | static_cast<std::uint32_t>(rng() % 4096)) : std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    }
    const std::size_t k = plan::k_for(d, n);
    std::vector<float> res = r;
    std::vector<std::uint64_t> got(k), want(k);
    std::vector<std::uint32_t> scratch(n);
    const auto sel = k_::accumulate_select_topk(g.data(), res.data(), n, k, 0, got.data(), ws);
    CHECK(sel.count == k_::select_topk(res.data(), n, k, 0, want.data(), scratch.data()));
    CHECK(got == want);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float G = g[i] + r[i];
      if (std::isnan(g[i]) && std::isnan(r[i])) CHECK(std::isnan(res[i]));
      else differ += bits(G) != bits(res[i]);
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("accumulate_select_topk: the sample misjudges both ways and the full selection gives the same result") {
  std::mt19937_64 rng(7);
  const std::size_t n = std::size_t{1} << 20;
  k_::topk_workspace ws;
  ws.reserve(n, n / 10);
  for (double d : {0.001, 0.01}) {
    const std::size_t k = plan::k_for(d, n);
    const auto sampled = sampled_positions(n, k);
    CAPTURE(d);
    std::vector<float> g(n), r(n, 0.0f);
    SUBCASE("too high: the large values are exactly where the sample looks (fewer than k candidates)") {
      for (std::size_t i = 0; i < n; ++i) g[i] = sampled[i] ? 100.0f + static_cast<float>(rng() % 64) : static_cast<float>(rng() % 1000) / 1000.0f;
      CHECK(check_onepass(g, r, k, 0, ws) == k_::topk_path::too_few);
      // the same through the residual (g = 0: the engine's residual-heavy iterations)
      CHECK(check_onepass(r, g, k, 0, ws) == k_::topk_path::too_few);
    }
    SUBCASE("too low: large values only where the sample does not look, the rest equal (more than the capacity)") {
      for (std::size_t i = 0; i < n; ++i) g[i] = sampled[i] ? 1.0f : (rng() % 100 == 0 ? -50.0f - static_cast<float>(rng() % 8) : 1.0f);
      CHECK(check_onepass(g, r, k, 0, ws) == k_::topk_path::overflow);
    }
    SUBCASE("too low: nearly every value equal to the threshold") {
      for (std::size_t i = 0; i < n; ++i) g[i] = rng() % 2000 == 0 ? static_cast<float>(rng() % 1000) / 500.0f : -0.5f;
      CHECK(check_onepass(g, r, k, 0, ws) == k_::topk_path::overflow);
      std::fill(g.begin(), g.end(), 0.25f);  // all equal: the k lowest indices
      CHECK(check_onepass(g, r, k, 0, ws) == k_::topk_path::overflow);
      std::vector<std::uint64_t> out(k);
      std::vector<float> res = r;
      (void)k_::accumulate_select_topk(g.data(), res.data(), n, k, 0, out.data(), ws);
      CHECK(out.back() == k - 1);
    }
  }
}

TEST_CASE("accumulate_select_topk: the workspace's capacity covers smaller densities; a smaller workspace only costs time") {
  std::mt19937_64 rng(11);
  const std::size_t n = 300'007;
  const auto g = onepass_values(rng, n, 0, false), r = onepass_values(rng, n, 0, true);
  {
    k_::topk_workspace ws;
    ws.reserve(n, n / 2);  // density 0.5 itself is not sampled; 0.001 is, with this workspace
    CHECK(check_onepass(g, r, plan::k_for(0.001, n), 0, ws) == k_::topk_path::candidates);
    CHECK(check_onepass(g, r, plan::k_for(0.1, n), 0, ws) == k_::topk_path::candidates);
  }
  {
    k_::topk_workspace ws;
    ws.reserve(n, 1);  // candidates for k = 1 only
    CHECK(check_onepass(g, r, plan::k_for(0.05, n), 0, ws) != k_::topk_path::candidates);
    CHECK(check_onepass(g, r, 1, 0, ws) == k_::topk_path::candidates);
  }
}

#if defined(GFLOW_TOPK_AVX2)
TEST_CASE("the gathering pass: AVX2 and the scalar twin append the same candidates and store the same G, capacity included") {
  if (!k_::detail::cpu_has_avx2()) return;
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = rng() % 3000;
    const int mode = trial % 6;
    const auto g = onepass_values(rng, n, mode, false), r = onepass_values(rng, n, mode, true);
    const std::uint32_t t = trial % 7 == 0 ? 1u : static_cast<std::uint32_t>(rng() % 0x7fffffffu) + 1;
    const std::size_t cap = trial % 3 == 0 ? n + 1 : rng() % (n / 4 + 2);
    const std::uint64_t pos0 = rng() % 100;
    std::vector<std::uint64_t> c1(cap + 1, 9), c2 = c1;
    std::vector<std::uint32_t> k1(cap + 1, 9), k2 = k1;
    std::vector<float> v1 = r, v2 = r;
    CAPTURE(trial);
    std::size_t a = 0, b = 0;
    if (trial % 2 == 0) {
      a = k_::detail::gather_scalar<true>(g.data(), v1.data(), n, t, pos0, c1.data(), k1.data(), cap);
      b = k_::detail::gather_avx2<true>(g.data(), v2.data(), n, t, pos0, c2.data(), k2.data(), cap);
    } else {
      a = k_::detail::gather_scalar<false>(v1.data(), v1.data(), n, t, pos0, c1.data(), k1.data(), cap);
      b = k_::detail::gather_avx2<false>(v2.data(), v2.data(), n, t, pos0, c2.data(), k2.data(), cap);
    }
    CHECK(a == b);
    CHECK(c1 == c2);
    CHECK(k1 == k2);
    CHECK(same_bits(v1, v2));
    // what the pass must find: every key >= t in index order, up to the capacity
    std::vector<float> G = r;
    if (trial % 2 == 0) k_::accumulate_into_residual(g.data(), G.data(), n);
    CHECK(same_bits(v1, G));
    std::size_t want = 0;
    for (std::size_t i = 0; i < n; ++i) want += k_::magnitude_key(G[i]) >= t;
    CHECK(a == (want > cap ? cap + 1 : want));
  }
}
#endif

TEST_CASE_TEMPLATE("pack / unpack_checked round trip and every rejection", I, std::uint32_t, std::uint64_t) {
  const std::size_t k = 5;
  std::vector<unsigned char> msg(gflow::sparse_message::bytes(k, sizeof(I), sizeof(float)));
  CHECK(msg.size() == 24 + 5 * (sizeof(I) + 4));
  const I idx[] = {10, 12, 19};
  const float val[] = {1.5f, -2.0f, 0.25f};
  gflow::sparse_message::pack(msg.data(), k, idx, val, 3);
  I ri[k];
  float rv[k];
  auto r = k_::unpack_checked(msg.data(), k, 10, 20, ri, rv);
  REQUIRE(r.ok());
  CHECK(r.count == 3);
  CHECK(ri[2] == 19);
  CHECK(rv[1] == -2.0f);

  auto rejected = [&](std::vector<unsigned char> m, gflow::sparse_message::fault_code f, std::uint64_t lo = 10, std::uint64_t hi = 20) {
    I si[k];
    float sv[k];
    std::fill(si, si + k, I{77});
    std::fill(sv, sv + k, 77.0f);
    auto rr = k_::unpack_checked(m.data(), k, lo, hi, si, sv);
    CHECK(rr.fault == f);
    CHECK(rr.count == 0);
    CHECK(std::all_of(si, si + k, [](I x) { return x == 77; }));  // nothing written on rejection
    CHECK(std::all_of(sv, sv + k, [](float x) { return x == 77.0f; }));
    CHECK(!gflow::sparse_message::describe(rr, k, lo, hi).empty());
  };
  rejected(msg, gflow::sparse_message::fault_code::index, 11, 20);  // 10 below lo
  rejected(msg, gflow::sparse_message::fault_code::index, 10, 19);  // 19 at hi
  {
    auto m = msg;
    const std::uint64_t c = 6;
    std::memcpy(m.data(), &c, 8);
    rejected(m, gflow::sparse_message::fault_code::count);
  }
  {
    const I dup[] = {10, 12, 12};
    auto m = msg;
    gflow::sparse_message::pack(m.data(), k, dup, val, 3);
    rejected(m, gflow::sparse_message::fault_code::order);
    const I down[] = {10, 14, 12};
    gflow::sparse_message::pack(m.data(), k, down, val, 3);
    rejected(m, gflow::sparse_message::fault_code::order);
  }
  {
    const float bad[] = {1.0f, std::nanf(""), 2.0f};
    auto m = msg;
    gflow::sparse_message::pack(m.data(), k, idx, bad, 3);
    rejected(m, gflow::sparse_message::fault_code::value);
    const float inf[] = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
    gflow::sparse_message::pack(m.data(), k, idx, inf, 3);
    CHECK(k_::unpack_checked(m.data(), k, 10, 20, ri, rv).ok());  // inf is a value, reported by finish()
  }
  {
    auto m = msg;
    gflow::sparse_message::pack(m.data(), k, idx, val, 3, gflow::sparse_message::header{0, 2, 4, 5, 1});
    rejected(m, gflow::sparse_message::fault_code::status);
  }
  // 16-bit NaN values are rejected too
  std::vector<unsigned char> m16(gflow::sparse_message::bytes(k, sizeof(I), 2));
  const half hv[] = {k_::to_half(1.0f), half{0x7e00}, k_::to_half(2.0f)};
  gflow::sparse_message::pack(m16.data(), k, idx, hv, 3);
  half hr[k];
  CHECK(k_::unpack_checked(m16.data(), k, 10, 20, ri, hr).fault == gflow::sparse_message::fault_code::value);
  const bfloat16 bv[] = {k_::to_bfloat16(1.0f), k_::to_bfloat16(2.0f), bfloat16{0x7fc1}};
  gflow::sparse_message::pack(m16.data(), k, idx, bv, 3);
  bfloat16 br[k];
  CHECK(k_::unpack_checked(m16.data(), k, 10, 20, ri, br).fault == gflow::sparse_message::fault_code::value);
}

TEST_CASE_TEMPLATE("merge_topk equals Definition 1 by brute force; records hold what was dropped or rounded", W, float, half) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t k = 1 + rng() % 40;
    const std::size_t range = k + rng() % (3 * k + 1);
    auto make = [&](std::vector<std::uint32_t>& idx, std::vector<W>& val) {
      std::vector<std::uint32_t> all(range);
      std::iota(all.begin(), all.end(), 100u);
      std::shuffle(all.begin(), all.end(), rng);
      const std::size_t c = rng() % (k + 1);
      idx.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(c, range)));
      std::sort(idx.begin(), idx.end());
      val.clear();
      for (std::size_t j = 0; j < idx.size(); ++j) {
        const float x = trial % 3 == 0 ? static_cast<float>(static_cast<int>(rng() % 5) - 2) : static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
        val.push_back(k_::wire_cast<W>(x));
      }
    };
    std::vector<std::uint32_t> ai, bi;
    std::vector<W> av, bv;
    make(ai, av);
    make(bi, bv);
    std::vector<std::uint32_t> oi(k), ri(2 * k), ui(2 * k);
    std::vector<W> ov(k);
    std::vector<float> rv(2 * k), us(2 * k);
    std::vector<std::uint32_t> uk(2 * k);
    std::size_t nrec = 0;
    const std::size_t kept = k_::merge_topk(ai.data(), av.data(), ai.size(), bi.data(), bv.data(), bi.size(), k, oi.data(), ov.data(), ri.data(),
                                            rv.data(), &nrec, k_::merge_scratch<std::uint32_t>{ui.data(), us.data(), uk.data()});
    // brute force
    std::map<std::uint32_t, float> sum;
    for (std::size_t j = 0; j < ai.size(); ++j) sum[ai[j]] = k_::to_float(av[j]);
    for (std::size_t j = 0; j < bi.size(); ++j) {
      auto it = sum.find(bi[j]);
      if (it == sum.end()) sum[bi[j]] = k_::to_float(bv[j]);
      else it->second = it->second + k_::to_float(bv[j]);
    }
    std::vector<std::uint32_t> ui2;
    std::vector<float> us2;
    for (auto [i, v] : sum) {
      ui2.push_back(i);
      us2.push_back(v);
    }
    auto keep = brute_topk(us2.data(), us2.size(), k);
    CAPTURE(trial);
    REQUIRE(kept == keep.size());
    std::map<std::uint32_t, float> rec_want;
    for (std::size_t p = 0, q = 0; p < ui2.size(); ++p) {
      if (q < keep.size() && keep[q] == p) {
        CHECK(oi[q] == ui2[p]);
        CHECK(bits(k_::to_float(ov[q])) == bits(k_::to_float(k_::wire_cast<W>(us2[p]))));
        const float err = us2[p] - k_::to_float(k_::wire_cast<W>(us2[p]));
        if (err != 0.0f) rec_want[ui2[p]] = err;
        ++q;
      } else {
        rec_want[ui2[p]] = us2[p];
      }
    }
    REQUIRE(nrec == rec_want.size());
    std::size_t j = 0;
    for (auto [i, v] : rec_want) {
      CHECK(ri[j] == i);
      CHECK(bits(rv[j]) == bits(v));
      ++j;
    }
  }
}

TEST_CASE("restore_unselected and restore_records_in: line 10 and its completion") {
  std::vector<float> res(10, 0.0f);
  const std::uint32_t mine[] = {1, 3, 5, 7};
  const float mv[] = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::uint32_t F[] = {3, 4, 7};
  k_::restore_unselected(res.data(), mine, mv, 4, F, 3, 2.0f);
  CHECK(res == std::vector<float>{0, 2, 0, 0, 0, 6, 0, 0, 0, 0});
  const std::uint32_t ri[] = {0, 4, 7, 9};
  const float rv[] = {10.0f, 20.0f, 30.0f, std::numeric_limits<float>::infinity()};
  k_::restore_records_in(res.data(), ri, rv, 4, F, 3, 1.0f);
  CHECK(res == std::vector<float>{0, 2, 0, 0, 20, 6, 0, 30, 0, 0});
  std::vector<float> d(6, 1.0f);
  const std::uint64_t si[] = {0, 5};
  const half sv[] = {k_::to_half(0.5f), k_::to_half(-2.0f)};
  k_::scatter_add(d.data(), si, sv, 2);
  CHECK(d == std::vector<float>{1.5f, 1, 1, 1, 1, -1.0f});
}

// ---- what goes on the wire (mock) --------------------------------------------------------------

TEST_CASE("mock: TopK does exactly one all_gather of k packed pairs per selection, and nothing else") {
  auto l = Layout::from_sizes({1000, 3, 257, 4096, 1, 77, 512});  // 5946 elements
  const std::size_t n = l.total_numel();
  SUBCASE("no fusion: one selection over the whole pool") {
    mock::transport m(4);
    on_mock<Exchanger<Sparsifier<TopK<0.01>>>> ex(m, l);
    for (int it = 0; it < 3; ++it) {
      m.calls().clear();
      for (std::size_t i = 0; i < l.size(); ++i) {
        for (auto& x : ex.view(i)) x = grad(0, 0, i * 10000 + static_cast<std::size_t>(&x - ex.view(i).data()), it);
        ex.ready(i);
        if (i + 1 < l.size()) CHECK(m.calls().records.empty());  // waits for the whole pool
      }
      auto st = ex.finish();
      const std::size_t k = plan::k_for(0.01, n);
      REQUIRE(m.calls().records.size() == 1);
      const auto& r = m.calls().records[0];
      CHECK(r.kind == mock::op::all_gather);
      CHECK(r.type == dtype::u8);
      CHECK(r.count == 24 + k * (4 + 4));
      CHECK(st.wire_bytes == r.bytes);
      CHECK(ex.sparsifier().k() == k);
      CHECK(ex.sparsifier().selections() == 1);
      CHECK(ex.sparsifier().index_bytes() == 4);
      // Table I: what each rank receives from the P-1 others, headers aside
      CHECK((4 - 1) * (r.bytes - 24) == plan::table1_bytes(plan::aggregation::topk_allreduce, 4, n, k, 4, 4));
    }
  }
  SUBCASE("fusion: one selection and one all_gather per bucket, k per bucket, 16-bit values") {
    mock::transport m(3);
    on_mock<Exchanger<Sparsifier<TopK<0.05>>, Fusion<2048>, Precision<wire::fp16>>> ex(m, l);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
    const auto ag = m.calls().of(mock::op::all_gather);
    REQUIRE(ag.size() == ex.buckets().size());
    CHECK(m.calls().records.size() == ag.size());
    std::size_t ktot = 0;
    for (std::size_t b = 0; b < ag.size(); ++b) {
      const std::size_t k = plan::k_for(0.05, ex.buckets()[b].count);
      ktot += k;
      CHECK(ag[b].count == 24 + k * (4 + 2));
    }
    CHECK(ex.sparsifier().k() == ktot);
    CHECK(ex.sparsifier().selections() == ex.buckets().size());
  }
  SUBCASE("64-bit indices on request") {
    mock::transport m(2);
    on_mock<Exchanger<Sparsifier<TopK<0.01>>>> ex(m, l);
    ex.sparsifier().set_index_bytes(8);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
    CHECK(m.calls().records.at(0).count == 24 + plan::k_for(0.01, n) * (8 + 4));
  }
}

TEST_CASE("mock: GTopK does ceil(log2 P) rounds of send/recv of one k-pair message, then one broadcast") {
  auto l = Layout::from_sizes({700, 300});
  const std::size_t n = 1000;
  const std::size_t k = plan::k_for(0.01, n);  // 10
  const std::size_t mb = 24 + k * 8;
  using E = Exchanger<Sparsifier<GTopK<0.01>>>;
  auto run_one = [&](int P, int rank) {
    mock::transport m(P, rank);
    on_mock<E> ex(m, l);
    CHECK(ex.sparsifier().rounds() == plan::gtopk_rounds(P));
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    auto st = ex.finish();
    std::vector<std::string> seq;
    for (const auto& r : m.calls().records) {
      CHECK(r.count == mb);
      CHECK(r.type == dtype::u8);
      seq.push_back(std::string(mock::to_string(r.kind)) + " " + std::to_string(r.peer));
    }
    std::size_t sent = 0;
    for (const auto& r : m.calls().records)
      if (r.kind != mock::op::recv) sent += r.bytes;
    CHECK(st.wire_bytes == sent);
    return seq;
  };
  CHECK(run_one(6, 0) == std::vector<std::string>{"recv 1", "recv 2", "recv 4", "broadcast 0"});
  CHECK(run_one(6, 3) == std::vector<std::string>{"send 2", "broadcast 0"});
  CHECK(run_one(6, 4) == std::vector<std::string>{"recv 5", "send 0", "broadcast 0"});
  CHECK(run_one(6, 5) == std::vector<std::string>{"send 4", "broadcast 0"});
  CHECK(run_one(1, 0) == std::vector<std::string>{"broadcast 0"});
  CHECK(run_one(16, 0) == std::vector<std::string>{"recv 1", "recv 2", "recv 4", "recv 8", "broadcast 0"});
  CHECK(run_one(16, 12) == std::vector<std::string>{"recv 13", "recv 14", "send 8", "broadcast 0"});
  // Table I on rank 0 (P = 8): log P received messages plus the broadcast, headers aside
  {
    mock::transport m(8, 0);
    on_mock<E> ex(m, l);
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
    std::size_t payload = 0;
    for (const auto& r : m.calls().records) payload += r.bytes - 24;
    CHECK(payload == 4 * k * 8);  // 3 recv + 1 broadcast
    // the paper counts the flat-tree broadcast once per round: 2 log P messages of 2k elements
    CHECK(plan::table1_bytes(plan::aggregation::gtopk_allreduce, 8, n, k, 4, 4) == 2 * 3 * k * 8);
  }
}

TEST_CASE("mock: GTopK rank 0 merges the queued messages exactly as Definition 1 says") {
  // P = 4, rank 0, k = 2 of 10 elements; rank 1 then rank 2 (holding 2 and 3 merged) send.
  auto l = Layout::from_sizes({10});
  mock::transport m(4, 0);
  on_mock<Exchanger<Sparsifier<GTopK<0.2>>>> ex(m, l);
  auto push = [&](std::vector<std::uint32_t> idx, std::vector<float> val) {
    std::vector<unsigned char> msg(gflow::sparse_message::bytes(2, 4, 4));
    gflow::sparse_message::pack(msg.data(), 2, idx.data(), val.data(), idx.size());
    m.calls().inbox.push_back(msg);
  };
  push({2, 7}, {5.0f, -1.0f});   // from rank 1
  push({3, 7}, {-4.5f, -6.0f});  // from rank 2
  // own G: top-2 are index 7 (3.0) and 2 (-2.0)
  const float own[10] = {0.1f, 0.2f, -2.0f, 0.5f, 0, 0, 0, 3.0f, 0, 0};
  std::copy(own, own + 10, ex.pool_data());
  ex.ready(0);
  auto st = ex.finish();
  CHECK(st.finite());
  // round 0: {2: 5 + -2 = 3, 7: -1 + 3 = 2} -> keep both; round 1: {2: 3, 3: -4.5, 7: 2 + -6 = -4} -> keep 3, 7
  // result = F / 4; 2 was dropped at rank 0 (value 3): not in F, so rank 0 restores only its own -2
  std::vector<float> want(10, 0.0f);
  want[3] = -4.5f / 4;
  want[7] = -4.0f * 0.25f;
  CHECK(std::vector<float>(ex.pool_data(), ex.pool_data() + 10) == want);
  auto res = ex.sparsifier().residual();
  CHECK(res[2] == -2.0f);  // own value whose index is not in the global top-k (line 10)
  CHECK(res[7] == 0.0f);
  CHECK(res[0] == 0.1f);
  CHECK(res[3] == 0.5f);
  CHECK(std::vector<std::uint64_t>(ex.sparsifier().exchanged().begin(), ex.sparsifier().exchanged().end()) == std::vector<std::uint64_t>{3, 7});
  CHECK(std::vector<std::uint64_t>(ex.sparsifier().selected().begin(), ex.sparsifier().selected().end()) == std::vector<std::uint64_t>{2, 7});
}

TEST_CASE("mock: a merge that drops a value whose index reaches the global top-k keeps it in the merging rank's residual") {
  // P = 4, rank 0, k = 1. Round 0 from rank 1: {5: 1.0}; own top-1 {5: 2.0}... use distinct indices:
  // own {4: 2.0}, rank 1 {5: 1.0}: merge keeps 4 (2.0), drops 5 (1.0). Round 1 from rank 2: {5: 10.0}:
  // merge {4: 2, 5: 10} keeps 5. F = {5: 10}: index 5 is global, so rank 0 keeps the dropped 1.0
  // (rank 1's value) and restores its own 2.0 at 4 (not global).
  auto l = Layout::from_sizes({8});
  mock::transport m(4, 0);
  on_mock<Exchanger<Sparsifier<GTopK<0.125>>>> ex(m, l);
  auto push = [&](std::uint32_t i, float v) {
    std::vector<unsigned char> msg(gflow::sparse_message::bytes(1, 4, 4));
    gflow::sparse_message::pack(msg.data(), 1, &i, &v, 1);
    m.calls().inbox.push_back(msg);
  };
  push(5, 1.0f);
  push(5, 10.0f);
  std::fill(ex.pool_data(), ex.pool_data() + 8, 0.0f);
  ex.pool_data()[4] = 2.0f;
  ex.ready(0);
  (void)ex.finish();
  CHECK(ex.pool_data()[5] == 10.0f / 4);
  auto res = ex.sparsifier().residual();
  CHECK(res[4] == 2.0f);
  CHECK(res[5] == 1.0f);
}

// ---- results against brute-force references, P = 1..16 ---------------------------------------

TEST_CASE("in-process: GTopK equals the brute-force tree reference bitwise (results and residuals), P = 1..16") {
  auto l = Layout::from_sizes({300, 17, 1, 129, 53});
  for (int P = 1; P <= 16; ++P) {
    CAPTURE(P);
    check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>>>(P, l, 3, 0, 0.05);
  }
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>>>(6, l, 3, 1, 0.03);                  // ties
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>, Fusion<256>>>(5, l, 3, 0, 0.1, 256);  // per bucket
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>, Precision<wire::fp16>>>(7, l, 3, 0, 0.05);
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>, Precision<wire::bf16>, Fusion<128>>>(3, l, 3, 1, 0.2, 128);
}

TEST_CASE("in-process: TopK equals the dense sum of every rank's top-k, bitwise, P = 1..16") {
  auto l = Layout::from_sizes({300, 17, 1, 129, 53});
  for (int P = 1; P <= 16; ++P) {
    CAPTURE(P);
    check_against_reference<Exchanger<Sparsifier<TopK<0.05>>>>(P, l, 3, 0, 0.05);
  }
  check_against_reference<Exchanger<Sparsifier<TopK<0.05>>>>(5, l, 3, 1, 0.02);
  check_against_reference<Exchanger<Sparsifier<TopK<0.05>>, Fusion<200>>>(4, l, 3, 0, 0.1, 200);
  check_against_reference<Exchanger<Sparsifier<TopK<0.05>>, Precision<wire::fp16>>>(6, l, 3, 0, 0.05);
}

TEST_CASE("in-process: TopK result cross-checked in float64 against the dense sum of each rank's brute-force top-k") {
  // Independent of the reference above: no residual (one iteration), float64 sums.
  auto l = Layout::from_sizes({500, 200});
  const int P = 5;
  const double d = 0.02;
  auto gfn = [](int r, std::size_t i, int it) { return grad(0, r, i, it); };
  auto tr = run_ranks<Exchanger<Sparsifier<TopK<0.02>>>>(P, l, 1, gfn);
  std::vector<double> want(700, 0.0);
  for (int q = 0; q < P; ++q) {
    std::vector<float> g(700);
    for (std::size_t i = 0; i < 700; ++i) g[i] = gfn(q, i, 0);
    for (auto i : brute_topk(g.data(), 700, plan::k_for(d, 700))) want[i] += g[i];
  }
  for (std::size_t i = 0; i < 700; ++i) CHECK(tr.result[0][0][i] == doctest::Approx(want[i] / P).epsilon(1e-6));
}

// ---- conservation ------------------------------------------------------------------------------

namespace {
// Random layouts, sizes, rank counts, fusion and density schedules: over every iteration, the
// sum of all gradients fed in equals P x the applied average plus every rank's residual.
template <class E>
int conservation_runs(std::uint64_t seed, int configs, int iters_each) {
  using S = typename E::policies::sparsifier::scheme;
  std::mt19937_64 rng(seed);
  int iterations = 0;
  for (int c = 0; c < configs; ++c) {
    const int P = 1 + static_cast<int>(rng() % 8);
    std::vector<std::size_t> sizes(1 + rng() % 6);
    for (auto& s : sizes) s = 1 + rng() % (rng() % 4 == 0 ? 3000 : 200);
    auto l = Layout::from_sizes(sizes);
    const std::size_t n = l.total_numel();
    exchange_options o;
    if (rng() % 2) o.threshold_bytes = 64 + rng() % 4096;
    o.average = rng() % 4 != 0;
    const int mode = static_cast<int>(rng() % 3 == 0 ? 1 : 0);
    std::vector<plan::density_step> steps;
    std::uint64_t until = 0;
    for (int s = 0, ns = static_cast<int>(rng() % 3); s < ns; ++s) {
      until += 1 + rng() % 8;
      steps.push_back({until, 0.001 + static_cast<double>(rng() % 1000) / 1000.0});
    }
    auto sched = plan::density_schedule::per_iteration(steps, 0.0005 + static_cast<double>(rng() % 300) / 1000.0);
    const std::uint64_t gseed = rng();
    auto gfn = [&](int r, std::size_t i, int it) { return grad(mode, r, i, it, gseed) * (1.0f + static_cast<float>(i % 7)); };
    auto tr = run_ranks<E>(
        P, l, iters_each, gfn, [&](auto& ex) { ex.sparsifier().set_schedule(sched); }, o);
    std::vector<double> fed(n, 0.0), applied(n, 0.0), scale(n, 0.0);
    for (int it = 0; it < iters_each; ++it) {
      for (int q = 0; q < P; ++q)
        for (std::size_t i = 0; i < n; ++i) {
          fed[i] += gfn(q, i, it);
          scale[i] += std::abs(gfn(q, i, it));
        }
      for (std::size_t i = 0; i < n; ++i) applied[i] += static_cast<double>(tr.result[it][0][i]) * (o.average ? P : 1);
      for (int q = 1; q < P; ++q) REQUIRE(same_bits(tr.result[it][q], tr.result[it][0]));
    }
    double held_total = 0, fed_total = 0, applied_total = 0, abs_total = 0;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double held = 0;
      for (int q = 0; q < P; ++q) held += tr.residual[iters_each - 1][q][i];
      if (std::abs(fed[i] - (applied[i] + held)) > 1e-5 * scale[i] + 1e-30) ++bad;
      held_total += held;
      fed_total += fed[i];
      applied_total += applied[i];
      abs_total += scale[i];
    }
    CAPTURE(c);
    CAPTURE(P);
    CAPTURE(S::global);
    CHECK(bad == 0);
    CHECK(std::abs(fed_total - (applied_total + held_total)) <= 1e-5 * abs_total);
    iterations += iters_each;
  }
  return iterations;
}
}  // namespace

TEST_CASE("conservation: fed = applied + residual over 1000+ random iterations, TopK") {
  int iters = 0;
  iters += conservation_runs<Exchanger<Sparsifier<TopK<0.01>>>>(1, 20, 25);
  iters += conservation_runs<Exchanger<Sparsifier<TopK<0.01>>, Precision<wire::fp16>>>(2, 10, 25);
  iters += conservation_runs<Exchanger<Sparsifier<TopK<0.01>>, Precision<wire::bf16>>>(3, 10, 25);
  CHECK(iters >= 1000);
}

TEST_CASE("conservation: fed = applied + residual over 1000+ random iterations, GTopK") {
  int iters = 0;
  iters += conservation_runs<Exchanger<Sparsifier<GTopK<0.01>>>>(4, 20, 25);
  iters += conservation_runs<Exchanger<Sparsifier<GTopK<0.01>>, Precision<wire::fp16>>>(5, 10, 25);
  iters += conservation_runs<Exchanger<Sparsifier<GTopK<0.01>>, Precision<wire::bf16>>>(6, 10, 25);
  CHECK(iters >= 1000);
}

TEST_CASE("in-process: units above the sampling size (the one-pass selection) equal the brute-force references bitwise") {
  auto l = Layout::from_sizes({40000, 9000, 30000, 1500});  // 80500 elements
  for (double d : {0.001, 0.01}) {
    CAPTURE(d);
    check_against_reference<Exchanger<Sparsifier<TopK<0.01>>>>(3, l, 3, 0, d);
    check_against_reference<Exchanger<Sparsifier<GTopK<0.01>>>>(4, l, 3, 0, d);
  }
  check_against_reference<Exchanger<Sparsifier<TopK<0.01>>>>(2, l, 2, 1, 0.01);  // ties
  check_against_reference<Exchanger<Sparsifier<GTopK<0.01>>>>(3, l, 2, 1, 0.01);
  check_against_reference<Exchanger<Sparsifier<TopK<0.01>>, Fusion<160000>>>(3, l, 2, 0, 0.01, 160000);  // per bucket
  check_against_reference<Exchanger<Sparsifier<GTopK<0.01>>, Fusion<160000>, Precision<wire::fp16>>>(3, l, 2, 0, 0.01, 160000);
  check_against_reference<Exchanger<Sparsifier<TopK<0.01>>, Precision<wire::bf16>>>(2, l, 2, 0, 0.005);
}

TEST_CASE_TEMPLATE("engine: the one-pass selection runs on large units and leaves the pool untouched until the result", S, TopK<0.01>, GTopK<0.01>) {
  auto l = Layout::from_sizes({40000, 9000, 30000, 1500});
  const std::size_t n = l.total_numel();
  mock::transport m(1, 0);
  on_mock<Exchanger<Sparsifier<S>>> ex(m, l);
  for (int it = 0; it < 3; ++it) {
    for (std::size_t i = 0; i < n; ++i) ex.pool_data()[i] = grad(0, 0, i, it);
    for (std::size_t i = 0; i + 1 < l.size(); ++i) ex.ready(i);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(ex.pool_data()[i] == grad(0, 0, i, it));  // the buckets before the last wait
    ex.ready(l.size() - 1);
    (void)ex.finish();
    const auto p = ex.sparsifier().paths();
    CHECK(p.candidates == 1);
    CHECK(p.full + p.too_few + p.overflow == 0);
  }
}

// ---- edge cases ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("edge cases: k >= n exchanges everything (dense sum), k = 1, all-zero gradients", S, TopK<1.0>, GTopK<1.0>) {
  auto l = Layout::from_sizes({5, 3});
  using E = Exchanger<Sparsifier<S>>;
  SUBCASE("density 1: integer gradients sum exactly like Dense, residual 0") {
    auto tr = run_ranks<E>(5, l, 2, [](int r, std::size_t i, int it) { return static_cast<float>((r + 1) * static_cast<int>(i + 1) + it); });
    for (std::size_t i = 0; i < 8; ++i) {
      float sum = 0;
      for (int r = 0; r < 5; ++r) sum += static_cast<float>((r + 1) * static_cast<int>(i + 1) + 1);
      CHECK(tr.result[1][3][i] == doctest::Approx(sum / 5).epsilon(1e-7));
      CHECK(tr.residual[1][3][i] == 0.0f);
    }
    CHECK(tr.exchanged[1][0].size() == 8);
  }
  SUBCASE("k = 1: one element, the largest |G| (lowest index on ties)") {
    auto tr = run_ranks<E>(
        3, l, 1, [](int, std::size_t i, int) { return (i == 2 || i == 6) ? -7.0f : 1.0f; }, [](auto& ex) { ex.sparsifier().set_density(0.01); });
    CHECK(tr.exchanged[0][0] == std::vector<std::uint64_t>{2});
    CHECK(tr.result[0][1][2] == doctest::Approx(-7.0f));
    CHECK(tr.residual[0][1][6] == -7.0f);
  }
  SUBCASE("all-zero gradients: k zeros exchanged, nothing non-finite, residual stays 0") {
    auto tr = run_ranks<E>(
        4, l, 2, [](int, std::size_t, int) { return 0.0f; }, [](auto& ex) { ex.sparsifier().set_density(0.3); });
    for (int it = 0; it < 2; ++it) {
      CHECK(std::all_of(tr.result[it][0].begin(), tr.result[it][0].end(), [](float x) { return x == 0.0f; }));
      CHECK(std::all_of(tr.residual[it][2].begin(), tr.residual[it][2].end(), [](float x) { return x == 0.0f; }));
      CHECK(tr.exchanged[it][0] == std::vector<std::uint64_t>{0, 1, 2});  // ties: lowest indices
      CHECK(tr.nonfinite[it][0] == 0);
    }
  }
}

TEST_CASE_TEMPLATE("edge cases: ties go to the lower index; non-finite gradients are reported on every rank", S, TopK<0.25>, GTopK<0.25>) {
  auto l = Layout::from_sizes({8});
  using E = Exchanger<Sparsifier<S>>;
  auto tr = run_ranks<E>(3, l, 1, [](int, std::size_t i, int) { return (i % 2 == 0) ? 1.0f : -1.0f; });
  CHECK(tr.exchanged[0][0] == std::vector<std::uint64_t>{0, 1});
  auto tr2 = run_ranks<E>(3, l, 2, [](int r, std::size_t i, int it) { return (r == 1 && i == 5 && it == 0) ? std::nanf("") : 0.5f; });
  for (int r = 0; r < 3; ++r) {
    CHECK(tr2.nonfinite[0][r] >= 1);
    CHECK(tr2.nonfinite[0][r] == tr2.nonfinite[0][0]);
    CHECK(tr2.nonfinite[1][r] == 0);  // not kept in any residual
    CHECK(std::all_of(tr2.residual[1][r].begin(), tr2.residual[1][r].end(), [](float x) { return std::isfinite(x); }));
  }
}

TEST_CASE_TEMPLATE("edge cases: density schedule boundaries change k at the right iteration", S, TopK<0.001>, GTopK<0.001>) {
  auto l = Layout::from_sizes({600, 400});
  mock::transport m(4, 0);
  on_mock<Exchanger<Sparsifier<S>>> ex(m, l);
  ex.sparsifier().set_schedule(plan::density_schedule::per_epoch({0.25, 0.0725, 0.015, 0.004}, 0.001, 2));
  const std::size_t want[] = {250, 250, 73, 73, 15, 15, 4, 4, 1, 1, 1};
  for (std::size_t it = 0; it < 11; ++it) {
    for (std::size_t i = 0; i < 2; ++i) ex.ready(i);
    (void)ex.finish();
    CAPTURE(it);
    CHECK(ex.sparsifier().k() == want[it]);
    CHECK(ex.sparsifier().selected().size() == want[it]);
    CHECK(ex.sparsifier().message_bytes() == 24 + want[it] * 8);
  }
  CHECK(ex.sparsifier().density() == 0.001);
}

// ---- bad input -------------------------------------------------------------------------------------

TEST_CASE("bad settings: density, schedule and index width are validated") {
  auto l = Layout::from_sizes({100});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<TopK<0.1>>>> ex(m, l);
  for (double d : {0.0, -1.0, 1.0001, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      ex.sparsifier().set_density(d);
      FAIL("expected invalid_argument");
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == "density");
    }
  }
  CHECK(ex.sparsifier().schedule() == plan::density_schedule::constant(0.1));  // unchanged
  try {
    ex.sparsifier().set_index_bytes(2);
    FAIL("expected invalid_argument");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "index_bytes");
  }
}

namespace {
// A mock that lets the test rewrite the gathered bytes of one rank (TopK's received messages).
class tamper_transport : public mock::transport {
 public:
  using mock::transport::transport;
  explicit tamper_transport(mock::transport base) : mock::transport(std::move(base)) {}
  std::function<void(unsigned char* gathered, std::size_t block_bytes)> edit;
  template <wire_element E>
  void all_gather(const E* s, E* r, std::size_t n) {
    mock::transport::all_gather(s, r, n);
    if constexpr (std::is_same_v<E, std::uint8_t>)
      if (edit) edit(r, n);
  }
  tamper_transport split(int color, int key) { return tamper_transport(mock::transport::split(color, key)); }
};
static_assert(gflow::transport<tamper_transport>);

template <class Fn>
void expect_parse_error(Fn fn, const std::string& subject, const std::string& text) {
  try {
    fn();
    FAIL("expected gflow::parse_error in '" << subject << "'");
  } catch (const gflow::parse_error& e) {
    CHECK(e.subject() == subject);
    INFO(e.what());
    CHECK(std::string(e.what()).find(text) != std::string::npos);
    CHECK(std::string(e.what()).find("Fix:") != std::string::npos);
  }
}
}  // namespace

TEST_CASE("bad input: a malformed all-gathered message is rejected on every rank, before the pool is touched") {
  auto l = Layout::from_sizes({50, 50});
  tamper_transport t(4);
  using E = Exchanger<Sparsifier<TopK<0.1>>>;
  typename E::template on<tamper_transport> ex(t, l);
  const std::size_t k = 10, mb = 24 + k * 8;
  auto run = [&] {
    for (std::size_t i = 0; i < 100; ++i) ex.pool_data()[i] = static_cast<float>(i);
    ex.ready(0);
    ex.ready(1);
  };
  auto at = [&](unsigned char* g, int rank, std::size_t byte) { return g + static_cast<std::size_t>(rank) * mb + byte; };
  SUBCASE("index out of range") {
    t.edit = [&](unsigned char* g, std::size_t) {
      const std::uint32_t bad = 100;
      std::memcpy(at(g, 2, 24 + 4), &bad, 4);
    };
    expect_parse_error(run, "index", "rank 2 was rejected: entry 1 has index 100, outside the selection range [0, 100)");
    // nothing lost: the residual holds the whole gradient again, the pool was not overwritten
    for (std::size_t i = 0; i < 100; ++i) CHECK(ex.sparsifier().residual()[i] == static_cast<float>(i));
    CHECK(ex.pool_data()[99] == 99.0f);
  }
  SUBCASE("count above k") {
    t.edit = [&](unsigned char* g, std::size_t) {
      const std::uint64_t c = 11;
      std::memcpy(at(g, 1, 0), &c, 8);
    };
    expect_parse_error(run, "count", "claims 11 entries, more than the capacity k = 10");
  }
  SUBCASE("duplicate index") {
    t.edit = [&](unsigned char* g, std::size_t) { std::memcpy(at(g, 3, 24 + 8), at(g, 3, 24 + 4), 4); };
    expect_parse_error(run, "index", "a duplicate or out-of-order index");
  }
  SUBCASE("NaN value") {
    t.edit = [&](unsigned char* g, std::size_t) {
      const float nan = std::nanf("");
      std::memcpy(at(g, 0, 24 + k * 4 + 8), &nan, 4);
    };
    expect_parse_error(run, "value", "has a NaN value");
  }
}

TEST_CASE("bad input: GTopK rejects a malformed received message, marks what it sends on, and every rank stops") {
  auto l = Layout::from_sizes({100});
  const std::size_t k = 10, mb = 24 + k * 8;
  using E = Exchanger<Sparsifier<GTopK<0.1>>>;
  auto msg = [&](std::vector<std::uint32_t> idx, std::vector<float> val, gflow::sparse_message::header h = {}) {
    std::vector<unsigned char> m(mb);
    gflow::sparse_message::pack(m.data(), k, idx.data(), val.data(), idx.size(), h);
    return m;
  };
  SUBCASE("rank 0 of 6 rejects rank 2's message in round 1") {
    mock::transport m(6, 0);
    on_mock<E> ex(m, l);
    m.calls().inbox.push_back(msg({1, 2}, {1.0f, 2.0f}));      // round 0, from 1: fine
    m.calls().inbox.push_back(msg({5, 300}, {1.0f, 2.0f}));    // round 1, from 2: index 300 of [0, 100)
    m.calls().inbox.push_back(msg({7}, {1.0f}));               // round 2, from 4: fine
    for (std::size_t i = 0; i < 100; ++i) ex.pool_data()[i] = 0.5f * static_cast<float>(i);
    expect_parse_error([&] { ex.ready(0); }, "index", "in merge round 1, rank 0 rejected the message from rank 2 (its index): entry 1 has index 300");
    // every round still ran (no peer is left waiting), the broadcast carried the mark
    CHECK(m.calls().of(mock::op::recv).size() == 3);
    CHECK(m.calls().of(mock::op::broadcast).size() == 1);
    for (std::size_t i = 0; i < 100; ++i) CHECK(ex.sparsifier().residual()[i] == 0.5f * static_cast<float>(i));
  }
  SUBCASE("rank 4 of 6 rejects rank 5's NaN and marks its message to rank 0") {
    mock::transport m(6, 4);
    on_mock<E> ex(m, l);
    m.calls().inbox.push_back(msg({3}, {std::nanf("")}));
    // the mock's broadcast leaves the buffer: feed the mark back as rank 0 would broadcast it
    expect_parse_error([&] { ex.ready(0); }, "value", "rank 4 rejected the message from rank 5");
    const auto sends = m.calls().of(mock::op::send);
    REQUIRE(sends.size() == 1);
    CHECK(sends[0].peer == 0);
  }
  SUBCASE("a rank told by the broadcast that another rank rejected a message") {
    mock::transport m(6, 0);
    on_mock<E> ex(m, l);
    m.calls().inbox.push_back(msg({}, {}, gflow::sparse_message::header{0, 3, 2, 3, 0}));  // rank 2 found a duplicate from rank 3
    expect_parse_error([&] { ex.ready(0); }, "index", "in merge round 0, rank 2 rejected the message from rank 3 (its index)");
  }
  SUBCASE("count above k from a peer") {
    mock::transport m(2, 0);
    on_mock<E> ex(m, l);
    auto bad = msg({1}, {1.0f});
    const std::uint64_t c = 99;
    std::memcpy(bad.data(), &c, 8);
    m.calls().inbox.push_back(bad);
    expect_parse_error([&] { ex.ready(0); }, "count", "claims 99 entries");
  }
}

namespace {
// In-process transport whose rank `culprit` corrupts the first index of every sparse message it sends.
class corrupting_transport : public inproc::transport {
 public:
  corrupting_transport(inproc::transport t, int culprit) : inproc::transport(std::move(t)), culprit_(culprit) {}
  template <wire_element E>
  void send(const E* buf, std::size_t n, int peer) {
    if constexpr (std::is_same_v<E, std::uint8_t>) {
      if (rank() == culprit_ && n > 28) {
        std::vector<unsigned char> copy(buf, buf + n);
        const std::uint32_t bad = 1u << 30;
        std::memcpy(copy.data() + 24, &bad, 4);
        inproc::transport::send(copy.data(), n, peer);
        return;
      }
    }
    inproc::transport::send(buf, n, peer);
  }
  corrupting_transport split(int color, int key) { return corrupting_transport(inproc::transport::split(color, key), culprit_); }

 private:
  int culprit_;
};
static_assert(gflow::transport<corrupting_transport>);
}  // namespace

TEST_CASE("in-process: a corrupt message deep in the tree stops EVERY rank with the same typed error, no hang") {
  auto l = Layout::from_sizes({100});
  for (int P : {8, 6}) {
    CAPTURE(P);
    std::vector<std::string> errors(static_cast<std::size_t>(P));
    std::vector<std::string> subjects(static_cast<std::size_t>(P));
    inproc::run(
        P,
        [&](inproc::transport& base) {
          corrupting_transport t(base, 3);  // rank 3 sends to rank 2 in round 0
          typename Exchanger<Sparsifier<GTopK<0.1>>>::template on<corrupting_transport> ex(t, l);
          for (std::size_t i = 0; i < 100; ++i) ex.pool_data()[i] = static_cast<float>(i + 1);
          try {
            ex.ready(0);
          } catch (const gflow::parse_error& e) {
            errors[static_cast<std::size_t>(t.rank())] = e.what();
            subjects[static_cast<std::size_t>(t.rank())] = e.subject();
          }
          // nothing lost: each rank's whole gradient is back in its residual
          for (std::size_t i = 0; i < 100; ++i) CHECK(ex.sparsifier().residual()[i] == static_cast<float>(i + 1));
        },
        std::chrono::seconds(20));
    for (int r = 0; r < P; ++r) {
      CAPTURE(r);
      CHECK(subjects[r] == "index");
      CHECK(errors[r].find("in merge round 0, rank 2 rejected the message from rank 3 (its index)") != std::string::npos);
    }
    CHECK(errors[2].find("has index 1073741824, outside the selection range [0, 100)") != std::string::npos);
  }
}

// ---- no allocation per iteration --------------------------------------------------------------

namespace gflow_test {  // the counting operator new of test_exchanger.cpp
extern std::atomic<bool> g_counting;
extern std::atomic<long> g_allocs;

/// Heap allocations made by `iters` iterations of ex (every tensor ready in layout order, then
/// finish), with the mock's call log reserved first.
template <class Ex>
long allocations_in(Ex& ex, gflow::mock::transport& m, const gflow::Layout& l, int iters) {
  m.calls().records.reserve(10000);
  g_allocs = 0;
  g_counting = true;
  for (int it = 0; it < iters; ++it) {
    for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
    (void)ex.finish();
  }
  g_counting = false;
  return g_allocs.load();
}
}  // namespace gflow_test

TEST_CASE_TEMPLATE("an iteration allocates nothing (mock transport, reserved log), schedules and index widths included", S, TopK<0.02>, GTopK<0.02>) {
  auto l = Layout::from_sizes({1000, 3, 257, 4096, 1, 77, 512});
  auto count_iterations = [&](auto& ex, mock::transport& m, int iters) { return gflow_test::allocations_in(ex, m, l, iters); };
  {
    mock::transport m(6, 0);
    on_mock<Exchanger<Sparsifier<S>, Fusion<4096>, Precision<wire::fp16>>> ex(m, l);
    CHECK(count_iterations(ex, m, 5) == 0);
  }
  {
    mock::transport m(5, 4);
    on_mock<Exchanger<Sparsifier<S>>> ex(m, l);
    ex.sparsifier().set_schedule(plan::density_schedule::per_iteration({{2, 0.3}, {4, 0.05}}, 0.01));  // k changes: no allocation
    CHECK(count_iterations(ex, m, 6) == 0);
    ex.sparsifier().set_index_bytes(8);
    CHECK(count_iterations(ex, m, 2) == 0);
  }
}

TEST_CASE_TEMPLATE("an iteration allocates nothing on the one-pass path either (units above the sampling size)", S, TopK<0.01>, GTopK<0.01>) {
  auto l = Layout::from_sizes({1000, 40000, 257, 30000, 77});
  auto count_iterations = [&](auto& ex, mock::transport& m, int iters) { return gflow_test::allocations_in(ex, m, l, iters); };
  {
    mock::transport m(6, 0);
    on_mock<Exchanger<Sparsifier<S>, Fusion<80000>, Precision<wire::fp16>>> ex(m, l);
    for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = grad(0, 0, i, 0);
    CHECK(count_iterations(ex, m, 3) == 0);
    CHECK(ex.sparsifier().paths().candidates > 0);
  }
  {
    mock::transport m(5, 4);
    on_mock<Exchanger<Sparsifier<S>>> ex(m, l);
    for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = grad(0, 1, i, 1);
    ex.sparsifier().set_schedule(plan::density_schedule::per_iteration({{2, 0.6}, {4, 0.05}}, 0.001));  // 0.6: not sampled; then sampled
    CHECK(count_iterations(ex, m, 6) == 0);
    CHECK(ex.sparsifier().paths().candidates == 1);
  }
}
