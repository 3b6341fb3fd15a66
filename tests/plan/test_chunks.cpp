// CSC chunk planning (gflow/detail/plan/chunks.hpp): chunk geometry, chunk ranges per bucket, the warm-up schedule.
#include <doctest/doctest.h>

#include <gflow/detail/plan/chunks.hpp>
#include <gflow/detail/plan/buckets.hpp>
#include <gflow/detail/plan/pool.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace gflow;

// ---- planning --------------------------------------------------------------------------------

TEST_CASE("CSC chunk geometry: last chunk partial, chunk larger than the pool, complete chunks per bucket end") {
  gflow::detail::plan::chunk_geometry g(100, 32);
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

  gflow::detail::plan::chunk_geometry big(10, 1000);
  CHECK(big.count() == 1);
  CHECK(big.size(0) == 10);
  CHECK(big.complete_before(9) == 0);
  CHECK(big.complete_before(10) == 1);

  gflow::detail::plan::chunk_geometry exact(96, 32);
  CHECK(exact.count() == 3);
  CHECK(exact.size(2) == 32);

  try {
    gflow::detail::plan::chunk_geometry bad(100, 0);
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "chunk_elems");
    CHECK(std::string(e.what()).find("must be positive") != std::string::npos);
  }
}

TEST_CASE("CSC chunk ranges: each chunk goes with the bucket whose end first covers it") {
  // pool order sizes 11, 7, 5, 3 (26 elements); chunks of 8: [0,8) [8,16) [16,24) [24,26)
  auto l = Layout::from_sizes({3, 5, 7, 11});
  auto p = gflow::detail::plan::plan_pool(l);
  auto b = gflow::detail::plan::plan_buckets(l, p, {4, 0, 0});  // one bucket per tensor: ends 11, 18, 23, 26
  gflow::detail::plan::chunk_geometry g(p.total, 8);
  auto r = gflow::detail::plan::plan_chunk_ranges(g, b);
  REQUIRE(r.size() == 4);
  CHECK(r[0] == gflow::detail::plan::chunk_range{0, 1});  // end 11 completes chunk 0
  CHECK(r[1] == gflow::detail::plan::chunk_range{1, 2});  // end 18 completes chunk 1
  CHECK(r[2] == gflow::detail::plan::chunk_range{2, 2});  // end 23: chunk 2 ends at 24, not yet
  CHECK(r[3] == gflow::detail::plan::chunk_range{2, 4});  // end 26: chunk 2 and the partial chunk 3
  // A chunk larger than the pool completes with the last bucket.
  auto r2 = gflow::detail::plan::plan_chunk_ranges(gflow::detail::plan::chunk_geometry(p.total, 1000), b);
  CHECK(r2.back() == gflow::detail::plan::chunk_range{0, 1});
  CHECK(r2[0] == gflow::detail::plan::chunk_range{0, 0});
  // Buckets that do not cover the pool are rejected.
  std::vector<gflow::detail::plan::bucket> part(b.begin(), b.end() - 1);
  CHECK_THROWS_AS(gflow::detail::plan::plan_chunk_ranges(g, part), gflow::invalid_argument);
}

TEST_CASE("CSC schedule: dense warm-up, linear ramp, then percent (boundaries)") {
  SUBCASE("warm-up 3, no ramp") {
    gflow::detail::plan::csc_schedule s{3, 0, 15};
    CHECK(s.selected(0, 100) == 100);
    CHECK(s.selected(2, 100) == 100);
    CHECK(s.selected(3, 100) == 15);
    CHECK(s.selected(1000000, 100) == 15);
    CHECK(s.selected(3, 101) == 16);  // ceil(15.15)
    CHECK(s.selected(3, 1) == 1);     // at least one chunk
  }
  SUBCASE("warm-up 0: iteration 0 is still dense (no norms yet)") {
    gflow::detail::plan::csc_schedule s{0, 0, 10};
    CHECK(s.selected(0, 50) == 50);
    CHECK(s.selected(1, 50) == 5);
  }
  SUBCASE("ramp 3 from 100% to 15%: 78.75%, 57.5%, 36.25%, then 15%") {
    gflow::detail::plan::csc_schedule s{2, 3, 15};
    CHECK(s.selected(1, 100) == 100);
    CHECK(s.selected(2, 100) == 79);
    CHECK(s.selected(3, 100) == 58);
    CHECK(s.selected(4, 100) == 37);
    CHECK(s.selected(5, 100) == 15);
    CHECK(s.selected(6, 100) == 15);
    // monotone over a long ramp
    gflow::detail::plan::csc_schedule t{1, 997, 3};
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
    gflow::detail::plan::csc_schedule s{0, 7, 100};
    for (std::uint64_t i = 0; i < 20; ++i) CHECK(s.selected(i, 37) == 37);
  }
}
