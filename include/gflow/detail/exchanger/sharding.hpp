#pragma once
// What basic_exchanger (exchanger.hpp) does for Sharding<ReduceScatter> beyond its engine
// (engines/sharded.hpp): the options it refuses, the shard plan cut from the buckets and the
// topology's ways (and re-cut when those move), the inf / NaN count every rank must agree on, and
// the shard plan's history, which moves a trainer's per-shard state when the shards move
// (shard_history).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../../error.hpp"
#include "../../options.hpp"
#include "../../transport/transport.hpp"
#include "../engines/concepts.hpp"
#include "../plan/shards.hpp"
#include "consistency.hpp"

namespace gflow::detail {

/// The facade's compile-time checks of a sharded composition's transport (the policy-only rules
/// are in exchanger/policy_set.hpp).
template <class T, bool Sharded>
struct sharding_checks {
  static_assert(!Sharded || sharding_transport<T>,
                "gflow::Exchanger: Sharding<ReduceScatter> needs a transport with reduce_scatter, ireduce_scatter and "
                "all_gatherv_in_place (the concept gflow::sharding_transport, transport/transport.hpp): use "
                "gflow::mpi::transport or gflow::inproc::transport (host memory), gflow::nccl::transport, "
                "gflow::mpi_device::transport or gflow::inproc_device::transport (device memory), or add those members to yours.");
  static constexpr bool ok = true;
};

/// The exchanger's sharding steps (a friend of basic_exchanger, like training_loop and tuning).
struct sharding_steps {
  static void check_gather(std::size_t got, std::size_t pool) {
    if (got != pool)
      throw invalid_argument("values", fmt::format("gather_shards got {} values; the pool holds {}.", got, pool),
                             "pass a buffer laid out like the pool (pool_size() elements, tensor i at pool_plan().offset[i]).");
  }

  /// The ways each bucket is split: the topology's choice for its size on the wire.
  template <class Ex>
  static std::vector<int> ways_of(const Ex& ex) {
    std::vector<int> w;
    w.reserve(ex.buckets_.size());
    for (const bucket& b : ex.buckets_) w.push_back(ex.engine_.template shard_ways<typename Ex::wire_type>(b.count));
    return w;
  }

  /// Exchanger::move_shard_state: the state is host memory on every transport. On device memory
  /// its one all_to_allv goes through device buffers (uploaded, exchanged, downloaded).
  template <class Ex>
  static std::vector<float> move_state(Ex& ex, std::span<const float> state, std::uint64_t from) {
    using T = std::remove_reference_t<decltype(*ex.t_)>;
    if constexpr (std::is_same_v<typename T::memory_space, host_memory>) {
      return ex.shard_log_.move(*ex.t_, ex.shards_, state, from);
    } else {
      struct through_device {
        Ex& ex;
        [[nodiscard]] int rank() const { return ex.t_->rank(); }
        [[nodiscard]] int size() const { return ex.t_->size(); }
        void all_to_allv(const float* send, const std::size_t* sc, float* recv, const std::size_t* rc) {
          std::size_t ns = 0, nr = 0;
          for (int q = 0; q < size(); ++q) {
            ns += sc[q];
            nr += rc[q];
          }
          typename Ex::backend::template buffer<float> ds(ns + 1), dr(nr + 1);
          ex.kernels_.upload(ds.data(), send, ns);
          ex.t_->all_to_allv(ds.data(), sc, dr.data(), rc);
          ex.kernels_.download(recv, dr.data(), nr);
        }
      } t{ex};
      return ex.shard_log_.move(t, ex.shards_, state, from);
    }
  }

  /// Cuts the shards from the buckets just planned (`first`: at construction).
  template <class Ex>
  static void plan(Ex& ex, bool first) {
    ex.shards_ = ex.shard_log_.record(ex.buckets_, ways_of(ex), ex.t_->rank(), ex.generation_, first);
  }

  /// At an iteration's first ready(): a topology whose split moved since the plan was cut (Hybrid's
  /// threshold, set between iterations or by Fusion<Auto>'s tuner) gets its shards re-cut here, at
  /// the same point on every rank, before any bucket launches.
  template <class Ex>
  static void sync(Ex& ex) {
    if constexpr (switched_topology<typename Ex::engine_t>) {  // Ring and Hierarchical<g>: the ways never move
      if (ways_of(ex) == ex.shards_.ways) return;
      plan(ex, false);
      ex.sparsifier_->replan();
      ex.runner_->replan();
    }
  }

  /// Each rank counted inf / NaN in its own shard only; the status must be the same on every rank
  /// (a trainer skips the step on all of them or none), so the counts are summed (one all-gather).
  /// A bucket split w ways is held by P / w ranks (one per aligned set of w). When every bucket has
  /// the same w the sum counts each element P / w times and is divided; when they differ (Hybrid's
  /// small buckets split in the group, its large ones among all), the ranks outside the first set
  /// take their copies of the group-split blocks back out (a count over those small blocks).
  template <class Ex>
  static std::size_t agreed_nonfinite(Ex& ex, std::size_t mine) {
    const auto& sp = ex.shards_;
    const int P = ex.t_->size(), w = sp.uniform_ways();
    if (w == 0) {
      for (std::size_t b = 0; b < sp.mine.size(); ++b)
        if (!sp.first_holder(b)) ex.kernels_.count_nonfinite(ex.grads_.data() + sp.mine[b].begin, sp.mine[b].size());
      mine -= ex.kernels_.take_nonfinite();
    }
    if (P == 1) return mine;
    const std::uint64_t m = mine;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
    control_all_gather(*ex.t_, &m, all.data(), 1);
    std::uint64_t sum = 0;
    for (std::uint64_t v : all) sum += v;
    return static_cast<std::size_t>(w == 0 ? sum : sum / static_cast<std::uint64_t>(P / w));
  }
};

/// The shard plans an exchanger has used: the current one (the exchanger's shards_) and the one
/// before the last change, so that state a trainer keeps for its shard (momentum, Adam's moments)
/// can follow a re-plan (Fusion<Auto>'s tuner, set_fusion, Hybrid's threshold). The generation
/// counts the changes; it is the same on every rank (the plans depend only on the buckets, their
/// ways and the ranks).
struct shard_history {
  std::uint64_t generation = 0;
  std::vector<bucket> previous_buckets, current_buckets;
  std::vector<int> previous_ways, current_ways;
  std::uint64_t previous_pool = 0, current_pool = 0;  // the pool layout (Exchanger::generation()) each plan cut

  /// The plan of `next` buckets split `ways` ways, recorded; `pool` is the exchanger's pool generation.
  plan::shard_plan record(const std::vector<bucket>& next, std::vector<int> ways, int rank, std::uint64_t pool, bool first) {
    plan::shard_plan s = plan::plan_shards(next, ways, rank);
    const bool same = !first && ways == current_ways && current_pool == pool && next.size() == current_buckets.size() &&
                      std::equal(next.begin(), next.end(), current_buckets.begin(),
                                 [](const bucket& a, const bucket& b) { return a.offset == b.offset && a.count == b.count; });
    if (!first && !same) {
      previous_buckets = std::move(current_buckets);
      previous_ways = std::move(current_ways);
      previous_pool = current_pool;
      ++generation;
    }
    current_buckets = next;
    current_ways = std::move(ways);
    current_pool = pool;
    return s;
  }

  /// Exchanger::move_shard_state: `state` packs this rank's shard of generation `from` (its ranges
  /// back to back); returns it packed over the current shard. Collective: one all_to_allv. Each
  /// element of the new shard comes from the rank that held it in the old plan within this rank's
  /// aligned set of that bucket's ways (the one holder where the bucket was split among all).
  template <class T>
  std::vector<float> move(T& t, const plan::shard_plan& now, std::span<const float> state, std::uint64_t from) const {
    const int me = t.rank(), P = t.size();
    if (from == generation) {
      check_size(state.size(), now.scratch_total, from);
      return {state.begin(), state.end()};
    }
    if (from + 1 != generation)
      throw usage_error("move_shard_state", fmt::format("the state is of shard generation {}; the shards are at generation {}, and only the "
                                                        "move from the one before ({}) is kept.", from, generation, generation == 0 ? 0 : generation - 1),
                        "call move_shard_state each time shard_generation() changes (after finish(), set_fusion or load_state).");
    if (previous_pool != current_pool)
      throw usage_error("move_shard_state", "the pool was laid out anew (learn_order's first finish(), or load_state of another order) since "
                                            "that generation, so the state's elements moved with their tensors.",
                        "size the shard's state after the first finish() with learn_order, or after load_state.");
    const auto mine_before = plan::shard_ranges(previous_buckets, previous_ways, me);
    const auto mine_now = plan::shard_ranges(current_buckets, current_ways, me);
    std::size_t before_total = 0;
    for (const auto& r : mine_before) before_total += r.size();
    check_size(state.size(), before_total, from);
    const auto ranks = static_cast<std::size_t>(P);
    std::vector<std::size_t> scounts(ranks, 0), rcounts(ranks, 0);
    std::vector<float> send, recv;
    std::vector<std::vector<pool_range>> incoming(ranks);
    for (int q = 0; q < P; ++q) {
      const auto k = static_cast<std::size_t>(q);
      for (const pool_range& r : plan::intersect_ranges(plan::held_ranges(previous_buckets, previous_ways, me, q),
                                                        plan::shard_ranges(current_buckets, current_ways, q))) {
        const std::size_t at = plan::packed_offset(mine_before, r.begin);
        send.insert(send.end(), state.begin() + static_cast<std::ptrdiff_t>(at), state.begin() + static_cast<std::ptrdiff_t>(at + r.size()));
        scounts[k] += r.size();
      }
      incoming[k] = plan::intersect_ranges(plan::held_ranges(previous_buckets, previous_ways, q, me), mine_now);
      for (const pool_range& r : incoming[k]) rcounts[k] += r.size();
    }
    std::size_t rtotal = 0;
    for (std::size_t c : rcounts) rtotal += c;
    recv.resize(rtotal);
    send.resize(send.size() + (send.empty() ? 1 : 0));  // a valid pointer where nothing goes out
    recv.resize(recv.size() + (recv.empty() ? 1 : 0));
    t.all_to_allv(send.data(), scounts.data(), recv.data(), rcounts.data());
    std::vector<float> out(now.scratch_total);
    std::size_t at = 0;
    for (const auto& pieces : incoming)
      for (const pool_range& r : pieces) {
        const std::size_t dst = plan::packed_offset(mine_now, r.begin);
        std::copy(recv.begin() + static_cast<std::ptrdiff_t>(at), recv.begin() + static_cast<std::ptrdiff_t>(at + r.size()),
                  out.begin() + static_cast<std::ptrdiff_t>(dst));
        at += r.size();
      }
    return out;
  }

 private:
  static void check_size(std::size_t got, std::size_t want, std::uint64_t from) {
    if (got != want)
      throw invalid_argument("state", fmt::format("move_shard_state got {} values; this rank's shard of generation {} holds {}.", got, from, want),
                             "pass the state packed over shard() as it was at that generation (its ranges back to back).");
  }
};

}  // namespace gflow::detail
