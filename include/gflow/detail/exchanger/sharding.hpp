#pragma once
// What basic_exchanger (exchanger.hpp) does for Sharding<ReduceScatter> beyond its engine
// (engines/sharded.hpp): the options it refuses, the inf / NaN count every rank must agree on, and
// the shard plan's history, which moves a trainer's per-shard state when the buckets are re-planned
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
#include "../plan/shards.hpp"
#include "consistency.hpp"

namespace gflow::detail {

/// The facade's compile-time checks of a sharded composition's transport (the policy-only rules
/// are in exchanger/policy_set.hpp).
template <class T, bool Sharded>
struct sharding_checks {
  static_assert(!Sharded || std::is_same_v<typename T::memory_space, host_memory>,
                "gflow::Exchanger: Sharding<ReduceScatter> runs on host memory (the MPI and in-process transports) so far; "
                "the device path (ncclReduceScatter / ncclAllGather) is not built yet. Drop Sharding on device memory.");
  static_assert(!Sharded || sharding_transport<T>,
                "gflow::Exchanger: Sharding<ReduceScatter> needs a transport with reduce_scatter, ireduce_scatter and "
                "all_gatherv_in_place (the concept gflow::sharding_transport, transport/transport.hpp): use "
                "gflow::mpi::transport or gflow::inproc::transport, or add those members to yours.");
  static constexpr bool ok = true;
};

struct sharding_rules {
  /// At construction, after the cross-rank check (every rank has the same options, so all refuse alike).
  /// learn_order is not refused: it lays the pool out at the first finish(), before any bucket
  /// launches, so the shards a trainer steps are cut from the learned layout from the start.
  static void refuse_options(const exchange_options& opt) {
    if (opt.uneven_inputs)
      throw invalid_argument("uneven_inputs", "Sharding<ReduceScatter> with uneven_inputs (join()) is not built yet: a joined "
                                              "rank still owns a shard that must be stepped.",
                             "leave exchange_options::uneven_inputs off with Sharding, or give every rank the same number of batches.");
  }

  static void check_gather(std::size_t got, std::size_t pool) {
    if (got != pool)
      throw invalid_argument("values", fmt::format("gather_shards got {} values; the pool holds {}.", got, pool),
                             "pass a buffer laid out like the pool (pool_size() elements, tensor i at pool_plan().offset[i]).");
  }

  /// Each rank counted inf / NaN in its own shard only; the status must be the same on every rank
  /// (a trainer skips the step on all of them or none), so the counts are summed (one all-gather).
  /// The shards of `shard_ranks` ranks cover the pool; with Hierarchical<g> each of the P / g
  /// groups covers it (the same values), so the sum counts every element P / shard_ranks times.
  template <class T>
  static std::size_t agreed_nonfinite(T& t, std::size_t mine, int shard_ranks) {
    const int P = t.size();
    if (P == 1) return mine;
    const std::uint64_t m = mine;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
    control_all_gather(t, &m, all.data(), 1);
    std::uint64_t sum = 0;
    for (std::uint64_t v : all) sum += v;
    return static_cast<std::size_t>(sum / static_cast<std::uint64_t>(P / shard_ranks));
  }
};

/// The shard plans an exchanger has used: the current one (the exchanger's shards_) and the one
/// before the last change, so that state a trainer keeps for its shard (momentum, Adam's moments)
/// can follow a re-plan (Fusion<Auto>'s tuner, set_fusion). The generation counts the changes; it
/// is the same on every rank (the plans depend only on the buckets and the ranks).
struct shard_history {
  std::uint64_t generation = 0;
  std::vector<bucket> previous_buckets, current_buckets;
  int ways = 1;
  bool has_previous = false;
  std::uint64_t previous_pool = 0, current_pool = 0;  // the pool layout (Exchanger::generation()) each plan cut

  /// The plan of `next` buckets, recorded; `pool` is the exchanger's pool generation.
  plan::shard_plan record(const std::vector<bucket>& next, int ways_, int rank, std::uint64_t pool, bool first) {
    plan::shard_plan s = plan::plan_shards(next, ways_, rank);
    const bool same = !first && ways == ways_ && current_pool == pool && next.size() == current_buckets.size() &&
                      std::equal(next.begin(), next.end(), current_buckets.begin(),
                                 [](const bucket& a, const bucket& b) { return a.offset == b.offset && a.count == b.count; });
    if (!first && !same) {
      previous_buckets = std::move(current_buckets);
      previous_pool = current_pool;
      has_previous = true;
      ++generation;
    }
    current_buckets = next;
    current_pool = pool;
    ways = ways_;
    return s;
  }

  /// Exchanger::move_shard_state: `state` packs this rank's shard of generation `from` (its ranges
  /// back to back); returns it packed over the current shard. Collective: one all_to_allv among the
  /// ranks that share the shards (the group with Hierarchical<g>, else all).
  template <class T>
  std::vector<float> move(T& t, const plan::shard_plan& now, std::span<const float> state, std::uint64_t from) const {
    const int me = now.rank, base = t.rank() - now.rank;
    const auto mine_now = plan::shard_ranges(current_buckets, ways, me);
    if (from == generation) {
      check_size(state.size(), now.scratch_total, from);
      return {state.begin(), state.end()};
    }
    if (from + 1 != generation || !has_previous)
      throw usage_error("move_shard_state", fmt::format("the state is of shard generation {}; the shards are at generation {}, and only the "
                                                        "move from the one before ({}) is kept.", from, generation, generation == 0 ? 0 : generation - 1),
                        "call move_shard_state each time shard_generation() changes (after finish(), set_fusion or load_state).");
    if (previous_pool != current_pool)
      throw usage_error("move_shard_state", "the pool was laid out anew (learn_order's first finish(), or load_state of another order) since "
                                            "that generation, so the state's elements moved with their tensors.",
                        "size the shard's state after the first finish() with learn_order, or after load_state.");
    const auto mine_before = plan::shard_ranges(previous_buckets, ways, me);
    std::size_t before_total = 0;
    for (const auto& r : mine_before) before_total += r.size();
    check_size(state.size(), before_total, from);
    const auto P = static_cast<std::size_t>(t.size());
    std::vector<std::size_t> scounts(P, 0), rcounts(P, 0);
    std::vector<float> send, recv;
    std::vector<std::vector<pool_range>> incoming(static_cast<std::size_t>(ways));
    for (int q = 0; q < ways; ++q) {
      const auto peer = static_cast<std::size_t>(base + q);
      for (const pool_range& r : plan::intersect_ranges(mine_before, plan::shard_ranges(current_buckets, ways, q))) {
        const std::size_t at = plan::packed_offset(mine_before, r.begin);
        send.insert(send.end(), state.begin() + static_cast<std::ptrdiff_t>(at), state.begin() + static_cast<std::ptrdiff_t>(at + r.size()));
        scounts[peer] += r.size();
      }
      incoming[static_cast<std::size_t>(q)] = plan::intersect_ranges(plan::shard_ranges(previous_buckets, ways, q), mine_now);
      for (const pool_range& r : incoming[static_cast<std::size_t>(q)]) rcounts[peer] += r.size();
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
