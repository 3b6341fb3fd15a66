// Top-k densities (gflow/detail/plan/density.hpp): k_for and the density schedules.
#include <doctest/doctest.h>

#include <gflow/detail/plan/density.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace gflow;

// ---- plan: densities ---------------------------------------------------------------------------

TEST_CASE("k_for: ceil(density * n), integer products exact, clamped to [1, n]") {
  CHECK(gflow::detail::plan::k_for(0.1, 30) == 3);  // 0.1 * 30 = 3.0000000000000004 in double
  CHECK(gflow::detail::plan::k_for(0.001, 25'557'032) == 25'558);
  CHECK(gflow::detail::plan::k_for(0.001, 1000) == 1);
  CHECK(gflow::detail::plan::k_for(0.001, 10) == 1);  // at least one
  CHECK(gflow::detail::plan::k_for(0.5, 7) == 4);
  CHECK(gflow::detail::plan::k_for(1.0, 7) == 7);
  CHECK(gflow::detail::plan::k_for(0.9999, 3) == 3);
  CHECK(gflow::detail::plan::k_for(0.25, 0) == 0);
  CHECK_THROWS_AS(gflow::detail::plan::k_for(0.0, 10), gflow::invalid_argument);
}

TEST_CASE("density schedules: warm-up by iteration range or epoch, paper 003's values, boundaries") {
  auto s = gflow::detail::plan::density_schedule::per_iteration({{100, 0.25}, {300, 0.01}}, 0.001);
  CHECK(s.at(0) == 0.25);
  CHECK(s.at(99) == 0.25);
  CHECK(s.at(100) == 0.01);
  CHECK(s.at(299) == 0.01);
  CHECK(s.at(300) == 0.001);
  CHECK(s.at(std::numeric_limits<std::uint64_t>::max()) == 0.001);
  CHECK(s.max() == 0.25);

  auto p = gflow::detail::plan::density_schedule::gtopk_warmup(10);
  const double want[] = {0.25, 0.0725, 0.015, 0.004, 0.001};
  for (int e = 0; e < 5; ++e) {
    CHECK(p.at(std::uint64_t(e) * 10) == want[e]);
    CHECK(p.at(std::uint64_t(e) * 10 + 9) == want[e]);
  }
  CHECK(p.at(1'000'000) == 0.001);
  CHECK(gflow::detail::plan::density_schedule::gtopk_warmup(10, 0.005).final_density() == 0.005);
  CHECK(gflow::detail::plan::density_schedule::constant(0.3).at(12345) == 0.3);
  CHECK(gflow::detail::plan::density_schedule::per_epoch({}, 0.5, 1).max() == 0.5);
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
  expect([] { (void)gflow::detail::plan::density_schedule::constant(0.0); }, "final_density");
  expect([] { (void)gflow::detail::plan::density_schedule::constant(1.5); }, "final_density");
  expect([] { (void)gflow::detail::plan::density_schedule::constant(std::nan("")); }, "final_density");
  expect([] { (void)gflow::detail::plan::density_schedule::constant(-0.1); }, "final_density");
  expect([] { (void)gflow::detail::plan::density_schedule::per_iteration({{10, 0.5}, {10, 0.1}}, 0.01); }, "steps[1].until");
  expect([] { (void)gflow::detail::plan::density_schedule::per_iteration({{0, 0.5}}, 0.01); }, "steps[0].until");
  expect([] { (void)gflow::detail::plan::density_schedule::per_iteration({{10, 2.0}}, 0.01); }, "steps[0].density");
  expect([] { (void)gflow::detail::plan::density_schedule::per_epoch({0.1}, 0.01, 0); }, "iterations_per_epoch");
  expect([] { gflow::detail::plan::check_density(0.0); }, "density");
}
