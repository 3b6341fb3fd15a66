// Sparsifier<CSC<chunk_elems, percent>> (GradientFlow (Sun et al.) section 3.2, Algorithm 1) on in-process ranks: a
// hand-computed example, the accounting identity over 1000+ random iterations (16-bit wires
// included), shared selection, the momentum-corrected history, edge cases, Overlap<Funneled>.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
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
#include "csc_reference.hpp"

using namespace gflow;
using namespace gflow_test;

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

TEST_CASE_TEMPLATE("CSC with a 16-bit wire keeps the encoding's rounding error in the history (issue 10's reproduction)", W, half, bfloat16) {
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

TEST_CASE_TEMPLATE("CSC with a 16-bit wire: fed == applied + held exactly, P = 2 and 3, averaging on and off", W, half, bfloat16) {
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

TEST_CASE_TEMPLATE("CSC with percent 100 equals the Dense exchange bit for bit", W, float, half, bfloat16) {
  // With a 16-bit wire CSC keeps the encoding's rounding error in its history and sends it with
  // the next iteration: Dense is fed the same accumulated gradient (pool + history, added in fp32
  // as CSC's compaction does). With fp32 the history stays 0 and both are fed the same values.
  using wt = W;
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
              want = g[k] - gflow::detail::kernels::to_float(gflow::detail::kernels::wire_cast<wt>(g[k] * scale)) * unscale;
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
