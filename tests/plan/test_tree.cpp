// The gTop-k tree and Table I's cost formulas (gflow/detail/plan/tree.hpp).
#include <doctest/doctest.h>

#include <gflow/detail/plan/tree.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

using namespace gflow;

// ---- plan: the tree and Table I ----------------------------------------------------------------

TEST_CASE("gTop-k tree: ceil(log2 P) rounds; every list reaches rank 0 exactly once, for any P") {
  CHECK(gflow::detail::plan::gtopk_rounds(1) == 0);
  CHECK(gflow::detail::plan::gtopk_rounds(2) == 1);
  CHECK(gflow::detail::plan::gtopk_rounds(3) == 2);
  CHECK(gflow::detail::plan::gtopk_rounds(8) == 3);
  CHECK(gflow::detail::plan::gtopk_rounds(9) == 4);
  CHECK(gflow::detail::plan::gtopk_rounds(16) == 4);
  CHECK(gflow::detail::plan::gtopk_rounds(17) == 5);
  // P = 6 spelled out: round 0: 1->0 3->2 5->4; round 1: 2->0 (4 idle: 6 does not exist); round 2: 4->0.
  using R = gflow::detail::plan::tree_role;
  CHECK(gflow::detail::plan::gtopk_step(0, 6, 0).role == R::receive);
  CHECK(gflow::detail::plan::gtopk_step(0, 6, 0).peer == 1);
  CHECK(gflow::detail::plan::gtopk_step(3, 6, 0).role == R::send);
  CHECK(gflow::detail::plan::gtopk_step(3, 6, 0).peer == 2);
  CHECK(gflow::detail::plan::gtopk_step(4, 6, 1).role == R::idle);
  CHECK(gflow::detail::plan::gtopk_step(2, 6, 1).role == R::send);
  CHECK(gflow::detail::plan::gtopk_step(4, 6, 2).role == R::send);
  CHECK(gflow::detail::plan::gtopk_step(4, 6, 2).peer == 0);
  CHECK(gflow::detail::plan::gtopk_step(0, 6, 2).peer == 4);
  CHECK(gflow::detail::plan::gtopk_step(3, 6, 1).role == R::idle);

  for (int P = 1; P <= 70; ++P) {
    CAPTURE(P);
    std::vector<std::set<int>> holds(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) holds[r] = {r};
    std::vector<int> sent(static_cast<std::size_t>(P), 0);
    const int rounds = gflow::detail::plan::gtopk_rounds(P);
    for (int j = 0; j < rounds; ++j) {
      for (int r = 0; r < P; ++r) {
        const auto s = gflow::detail::plan::gtopk_step(r, P, j);
        if (s.role == R::send) {
          const auto back = gflow::detail::plan::gtopk_step(s.peer, P, j);
          REQUIRE(back.role == R::receive);
          REQUIRE(back.peer == r);
          CHECK(sent[r] == 0);  // a sender sends once, then is idle
          ++sent[r];
        }
        if (sent[r] && s.role != R::send) CHECK(s.role == R::idle);
      }
      for (int r = 0; r < P; ++r) {
        const auto s = gflow::detail::plan::gtopk_step(r, P, j);
        if (s.role == R::receive) {
          for (int x : holds[s.peer]) CHECK(holds[r].insert(x).second);  // never twice
          holds[s.peer].clear();
        }
      }
    }
    CHECK(holds[0].size() == static_cast<std::size_t>(P));
    CHECK(gflow::detail::plan::gtopk_schedule(0, P).size() == static_cast<std::size_t>(rounds));
  }
  CHECK_THROWS_AS(gflow::detail::plan::gtopk_rounds(0), gflow::invalid_argument);
  CHECK_THROWS_AS(gflow::detail::plan::gtopk_step(6, 6, 0), gflow::invalid_argument);
  CHECK_THROWS_AS(gflow::detail::plan::gtopk_step(0, 6, 3), gflow::invalid_argument);
}

TEST_CASE("Table I cost formulas") {
  const std::size_t m = 25'000'000, k = 25'000;
  auto d = gflow::detail::plan::table1_cost(gflow::detail::plan::aggregation::dense_allreduce, 8, m, k);
  CHECK(d.latency_terms == 14.0);
  CHECK(d.elements == doctest::Approx(2.0 * 7.0 / 8.0 * m));
  auto t = gflow::detail::plan::table1_cost(gflow::detail::plan::aggregation::topk_allreduce, 8, m, k);
  CHECK(t.latency_terms == 3.0);
  CHECK(t.elements == 2.0 * 7 * k);
  auto g = gflow::detail::plan::table1_cost(gflow::detail::plan::aggregation::gtopk_allreduce, 8, m, k);
  CHECK(g.latency_terms == 6.0);
  CHECK(g.elements == 4.0 * k * 3);
  CHECK(g.time(1e-5, 1e-9) == doctest::Approx(6e-5 + 12.0 * k * 1e-9));
  CHECK(gflow::detail::plan::table1_bytes(gflow::detail::plan::aggregation::dense_allreduce, 8, m, k, 4, 4) == 2 * 7 * m * 4 / 8);
  CHECK(gflow::detail::plan::table1_bytes(gflow::detail::plan::aggregation::topk_allreduce, 8, m, k, 4, 4) == 7 * k * 8);
  CHECK(gflow::detail::plan::table1_bytes(gflow::detail::plan::aggregation::gtopk_allreduce, 8, m, k, 4, 2) == 2 * 3 * k * 6);
  CHECK(gflow::detail::plan::table1_bytes(gflow::detail::plan::aggregation::gtopk_allreduce, 6, m, k, 8, 4) == 2 * 3 * k * 12);  // ceil(log2 6) = 3
}
