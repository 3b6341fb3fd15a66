// Sparsifier<OkTopK<d>> over MPI: the variable-size collectives (all_to_all, all_to_allv,
// all_gatherv) against values every rank can compute, and the exchanger against the
// straightforward reference (tests/oktopk_reference.hpp), bit for bit on every rank.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "../oktopk_reference.hpp"

namespace {
std::uint64_t val(int src, int dst, std::size_t j) { return std::uint64_t(src) * 1000000 + std::uint64_t(dst) * 1000 + j; }
std::size_t cnt(int src, int dst) { return static_cast<std::size_t>((src * 7 + dst * 3) % 5); }  // some blocks empty
}  // namespace

TEST_CASE("mpi transport: all_to_all, all_to_allv and all_gatherv deliver every block in rank order, with every variable window") {
  gflow::mpi::transport world;
  const int P = world.size(), me = world.rank();
  CHECK(world.variable_window() == gflow::mpi::default_variable_window);
  std::vector<std::uint64_t> s(static_cast<std::size_t>(P) * 2), r(s.size());
  for (int q = 0; q < P; ++q)
    for (std::size_t j = 0; j < 2; ++j) s[static_cast<std::size_t>(q) * 2 + j] = val(me, q, j);
  world.all_to_all(s.data(), r.data(), 2);
  for (int q = 0; q < P; ++q)
    for (std::size_t j = 0; j < 2; ++j) CHECK(r[static_cast<std::size_t>(q) * 2 + j] == val(q, me, j));

  // 0: the MPI library's collectives; 1: one peer at a time (Open MPI's pairwise order); 2: fewer
  // in flight than peers from 4 ranks; 8 and 1000: every peer at once at the ranks CI runs.
  for (const int window : {0, 1, 2, 8, 1000}) {
    CAPTURE(window);
    world.set_variable_window(window);
    for (int round = 0; round < 2; ++round) {  // back to back: the second call's messages never mix with the first's
      CAPTURE(round);
      std::vector<std::size_t> sc(static_cast<std::size_t>(P)), rc(sc.size());
      std::vector<std::uint64_t> sv, want;
      for (int q = 0; q < P; ++q) {
        sc[static_cast<std::size_t>(q)] = cnt(me + round, q);
        rc[static_cast<std::size_t>(q)] = cnt(q + round, me);
        for (std::size_t j = 0; j < cnt(me + round, q); ++j) sv.push_back(val(me, q, j + 10 * static_cast<std::size_t>(round)));
        for (std::size_t j = 0; j < cnt(q + round, me); ++j) want.push_back(val(q, me, j + 10 * static_cast<std::size_t>(round)));
      }
      std::vector<std::uint64_t> rv(want.size() + 1, 0);
      sv.resize(sv.size() + 1);  // a valid pointer where nothing goes out
      world.all_to_allv(sv.data(), sc.data(), rv.data(), rc.data());
      rv.resize(want.size());
      CHECK(rv == want);

      std::vector<std::size_t> gc(static_cast<std::size_t>(P));
      std::vector<std::uint64_t> mine, all;
      for (int q = 0; q < P; ++q) {
        // Uneven, zeros in the middle: blocks straddle the slices' edges, and a slice gathers parts
        // of several ranks' blocks in the balancing step.
        gc[static_cast<std::size_t>(q)] = static_cast<std::size_t>((3 * q + 5 * round + 1) % 7);
        for (std::size_t j = 0; j < gc[static_cast<std::size_t>(q)]; ++j) all.push_back(val(q, q, j));
      }
      for (std::size_t j = 0; j < gc[static_cast<std::size_t>(me)]; ++j) mine.push_back(val(me, me, j));
      mine.resize(mine.size() + 1);
      std::vector<std::uint64_t> got(all.size() + 1, 0);
      world.all_gatherv(mine.data(), gc[static_cast<std::size_t>(me)], got.data(), gc.data());
      got.resize(all.size());
      CHECK(got == all);
    }
    // Uneven extremes: one rank holds everything (its block crosses every slice), and fewer
    // elements than ranks (empty slices).
    for (const std::size_t heavy : {std::size_t{37}, std::size_t{1}}) {
      CAPTURE(heavy);
      std::vector<std::size_t> gc(static_cast<std::size_t>(P), 0);
      gc[static_cast<std::size_t>(P - 1)] = heavy;
      std::vector<std::uint64_t> all, mine;
      for (std::size_t j = 0; j < heavy; ++j) all.push_back(val(P - 1, P - 1, j));
      if (me == P - 1) mine = all;
      mine.resize(mine.size() + 1);
      std::vector<std::uint64_t> got(heavy, 0);
      world.all_gatherv(mine.data(), gc[static_cast<std::size_t>(me)], got.data(), gc.data());
      CHECK(got == all);
    }
  }
  // Sub-groups inherit the window; copies made before a change keep theirs.
  world.set_variable_window(3);
  const gflow::mpi::transport copy = world;
  world.set_variable_window(5);
  CHECK(copy.variable_window() == 3);
  auto half = world.split(me % 2, me);
  CHECK(half.variable_window() == 5);
  world.set_variable_window(gflow::mpi::default_variable_window);
}

TEST_CASE("mpi transport: a negative variable window, and counts that contradict the call, are typed errors naming the parameter") {
  gflow::mpi::transport world;
  const int me = world.rank(), P = world.size();
  CHECK_THROWS_AS(world.set_variable_window(-1), gflow::invalid_argument);
  try {
    world.set_variable_window(-1);
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "window");
  }
  CHECK(world.variable_window() == gflow::mpi::default_variable_window);
  // Raised on the calling rank before any message (every rank here calls it the same wrong way).
  std::vector<std::size_t> sc(static_cast<std::size_t>(P), 1), rc(sc.size(), 1);
  rc[static_cast<std::size_t>(me)] = 2;
  std::vector<std::uint64_t> sv(static_cast<std::size_t>(P) + 1), rv(static_cast<std::size_t>(P) + 2);
  CHECK_THROWS_AS(world.all_to_allv(sv.data(), sc.data(), rv.data(), rc.data()), gflow::mismatch_error);
  std::vector<std::size_t> gc(static_cast<std::size_t>(P), 1);
  CHECK_THROWS_AS(world.all_gatherv(sv.data(), 2, rv.data(), gc.data()), gflow::mismatch_error);
  world.barrier();  // the transport is still usable: nothing was sent
}

// Every rank here takes part in each schedule step before the failing receive (window 16 covers
// every peer up to 17 ranks); from 18 ranks the other ranks would wait for the failed rank's later
// sends until their timeout.
TEST_CASE("mpi transport: an all_to_allv whose counts contradict the peer's is a typed error on the receiving rank, which then refuses the communicator") {
  gflow::mpi::transport world;
  const int P = world.size(), me = world.rank();
  auto sub = world.split(0, me);  // broken below; world stays usable
  // Every rank sends 2 elements to each peer; rank 0 expects 3 from each (it gets 2).
  std::vector<std::size_t> sc(static_cast<std::size_t>(P), 2), rc(sc.size(), me == 0 ? 3 : 2);
  sc[static_cast<std::size_t>(me)] = rc[static_cast<std::size_t>(me)];
  std::vector<std::uint64_t> sv(static_cast<std::size_t>(P) * 3, 7), rv(static_cast<std::size_t>(P) * 3, 0);
  if (me == 0) {
    try {
      sub.all_to_allv(sv.data(), sc.data(), rv.data(), rc.data());
      FAIL("no error for a short message");
    } catch (const gflow::mismatch_error& e) {
      CHECK(e.subject() == "all_to_allv");
      CHECK(std::string(e.what()).find("expected 3 elements") != std::string::npos);
    }
    CHECK_THROWS_AS(sub.barrier(), gflow::transport_error);
  } else {
    sub.all_to_allv(sv.data(), sc.data(), rv.data(), rc.data());
  }
  world.barrier();
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
