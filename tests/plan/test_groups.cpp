// The group plan of Topology<Hierarchical<g>> and Topology<Hybrid<threshold, g>> (gflow/detail/plan/groups.hpp):
// groups that divide P or not, every rank in exactly one group, bad input.
#include <doctest/doctest.h>

#include <gflow/error.hpp>
#include <gflow/detail/plan/groups.hpp>

#include <set>
#include <string>
#include <vector>

using namespace gflow;

// ============================================================================================
// The group plan
// ============================================================================================

TEST_CASE("groups: a group size that divides P") {
  const auto p = gflow::detail::plan::plan_groups(8, 4);
  CHECK(p.groups == 2);
  CHECK(p.members(0) == std::vector<int>{0, 1, 2, 3});
  CHECK(p.members(1) == std::vector<int>{4, 5, 6, 7});
  CHECK(p.masters() == std::vector<int>{0, 4});
  CHECK(p.group_of(5) == 1);
  CHECK(p.local_rank(5) == 1);
  CHECK(p.is_master(4));
  CHECK_FALSE(p.is_master(3));
  CHECK(p.group_split(6) == gflow::detail::plan::split_args{1, 6});
  CHECK(p.masters_split(4) == gflow::detail::plan::split_args{2, 4});  // masters: colour G = 2
  CHECK(p.masters_split(5) == gflow::detail::plan::split_args{3, 5});  // the rest: colour G + 1
}

TEST_CASE("groups: a group size that does not divide P makes the last group smaller") {
  const auto p = gflow::detail::plan::plan_groups(10, 4);
  CHECK(p.groups == 3);
  CHECK(p.size_of(0) == 4);
  CHECK(p.size_of(1) == 4);
  CHECK(p.size_of(2) == 2);
  CHECK(p.members(2) == std::vector<int>{8, 9});
  CHECK(p.masters() == std::vector<int>{0, 4, 8});
  CHECK(p.group_of(9) == 2);
  CHECK(p.local_rank(9) == 1);

  const auto q = gflow::detail::plan::plan_groups(7, 3);  // 3 + 3 + 1: a last group of one rank
  CHECK(q.groups == 3);
  CHECK(q.members(2) == std::vector<int>{6});
  CHECK(q.is_master(6));

  const auto one = gflow::detail::plan::plan_groups(5, 5);
  CHECK(one.groups == 1);
  CHECK(one.masters() == std::vector<int>{0});
  const auto all = gflow::detail::plan::plan_groups(5, 1);
  CHECK(all.groups == 5);
  CHECK(all.masters() == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("groups: every rank in exactly one group, for P = 1..16 and every group size") {
  for (int P = 1; P <= 16; ++P)
    for (int g = 1; g <= P; ++g) {
      CAPTURE(P);
      CAPTURE(g);
      const auto p = gflow::detail::plan::plan_groups(P, g);
      CHECK(p.groups == (P + g - 1) / g);
      std::vector<int> seen;
      for (int k = 0; k < p.groups; ++k) {
        const auto m = p.members(k);
        CHECK(static_cast<int>(m.size()) == p.size_of(k));
        if (k + 1 < p.groups) CHECK(p.size_of(k) == g);
        else CHECK((p.size_of(k) >= 1 && p.size_of(k) <= g));
        CHECK(m.front() == p.master(k));
        for (std::size_t i = 0; i < m.size(); ++i) {
          CHECK(p.group_of(m[i]) == k);
          CHECK(p.local_rank(m[i]) == static_cast<int>(i));
          CHECK(p.is_master(m[i]) == (i == 0));
        }
        seen.insert(seen.end(), m.begin(), m.end());
      }
      std::vector<int> all(static_cast<std::size_t>(P));
      for (int r = 0; r < P; ++r) all[static_cast<std::size_t>(r)] = r;
      CHECK(seen == all);  // consecutive, disjoint, complete
      // The two splits' colours never overlap, and every rank takes part in both.
      std::set<int> group_colours, master_colours;
      for (int r = 0; r < P; ++r) {
        group_colours.insert(p.group_split(r).color);
        master_colours.insert(p.masters_split(r).color);
        CHECK(p.group_split(r).key == r);
        CHECK(p.masters_split(r).key == r);
      }
      CHECK(*group_colours.rbegin() < *master_colours.begin());
    }
}

TEST_CASE("groups: bad input names the parameter and the fix") {
  try {
    (void)gflow::detail::plan::plan_groups(4, 5);
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "group_size");
    CHECK(std::string(e.what()).find("group size 5 exceeds the 4 ranks") != std::string::npos);
    CHECK(std::string(e.what()).find("Fix: pass a group size between 1 and 4") != std::string::npos);
  }
  try {
    (void)gflow::detail::plan::plan_groups(4, 0);
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "group_size");
    CHECK(std::string(e.what()).find("must be positive (got 0)") != std::string::npos);
  }
  CHECK_THROWS_AS((void)gflow::detail::plan::plan_groups(4, -2), gflow::invalid_argument);
  CHECK_THROWS_AS((void)gflow::detail::plan::plan_groups(0, 1), gflow::invalid_argument);
  const auto p = gflow::detail::plan::plan_groups(6, 4);
  CHECK_THROWS_AS((void)p.group_of(6), gflow::invalid_argument);
  CHECK_THROWS_AS((void)p.local_rank(-1), gflow::invalid_argument);
  CHECK_THROWS_AS((void)p.size_of(2), gflow::invalid_argument);
}
