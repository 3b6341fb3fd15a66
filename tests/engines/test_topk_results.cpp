// Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> results against brute-force references of the same
// semantics on 1..16 in-process ranks, conservation over 1000+ random iterations, the one-pass
// selection on large units, edge cases.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
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
#include "topk_reference.hpp"

using namespace gflow;
using namespace gflow_test;
namespace k_ = gflow::detail::kernels;

// ---- results against brute-force references, P = 1..16 ---------------------------------------

TEST_CASE("in-process: GTopK equals the brute-force tree reference bitwise (results and residuals), P = 1..16") {
  auto l = Layout::from_sizes({300, 17, 1, 129, 53});
  for (int P = 1; P <= 16; ++P) {
    CAPTURE(P);
    check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>>>(P, l, 3, 0, 0.05);
  }
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>>>(6, l, 3, 1, 0.03);                  // ties
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>, Fusion<256>>>(5, l, 3, 0, 0.1, 256);  // per bucket
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>, Precision<half>>>(7, l, 3, 0, 0.05);
  check_against_reference<Exchanger<Sparsifier<GTopK<0.05>>, Precision<bfloat16>, Fusion<128>>>(3, l, 3, 1, 0.2, 128);
}

TEST_CASE("in-process: TopK equals the dense sum of every rank's top-k, bitwise, P = 1..16") {
  auto l = Layout::from_sizes({300, 17, 1, 129, 53});
  for (int P = 1; P <= 16; ++P) {
    CAPTURE(P);
    check_against_reference<Exchanger<Sparsifier<TopK<0.05>>>>(P, l, 3, 0, 0.05);
  }
  check_against_reference<Exchanger<Sparsifier<TopK<0.05>>>>(5, l, 3, 1, 0.02);
  check_against_reference<Exchanger<Sparsifier<TopK<0.05>>, Fusion<200>>>(4, l, 3, 0, 0.1, 200);
  check_against_reference<Exchanger<Sparsifier<TopK<0.05>>, Precision<half>>>(6, l, 3, 0, 0.05);
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
    for (auto i : brute_topk(g.data(), 700, gflow::detail::plan::k_for(d, 700))) want[i] += g[i];
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
    std::size_t fusion = 0;
    if (rng() % 2) fusion = 64 + rng() % 4096;
    o.average = rng() % 4 != 0;
    const int mode = static_cast<int>(rng() % 3 == 0 ? 1 : 0);
    std::vector<gflow::detail::plan::density_step> steps;
    std::uint64_t until = 0;
    for (int s = 0, ns = static_cast<int>(rng() % 3); s < ns; ++s) {
      until += 1 + rng() % 8;
      steps.push_back({until, 0.001 + static_cast<double>(rng() % 1000) / 1000.0});
    }
    auto sched = gflow::detail::plan::density_schedule::per_iteration(steps, 0.0005 + static_cast<double>(rng() % 300) / 1000.0);
    const std::uint64_t gseed = rng();
    auto gfn = [&](int r, std::size_t i, int it) { return grad(mode, r, i, it, gseed) * (1.0f + static_cast<float>(i % 7)); };
    auto tr = run_ranks<E>(
        P, l, iters_each, gfn, [&](auto& ex) { ex.sparsifier().set_schedule(sched); }, o, fusion);
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
  iters += conservation_runs<Exchanger<Sparsifier<TopK<0.01>>, Precision<half>>>(2, 10, 25);
  iters += conservation_runs<Exchanger<Sparsifier<TopK<0.01>>, Precision<bfloat16>>>(3, 10, 25);
  CHECK(iters >= 1000);
}

TEST_CASE("conservation: fed = applied + residual over 1000+ random iterations, GTopK") {
  int iters = 0;
  iters += conservation_runs<Exchanger<Sparsifier<GTopK<0.01>>>>(4, 20, 25);
  iters += conservation_runs<Exchanger<Sparsifier<GTopK<0.01>>, Precision<half>>>(5, 10, 25);
  iters += conservation_runs<Exchanger<Sparsifier<GTopK<0.01>>, Precision<bfloat16>>>(6, 10, 25);
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
  check_against_reference<Exchanger<Sparsifier<GTopK<0.01>>, Fusion<160000>, Precision<half>>>(3, l, 2, 0, 0.01, 160000);
  check_against_reference<Exchanger<Sparsifier<TopK<0.01>>, Precision<bfloat16>>>(2, l, 2, 0, 0.005);
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
  ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_epoch({0.25, 0.0725, 0.015, 0.004}, 0.001, 2));
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
