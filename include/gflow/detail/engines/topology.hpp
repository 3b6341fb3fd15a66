#pragma once
// The topology engines: how a dense allreduce travels over a transport. The tags that name them
// (Ring, Hierarchical<g>, Hybrid<threshold, g>) are in policies/topology.hpp, with what each
// algorithm does; the contract (a constructor from T&, run / start / wait) is the concept
// gflow::detail::topology_engine (engines/concepts.hpp), asserted below.
//
//   ring_engine<T>           the transport's own allreduce
//   hierarchical_engine<T>   the three phases over groups of a run-time size: reduce to the
//                            group's master, allreduce among masters, broadcast from the master
//   hybrid_engine<T>         per message, hierarchical below a run-time threshold (bytes on the
//                            wire), ring at or above it
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "../../dtype.hpp"
#include "../../error.hpp"
#include "../plan/groups.hpp"
#include "../../transport/archetype.hpp"
#include "../../transport/transport.hpp"
#include "concepts.hpp"

namespace gflow::detail {

/// The transport's own allreduce (Topology<Ring>).
template <transport T>
class ring_engine {
 public:
  using request = typename T::request;
  explicit ring_engine(T& t) : t_(&t) {}
  template <class W>
  void run(W* buf, std::size_t n) { t_->all_reduce(buf, n, reduce_op::sum); }
  template <class W>
  request start(W* buf, std::size_t n) { return t_->iall_reduce(buf, n, reduce_op::sum); }
  void wait(request& r) { t_->wait(r); }
  // Sharding<ReduceScatter>: the transport's own reduce-scatter of P packed blocks (send), block
  // rank() of the sum into recv. `ways` is the plan's for the bucket (always P here).
  /// The ranks a bucket of n elements of W is split among: all of them.
  template <class W>
  [[nodiscard]] int shard_ways(std::size_t) const { return t_->size(); }
  template <class W>
    requires sharding_transport<T>
  void reduce_scatter(const W* send, W* recv, const std::size_t* counts, int) { t_->reduce_scatter(send, recv, counts, reduce_op::sum); }
  template <class W>
    requires sharding_transport<T>
  request start_reduce_scatter(const W* send, W* recv, const std::size_t* counts, int) { return t_->ireduce_scatter(send, recv, counts, reduce_op::sum); }
  /// The all-gather of the blocks, in place.
  template <class W>
    requires sharding_transport<T>
  void all_gather_shards(W* buf, const std::size_t* counts, int) { t_->all_gatherv_in_place(buf, counts); }

 private:
  T* t_;
};

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

  // ---- Sharding<ReduceScatter>, two levels (ZeRO++'s hierarchical partitioning) --------------------
  // A bucket is split among the g ranks of a group: reduce-scatter inside the group, then the
  // allreduce of each block among its peers (the ranks of that local rank, one per group), so every
  // group holds the whole average, each rank its block. Every group must have g ranks (P a multiple
  // of g), or the groups' blocks would not line up.
  /// The ranks a bucket is split among: the group's g (every group must hold g ranks).
  template <class W>
  [[nodiscard]] int shard_ways(std::size_t) const {
    if (plan_.ranks % plan_.group_size != 0)
      throw invalid_argument("group_size", fmt::format("Sharding with Hierarchical<{}> needs every group to hold {} ranks; {} ranks make a last "
                                                       "group of {}.", plan_.group_size, plan_.group_size, plan_.ranks, plan_.size_of(plan_.groups - 1)),
                             "run a multiple of the group size of ranks, or pick a group size that divides the job's size.");
    return group_.size();
  }
  template <class W>
    requires sharding_transport<T>
  void reduce_scatter(const W* send, W* recv, const std::size_t* counts, int) {
    group_.reduce_scatter(send, recv, counts, reduce_op::sum);
    if (plan_.groups > 1) peers().all_reduce(recv, counts[group_.rank()], reduce_op::sum);
  }
  /// Host transports: runs both phases (blocking) and returns a completed request.
  template <class W>
    requires sharding_transport<T>
  request start_reduce_scatter(const W* send, W* recv, const std::size_t* counts, int ways) {
    reduce_scatter(send, recv, counts, ways);
    return {};
  }
  template <class W>
    requires sharding_transport<T>
  void all_gather_shards(W* buf, const std::size_t* counts, int) { group_.all_gatherv_in_place(buf, counts); }

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
    throw transport_error("split", fmt::format("Hierarchical: the {} sub-group of rank {} of "
                                       "{} has {} ranks with this rank at "
                                       "{}; the group plan expects {} ranks with it at "
                                       "{}.", which, world_->rank(), world_->size(), sub.size(), sub.rank(), size, rank),
                          "the transport's split(color, key) must put the ranks of one colour together, ordered by key "
                          "(a gflow::mock::transport needs a split rule: mock::log::split_rule).");
  }

  // The peers' communicator, split at the first sharded exchange (every rank reaches it at the same
  // collective): an unsharded exchanger never makes it.
  T& peers() {
    if (!peers_) peers_.emplace(split(*world_, plan_.peers_split(world_->rank())));
    return *peers_;
  }

  T* world_;
  plan::group_plan plan_;
  T group_;
  T masters_;
  bool master_;
  std::optional<T> peers_;
};

/// Per message: hierarchical below a threshold in bytes on the wire, ring at or above it (Topology<Hybrid>).
template <transport T>
class hybrid_engine {
  using hier_t = hierarchical_engine<T>;

 public:
  using request = typename hier_t::request;
  static constexpr bool nonblocking_start = hier_t::nonblocking_start;

  /// Collective over t (every rank, the same arguments). A threshold of 0 or a group size outside
  /// [1, t.size()] raises gflow::invalid_argument on every rank, before any split.
  hybrid_engine(T& t, std::size_t threshold_bytes, int group_size) : threshold_(checked(threshold_bytes)), ring_(t), hier_(t, group_size) {}

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

  // Sharding<ReduceScatter>: a bucket below the threshold is split among its group (the
  // hierarchical two levels), one at or above it among all ranks (the ring's reduce-scatter). The
  // split is the shard plan's (`ways`, fixed when the plan was cut), not the threshold's now, so a
  // threshold changed between iterations moves no bucket until the exchanger re-plans its shards.
  template <class W>
  [[nodiscard]] int shard_ways(std::size_t n) const {
    const int g = hier_.template shard_ways<W>(n);  // refuses a job that is not a multiple of g, whatever the threshold
    return hierarchical_for<W>(n) ? g : ring_.template shard_ways<W>(n);
  }
  template <class W>
    requires sharding_transport<T>
  void reduce_scatter(const W* send, W* recv, const std::size_t* counts, int ways) {
    if (ring_split(ways)) ring_.reduce_scatter(send, recv, counts, ways);
    else hier_.reduce_scatter(send, recv, counts, ways);
  }
  template <class W>
    requires sharding_transport<T>
  request start_reduce_scatter(const W* send, W* recv, const std::size_t* counts, int ways) {
    if (ring_split(ways)) return {ring_.start_reduce_scatter(send, recv, counts, ways), hier_t::issuer::world};
    return hier_.start_reduce_scatter(send, recv, counts, ways);
  }
  template <class W>
    requires sharding_transport<T>
  void all_gather_shards(W* buf, const std::size_t* counts, int ways) {
    if (ring_split(ways)) ring_.all_gather_shards(buf, counts, ways);
    else hier_.all_gather_shards(buf, counts, ways);
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
  [[nodiscard]] bool ring_split(int ways) const noexcept { return ways == hier_.groups().ranks; }
  static std::size_t checked(std::size_t bytes) {
    if (bytes == 0)
      throw invalid_argument("threshold_bytes", "the Hybrid threshold must be positive (got 0); messages below it go hierarchical, at or above it ring.",
                             "pass the message size in bytes where ring starts to win (e.g. 1 << 20); for ring only, use Topology<Ring>.");
    return bytes;
  }

  std::size_t threshold_;
  ring_engine<T> ring_;
  hier_t hier_;
};

// The engines meet gflow::detail::topology_engine (engines/concepts.hpp).
static_assert(topology_engine<ring_engine<transport_archetype<>>, transport_archetype<>, half> &&
                  topology_engine<ring_engine<transport_archetype<>>, transport_archetype<>, bfloat16> &&
                  !checkpointed<ring_engine<transport_archetype<>>>,
              "gflow::detail::ring_engine must meet gflow::detail::topology_engine (engines/concepts.hpp)");
// hierarchical_engine and hybrid_engine take their group size (and threshold) at run time; the
// tags' engines that fix them (Hierarchical<g>::engine, Hybrid<t, g>::engine) are asserted in
// policies/topology.hpp.

}  // namespace gflow::detail
