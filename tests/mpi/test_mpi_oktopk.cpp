// Sparsifier<OkTopK<d>> over MPI: the variable-size collectives (all_to_all, all_to_allv,
// all_gatherv) against values every rank can compute, and the exchanger against the
// straightforward reference (tests/oktopk_reference.hpp), bit for bit on every rank.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "../oktopk_reference.hpp"

namespace {
std::uint64_t val(int src, int dst, std::size_t j) { return std::uint64_t(src) * 1000000 + std::uint64_t(dst) * 1000 + j; }
std::size_t cnt(int src, int dst) { return static_cast<std::size_t>((src * 7 + dst * 3) % 5); }  // some blocks empty
}  // namespace

TEST_CASE("mpi transport: all_to_all, all_to_allv and all_gatherv deliver every block in rank order") {
  gflow::mpi::transport world;
  const int P = world.size(), me = world.rank();
  std::vector<std::uint64_t> s(static_cast<std::size_t>(P) * 2), r(s.size());
  for (int q = 0; q < P; ++q)
    for (std::size_t j = 0; j < 2; ++j) s[static_cast<std::size_t>(q) * 2 + j] = val(me, q, j);
  world.all_to_all(s.data(), r.data(), 2);
  for (int q = 0; q < P; ++q)
    for (std::size_t j = 0; j < 2; ++j) CHECK(r[static_cast<std::size_t>(q) * 2 + j] == val(q, me, j));

  std::vector<std::size_t> sc(static_cast<std::size_t>(P)), rc(sc.size());
  std::vector<std::uint64_t> sv, want;
  for (int q = 0; q < P; ++q) {
    sc[static_cast<std::size_t>(q)] = cnt(me, q);
    rc[static_cast<std::size_t>(q)] = cnt(q, me);
    for (std::size_t j = 0; j < cnt(me, q); ++j) sv.push_back(val(me, q, j));
    for (std::size_t j = 0; j < cnt(q, me); ++j) want.push_back(val(q, me, j));
  }
  std::vector<std::uint64_t> rv(want.size() + 1, 0);
  world.all_to_allv(sv.data(), sc.data(), rv.data(), rc.data());
  rv.resize(want.size());
  CHECK(rv == want);

  std::vector<std::size_t> gc(static_cast<std::size_t>(P));
  std::vector<std::uint64_t> mine, all;
  for (int q = 0; q < P; ++q) {
    gc[static_cast<std::size_t>(q)] = cnt(q, q) + 1;
    for (std::size_t j = 0; j < cnt(q, q) + 1; ++j) all.push_back(val(q, q, j));
  }
  for (std::size_t j = 0; j < cnt(me, me) + 1; ++j) mine.push_back(val(me, me, j));
  std::vector<std::uint64_t> got(all.size());
  world.all_gatherv(mine.data(), mine.size(), got.data(), gc.data());
  CHECK(got == all);
}

TEST_CASE("mpi exchanger: OkTopK equals the reference bit for bit on every rank (fp32 and fp16, fused or not)") {
  gflow::mpi::transport world;
  const int P = world.size(), me = world.rank();
  auto l = gflow::Layout::from_sizes({700, 33, 1200, 5});
  const std::size_t total = l.total_numel();
  gflow::detail::oktopk_params prm;
  prm.threshold_period = 4;
  prm.boundary_period = 3;
  prm.local_adapt = 1.1;
  auto gfn = [](int r, std::size_t i, int it) { return gflow_test::grad(0, r, i, it) * (1.0f + static_cast<float>(i % 5)); };
  auto check = [&](auto& ex, auto ref, std::size_t threshold) {
    (void)threshold;
    ex.sparsifier().set_density(0.03);
    ex.sparsifier().set_params(prm);
    for (int it = 0; it < 10; ++it) {
      std::vector<std::vector<float>> g(static_cast<std::size_t>(P), std::vector<float>(total));
      for (int q = 0; q < P; ++q)
        for (std::size_t i = 0; i < total; ++i) g[static_cast<std::size_t>(q)][i] = gfn(q, i, it);
      ref.step(g, 0.03, static_cast<std::uint64_t>(it));
      std::copy(g[static_cast<std::size_t>(me)].begin(), g[static_cast<std::size_t>(me)].end(), ex.pool_data());
      for (std::size_t b = l.size(); b-- > 0;) ex.ready(b);
      (void)ex.finish();
      CAPTURE(it);
      CHECK(std::vector<float>(ex.pool_data(), ex.pool_data() + total) == ref.result);
      auto res = ex.sparsifier().residual();
      CHECK(gflow_test::same_bits(std::vector<float>(res.begin(), res.end()), ref.res[static_cast<std::size_t>(me)]));
      auto xs = ex.sparsifier().exchanged();
      CHECK(std::vector<std::uint64_t>(xs.begin(), xs.end()) == ref.exchanged);
    }
  };
  {
    gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.03>>>::on<gflow::mpi::transport> ex(world, l);
    check(ex, gflow_test::oktopk_reference<float>(P, true, prm, gflow_test::units_of(l, 0, 4), total), 0);
  }
  {
    gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.03>>, gflow::Precision<gflow::half>>::on<gflow::mpi::transport> ex(world, l);
    ex.set_fusion(2048);
    check(ex, gflow_test::oktopk_reference<gflow::half>(P, true, prm, gflow_test::units_of(l, 2048, 2), total), 2048);
  }
}
