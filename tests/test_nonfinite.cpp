// Non-finite gradients (docs/DESIGN.md, "Non-finite values"): inf, -inf and NaN injected at a
// random position on one random rank, for every wire precision x sparsifier x Fusion on/off, on 2
// and 4 in-process ranks. Every rank reports the bad iteration (exchange_status::nonfinite > 0,
// identical statuses); residuals and CSC history hold only finite values after it; later clean
// iterations are finite; and nothing else is lost: fed == applied + held for every element, the
// injected one counted afresh from the iteration that reported it. Also: a finite gradient that
// overflows the fp16 wire is reported, and a Top-k rank with more inf/NaN than k keeps none.
//
// Gradients are small integers and P a power of two, so every step of every exchange is exact in
// every wire type and the conservation check can be exact too.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_inproc;

namespace {

const float inf = std::numeric_limits<float>::infinity();

/// An integer in [-2, 2] from (rank, pool index, iteration).
float grad(int r, std::size_t i, int it) {
  std::uint64_t x = (std::uint64_t(r + 1) * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t(i) * 0xBF58476D1CE4E5B9ull) ^
                    (std::uint64_t(it + 1) * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int>(x % 5) - 2);
}

const Layout& nf_layout() {
  static const Layout l = Layout::from_sizes({200, 37, 128, 5, 61});
  return l;
}

struct injection {
  int iteration = -1;
  std::size_t index = 0;
  int rank = 0;
  bool kept_back = false;  // CSC: in a chunk this iteration keeps back
};

struct trace {
  int P = 0;
  std::vector<std::vector<exchange_status>> status;         // [it][rank]
  std::vector<std::vector<std::vector<float>>> fed, view, residual;  // [it][rank][pool index]
  std::vector<injection> injected;
};

template <class X>
constexpr bool is_csc = requires(X& x) { x.sparsifier().upcoming_chunks(); };

/// Runs E on P ranks for `iters` iterations; at each iteration of `bad` (in order), one rank
/// chosen at random writes `value` at a random pool index. For CSC, the first injection goes into
/// a chunk this iteration exchanges and the second into one it keeps back.
template <class E>
trace run_injected(int P, int iters, const std::vector<int>& bad, float value, std::uint64_t seed) {
  const Layout& l = nf_layout();
  const std::size_t n = l.total_numel();
  trace tr;
  tr.P = P;
  const auto I = static_cast<std::size_t>(iters), R = static_cast<std::size_t>(P);
  tr.status.assign(I, std::vector<exchange_status>(R));
  tr.fed.assign(I, std::vector<std::vector<float>>(R));
  tr.view = tr.residual = tr.fed;
  inproc::run(P, [&](inproc::transport& t) {
    using X = on_inproc<E>;
    X ex(t, l);
    if constexpr (is_csc<X>) ex.sparsifier().set_warmup(1, 0);  // iteration 0 dense, then 25% of the chunks
    const auto r = static_cast<std::size_t>(t.rank());
    std::mt19937_64 shared(seed);  // the same draws on every rank
    std::size_t nbad = 0;
    for (int it = 0; it < iters; ++it) {
      float* pool = ex.pool_data();
      for (std::size_t i = 0; i < n; ++i) pool[i] = grad(t.rank(), i, it);
      if (nbad < bad.size() && bad[nbad] == it) {
        injection inj;
        inj.iteration = it;
        inj.rank = static_cast<int>(shared() % std::uint64_t(P));
        if constexpr (is_csc<X>) {
          auto& s = ex.sparsifier();
          inj.kept_back = nbad % 2 == 1;
          const auto up = s.upcoming_chunks();
          std::vector<std::uint8_t> sel(s.chunk_count(), 0);
          for (auto c : up) sel[c] = 1;
          std::vector<std::size_t> cand;
          for (std::size_t i = 0; i < n; ++i)
            if (sel[i / s.chunk_elems()] != inj.kept_back) cand.push_back(i);
          REQUIRE(!cand.empty());
          inj.index = cand[shared() % cand.size()];
        } else {
          inj.index = shared() % n;
        }
        if (t.rank() == inj.rank) pool[inj.index] = value;
        if (r == 0) tr.injected.push_back(inj);
        ++nbad;
      }
      tr.fed[std::size_t(it)][r].assign(pool, pool + n);
      for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);
      tr.status[std::size_t(it)][r] = ex.finish();
      tr.view[std::size_t(it)][r].assign(pool, pool + n);
      if constexpr (requires { ex.sparsifier().residual(); }) {
        auto res = ex.sparsifier().residual();
        tr.residual[std::size_t(it)][r].assign(res.begin(), res.end());
      } else {
        tr.residual[std::size_t(it)][r].assign(n, 0.0f);  // Dense holds nothing
      }
    }
  });
  return tr;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

/// The checks every injection run must pass. `reported` lists the iterations that must report
/// non-finite values (the others must not).
void check_trace(const trace& tr, const std::set<int>& reported) {
  const int P = tr.P;
  const std::size_t iters = tr.status.size();
  const std::size_t n = tr.fed[0][0].size();
  std::vector<double> fed(n, 0.0), applied(n, 0.0);
  for (std::size_t it = 0; it < iters; ++it) {
    CAPTURE(it);
    const auto& st = tr.status[it];
    for (int q = 0; q < P; ++q) {
      CHECK(st[std::size_t(q)].nonfinite == st[0].nonfinite);  // identical on every rank
      CHECK(st[std::size_t(q)].iteration == it);
      CHECK(std::memcmp(tr.view[it][std::size_t(q)].data(), tr.view[it][0].data(), n * sizeof(float)) == 0);
      CHECK(all_finite(tr.residual[it][std::size_t(q)]));  // never an inf/NaN in a residual or history
    }
    const bool bad = reported.count(int(it)) != 0;
    if (bad) {
      CHECK(st[0].nonfinite > 0);
    } else {
      CHECK(st[0].nonfinite == 0);
      CHECK(all_finite(tr.view[it][0]));
    }
    for (const auto& inj : tr.injected)
      if (std::size_t(inj.iteration) == it) {
        if (inj.kept_back) CHECK(tr.view[it][0][inj.index] == 0.0f);  // kept back: nothing applied there
        else if (bad) CHECK(!std::isfinite(tr.view[it][0][inj.index]));
      }
    // Accounting. The average of P = 2^j ranks is exact: applied = P * view.
    for (std::size_t i = 0; i < n; ++i) {
      for (int q = 0; q < P; ++q) fed[i] += tr.fed[it][std::size_t(q)][i];
      applied[i] += double(P) * tr.view[it][0][i];
    }
    if (bad)  // the injected elements start afresh from what the ranks hold now
      for (const auto& inj : tr.injected) {
        if (std::size_t(inj.iteration) > it) continue;
        double held = 0;
        for (int q = 0; q < P; ++q) held += tr.residual[it][std::size_t(q)][inj.index];
        fed[inj.index] = held;
        applied[inj.index] = 0;
      }
  }
  std::size_t lost = 0, first = n;
  for (std::size_t i = 0; i < n; ++i) {
    double held = 0;
    for (int q = 0; q < P; ++q) held += tr.residual[iters - 1][std::size_t(q)][i];
    if (!(std::fabs(fed[i] - applied[i] - held) <= 1e-9)) {
      ++lost;
      if (first == n) first = i;
    }
  }
  INFO("first element where fed != applied + held: " << first);
  CHECK(lost == 0);
}

template <class E>
void inject_matrix(const char* name) {
  CAPTURE(name);
  int v = 0;
  for (float value : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    for (int P : {2, 4}) {
      CAPTURE(value);
      CAPTURE(P);
      const std::uint64_t seed = std::uint64_t(v * 10 + P) * 7919u + std::hash<std::string>{}(name);
      const auto tr = run_injected<E>(P, 12, {3, 7}, value, seed);
      REQUIRE(tr.injected.size() == 2);
      check_trace(tr, {3, 7});
    }
    ++v;
  }
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("non-finite: inf, -inf, NaN on one rank, every sparsifier x Fusion on/off, reported on every rank, never kept", W,
                          wires_id) {
  gflow_test::for_each_type<gflow_test::schemes>([&]<class S>() {
    const std::string name = gflow_test::scheme_label<S>();
    inject_matrix<Exchanger<Precision<W>, Sparsifier<S>>>(name.c_str());
    inject_matrix<Exchanger<Precision<W>, Fusion<256>, Sparsifier<S>>>((name + " + Fusion").c_str());
  });
}
TEST_CASE_TEMPLATE_APPLY(wires_id, gflow_test::wires);

TEST_CASE_TEMPLATE_DEFINE("non-finite: a finite gradient that overflows the fp16 wire is reported on every rank, and not kept", S,
                          schemes_id) {
  using E = Exchanger<Precision<half>, Sparsifier<S>>;
  constexpr bool csc = requires { S::chunk_elems; };
  for (int P : {2, 4}) {
    CAPTURE(P);
    // 1e6 is finite in fp32; divided by P it is still above fp16's largest value, 65504.
    const auto tr = run_injected<E>(P, 12, {3, 7}, 1e6f, 101u + unsigned(P));
    // CSC keeps the kept-back one in its history (a finite fp32 value) and sends it next iteration.
    check_trace(tr, csc ? std::set<int>{3, 8} : std::set<int>{3, 7});
    if constexpr (csc) {
      const auto& inj = tr.injected[1];  // iteration 7: kept, finite, waiting for its chunk's exchange
      CHECK(tr.residual[7][std::size_t(inj.rank)][inj.index] >= 1e6f - 4.0f);
    }
  }
}

TEST_CASE_TEMPLATE_APPLY(schemes_id, gflow_test::schemes);

TEST_CASE_TEMPLATE("non-finite: a Top-k rank with more inf/NaN than k sends k and keeps none", S, TopK<0.01>, GTopK<0.01>) {
  using E = Exchanger<Sparsifier<S>>;
  const Layout l = Layout::from_sizes({300});  // k = 3
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    for (int it = 0; it < 4; ++it) {
      auto v = ex.view(0);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = grad(t.rank(), i, it);
      if (it == 1 && t.rank() == 2)
        for (std::size_t i : {5, 50, 77, 123, 200, 299}) v[i] = i % 2 ? inf : std::numeric_limits<float>::quiet_NaN();
      ex.ready(0);
      const auto st = ex.finish();
      CHECK(st.finite() == (it != 1));
      if (it == 1) CHECK(st.nonfinite >= 1);
      for (float x : ex.sparsifier().residual()) CHECK(std::isfinite(x));
      if (it != 1)
        for (float x : ex.view(0)) CHECK(std::isfinite(x));
    }
  });
}
