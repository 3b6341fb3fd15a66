#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

#include <type_traits>

using namespace gflow;

TEST_CASE("missing families take their defaults") {
  using S = Exchanger<>::policies;
  static_assert(std::is_same_v<S::precision, Precision<wire::fp32>>);
  static_assert(std::is_same_v<S::fusion, NoFusion>);
  static_assert(std::is_same_v<S::sparsifier, Sparsifier<Dense>>);
  static_assert(std::is_same_v<S::topology, Topology<Ring>>);
  static_assert(std::is_same_v<S::overlap, Overlap<None>>);
  CHECK(true);
}

TEST_CASE("policies may be given in any order") {
  using A = Exchanger<Precision<wire::fp16>, Fusion<1024>, Topology<Ring>>::policies;
  using B = Exchanger<Topology<Ring>, Fusion<1024>, Precision<wire::fp16>>::policies;
  static_assert(std::is_same_v<A::precision, B::precision>);
  static_assert(std::is_same_v<A::fusion, B::fusion>);
  static_assert(std::is_same_v<A::fusion, Fusion<1024>>);
  static_assert(A::fusion::threshold_bytes == 1024);
  static_assert(std::is_same_v<Exchanger<Fusion<1>>::on<mock::transport>::wire_type, float>);
  static_assert(std::is_same_v<Exchanger<Precision<wire::bf16>>::on<mock::transport>::wire_type, bfloat16>);
  CHECK(true);
}

TEST_CASE("every family's concept accepts its policies and rejects the others") {
  static_assert(precision_policy<Precision<wire::fp16>>);
  static_assert(!precision_policy<Fusion<8>>);
  static_assert(fusion_policy<Fusion<8, 4>>);
  static_assert(!fusion_policy<Topology<>>);
  static_assert(topology_policy<Topology<Ring>>);
  static_assert(sparsifier_policy<Sparsifier<Dense>>);
  static_assert(overlap_policy<Overlap<None>>);
  static_assert(!policy<int>);
  CHECK(true);
}
