#pragma once
// Sorts an Exchanger's template arguments into the five policy families, fills in defaults,
// and rejects what makes no sense with a sentence that says what to do instead.
// The compiler's "required from" line under each message names the offending type.
#include <type_traits>

#include "../../policies/family.hpp"
#include "../../policies/fusion.hpp"
#include "../../policies/overlap.hpp"
#include "../../policies/precision.hpp"
#include "../../policies/csc.hpp"
#include "../../policies/sparsifier.hpp"
#include "../../policies/oktopk.hpp"
#include "../../policies/topk.hpp"
#include "../../policies/topology.hpp"
#include "../../policies/sharding.hpp"

namespace gflow::detail {

template <class P>
struct family_of { using type = void; };
template <policy P>
struct family_of<P> { using type = typename P::gflow_family; };

template <class P>
struct check_is_policy {
  static_assert(policy<P>,
                "gflow::Exchanger: a template argument is not a gflow policy. Pass only "
                "gflow::Precision<...>, gflow::Fusion<...>, gflow::Sparsifier<...>, gflow::Topology<...>, "
                "gflow::Overlap<...> or gflow::Sharding<...> (the offending type is named in the 'required from' line).");
  static constexpr bool value = true;
};

template <class F, class... Ps>
inline constexpr int count_family = (0 + ... + int(std::is_same_v<typename family_of<Ps>::type, F>));

template <class F, class Default, class... Ps>
struct pick { using type = Default; };
template <class F, class Default, class P, class... Ps>
struct pick<F, Default, P, Ps...> {
  using type = std::conditional_t<std::is_same_v<typename family_of<P>::type, F>, P, typename pick<F, Default, Ps...>::type>;
};

template <class... Ps>
struct policy_set {
  static_assert((true && ... && check_is_policy<Ps>::value));
  static_assert(count_family<precision_family, Ps...> <= 1,
                "gflow::Exchanger: more than one Precision policy. Keep exactly one gflow::Precision<...>.");
  static_assert(count_family<fusion_family, Ps...> <= 1,
                "gflow::Exchanger: more than one Fusion policy. Keep exactly one gflow::Fusion<...>.");
  static_assert(count_family<sparsifier_family, Ps...> <= 1,
                "gflow::Exchanger: more than one Sparsifier policy. Keep exactly one gflow::Sparsifier<...>.");
  static_assert(count_family<topology_family, Ps...> <= 1,
                "gflow::Exchanger: more than one Topology policy. Keep exactly one gflow::Topology<...>.");
  static_assert(count_family<overlap_family, Ps...> <= 1,
                "gflow::Exchanger: more than one Overlap policy. Keep exactly one gflow::Overlap<...>.");

  static_assert(count_family<sharding_family, Ps...> <= 1,
                "gflow::Exchanger: more than one Sharding policy. Keep exactly one gflow::Sharding<...>.");

  using precision = typename pick<precision_family, Precision<>, Ps...>::type;
  using fusion = typename pick<fusion_family, no_fusion, Ps...>::type;
  using sparsifier = typename pick<sparsifier_family, Sparsifier<>, Ps...>::type;
  using topology = typename pick<topology_family, Topology<>, Ps...>::type;
  using overlap = typename pick<overlap_family, Overlap<>, Ps...>::type;
  using sharding = typename pick<sharding_family, Sharding<>, Ps...>::type;

  static_assert(precision_policy<precision>);
  static_assert(fusion_policy<fusion>);
  static_assert(sparsifier_policy<sparsifier>);
  static_assert(topology_policy<topology>);
  static_assert(overlap_policy<overlap>);
  static_assert(sharding_policy<sharding>);

  // Composition rules between families (docs/DESIGN.md, "Which compositions compile").
  static_assert(scheme_uses_topology<typename sparsifier::scheme>() || std::is_same_v<typename topology::algorithm, Ring>,
                "gflow::Exchanger: Sparsifier<TopK<d>> and Sparsifier<GTopK<d>> exchange with their own all_gather or merge "
                "tree and never use the Topology, so Topology<Hierarchical<g>> or Topology<Hybrid<t, g>> would only split "
                "the communicator for nothing. Leave Topology out (Ring) with them, or use Hierarchical or Hybrid with "
                "Sparsifier<None> or Sparsifier<CSC<...>>.");
  static_assert(!sharding::sharded || shardable_scheme<typename sparsifier::scheme>,
                "gflow::Exchanger: Sharding<ReduceScatter> needs Sparsifier<None> or Sparsifier<OkTopK<d>>. TopK and GTopK "
                "send every rank's selection to every rank, and CSC allreduces whole chunks, so none of them hands a rank "
                "only its own slice of the sum; OkTopK's split-and-reduce does (each region summed by its owner): use it, "
                "drop the Sparsifier, or drop Sharding to compress an allreduce.");
};

}  // namespace gflow::detail
