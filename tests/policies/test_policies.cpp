#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mock.hpp>

#include <type_traits>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::on_mock;

TEST_CASE("missing families take their defaults") {
  using S = Exchanger<>::policies;
  static_assert(std::is_same_v<S::precision, Precision<float>>);
  static_assert(std::is_same_v<S::fusion, detail::no_fusion>);
  static_assert(std::is_same_v<S::sparsifier, Sparsifier<None>>);
  static_assert(std::is_same_v<S::topology, Topology<Ring>>);
  static_assert(std::is_same_v<S::overlap, Overlap<None>>);
  CHECK(true);
}

TEST_CASE("policies may be given in any order") {
  using A = Exchanger<Precision<half>, Fusion<1024>, Topology<Ring>>::policies;
  using B = Exchanger<Topology<Ring>, Fusion<1024>, Precision<half>>::policies;
  static_assert(std::is_same_v<A::precision, B::precision>);
  static_assert(std::is_same_v<A::fusion, B::fusion>);
  static_assert(std::is_same_v<A::fusion, Fusion<1024>>);
  static_assert(A::fusion::threshold_bytes == 1024);
  static_assert(std::is_same_v<Exchanger<Fusion<1>>::on<mock::transport>::wire_type, float>);
  static_assert(std::is_same_v<Exchanger<Precision<bfloat16>>::on<mock::transport>::wire_type, bfloat16>);
  CHECK(true);
}

TEST_CASE("every family's concept accepts its policies and rejects the others") {
  static_assert(precision_policy<Precision<half>>);
  static_assert(!precision_policy<Fusion<8>>);
  static_assert(fusion_policy<Fusion<8, 4>>);
  static_assert(!fusion_policy<Topology<>>);
  static_assert(topology_policy<Topology<Ring>>);
  static_assert(sparsifier_policy<Sparsifier<None>>);
  static_assert(overlap_policy<Overlap<None>>);
  static_assert(!policy<int>);
  CHECK(true);
}

// Issue 12: the engine contracts (include/gflow/detail/engines/concepts.hpp) accept the built-in engines and
// backends and reject what lacks a member.
namespace concept_cases {
using ctx = gflow::detail::archetype_context<>;
struct engine_without_end_iteration {
  explicit engine_without_end_iteration(ctx&) {}
  void replan() {}
  void exchange(std::size_t) {}
  [[nodiscard]] std::size_t wire_bytes() const { return 0; }
  struct saved_state {};
  void save_state(gflow::detail::checkpoint_writer&) const {}
  [[nodiscard]] saved_state read_state(gflow::detail::checkpoint_reader&) const { return {}; }
  void restore_state(saved_state&&) {}
};
struct engine_without_checkpoint {
  explicit engine_without_checkpoint(ctx&) {}
  void replan() {}
  void exchange(std::size_t) {}
  void end_iteration() {}
  [[nodiscard]] std::size_t wire_bytes() const { return 0; }
};
struct topology_without_wait {
  using request = int;
  explicit topology_without_wait(gflow::transport_archetype<>&) {}
  template <class W> void run(W*, std::size_t) {}
  template <class W> request start(W*, std::size_t) { return 0; }
};
}  // namespace concept_cases

TEST_CASE("engine concepts: the built-ins meet them, an incomplete engine does not") {
  using namespace gflow;
  using concept_cases::ctx;
  static_assert(detail::sparsifier_engine<detail::dense_scheme::engine<ctx>, ctx>);
  static_assert(detail::sparsifier_engine<CSC<64, 10>::engine<ctx>, ctx> && detail::counts_collectives<CSC<64, 10>::engine<ctx>>);
  static_assert(detail::sparsifier_engine<GTopK<0.1>::engine<ctx>, ctx> && detail::counts_collectives<GTopK<0.1>::engine<ctx>>);
  static_assert(!detail::counts_collectives<detail::dense_scheme::engine<ctx>>);
  static_assert(!detail::sparsifier_engine<concept_cases::engine_without_end_iteration, ctx>);
  static_assert(!detail::sparsifier_engine<concept_cases::engine_without_checkpoint, ctx>);
  static_assert(detail::topology_engine<Ring::engine<transport_archetype<>>, transport_archetype<>, half>);
  static_assert(!detail::topology_engine<concept_cases::topology_without_wait, transport_archetype<>, half>);
  static_assert(detail::backend<detail::host_backend> && detail::topk_backend<detail::host_backend>);
  static_assert(!detail::backend<int> && !detail::backend<None>);
  static_assert(detail::backend_for_transport<detail::host_backend, mock::transport>);
  CHECK(true);
}

TEST_CASE("CSC policy tag: concept, defaults, composition") {
  static_assert(sparsifier_policy<Sparsifier<CSC<>>>);
  static_assert(CSC<>::chunk_elems == 32768 && CSC<>::percent == 15);
  static_assert(std::is_same_v<Exchanger<Sparsifier<CSC<32768, 15>>, Fusion<1024>>::policies::sparsifier::scheme, CSC<32768, 15>>);
  auto l = Layout::from_sizes({100000});
  mock::transport m(2);
  on_mock<Exchanger<Sparsifier<CSC<>>>> ex(m, l);
  CHECK(ex.sparsifier().chunk_count() == 4);  // 100000 / 32768, ceil
  CHECK(ex.sparsifier().geometry().size(3) == 100000 - 3 * 32768);
  CHECK(ex.sparsifier().upcoming_chunks().size() == 4);
  CHECK(ex.sparsifier().selected_chunks().empty());
}
