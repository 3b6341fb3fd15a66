#pragma once
// What the host tests run on, and the compositions they instantiate: one list, so that a
// composition is added here (and refused in tests/compile_fail), not in each file. A list of
// supported combinations, not their cartesian product (CONVENTIONS, Tests). Files that need a
// composition with numbers chosen for one case (e.g. CSC<4, 50> on a 16-element layout) keep their
// own spelling; these lists are for the "every X" loops.
#include <algorithm>
#include <tuple>
#include <type_traits>

#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

namespace gflow_test {

using mock_t = gflow::mock::transport;
using inproc_t = gflow::inproc::transport;
template <class E>
using on_mock = typename E::template on<mock_t>;
template <class E>
using on_inproc = typename E::template on<inproc_t>;

// Topology<Hierarchical<g>> / Topology<Hybrid<t, g>> on the mock: the split a real transport makes,
// written out from the rule in plan/groups.hpp (independently of group_plan, so the mock tests do
// not check the planner against itself): groups of g consecutive ranks, colour = group index; then
// masters (colour G) and the rest (colour G + 1), ordered by key = world rank.
inline gflow::mock::split_result world_split(int P, int g, const gflow::mock::split_query& q) {
  REQUIRE(q.group == "world");
  REQUIRE(q.key == q.rank);
  const int G = (P + g - 1) / g;
  if (q.color < G) {
    const int first = q.color * g;
    return {std::min(g, P - first), q.key - first};
  }
  if (q.color == G) return {G, q.key / g};
  return {P - G, q.key - q.key / g - 1};
}

/// A mock playing rank r of P whose splits follow world_split for group size g.
inline mock_t played_rank(int P, int r, int g) {
  mock_t m(P, r);
  m.calls().split_rule = [P, g](const gflow::mock::split_query& q) { return world_split(P, g, q); };
  return m;
}

// Families, one small instance each (sized for test layouts of a few thousand elements).
using wires = std::tuple<float, gflow::half, gflow::bfloat16>;
using schemes = std::tuple<gflow::None, gflow::CSC<16, 25>, gflow::TopK<0.1>, gflow::GTopK<0.1>>;
using strategies = std::tuple<gflow::None, gflow::Funneled, gflow::Concurrent<1>, gflow::Concurrent<2>, gflow::Concurrent<3>, gflow::Chained>;

/// The family name of a scheme of `schemes` ("Dense", "CSC", "TopK", "GTopK"): test labels and seeds.
template <class S>
constexpr const char* scheme_label() {
  if constexpr (std::is_same_v<S, gflow::None>) return "Dense";
  else if constexpr (requires { S::chunk_elems; }) return "CSC";
  else return S::global ? "GTopK" : "TopK";
}

// The supported compositions (docs/DESIGN.md, "Which compositions compile"): every scheme with and
// without Fusion, in each precision it meets in practice; every topology with the schemes that use
// it; every overlap with the schemes it can split. Refused ones are cases of tests/compile_fail.
using supported = std::tuple<
    gflow::Exchanger<>,
    gflow::Exchanger<gflow::Fusion<256>>,
    gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<256>>,
    gflow::Exchanger<gflow::Precision<gflow::bfloat16>, gflow::Fusion<256>>,
    gflow::Exchanger<gflow::Fusion<256>, gflow::Topology<gflow::Hierarchical<2>>>,
    gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<256>, gflow::Topology<gflow::Hybrid<1024, 2>>>,
    gflow::Exchanger<gflow::Fusion<256>, gflow::Overlap<gflow::Funneled>>,
    gflow::Exchanger<gflow::Fusion<256>, gflow::Overlap<gflow::Concurrent<2>>>,
    gflow::Exchanger<gflow::Fusion<256>, gflow::Overlap<gflow::Chained>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::CSC<16, 25>>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::CSC<16, 25>>, gflow::Fusion<256>, gflow::Overlap<gflow::Funneled>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::CSC<16, 25>>, gflow::Precision<gflow::half>, gflow::Topology<gflow::Hybrid<1024, 2>>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.1>>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::TopK<0.1>>, gflow::Fusion<256>, gflow::Precision<gflow::half>, gflow::Overlap<gflow::Funneled>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.1>>>,
    gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.1>>, gflow::Fusion<256>, gflow::Precision<gflow::bfloat16>, gflow::Overlap<gflow::Funneled>>>;

/// Calls f.template operator()<T>() for every T of a std::tuple type list.
template <class List, class F>
void for_each_type(F&& f) {
  [&]<class... T>(std::tuple<T...>*) { (f.template operator()<T>(), ...); }(static_cast<List*>(nullptr));
}

}  // namespace gflow_test
