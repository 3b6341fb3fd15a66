#pragma once
// Sparsifier<S>: what part of the pool is exchanged, and what is kept back as residual.
//
// A scheme S provides an engine, built once per exchanger over its exchange context
// (engines/context.hpp); the contract is the concept gflow::sparsifier_engine
// (engines/concepts.hpp), asserted after each engine:
//
//   template <class Ctx> class engine {
//     explicit engine(Ctx& cx);       // after planning; may allocate here
//     void replan();                  // the buckets changed (Exchanger::set_fusion)
//     void exchange(std::size_t b);   // bucket b's gradients are final: exchange them in place
//     void end_iteration();           // after the last bucket (selection for the next iteration)
//     std::size_t wire_bytes() const; // bytes this rank handed to collectives this iteration
//     // checkpoints (Exchanger::save_state / load_state, between iterations):
//     void save_state(gflow::checkpoint_writer&) const;
//     saved_state read_state(gflow::checkpoint_reader&) const;  // reads and validates, changes nothing
//     void restore_state(saved_state&&);                         // applies it
//   };
//
// exchange() runs in pool order, once per bucket per iteration, on every rank in the same order,
// on the caller's thread or on the Overlap policy's issuing thread. An engine that can split a
// bucket's exchange into phases (needed by Overlap<Chained>) also has
//     static constexpr bool phased = true;  request start(b);  void complete(b, request&);
// Sparsifier<None> (the default: the dense exchange) allreduces every bucket (engines/dense.hpp). The sparse schemes' tags are in
// csc.hpp (CSC), topk.hpp (TopK, GTopK) and oktopk.hpp (OkTopK), which include this header, their
// engines in engines/csc.hpp, engines/topk/ and engines/oktopk/; exchanger/policy_set.hpp includes all four.
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "../detail/engines/archetype.hpp"
#include "../detail/engines/concepts.hpp"
#include "../detail/engines/dense.hpp"
#include "../detail/engines/sharded.hpp"
#include "family.hpp"

namespace gflow {

namespace detail {
/// The scheme behind Sparsifier<None>: every bucket allreduced whole.
struct dense_scheme {
  template <class Ctx>
  using engine = dense_engine<Ctx>;
  template <class Ctx>
  using sharded_engine = sharded_dense_engine<Ctx>;  // Sharding<ReduceScatter>: each bucket reduce-scattered
};
}  // namespace detail

/// A sparsification scheme: a class whose member template engine<Ctx> is the engine over an
/// exchange context (CSC<chunk, percent>, TopK<d>, GTopK<d>, OkTopK<d>, or one's own; the engine's
/// contract is gflow::sparsifier_engine, <gflow/extension.hpp>).
template <class S>
concept sparsifier_scheme = requires { typename S::template engine<detail::archetype_context<>>; };

// The family wrappers (Sparsifier, Topology, Overlap) share this shape on purpose (duplicates lists
// them as a pair): each is its own class template because its type name is what
// composition_name<Set>() prints into checkpoints and the consistency check (support/fingerprint.hpp),
// so one generic wrapper would change every saved checkpoint's fingerprint.
template <class S = None>
struct Sparsifier {
  static_assert(std::same_as<S, None> || sparsifier_scheme<S>,
                "gflow::Sparsifier<S>: S is not a sparsification scheme. "
                "Use gflow::None (dense), gflow::CSC<chunk_elems, percent>, gflow::TopK<density>, gflow::GTopK<density> or gflow::OkTopK<density>.");
  using gflow_family = sparsifier_family;
  // The dense scheme for None, and for a wrong S (keeping Sparsifier<not-a-scheme> down to the one
  // static_assert above).
  using scheme = std::conditional_t<sparsifier_scheme<S>, S, detail::dense_scheme>;
  static constexpr bool dense = std::same_as<S, None>;
};

namespace detail {
/// Whether a scheme's exchange goes through the Topology (every scheme's does, unless it says
/// `static constexpr bool uses_topology = false;`, as TopK and GTopK do).
template <class S>
constexpr bool scheme_uses_topology() {
  if constexpr (requires { S::uses_topology; }) return S::uses_topology;
  else return true;
}
}  // namespace detail

/// A scheme that can run under Sharding<ReduceScatter>: it names a sharded_engine<Ctx> beside its
/// engine<Ctx>, whose exchange leaves this rank's shard of each bucket holding the average (the
/// dense scheme, and OkTopK, whose split-and-reduce is a sparse reduce-scatter; one's own scheme
/// shards by naming one too).
template <class S>
concept shardable_scheme = requires { typename S::template sharded_engine<detail::archetype_context<>>; };

namespace detail {
/// The engine the exchanger runs: the scheme's sharded_engine under Sharding<ReduceScatter>, its
/// engine otherwise (and for a scheme that cannot shard, which exchanger/policy_set.hpp refuses
/// first with the reason).
template <class S, class Ctx, bool Sharded>
struct engine_of {
  using type = typename S::template engine<Ctx>;
};
template <class S, class Ctx>
  requires shardable_scheme<S>
struct engine_of<S, Ctx, true> {
  using type = typename S::template sharded_engine<Ctx>;
};
}  // namespace detail

template <class P>
concept sparsifier_policy = std::same_as<typename P::gflow_family, sparsifier_family> && requires { typename P::scheme; };

static_assert(sparsifier_policy<Sparsifier<>>);

}  // namespace gflow
