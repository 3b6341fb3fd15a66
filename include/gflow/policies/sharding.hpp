#pragma once
// Sharding<M>: who keeps which part of the exchanged gradient (ZeRO stage 2, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models"; PyTorch FSDP's SHARD_GRAD_OP).
//
//   None           every rank gets the whole averaged gradient (an allreduce per bucket): the
//                  default, today's data parallelism.
//   ReduceScatter  each bucket is split into P blocks as the bucket plan cuts the pool (block q
//                  of a bucket of n elements holds n / P elements, one more for q < n mod P), and
//                  rank q receives only block q of the average (a reduce-scatter per bucket, the
//                  same bytes as half a ring allreduce). ex.shard() names this rank's blocks; after
//                  finish() the pool holds the average there and unspecified values elsewhere. A
//                  trainer steps its shard (keeping optimizer state for it only: 1/P of the memory)
//                  and refreshes the parameters with ex.gather_shards(values), an all-gather in place.
//
// With Topology<Hierarchical<g>> the split is two-level (ZeRO++'s hierarchical partitioning): P
// becomes g above (a reduce-scatter among the group's g ranks), and each block is then allreduced
// among its peers, the ranks of the same local rank in the other groups; g must divide P. With
// Topology<Hybrid<t, g>> each bucket is split as its allreduce would go: below t bytes on the wire
// in the group (two levels), at or above t among all P ranks; the split is fixed when the shards
// are cut, and a threshold changed later (engine set_threshold, Fusion<Auto>'s tuner, load_state)
// re-cuts them at the next iteration's first ready() (Exchanger::shard_generation counts it).
//
// What composes (docs/GUIDE.md, "Sharding"): every Precision, every Fusion (with Fusion<Auto> the
// shards move as the tuner re-plans: Exchanger::move_shard_state), every Overlap strategy, every
// Topology (Ring, Hierarchical<g>, Hybrid<t, g>), no_sync, find_unused and learn_order (the shards
// are cut from the learned layout, fixed at the first finish()), uneven_inputs (join(after_each)),
// on host memory over the MPI and in-process transports, and on device memory over NCCL and the
// staged device transports (gflow::mpi_device, gflow::inproc_device; the device path has not yet
// run on a GPU). Sparsifier<OkTopK<d>> composes: its split-and-reduce over the shards is a sparse
// reduce-scatter (each bucket a selection unit, its regions the shard plan's blocks; no global cut,
// no allgatherv; policies/oktopk.hpp). Refused at compile time with the reason: TopK, GTopK and
// CSC, a transport without reduce_scatter, and join() without a step for the shard.
#include <concepts>
#include <type_traits>

#include "family.hpp"

namespace gflow {

struct ReduceScatter {};

template <class M>
inline constexpr bool is_sharding_mode = std::is_same_v<M, None> || std::is_same_v<M, ReduceScatter>;

template <class M = None>
struct Sharding {
  static_assert(is_sharding_mode<M>, "gflow::Sharding<M>: M is not a sharding mode. Use gflow::None or gflow::ReduceScatter.");
  using gflow_family = sharding_family;
  using mode = std::conditional_t<is_sharding_mode<M>, M, None>;
  static constexpr bool sharded = std::is_same_v<mode, ReduceScatter>;
};

template <class P>
concept sharding_policy = std::same_as<typename P::gflow_family, sharding_family> && requires {
  typename P::mode;
  { P::sharded } -> std::convertible_to<bool>;
};

static_assert(sharding_policy<Sharding<>> && sharding_policy<Sharding<ReduceScatter>>);

}  // namespace gflow
