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
// Hierarchical<g> (paper 001 section 4.3, "three-phase all-reduce"): the ranks form groups of
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
// Hybrid<threshold, g> (paper 001 section 4.3, "hybrid all-reduce"): per message, by its size
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
#include <type_traits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../plan/groups.hpp"
#include "../detail/concepts.hpp"
#include "../transport/archetype.hpp"
#include "../transport/transport.hpp"
#include "family.hpp"

namespace gflow {

struct Ring {
  template <transport T>
  class engine {
   public:
    using request = typename T::request;
    explicit engine(T& t) : t_(&t) {}
    template <class W>
    void run(W* buf, std::size_t n) { t_->all_reduce(buf, n, reduce_op::sum); }
    template <class W>
    request start(W* buf, std::size_t n) { return t_->iall_reduce(buf, n, reduce_op::sum); }
    void wait(request& r) { t_->wait(r); }
   private:
    T* t_;
  };
};

namespace detail {

/// A transport whose operations, on it and on the sub-groups it splits off, run in one stream
/// order (device memory, with a non-blocking reduce): dependent phases can be enqueued back to
/// back without a host wait.
template <class T>
concept stream_ordered_transport = transport<T> && std::same_as<typename T::memory_space, device_memory> &&
                                   requires(T& t, float* buf, std::size_t n) {
                                     { t.ireduce(buf, n, reduce_op::sum, 0) } -> std::same_as<typename T::request>;
                                   };

/// The three-phase allreduce over a run-time group size (Hierarchical<g> and Hybrid<t, g>).
template <transport T>
class hierarchical_engine {
 public:
  /// Which of the engine's transports issued a request.
  enum class issuer : std::uint8_t { none, world, group, masters };
  struct request {
    typename T::request inner{};
    issuer on = issuer::none;
  };
  /// True when start() enqueues the phases without waiting (see the header comment).
  static constexpr bool nonblocking_start = stream_ordered_transport<T>;

  /// Collective over t: every rank of t must construct it, with the same group size.
  hierarchical_engine(T& t, int group_size)
      : world_(&t), plan_(plan::plan_groups(t.size(), group_size)), group_(split(t, plan_.group_split(t.rank()))),
        masters_(split(t, plan_.masters_split(t.rank()))), master_(plan_.is_master(t.rank())) {
    verify();
  }

  /// Sums buf[0, n) over every rank of the transport, in place; complete on return.
  template <class W>
  void run(W* buf, std::size_t n) {
    if (group_.size() > 1) group_.reduce(buf, n, reduce_op::sum, 0);
    if (master_ && masters_.size() > 1) masters_.all_reduce(buf, n, reduce_op::sum);
    if (group_.size() > 1) group_.broadcast(buf, n, 0);
  }

  /// Stream-ordered transports: enqueues the three phases and returns the last one's request.
  /// Host transports: runs them (blocking) and returns a completed request.
  template <class W>
  request start(W* buf, std::size_t n) {
    request r;
    if constexpr (nonblocking_start) {
      // Earlier phases' requests are dropped: the stream completes them before the last one.
      if (group_.size() > 1) r = {group_.ireduce(buf, n, reduce_op::sum, 0), issuer::group};
      if (master_ && masters_.size() > 1) r = {masters_.iall_reduce(buf, n, reduce_op::sum), issuer::masters};
      if (group_.size() > 1) r = {group_.ibroadcast(buf, n, 0), issuer::group};
    } else {
      run(buf, n);
    }
    return r;
  }

  void wait(request& r) {
    switch (r.on) {
      case issuer::none: break;
      case issuer::world: world_->wait(r.inner); break;
      case issuer::group: group_.wait(r.inner); break;
      case issuer::masters: masters_.wait(r.inner); break;
    }
    r.on = issuer::none;
  }

  // ---- introspection -----------------------------------------------------------------------
  [[nodiscard]] const plan::group_plan& groups() const noexcept { return plan_; }
  /// This rank's group (rank 0 there is the master).
  [[nodiscard]] const T& group() const noexcept { return group_; }
  /// The masters' group on a master; on any other rank, the spare group of non-masters.
  [[nodiscard]] const T& masters() const noexcept { return masters_; }
  [[nodiscard]] bool is_master() const noexcept { return master_; }

 private:
  static T split(T& t, plan::split_args a) { return t.split(a.color, a.key); }

  // A transport whose split does not group by colour and order by key would make the phases
  // sum the wrong ranks: refuse it here rather than return a wrong gradient.
  void verify() const {
    const int r = world_->rank();
    const int k = plan_.group_of(r);
    check_sub("group", group_, plan_.size_of(k), plan_.local_rank(r));
    if (master_) check_sub("masters", masters_, plan_.groups, k);
  }
  void check_sub(const char* which, const T& sub, int size, int rank) const {
    if (sub.size() == size && sub.rank() == rank) return;
    throw transport_error("split", std::string("Hierarchical: the ") + which + " sub-group of rank " + std::to_string(world_->rank()) + " of " +
                                       std::to_string(world_->size()) + " has " + std::to_string(sub.size()) + " ranks with this rank at " +
                                       std::to_string(sub.rank()) + "; the group plan expects " + std::to_string(size) + " ranks with it at " +
                                       std::to_string(rank) + ".",
                          "the transport's split(color, key) must put the ranks of one colour together, ordered by key "
                          "(a gflow::mock::transport needs a split rule: mock::log::split_rule).");
  }

  T* world_;
  plan::group_plan plan_;
  T group_;
  T masters_;
  bool master_;
};

}  // namespace detail

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
  class engine {
    using hier_t = detail::hierarchical_engine<T>;

   public:
    using request = typename hier_t::request;
    static constexpr bool nonblocking_start = hier_t::nonblocking_start;

    /// Collective over t. Raises gflow::invalid_argument("group_size") when GroupSize > t.size().
    explicit engine(T& t) : engine(t, ThresholdBytes, GroupSize) {}
    /// Run-time threshold and group size (0 threshold or a bad group size: invalid_argument).
    engine(T& t, std::size_t threshold_bytes, int group_size) : threshold_(checked(threshold_bytes)), ring_(t), hier_(t, group_size) {}

    /// Run-time override of the threshold (an auto-tuner's knob). Every rank must pass the same
    /// value, between iterations.
    void set_threshold(std::size_t bytes) { threshold_ = checked(bytes); }
    [[nodiscard]] std::size_t threshold() const noexcept { return threshold_; }
    /// True when a message of n elements of W goes hierarchical (it is below the threshold).
    template <class W>
    [[nodiscard]] bool hierarchical_for(std::size_t n) const noexcept { return n * sizeof(W) < threshold_; }

    template <class W>
    void run(W* buf, std::size_t n) {
      if (hierarchical_for<W>(n)) hier_.run(buf, n);
      else ring_.run(buf, n);
    }
    template <class W>
    request start(W* buf, std::size_t n) {
      if (hierarchical_for<W>(n)) return hier_.start(buf, n);
      return {ring_.start(buf, n), hier_t::issuer::world};
    }
    void wait(request& r) {
      if (r.on == hier_t::issuer::world) {
        ring_.wait(r.inner);
        r.on = hier_t::issuer::none;
      } else {
        hier_.wait(r);
      }
    }

    [[nodiscard]] const hier_t& hierarchical() const noexcept { return hier_; }

    // Checkpoints (Exchanger::save_state / load_state): the run-time threshold. Ring and
    // Hierarchical keep no run-time state (the group size is the type's).
    template <class Writer>
    void save_state(Writer& w) const { w.u64(threshold_); }
    template <class Reader>
    [[nodiscard]] std::size_t read_state(Reader& r) const {
      const std::uint64_t t = r.u64("threshold_bytes");
      if (t == 0) r.fail("threshold_bytes", "the checkpoint's Hybrid threshold is 0 (it must be positive).");
      return static_cast<std::size_t>(t);
    }
    void restore_state(std::size_t t) noexcept { threshold_ = t; }

   private:
    static std::size_t checked(std::size_t bytes) {
      if (bytes == 0)
        throw invalid_argument("threshold_bytes", "the Hybrid threshold must be positive (got 0); messages below it go hierarchical, at or above it ring.",
                               "pass the message size in bytes where ring starts to win (e.g. 1 << 20); for ring only, use Topology<Ring>.");
      return bytes;
    }

    std::size_t threshold_;
    Ring::engine<T> ring_;
    hier_t hier_;
  };
};

/// A topology algorithm: a class whose member template engine<Transport> is the engine over a
/// transport (Ring, Hierarchical<g>, Hybrid<bytes, g>, or one's own; the engine's contract is
/// detail::topology_engine).
template <class A>
concept topology_algorithm = requires { typename A::template engine<transport_archetype<>>; };

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

// The topology engines meet gflow::detail::topology_engine (detail/concepts.hpp).
static_assert(detail::topology_engine<Ring::engine<transport_archetype<>>, transport_archetype<>, half> &&
                  detail::topology_engine<Ring::engine<transport_archetype<>>, transport_archetype<>, bfloat16> &&
                  !detail::checkpointed<Ring::engine<transport_archetype<>>>,
              "Ring::engine must meet gflow::detail::topology_engine (detail/concepts.hpp)");
static_assert(detail::topology_engine<Hierarchical<2>::engine<transport_archetype<>>, transport_archetype<>, half> &&
                  !detail::checkpointed<Hierarchical<2>::engine<transport_archetype<>>>,
              "Hierarchical<g>::engine must meet gflow::detail::topology_engine (detail/concepts.hpp)");
static_assert(detail::topology_engine<Hybrid<1024, 2>::engine<transport_archetype<>>, transport_archetype<>, half> &&
                  detail::checkpointed<Hybrid<1024, 2>::engine<transport_archetype<>>>,
              "Hybrid<t, g>::engine must meet gflow::detail::topology_engine and be checkpointed (detail/concepts.hpp)");

}  // namespace gflow
