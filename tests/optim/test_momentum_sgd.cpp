// Algorithm 1's update step (gflow/optim/momentum_sgd.hpp): exchanged chunks only, per tensor or
// whole pool, and with a CSC exchange on in-process ranks.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/transport/inproc.hpp>

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
using namespace gflow_test;

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
