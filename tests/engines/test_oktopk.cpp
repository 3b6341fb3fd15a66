// Sparsifier<OkTopK<d>>: results against the straightforward reference (tests/oktopk_reference.hpp)
// bitwise on 1..8 in-process ranks, identical on every rank, conservation (bitwise on dyadic
// inputs, to 1e-5 on random ones), who keeps what the global selection dropped, the wire traffic,
// bad messages on every rank, checkpoints, parameters, no allocation per iteration once warm.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <bit>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "compositions.hpp"
#include "oktopk_reference.hpp"
#include "topk_reference.hpp"

using namespace gflow;
using namespace gflow_test;

namespace {

/// Gradients whose top-k stays put and overlaps across ranks, as the threshold path expects of
/// data-parallel training: k = n/100 large entries (magnitudes in [1, 2), positive) at i = 100 j on
/// every rank, noise of 1e-4 elsewhere.
float steady(int r, std::size_t i, int it) {
  const float u = grad(0, r, i, it);
  if (i % 100 == 0) return 1.0f + std::fabs(u);
  return 1e-4f * u;
}

detail::oktopk_params short_periods() {
  detail::oktopk_params p;
  p.threshold_period = 4;
  p.boundary_period = 3;
  p.local_adapt = 1.1;
  return p;
}

/// Runs E on P in-process ranks (gradients gfn(rank, element, iteration)) and checks every
/// rank's result, residual and exchanged() against the reference, bitwise, every iteration.
template <class E, class Gfn>
void check_oktopk_on(int P, const Layout& l, int iters, Gfn gfn, double density, std::size_t threshold, detail::oktopk_params prm, bool average = true) {
  using W = typename E::template on<inproc::transport>::wire_type;
  exchange_options o;
  o.average = average;
  auto tr = run_ranks<E>(
      P, l, iters, gfn,
      [&](auto& ex) {
        ex.sparsifier().set_density(density);
        ex.sparsifier().set_params(prm);
      },
      o, threshold);
  const std::size_t total = l.total_numel();
  oktopk_reference<W> ref(P, average, prm, units_of(l, threshold, sizeof(W)), total);
  for (int it = 0; it < iters; ++it) {
    std::vector<std::vector<float>> g(static_cast<std::size_t>(P), std::vector<float>(total));
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < total; ++i) g[q][i] = gfn(q, i, it);
    ref.step(g, density, static_cast<std::uint64_t>(it));
    for (int q = 0; q < P; ++q) {
      CAPTURE(q);
      CAPTURE(it);
      REQUIRE(same_bits(tr.result[it][q], ref.result));
      REQUIRE(same_bits(tr.residual[it][q], ref.res[static_cast<std::size_t>(q)]));
      REQUIRE(tr.exchanged[it][q] == ref.exchanged);
    }
  }
}

template <class E>
void check_oktopk(int P, const Layout& l, int iters, int mode, double density, std::size_t threshold, detail::oktopk_params prm, bool average = true) {
  auto gfn = [mode](int r, std::size_t i, int it) { return grad(mode, r, i, it) * (1.0f + static_cast<float>(i % 5)); };
  check_oktopk_on<E>(P, l, iters, gfn, density, threshold, prm, average);
}

}  // namespace

TEST_CASE("region reduction: the radix reduction sums each index in block order, bitwise a P-way merge by (index, block)") {
  // The merge it replaces: a heap of the blocks' heads by (index, block); each index's entries
  // visited in block order, the first assigned and the others added in fp32.
  auto merged = [](const auto& idx, const auto& val, const std::vector<std::size_t>& from) {
    std::vector<std::pair<std::uint64_t, float>> out;
    std::vector<std::size_t> at(from.begin(), from.end() - 1);
    for (;;) {
      std::size_t best = at.size();
      for (std::size_t q = 0; q < at.size(); ++q)
        if (at[q] < from[q + 1] && (best == at.size() || idx[at[q]] < idx[at[best]])) best = q;
      if (best == at.size()) return out;
      const float v = gflow::detail::kernels::to_float(val[at[best]]);
      const auto i = static_cast<std::uint64_t>(idx[at[best]++]);
      if (!out.empty() && out.back().first == i) out.back().second += v;
      else out.push_back({i, v});
    }
  };
  auto same = [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t j = 0; j < a.size(); ++j)
      if (a[j].first != b[j].first || std::bit_cast<std::uint32_t>(a[j].second) != std::bit_cast<std::uint32_t>(b[j].second)) return false;
    return true;
  };
  std::mt19937_64 rng(2411);
  auto run = [&]<class I, class W>(I, W, int P, std::uint64_t lo, std::uint64_t span, std::size_t per_block) {
    std::vector<I> idx;
    std::vector<W> val;
    std::vector<std::size_t> from{0};
    const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::bit_cast<float>(0x7fc01234u), std::bit_cast<float>(0xffa00001u), 1e30f, -1e30f};
    for (int q = 0; q < P; ++q) {
      std::vector<std::uint64_t> off;
      // a few offsets shared by every block (sums of P entries), the rest at random, the region's ends too
      for (std::uint64_t c : {std::uint64_t{0}, span - 1, span / 2, span / 3}) off.push_back(c);
      for (std::size_t j = 0; j < per_block; ++j) off.push_back(rng() % span);
      std::sort(off.begin(), off.end());
      off.erase(std::unique(off.begin(), off.end()), off.end());
      for (std::uint64_t o : off) {
        idx.push_back(static_cast<I>(lo + o));
        const float v = rng() % 16 == 0 ? specials[rng() % 8] : static_cast<float>(static_cast<double>(rng() % 2000001) / 1000.0 - 1000.0);
        val.push_back(gflow::detail::kernels::wire_cast<W>(v));
      }
      from.push_back(idx.size());
    }
    detail::region_reduce_scratch s;
    std::vector<std::pair<std::uint64_t, float>> out;
    detail::reduce_by_index(idx.data(), val.data(), idx.size(), lo, lo + span, s, out);
    CAPTURE(P);
    CAPTURE(span);
    CHECK(same(out, merged(idx, val, from)));
    CHECK(std::adjacent_find(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first >= b.first; }) == out.end());
  };
  for (int P : {1, 2, 3, 8, 16}) {
    run(std::uint32_t{}, float{}, P, 1000, 7, 5);                 // a tiny region: one pass, dense overlaps
    run(std::uint32_t{}, float{}, P, 123456, 1u << 20, 3000);     // two passes
    run(std::uint32_t{}, half{}, P, 77, (1u << 31) + 5, 3000);   // three passes, fp16 values
    run(std::uint64_t{}, bfloat16{}, P, std::uint64_t{1} << 40, (std::uint64_t{1} << 34) + 3, 2000);  // four passes, 64-bit indices
    run(std::uint64_t{}, float{}, P, std::uint64_t{1} << 40, 1u << 20, 3000);  // one-word entries, lo beyond 32 bits
    run(std::uint32_t{}, float{}, P, 0, std::uint64_t{1} << 32, 50);            // the largest region of one-word entries
    run(std::uint64_t{}, float{}, P, 5, (std::uint64_t{1} << 32) + 1, 50);      // the smallest region of two-word entries
    run(std::uint32_t{}, float{}, P, 9, 1, 3);                                   // a region of one element
  }
  detail::region_reduce_scratch s;  // nothing received: nothing summed
  std::vector<std::pair<std::uint64_t, float>> out{{1, 1.0f}};
  detail::reduce_by_index(static_cast<const std::uint32_t*>(nullptr), static_cast<const float*>(nullptr), 0, 0, 10, s, out);
  CHECK(out.empty());
}

TEST_CASE("in-process: OkTopK equals the reference bitwise (results, residuals, exchanged on every rank), P = 1..8") {
  auto l = Layout::from_sizes({700, 33, 1200, 5});
  for (int P : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(P);
    for (int mode : {0, 1}) {
      CAPTURE(mode);
      check_oktopk<Exchanger<Sparsifier<OkTopK<0.02>>>>(P, l, 14, mode, 0.02, 0, short_periods());
      check_oktopk<Exchanger<Sparsifier<OkTopK<0.02>>>>(P, l, 14, mode, 0.05, 2048, short_periods());
      check_oktopk<Exchanger<Sparsifier<OkTopK<0.02>>, Precision<half>>>(P, l, 10, mode, 0.03, 0, short_periods());
      check_oktopk<Exchanger<Sparsifier<OkTopK<0.02>>, Precision<bfloat16>>>(P, l, 8, mode, 0.03, 4096, short_periods(), false);
    }
    check_oktopk<Exchanger<Sparsifier<OkTopK<0.01>>>>(P, l, 40, 0, 0.01, 0, detail::oktopk_params{});  // the defaults
  }
}

TEST_CASE("in-process: every rank selects the same indices; OkTopK adds each index's values in rank order 0..P-1, bitwise as the reference") {
  // k = n/100 shared entries of random magnitude in [1, 2) on every rank: each reduced index has P
  // contributors, whose fp32 sum depends on the order of the additions.
  auto l = Layout::from_sizes({3000});
  auto gfn = [](int r, std::size_t i, int it) {
    const float u = grad(0, r, i, it);
    return i % 100 == 7 ? 1.0f + 0.999f * std::fabs(u) : 1e-4f * u;
  };
  for (int P : {3, 5, 8}) {
    CAPTURE(P);
    std::size_t order_matters = 0;  // indices where the reverse order gives other bits (so the test can tell)
    for (std::size_t i = 7; i < 3000; i += 100) {
      float fwd = gfn(0, i, 0), rev = gfn(P - 1, i, 0);
      for (int q = 1; q < P; ++q) fwd += gfn(q, i, 0);
      for (int q = P - 2; q >= 0; --q) rev += gfn(q, i, 0);
      order_matters += fwd != rev;
    }
    CHECK(order_matters > 0);
    check_oktopk_on<Exchanger<Sparsifier<OkTopK<0.01>>>>(P, l, 8, gfn, 0.01, 0, short_periods());
    check_oktopk_on<Exchanger<Sparsifier<OkTopK<0.01>>, Precision<half>>>(P, l, 8, gfn, 0.01, 0, short_periods());
  }
}

TEST_CASE("in-process: OkTopK's threshold path runs between re-estimations and they are reported") {
  auto l = Layout::from_sizes({4000});
  std::vector<std::size_t> local(8), boundary(8), global(8);
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<OkTopK<0.01>>>> ex(t, l);
    ex.sparsifier().set_params(short_periods());
    for (int it = 0; it < 8; ++it) {
      for (std::size_t i = 0; i < 4000; ++i) ex.pool_data()[i] = steady(t.rank(), i, it);
      ex.ready(0);
      (void)ex.finish();
      if (t.rank() == 0) {
        const auto r = ex.sparsifier().reestimated();
        local[static_cast<std::size_t>(it)] = r.local;
        boundary[static_cast<std::size_t>(it)] = r.boundary;
        global[static_cast<std::size_t>(it)] = r.global;
      }
    }
  });
  // iterations 0 and 4: exact local top-k (period 4); boundaries at 0, 3, 6 (period 3); the
  // global cut's full-range search on first use only (after it, the window round settles it)
  CHECK(local[0] == 1);
  CHECK(local[4] == 1);
  CHECK(global[0] == 1);
  CHECK(global[1] + global[2] + global[3] + global[4] + global[5] + global[6] + global[7] == 0);
  CHECK(boundary[0] == 1);
  CHECK(boundary[3] == 1);
  CHECK(boundary[6] == 1);
  CHECK(boundary[1] + boundary[2] + boundary[4] == 0);
  CHECK(local[1] + local[2] + local[3] + local[5] + local[6] + local[7] == 0);  // the threshold selection
}

namespace {
// fed = P x applied average + held, summed over ranks, exactly: dyadic gradients (multiples of
// 1/8 below 2^10), P a power of two, so every float sum is exact.
template <class E>
void conservation_bitwise(int P, bool average, std::size_t threshold) {
  auto l = Layout::from_sizes({300, 41, 900});
  const std::size_t n = l.total_numel();
  exchange_options o;
  o.average = average;
  auto gfn = [](int r, std::size_t i, int it) { return static_cast<float>(static_cast<int>(grad(0, r, i, it) * 64.0f)) / 8.0f; };
  const int iters = 20;
  auto tr = run_ranks<E>(
      P, l, iters, gfn, [](auto& ex) { ex.sparsifier().set_params(short_periods()); }, o, threshold);
  for (std::size_t i = 0; i < n; ++i) {
    double fed = 0, applied = 0, held = 0;
    for (int it = 0; it < iters; ++it) {
      for (int q = 0; q < P; ++q) fed += gfn(q, i, it);
      applied += static_cast<double>(tr.result[it][0][i]) * (average ? P : 1);
    }
    for (int q = 0; q < P; ++q) held += tr.residual[iters - 1][q][i];
    CAPTURE(i);
    REQUIRE(fed == applied + held);
  }
}
}  // namespace

TEST_CASE("conservation: OkTopK fed = applied + held exactly on dyadic inputs (fp32 and fp16 wires, fused or not)") {
  for (int P : {1, 2, 4, 8}) {
    CAPTURE(P);
    conservation_bitwise<Exchanger<Sparsifier<OkTopK<0.02>>>>(P, true, 0);
    conservation_bitwise<Exchanger<Sparsifier<OkTopK<0.02>>>>(P, false, 1024);
    conservation_bitwise<Exchanger<Sparsifier<OkTopK<0.02>>, Precision<half>>>(P, true, 2048);
  }
}

TEST_CASE("conservation: OkTopK over random layouts, ranks, fusion and schedules (to 1e-5 of the fed magnitude)") {
  std::mt19937_64 rng(24);
  for (int c = 0; c < 25; ++c) {
    const int P = 1 + static_cast<int>(rng() % 7);
    std::vector<std::size_t> sizes(1 + rng() % 5);
    for (auto& s : sizes) s = 1 + rng() % (rng() % 4 == 0 ? 3000 : 200);
    auto l = Layout::from_sizes(sizes);
    const std::size_t n = l.total_numel();
    std::size_t fusion = 0;
    if (rng() % 2) fusion = 64 + rng() % 4096;
    const double d = 0.002 + static_cast<double>(rng() % 200) / 1000.0;
    const std::uint64_t gseed = rng();
    auto gfn = [&](int r, std::size_t i, int it) { return grad(0, r, i, it, gseed) * (1.0f + static_cast<float>(i % 7)); };
    const int iters = 15;
    auto tr = run_ranks<Exchanger<Sparsifier<OkTopK<0.01>>>>(
        P, l, iters, gfn,
        [&](auto& ex) {
          ex.sparsifier().set_density(d);
          ex.sparsifier().set_params(short_periods());
        },
        {}, fusion);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double fed = 0, applied = 0, held = 0, mag = 0;
      for (int it = 0; it < iters; ++it) {
        for (int q = 0; q < P; ++q) {
          fed += gfn(q, i, it);
          mag += std::abs(gfn(q, i, it));
        }
        applied += static_cast<double>(tr.result[it][0][i]) * P;
        for (int q = 1; q < P; ++q) REQUIRE(tr.result[it][q][i] == tr.result[it][0][i]);
      }
      for (int q = 0; q < P; ++q) held += tr.residual[iters - 1][q][i];
      if (std::abs(fed - (applied + held)) > 1e-5 * mag + 1e-30) ++bad;
    }
    CAPTURE(c);
    CAPTURE(P);
    CHECK(bad == 0);
  }
}

TEST_CASE("residual rule: what the global selection drops stays with each contributor, whole; the region's owner keeps none of it") {
  // Two ranks, one unit of 8, k = 2, exact selections (first iteration). The boundaries cut the
  // unit at (3 + 6) / 2 = 4 (each rank proposes its second selected index): rank 0 reduces [0, 4)
  // = {0: 8, 3: 4}, rank 1 reduces [4, 8) = {4: 5, 6: 6}; the exact global top-2 keeps 0 and 6.
  auto l = Layout::from_sizes({8});
  std::vector<std::vector<float>> res(2), out(2);
  std::vector<std::vector<std::uint64_t>> xs(2);
  inproc::run(2, [&](inproc::transport& t) {
    exchange_options o;
    o.average = false;
    on_inproc<Exchanger<Sparsifier<OkTopK<0.25>>>> ex(t, l, o);
    const float g0[8] = {8, 0, 0, 4, 0, 1, 0, 2};  // rank 0 selects 0 and 3
    const float g1[8] = {0, 0, 0, 0, 5, 0, 6, 2};  // rank 1 selects 4 and 6 (ties: lower index)
    const float* g = t.rank() == 0 ? g0 : g1;
    std::memcpy(ex.pool_data(), g, sizeof g0);
    ex.ready(0);
    (void)ex.finish();
    const auto r = static_cast<std::size_t>(t.rank());
    res[r].assign(ex.sparsifier().residual().begin(), ex.sparsifier().residual().end());
    out[r].assign(ex.pool_data(), ex.pool_data() + 8);
    xs[r].assign(ex.sparsifier().exchanged().begin(), ex.sparsifier().exchanged().end());
  });
  // Global top-2 of {0: 8, 3: 4, 4: 5, 6: 6}: indices 0 and 6.
  CHECK(xs[0] == std::vector<std::uint64_t>{0, 6});
  CHECK(xs[1] == xs[0]);
  CHECK(out[0] == std::vector<float>{8, 0, 0, 0, 0, 0, 6, 0});
  CHECK(out[1] == out[0]);
  // Dropped: 3 (rank 0's 4) and 4 (rank 1's 5) go back to their contributors, whatever rank owned
  // the region; unselected values stayed where they were.
  CHECK(res[0] == std::vector<float>{0, 0, 0, 4, 0, 1, 0, 2});
  CHECK(res[1] == std::vector<float>{0, 0, 0, 0, 5, 0, 0, 2});
}

TEST_CASE("wire: every iteration keeps at most k (k unless the selections overlap) and the mean bytes per rank stay within 6k(P-1)/P words (+10%, + the fixed per-peer bytes), under steady, repeated and drifting gradients") {
  // The bound is Ok-Topk's: a selection of at most 2k (capacity 2) split to the other regions, and
  // k kept entries all-gathered, (2k + k) (P-1)/P entries of two 4-byte words. The fixed bytes
  // per iteration: the counts (8 B per peer), a 24-byte header on every split and result block
  // and the 24-byte announcement (per peer), the global cut's all_reduces (at most two of 32 u32),
  // the boundaries' all_reduce (P - 1 u64) when due. Before the global cut (an adaptive global
  // threshold), repeated gradients sent P k entries in the all_gatherv on most iterations.
  const std::size_t n = 200000;
  auto l = Layout::from_sizes({n});
  const double d = 0.01;
  const std::size_t k = gflow::detail::plan::k_for(d, n);
  const int iters = 14;
  // three gradient sequences: (0) steady top-k; (1) the same gradient every iteration (every
  // residual grows each iteration: thresholds from one iteration are too low for the next);
  // (2) drifting: the scale jumps x8 up and / 16 down, and the large entries move
  auto gfn = [](int seq, int r, std::size_t i, int it) -> float {
    if (seq == 0) return steady(r, i, it);
    if (seq == 1) return grad(0, r, i, 0);
    const float scale[] = {1.0f, 8.0f, 64.0f, 4.0f, 0.25f, 0.25f, 16.0f, 1.0f, 1.0f / 64, 8.0f, 1.0f, 512.0f, 1.0f, 0.5f};
    const float u = grad(0, r, i, it);
    return scale[it] * (i % 97 == static_cast<std::size_t>(it) % 97 ? 4.0f * u : u);
  };
  for (int seq : {0, 1, 2})
    for (int P : {4, 8, 16}) {
      CAPTURE(seq);
      CAPTURE(P);
      std::vector<std::vector<std::size_t>> bytes(static_cast<std::size_t>(iters), std::vector<std::size_t>(static_cast<std::size_t>(P), 0));
      std::vector<std::size_t> kept(static_cast<std::size_t>(iters), 0);
      inproc::run(P, [&](inproc::transport& t) {
        on_inproc<Exchanger<Sparsifier<OkTopK<0.01>>>> ex(t, l);
        for (int it = 0; it < iters; ++it) {
          for (std::size_t i = 0; i < n; ++i) ex.pool_data()[i] = gfn(seq, t.rank(), i, it);
          ex.ready(0);
          (void)ex.finish();
          bytes[static_cast<std::size_t>(it)][static_cast<std::size_t>(t.rank())] = ex.sparsifier().wire_bytes();
          if (t.rank() == 0) kept[static_cast<std::size_t>(it)] = ex.sparsifier().exchanged().size();
        }
      });
      const double p = P;
      const double bound = 6.0 * static_cast<double>(k) * (p - 1) / p * 4.0;
      const double fixed = (8.0 + 3 * 24.0) * (p - 1) + 2 * (2 * 128.0 * (p - 1) / p) + 2 * (p - 1) / p * 8.0 * (p - 1);
      const double topk = static_cast<double>(gflow::detail::sparse_message::bytes(k, 4, 4)) * (p - 1);  // what TopK's ring all_gather sends per rank
      for (int it = 0; it < iters; ++it) {
        CAPTURE(it);
        const auto& b = bytes[static_cast<std::size_t>(it)];
        double mean = 0;
        for (std::size_t x : b) mean += static_cast<double>(x) / p;
        // exactly k whenever the ranks' selections hold k distinct indices (a rank selects at least k/2:
        // an emptier threshold selection takes the exact top-k); the same gradients on every rank
        // (steady: overlapping selections) may hold fewer
        CHECK(kept[static_cast<std::size_t>(it)] <= k);
        if (seq != 0) CHECK(kept[static_cast<std::size_t>(it)] == k);
        CHECK(mean <= 1.1 * bound + fixed);
        CHECK(mean < topk);
      }
    }
}

TEST_CASE("the global cut (engines/oktopk/cut.hpp): one window round or coarse + fine rounds find the level of the k-th largest key and k - (keys above it)") {
  namespace oc = gflow::detail::oktopk_cut;
  std::mt19937 rng(7);
  std::size_t settled = 0, missed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    // keys spread over a few octaves around a random level, some ties, some zeros
    const std::uint32_t centre = 8 + rng() % 1000;
    std::vector<std::uint32_t> keys(1 + rng() % 300);
    for (auto& key : keys) {
      const int spread = static_cast<int>(rng() % 40) - 20;
      const std::uint32_t lv = static_cast<std::uint32_t>(std::clamp<int>(static_cast<int>(centre) + spread, 0, 1023));
      key = rng() % 10 == 0 ? 0u : oc::level_floor(lv) + (rng() % 4 == 0 ? 0u : rng() % (1u << oc::level_shift));
    }
    const std::uint64_t k = 1 + rng() % 200;
    std::vector<std::uint32_t> nz;
    for (auto key : keys)
      if (key) nz.push_back(key);
    std::sort(nz.begin(), nz.end(), std::greater<>());
    const bool all = nz.size() < k;  // (exactly k: a cut whose allowance takes the whole level, the same entries)
    const std::uint32_t L = all ? 0u : oc::level_of(nz[k - 1]);
    std::uint64_t above = 0;
    for (auto key : nz) above += oc::level_of(key) > L;
    auto count = [&](oc::round r) {
      std::array<std::uint32_t, oc::slots> h{};
      for (auto key : nz)
        if (const auto sl = oc::slot_of(r, oc::level_of(key)); sl < oc::slots) ++h[sl];
      return h;
    };
    auto check = [&](const oc::cut& c) {
      CHECK(c.keep_all == all);
      if (!all) {
        CHECK(c.level == L);
        CHECK(c.allowance == k - above);
      }
    };
    const std::uint32_t lo = oc::window_lo(static_cast<std::uint32_t>(std::clamp<int>(static_cast<int>(centre) + static_cast<int>(rng() % 60) - 30, 0, 1023)));
    const auto hw = count({oc::round_kind::window, lo});
    const auto v = oc::settle_window(hw.data(), lo, k);
    if (v.settled) {
      ++settled;
      check(v.c);
    } else {
      ++missed;
      CHECK(!all);
      CHECK((L < lo || L >= lo + 30));  // a miss only when the level lies outside the window's single levels
    }
    const auto hc = count({oc::round_kind::coarse, 0});
    const auto f = oc::find(hc.data(), 0, k);
    if (f.all) {
      check(oc::keep_all);
    } else {
      const auto hf = count({oc::round_kind::fine, f.slot});
      check(oc::settle_fine(hf.data(), f.slot, f.above, k));
    }
  }
  CHECK(settled > 100);  // both paths taken
  CHECK(missed > 100);
  // the allotment: rank order, each at most its count at the level
  oc::allotter a({5, 7, false});
  CHECK(a.next(3) == 3);
  CHECK(a.next(0) == 0);
  CHECK(a.next(9) == 4);
  CHECK(a.next(2) == 0);
}

TEST_CASE("mock: OkTopK issues all_reduce (boundaries due), all_to_all, all_to_allv, all_reduce (the cut), all_gather, all_gatherv per unit") {
  auto l = Layout::from_sizes({1000});
  mock::transport m(4, 2);
  on_mock<Exchanger<Sparsifier<OkTopK<0.01>>>> ex(m, l);
  {
    m.calls().clear();
    for (std::size_t i = 0; i < 1000; ++i) ex.pool_data()[i] = static_cast<float>((i * 37) % 101) - 50.0f;
    // The mock gives every rank the played rank's data, so every region's result block carries the
    // played rank's region: the check rejects it (a real transport never delivers that).
    CHECK_THROWS_AS(ex.ready(0), parse_error);
    std::vector<mock::op> ops;
    for (const auto& r : m.calls().records) ops.push_back(r.kind);
    // first use: the cut's full-range search; its coarse round finds k or fewer nonzero sums (the
    // mock's all_reduce multiplies the played rank's counts by 4), so no fine round follows
    CHECK(ops == std::vector<mock::op>{mock::op::all_reduce, mock::op::all_to_all, mock::op::all_to_allv, mock::op::all_reduce, mock::op::all_gather,
                                       mock::op::all_gatherv});
  }
}

namespace {
// In-process transport whose rank `culprit` corrupts the first index of every block it sends in
// all_to_allv (where == 0) or all_gatherv (where == 1).
class corrupting_transport : public inproc::transport {
 public:
  corrupting_transport(inproc::transport t, int culprit, int where) : inproc::transport(std::move(t)), culprit_(culprit), where_(where) {}
  template <wire_element E>
  void all_to_allv(const E* s, const std::size_t* sc, E* r, const std::size_t* rc) {
    if constexpr (std::is_same_v<E, std::uint8_t>) {
      if (rank() == culprit_ && where_ == 0) {
        std::size_t total = 0;
        for (int q = 0; q < size(); ++q) total += sc[q];
        std::vector<std::uint8_t> copy(s, s + total);
        for (std::size_t q = 0, at = 0; q < static_cast<std::size_t>(size()); at += sc[q], ++q)
          if (sc[q] > 28) {
            const std::uint32_t bad = 1u << 30;
            std::memcpy(copy.data() + at + 24, &bad, 4);
          }
        inproc::transport::all_to_allv(copy.data(), sc, r, rc);
        return;
      }
    }
    inproc::transport::all_to_allv(s, sc, r, rc);
  }
  template <wire_element E>
  void all_gatherv(const E* s, std::size_t n, E* r, const std::size_t* c) {
    if constexpr (std::is_same_v<E, std::uint8_t>) {
      if (rank() == culprit_ && where_ == 1 && n > 28) {
        std::vector<std::uint8_t> copy(s, s + n);
        const std::uint32_t bad = 1u << 30;
        std::memcpy(copy.data() + 24, &bad, 4);
        inproc::transport::all_gatherv(copy.data(), n, r, c);
        return;
      }
    }
    inproc::transport::all_gatherv(s, n, r, c);
  }
  corrupting_transport split(int color, int key) { return corrupting_transport(inproc::transport::split(color, key), culprit_, where_); }

 private:
  int culprit_, where_;
};
static_assert(gflow::variable_transport<corrupting_transport>);
}  // namespace

namespace {
/// Rank 2 corrupts its blocks (where: 0 the split, 1 the result): every rank's parse_error (subject,
/// text), and each rank's gradient must be back in its residual.
template <class E>
std::pair<std::vector<std::string>, std::vector<std::string>> corrupt_block_errors(int P, int where) {
  auto l = Layout::from_sizes({400});
  std::vector<std::string> errors(static_cast<std::size_t>(P)), subjects(static_cast<std::size_t>(P));
  inproc::run(
      P,
      [&](inproc::transport& base) {
        corrupting_transport t(base, 2, where);
        typename E::template on<corrupting_transport> ex(t, l);
        for (std::size_t i = 0; i < 400; ++i) ex.pool_data()[i] = static_cast<float>(i + 1 + t.rank());
        try {
          ex.ready(0);
        } catch (const gflow::parse_error& e) {
          errors[static_cast<std::size_t>(t.rank())] = e.what();
          subjects[static_cast<std::size_t>(t.rank())] = e.subject();
        }
        for (std::size_t i = 0; i < 400; ++i) CHECK(ex.sparsifier().residual()[i] == static_cast<float>(i + 1 + t.rank()));
      },
      std::chrono::seconds(20));
  return {subjects, errors};
}
}  // namespace

TEST_CASE("bad input: a corrupt block stops EVERY rank with the same typed error, and each rank's gradient is back in its residual") {
  for (int where : {0, 1}) {
    CAPTURE(where);
    const int P = 4;
    const auto [subjects, errors] = corrupt_block_errors<Exchanger<Sparsifier<OkTopK<0.1>>>>(P, where);
    for (int r = 0; r < P; ++r) {
      CAPTURE(r);
      CHECK(subjects[r] == "index");
      if (where == 0) CHECK(errors[r].find("in the split-and-reduce, rank ") != std::string::npos);
      else CHECK(errors[r].find("the result block all-gathered from rank 2 was rejected: entry 0 has index 1073741824, outside") != std::string::npos);
    }
  }
}

TEST_CASE("bad input, sharded: a corrupt split block stops EVERY rank with the same typed error; each rank's gradient is back in its residual") {
  const int P = 4;
  const auto [subjects, errors] = corrupt_block_errors<Exchanger<Sparsifier<OkTopK<0.1>>, Sharding<ReduceScatter>>>(P, 0);
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(subjects[r] == "index");
    CHECK(errors[r].find("rejected the block rank 2 sent for its region") != std::string::npos);
  }
}

TEST_CASE("checkpoint: OkTopK resumes bit for bit (residual, thresholds, boundaries, parameters)") {
  auto l = Layout::from_sizes({900, 77});
  using E = Exchanger<Sparsifier<OkTopK<0.02>>, Fusion<2048>>;
  const int P = 3;
  std::vector<std::vector<float>> straight(P), resumed(P);
  auto feed = [&](auto& ex, int r, int it) {
    for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = grad(0, r, i, it);
    for (std::size_t b = 0; b < l.size(); ++b) ex.ready(b);
    (void)ex.finish();
  };
  inproc::run(P, [&](inproc::transport& t) {
    const int r = t.rank();
    std::stringstream file;
    {
      on_inproc<E> a(t, l);
      a.sparsifier().set_params(short_periods());
      for (int it = 0; it < 6; ++it) feed(a, r, it);
      a.save_state(file);
      for (int it = 6; it < 13; ++it) feed(a, r, it);
      straight[static_cast<std::size_t>(r)].assign(a.pool_data(), a.pool_data() + l.total_numel());
      auto res = a.sparsifier().residual();
      straight[static_cast<std::size_t>(r)].insert(straight[static_cast<std::size_t>(r)].end(), res.begin(), res.end());
    }
    on_inproc<E> b(t, l);  // default parameters: the checkpoint brings the saved ones
    b.load_state(file);
    CHECK(b.sparsifier().params().threshold_period == 4);
    CHECK(b.sparsifier().unit(0).bounds.size() == P + 1);
    for (int it = 6; it < 13; ++it) feed(b, r, it);
    resumed[static_cast<std::size_t>(r)].assign(b.pool_data(), b.pool_data() + l.total_numel());
    auto res = b.sparsifier().residual();
    resumed[static_cast<std::size_t>(r)].insert(resumed[static_cast<std::size_t>(r)].end(), res.begin(), res.end());
  });
  for (int r = 0; r < P; ++r) CHECK(same_bits(straight[r], resumed[r]));
}

TEST_CASE("parameters: OkTopK rejects periods of 0 and adaptation factors or capacities out of range, naming the field") {
  auto l = Layout::from_sizes({100});
  mock::transport m(2, 0);
  on_mock<Exchanger<Sparsifier<OkTopK<0.1>>>> ex(m, l);
  auto subject = [&](detail::oktopk_params p) {
    try {
      ex.sparsifier().set_params(p);
    } catch (const invalid_argument& e) {
      return e.subject();
    }
    return std::string("none");
  };
  detail::oktopk_params p;
  p.threshold_period = 0;
  CHECK(subject(p) == "threshold_period");
  p = {};
  p.boundary_period = 0;
  CHECK(subject(p) == "boundary_period");
  p = {};
  p.local_adapt = 0.9;
  CHECK(subject(p) == "local_adapt");
  p = {};
  p.local_adapt = std::nan("");
  CHECK(subject(p) == "local_adapt");
  p = {};
  p.capacity = 0.5;
  CHECK(subject(p) == "capacity");
  CHECK(subject({}) == "none");
}

TEST_CASE("schedules and views: OkTopK's k follows the density schedule; selected() is this rank's selection, exchanged() the result") {
  auto l = Layout::from_sizes({1000});
  std::vector<std::size_t> ks(6);
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<OkTopK<0.01>>>> ex(t, l);
    ex.sparsifier().set_schedule(gflow::detail::plan::density_schedule::per_iteration({{2, 0.1}, {4, 0.05}}, 0.01));
    for (int it = 0; it < 6; ++it) {
      for (std::size_t i = 0; i < 1000; ++i) ex.pool_data()[i] = grad(0, t.rank(), i, it);
      ex.ready(0);
      (void)ex.finish();
      const auto sel = ex.sparsifier().selected();
      const auto xs = ex.sparsifier().exchanged();
      CHECK(std::is_sorted(sel.begin(), sel.end()));
      CHECK(sel.size() <= 2 * ex.sparsifier().k());
      for (std::size_t i = 0; i < 1000; ++i) {  // the pool is non-zero exactly at exchanged()
        const bool in = std::binary_search(xs.begin(), xs.end(), static_cast<std::uint64_t>(i));
        if (!in) CHECK(ex.pool_data()[i] == 0.0f);
      }
      if (t.rank() == 0) ks[static_cast<std::size_t>(it)] = ex.sparsifier().k();
    }
  });
  CHECK(ks == std::vector<std::size_t>{100, 100, 50, 50, 10, 10});
}

TEST_CASE("local selection over capacity: the exact top-k is taken among the candidates (no second pass), as the reference's brute force") {
  // k = n/100 steady entries; from iteration 2 on, 2k more entries above the threshold each
  // iteration (3k candidates: over the capacity 2k, within the 8k candidate buffer); iteration 5
  // floods 39k entries of 100 (beyond the buffer: the full radix select runs).
  auto l = Layout::from_sizes({5000});
  auto gfn = [](int r, std::size_t i, int it) {
    const float base = steady(r, i, it);
    if (it >= 2 && (i % 100 == 50 || i % 100 == 51)) return 1.5f + 0.001f * static_cast<float>(i % 7);
    if (it == 5 && i % 100 > 60) return 100.0f + 0.01f * static_cast<float>(i % 5);
    return base;
  };
  const int P = 3, iters = 7;
  const auto prm = short_periods();
  std::vector<std::size_t> local(iters), second(iters);
  auto tr = run_ranks<Exchanger<Sparsifier<OkTopK<0.01>>>>(P, l, iters, gfn, [&](auto& ex) { ex.sparsifier().set_params(prm); });
  inproc::run(P, [&](inproc::transport& t) {  // the counters, on the same data
    on_inproc<Exchanger<Sparsifier<OkTopK<0.01>>>> ex(t, l);
    ex.sparsifier().set_params(prm);
    for (int it = 0; it < iters; ++it) {
      for (std::size_t i = 0; i < 5000; ++i) ex.pool_data()[i] = gfn(t.rank(), i, it);
      ex.ready(0);
      (void)ex.finish();
      if (t.rank() == 0) {
        local[static_cast<std::size_t>(it)] = ex.sparsifier().reestimated().local;
        second[static_cast<std::size_t>(it)] = ex.sparsifier().reestimated().second_pass;
      }
    }
  });
  oktopk_reference<float> ref(P, true, prm, {{0, 5000}}, 5000);
  for (int it = 0; it < iters; ++it) {
    std::vector<std::vector<float>> g(P, std::vector<float>(5000));
    for (int q = 0; q < P; ++q)
      for (std::size_t i = 0; i < 5000; ++i) g[static_cast<std::size_t>(q)][i] = gfn(q, i, it);
    ref.step(g, 0.01, static_cast<std::uint64_t>(it));
    for (int q = 0; q < P; ++q) {
      CAPTURE(it);
      CAPTURE(q);
      REQUIRE(same_bits(tr.result[it][q], ref.result));
      REQUIRE(same_bits(tr.residual[it][q], ref.res[static_cast<std::size_t>(q)]));
    }
  }
  CHECK(local[1] == 0);  // the threshold selection
  CHECK(local[2] == 1);  // over capacity: exact among the candidates
  CHECK(second[2] == 0);
  CHECK(local[5] == 1);  // flooded: the full radix select
  CHECK(second[5] == 1);
}

// ---- no allocation per iteration once warm --------------------------------------------------

namespace gflow_test {  // the counting operator new of test_exchanger.cpp
extern std::atomic<bool> g_counting;
extern std::atomic<long> g_allocs;
extern thread_local bool t_uncounted;
}  // namespace gflow_test

namespace {
// In-process transport whose own allocations (the collectives' bookkeeping in its group) are not
// counted, so that the count is the engine's and the exchanger's.
class uncounted_transport : public inproc::transport {
 public:
  explicit uncounted_transport(inproc::transport t) : inproc::transport(std::move(t)) {}
  template <wire_element E>
  void all_reduce(E* b, std::size_t n, reduce_op op) {
    pause p;
    inproc::transport::all_reduce(b, n, op);
  }
  template <wire_element E>
  void all_gather(const E* s, E* r, std::size_t n) {
    pause p;
    inproc::transport::all_gather(s, r, n);
  }
  template <wire_element E>
  void all_to_all(const E* s, E* r, std::size_t n) {
    pause p;
    inproc::transport::all_to_all(s, r, n);
  }
  template <wire_element E>
  void all_to_allv(const E* s, const std::size_t* sc, E* r, const std::size_t* rc) {
    pause p;
    inproc::transport::all_to_allv(s, sc, r, rc);
  }
  template <wire_element E>
  void all_gatherv(const E* s, std::size_t n, E* r, const std::size_t* c) {
    pause p;
    inproc::transport::all_gatherv(s, n, r, c);
  }
  void barrier() {
    pause p;
    inproc::transport::barrier();
  }
  uncounted_transport split(int color, int key) { return uncounted_transport(inproc::transport::split(color, key)); }

 private:
  struct pause {
    bool was = gflow_test::t_uncounted;
    pause() { gflow_test::t_uncounted = true; }
    ~pause() { gflow_test::t_uncounted = was; }
    pause(const pause&) = delete;
    pause& operator=(const pause&) = delete;
  };
};
static_assert(gflow::variable_transport<uncounted_transport>);

struct counted_run {
  long allocations = -1;
  // what rank 0's counted iterations ran, summed over their selection units: exact local top-k,
  // boundary estimates, full-range searches of the global cut, threshold selections
  std::size_t local = 0, boundary = 0, global = 0, threshold = 0;
};

/// Heap allocations (every rank's, the transport's aside) in `counted` iterations of E on P
/// ranks after `warm` iterations; random gradients (counts vary), periods 3 (exact local top-k)
/// and 2 (boundaries), the density schedule `sched`. reload_initial: after the
/// warm-up, load the checkpoint saved before the first iteration (no boundaries estimated yet),
/// so that the counted iterations estimate them again.
template <class E>
counted_run oktopk_allocations(int P, const Layout& l, int warm, int counted, const gflow::detail::plan::density_schedule& sched, std::size_t index_bytes = 4,
                               bool reload_initial = false) {
  detail::oktopk_params prm = short_periods();
  prm.threshold_period = 3;
  prm.boundary_period = 2;
  counted_run out;
  inproc::run(
      P,
      [&](inproc::transport& base) {
        uncounted_transport t(base);
        typename E::template on<uncounted_transport> ex(t, l);
        ex.sparsifier().set_schedule(sched);
        ex.sparsifier().set_params(prm);
        ex.sparsifier().set_index_bytes(index_bytes);
        std::stringstream initial;
        ex.save_state(initial);
        auto step = [&](int it) {
          for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = grad(1, t.rank(), i, it) * (1.0f + static_cast<float>(i % 5));
          for (std::size_t b = 0; b < l.size(); ++b) ex.ready(b);
          (void)ex.finish();
        };
        for (int it = 0; it < warm; ++it) step(it);
        if (reload_initial) {
          ex.load_state(initial);
          REQUIRE(ex.sparsifier().unit(0).bounds.empty());
        }
        t.barrier();  // every rank's load (which allocates) done before rank 0 starts counting
        if (t.rank() == 0) {
          gflow_test::g_allocs = 0;
          gflow_test::g_counting = true;
        }
        t.barrier();
        for (int it = warm; it < warm + counted; ++it) {
          step(it);
          if (t.rank() == 0) {
            const auto r = ex.sparsifier().reestimated();
            out.local += r.local;
            out.boundary += r.boundary;
            out.global += r.global;
            out.threshold += ex.sparsifier().selections() - r.local;
          }
        }
        t.barrier();
        if (t.rank() == 0) {
          gflow_test::g_counting = false;
          out.allocations = gflow_test::g_allocs.load();
        }
      },
      std::chrono::seconds(60));
  return out;
}
}  // namespace

TEST_CASE("an OkTopK iteration allocates nothing once warm, re-estimation iterations included (in-process; the transport's own allocations aside)") {
  auto l = Layout::from_sizes({1000, 3, 257, 4096, 1, 77, 512});
  const auto constant = gflow::detail::plan::density_schedule::constant(0.02);
  // k grows after the warm-up: buffers are sized for the schedule's largest density
  const auto growing = gflow::detail::plan::density_schedule::per_iteration({{8, 0.01}}, 0.03);
  auto check = [](const counted_run& r) {
    CHECK(r.allocations == 0);
    CHECK(r.local > 0);  // the counted iterations include exact local top-k,
    CHECK(r.boundary > 0);  // boundary estimates,
    CHECK(r.threshold > 0);  // and threshold selections
  };
  for (int P : {1, 3, 4}) {
    CAPTURE(P);
    check(oktopk_allocations<Exchanger<Sparsifier<OkTopK<0.02>>>>(P, l, 6, 10, constant));
    check(oktopk_allocations<Exchanger<Sparsifier<OkTopK<0.02>>, Fusion<4096>>>(P, l, 6, 10, growing, 8));
    check(oktopk_allocations<Exchanger<Sparsifier<OkTopK<0.02>>, Precision<half>>>(P, l, 6, 10, growing));
    check(oktopk_allocations<Exchanger<Sparsifier<OkTopK<0.02>>, Fusion<4096>, Precision<bfloat16>>>(P, l, 6, 10, constant));
    // a checkpoint saved before the first estimate, loaded after the warm-up: its units hold no
    // boundaries, and estimating them (and the global cut's full-range search) must not allocate either
    const auto reloaded = oktopk_allocations<Exchanger<Sparsifier<OkTopK<0.02>>, Fusion<4096>>>(P, l, 6, 10, constant, 4, true);
    check(reloaded);
    CHECK(reloaded.global > 0);
  }
}
