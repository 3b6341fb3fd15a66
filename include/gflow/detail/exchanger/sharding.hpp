#pragma once
// What basic_exchanger (exchanger.hpp) does for Sharding<ReduceScatter> beyond its engine
// (engines/sharded.hpp): the options it refuses, and the inf / NaN count every rank must agree on.
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../../error.hpp"
#include "../../options.hpp"
#include "../../transport/transport.hpp"
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
  static void refuse_options(const exchange_options& opt) {
    if (opt.learn_order)
      throw invalid_argument("learn_order", "Sharding<ReduceScatter> with learn_order is not built yet: the learned order re-lays "
                                            "the pool out after the first iteration, which would move every rank's shard.",
                             "leave exchange_options::learn_order off with Sharding.");
    if (opt.uneven_inputs)
      throw invalid_argument("uneven_inputs", "Sharding<ReduceScatter> with uneven_inputs (join()) is not built yet: a joined "
                                              "rank still owns a shard that must be stepped.",
                             "leave exchange_options::uneven_inputs off with Sharding, or give every rank the same number of batches.");
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

}  // namespace gflow::detail
