#pragma once
// Topology<Algo>: how a dense allreduce travels. Every dense allreduce the exchanger issues
// goes through the topology's engine, built once per exchanger over its transport:
//
//   typename Algo::template engine<T> e(transport);
//   e.run(buf, n);              // sum buf over all ranks, in place, complete on return
//   auto r = e.start(buf, n);   // or begin it (non-blocking form) ...
//   e.wait(r);                  // ... and complete it later
//
// Ring: the transport's own allreduce (MPI_Allreduce / ncclAllReduce / in-process).
//
// Hierarchical<g> (Jia et al. section 4.3, "three-phase all-reduce"): the ranks form groups of
//   g consecutive ranks (plan/groups.hpp; when g does not divide P the LAST group is smaller),
//   and a sum runs in three phases:
//     1. reduce inside each group to its master (its lowest rank),
//     2. allreduce among the masters,
//     3. broadcast inside each group from its master.
//   The two sub-groups come from transport.split(color, key), called by every rank, twice, once,
//   in the engine's constructor (the exchanger builds its engine in its own constructor, so
//   constructing the exchanger is a collective). A phase whose group has one rank is an identity
//   and is skipped (g = 1: only the masters' allreduce, which then spans every rank; g = P: no
//   masters' allreduce). Group size 0 is a static_assert; a group size above P raises
//   gflow::invalid_argument("group_size") on every rank when the engine is built (P is only
//   known then), before any split, so no rank waits for another.
//   Results: the same sum as Ring's, added in a different order: bitwise equal for
//   integer-valued inputs, within rounding otherwise; bitwise identical on every rank (the
//   broadcast copies the master's bits).
//   start/wait: on a stream-ordered transport (device memory with ireduce: NCCL, whose split
//   sub-groups share the parent's CUDA stream) start enqueues the three phases with the
//   non-blocking forms and returns the last phase's request; the stream orders the phases, so
//   the host never waits in start. On host transports (MPI, in-process, mock) each phase needs
//   the previous one's result on the host, so start runs the three phases blocking and returns
//   an already completed request (wait is then a no-op): honest, not overlapped.
//
// Hybrid<threshold, g> (Jia et al. section 4.3, "hybrid all-reduce"): per message, by its size
//   on the wire (n * sizeof(wire element)):
//     size <  threshold  ->  Hierarchical<g>   (small messages: latency-bound, where the paper
//                                               finds the three-phase algorithm faster)
//     size >= threshold  ->  Ring              (large messages: bandwidth-bound, where the paper
//                                               finds ring all-reduce still faster)
//   This is the paper's direction ("hierarchical all-reduce can bring performance gain for
//   convolution layers which usually have a smaller number of weights ... for fully-connected
//   layers ... ring-based all-reduce still outperforms"). Threshold 0 is a static_assert (it
//   would make every message ring: use Topology<Ring>); the run-time override
//   engine::set_threshold(bytes) rejects 0 with gflow::invalid_argument("threshold_bytes").
//   Every rank must use the same threshold, or ranks pick different algorithms for the same
//   message; change it between iterations only.
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "../detail/engines/topology.hpp"
#include "../transport/archetype.hpp"
#include "../transport/transport.hpp"
#include "family.hpp"

namespace gflow {

/// The transport's own allreduce.
struct Ring {
  template <transport T>
  using engine = detail::ring_engine<T>;
};

/// Three-phase allreduce over groups of GroupSize consecutive ranks (see the header comment).
template <int GroupSize>
struct Hierarchical {
  static_assert(GroupSize > 0,
                "gflow::Hierarchical<0>: the group size must be positive. Pass the number of ranks per group "
                "(e.g. the GPUs per node), between 1 and the number of ranks.");
  static constexpr int group_size = GroupSize;

  template <transport T>
  class engine : public detail::hierarchical_engine<T> {
   public:
    /// Collective over t. Raises gflow::invalid_argument("group_size") when GroupSize > t.size().
    explicit engine(T& t) : detail::hierarchical_engine<T>(t, GroupSize) {}
    /// The same with a group size known only at run time (e.g. the launcher's ranks per node).
    engine(T& t, int group_size) : detail::hierarchical_engine<T>(t, group_size) {}
  };
};

/// Per message: Hierarchical<GroupSize> below ThresholdBytes on the wire, Ring at or above it.
template <std::size_t ThresholdBytes, int GroupSize>
struct Hybrid {
  static_assert(ThresholdBytes > 0,
                "gflow::Hybrid<0, g>: the threshold must be positive. Messages below it go hierarchical, messages at or "
                "above it go ring; pass the message size in bytes where ring starts to win (e.g. 1 << 20), "
                "or use Topology<Ring> alone.");
  static_assert(GroupSize > 0,
                "gflow::Hybrid<threshold, 0>: the group size must be positive. Pass the number of ranks per group "
                "(e.g. the GPUs per node), between 1 and the number of ranks.");
  static constexpr std::size_t threshold_bytes = ThresholdBytes;
  static constexpr int group_size = GroupSize;

  template <transport T>
  class engine : public detail::hybrid_engine<T> {
   public:
    /// Collective over t. Raises gflow::invalid_argument("group_size") when GroupSize > t.size().
    explicit engine(T& t) : detail::hybrid_engine<T>(t, ThresholdBytes, GroupSize) {}
    /// Run-time threshold and group size (0 threshold or a bad group size: invalid_argument).
    engine(T& t, std::size_t threshold_bytes, int group_size) : detail::hybrid_engine<T>(t, threshold_bytes, group_size) {}
  };
};

/// A topology algorithm: a class whose member template engine<Transport> is the engine over a
/// transport (Ring, Hierarchical<g>, Hybrid<bytes, g>, or one's own; the engine's contract is
/// gflow::topology_engine, <gflow/extension.hpp>).
template <class A>
concept topology_algorithm = requires { typename A::template engine<transport_archetype<>>; };

// Shaped like Sparsifier<S> on purpose (see the note there).
template <class Algo = Ring>
struct Topology {
  static_assert(topology_algorithm<Algo>,
                "gflow::Topology<A>: A is not a topology algorithm. "
                "Use gflow::Ring, gflow::Hierarchical<group_size> or gflow::Hybrid<threshold_bytes, group_size>.");
  using gflow_family = topology_family;
  // Ring for a wrong A keeps Topology<not-an-algorithm> down to the one static_assert above.
  using algorithm = std::conditional_t<topology_algorithm<Algo>, Algo, Ring>;
};

template <class P>
concept topology_policy = std::same_as<typename P::gflow_family, topology_family> && requires { typename P::algorithm; };

static_assert(topology_policy<Topology<>>);
static_assert(topology_policy<Topology<Hierarchical<8>>>);
static_assert(topology_policy<Topology<Hybrid<(1 << 20), 8>>>);

// The tags bind engines that meet gflow::detail::topology_engine (engines/topology.hpp asserts them).
static_assert(detail::topology_engine<Hierarchical<2>::engine<transport_archetype<>>, transport_archetype<>, half> &&
                  detail::topology_engine<Hybrid<1024, 2>::engine<transport_archetype<>>, transport_archetype<>, half> &&
                  detail::checkpointed<Hybrid<1024, 2>::engine<transport_archetype<>>>,
              "Hierarchical<g>::engine and Hybrid<t, g>::engine must meet gflow::topology_engine (<gflow/extension.hpp>)");
// Which topologies write a TOPO section with state into checkpoints (Hybrid: its threshold).
static_assert(!detail::checkpointed<Ring::engine<transport_archetype<>>> && !detail::checkpointed<Hierarchical<2>::engine<transport_archetype<>>>,
              "Ring and Hierarchical keep no run-time state: their checkpoint section is empty");
// Which topologies have a switch Fusion<Auto> tunes (Hybrid: messages below it go hierarchical).
static_assert(detail::switched_topology<Hybrid<1024, 2>::engine<transport_archetype<>>> &&
                  !detail::switched_topology<Ring::engine<transport_archetype<>>> &&
                  !detail::switched_topology<Hierarchical<2>::engine<transport_archetype<>>>,
              "Fusion<Auto> tunes Hybrid's switch and only Hybrid's");

}  // namespace gflow
