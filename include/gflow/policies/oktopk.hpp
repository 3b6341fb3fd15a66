#pragma once
// Sparsifier<OkTopK<density>>: Ok-Topk (Li and Hoefler, "Near-optimal sparse allreduce for
// distributed deep learning", PPoPP'22), a sparse allreduce whose traffic per rank stays below
// 3k(P-1)/P entries (index + value: the paper's 6k(P-1)/P words) on every iteration, on average
// over ranks, whatever P is, where TopK's all_gather sends k(P-1) and GTopK's tree ceil(log2 P) k
// plus a broadcast.
//
//   using Exchange = gflow::Exchanger<gflow::Sparsifier<gflow::OkTopK<0.001>>, gflow::Fusion<4 << 20>>;
//   Exchange::on<gflow::mpi::transport> ex(comm, layout);
//   ex.sparsifier().set_params({.threshold_period = 32, .boundary_period = 64});
//
// Per selection unit of n elements (each fused bucket, else the whole pool), k = k_for(d, n):
//   1. Local selection, one pass: G = g + residual into the residual; the indices with
//      |G| >= the unit's local threshold (at most capacity * k; zeros never). Every
//      threshold_period iterations (and on first use) the exact top-k instead (TopK's
//      selection), which re-estimates the threshold as the smallest |G| it selected; a threshold
//      selection over its capacity takes the exact top-k among its candidates (no second pass
//      while they fit 4 x capacity, a full radix select beyond), and one under k/2 a full radix
//      select of the G it stored (the gradients shrank). In between the threshold adapts: / local_adapt
//      when fewer than 2k/3 were selected, x local_adapt above 5k/4. The selected values are
//      taken in the wire type (16-bit wire with averaging: divided by P first; the rounding stays
//      in the residual), exactly as TopK does.
//   2. Regions: P contiguous index ranges of the unit, region q reduced by rank q. Re-estimated
//      every boundary_period iterations (and on first use): each rank proposes the P - 1 indices
//      that cut its own selection into equal counts; one all_reduce (u64 sum) of the proposals,
//      divided by P, gives every rank the same boundaries (made non-decreasing).
//   3. Split-and-reduce: an all_to_all of one u64 per peer (how many entries each rank sends to
//      each region), checked, then an all_to_allv of the blocks (support/oktopk_message.hpp).
//      Rank q checks every block, then sums the entries of each index in rank order 0..P-1 (fp32).
//   4. The global cut and the allgatherv (engines/oktopk/cut.hpp): every rank counts its region's
//      sums by level (the bits of |sum| >> 21: four levels per octave), an all_reduce of 32 counts
//      sums them over ranks (one round while the previous iteration's level frames the k-th
//      largest sum, else a coarse and a fine round over the whole range), and every rank reaches
//      the same cut: every sum above the level of the unit's k-th largest |sum|, and at that level
//      k minus those, allotted in rank order, each rank's largest first (ties: lower index). So
//      the result holds exactly k entries (all nonzero sums when there are fewer) on every
//      iteration, whatever the gradients did since the last: no threshold to fall behind them.
//      Each rank all-gathers a 24-byte announcement (its counts above and at the level, or a
//      fault mark), from which every rank computes every block's count, then an all_gatherv of
//      the blocks, encoded in the wire type. Every rank checks every block. The result F is their
//      union (increasing indices, regions in rank order). (The paper's balancing step, which
//      evens out the blocks before a fixed-size allgather, is not needed: the all_gatherv moves
//      the blocks at their own sizes; a region holding more of the top-k sends more.)
//   5. The unit is zeroed and F written (divided by P with an fp32 wire and averaging): the same
//      bits on every rank.
// Residuals (nothing is lost; tests/engines/test_oktopk.cpp checks it bitwise on dyadic inputs):
//   - a rank's own selected entries whose index is not in F go back into its own residual whole
//     (GTopK's Algorithm 4 line 10): the contributors keep their own contributions, also for a
//     region whose reduced sum the global cut dropped; the
//     owner of that region keeps nothing of it;
//   - the owner of an applied entry keeps the rounding of its 16-bit re-encoding (0 with fp32).
//   So fed = P x applied average + held, summed over ranks. Non-finite values: as in TopK and
//   GTopK (NaN travels as +inf, inf is applied and reported by finish(), never kept in a residual).
// Under Sharding<ReduceScatter> (ZeRO-2; the scheme's sharded_engine): every bucket is a selection
// unit (fused or not), its regions are the shard plan's blocks of it (no boundary estimate), and
// after the split-and-reduce rank r writes its region's sums into its shard (zero where no rank
// sent an entry; divided by P with an fp32 wire and averaging). No global cut and no allgatherv:
// every entry sent is applied, so the residuals keep exactly what their ranks did not select; the
// announcements' all_gather stays, carrying only fault marks. exchanged() then lists this rank's
// shard entries. Three collectives a bucket: use a large Fusion threshold.
// Received data is checked before use: counts (<= the sender's capacity and the region's size),
// blocks (size, header count, indices increasing within the region, no NaN). A rank that rejects
// a split block marks its header, so every rank raises the same parse_error after the header
// all_gather; a bad result block is seen by every rank alike. On any error every rank puts its own
// selection back into its residual first.
//
// Parameters (ex.sparsifier().set_params(gflow::oktopk_params{...}); defaults from the authors' code): threshold_period
// 32, boundary_period 64, local_adapt 1.012, capacity 2 (the global cut has no parameter). Densities and
// schedules: set_density / set_schedule as TopK. Checkpoints hold TopK's fields plus the
// parameters and, per unit, the local threshold, the global cut's last level (as a threshold)
// and the boundaries (re-sharded onto another number
// of ranks: the residual by the share rule, the estimates reset, support/reshard.hpp). Introspection: residual(),
// selected(), exchanged(), k(), wire_bytes() (every round), reestimated() (which iterations
// paid for an exact selection, a boundary estimate or a full-range search of the global cut), unit(u).
// Buffers are reserved for the schedule's largest density: an iteration allocates nothing once
// warm, re-estimations included. Host and device memory (MPI, in-process, mock and NCCL
// transports): on device memory the passes over the pool are CUDA kernels and the per-entry steps
// run on the host on copies of the selection (engines/oktopk/engine.hpp), with the same bits.
#include <concepts>

#include "../detail/engines/oktopk.hpp"
#include "family.hpp"
#include "sparsifier.hpp"

namespace gflow {

/// Ok-Topk: split-and-reduce over balanced regions, then an allgatherv of the k largest sums,
/// agreed by a histogram all_reduce (Li and Hoefler; the cut: engines/oktopk/cut.hpp).
template <double Density>
struct OkTopK {
  static_assert(Density > 0.0 && Density <= 1.0,
                "gflow::OkTopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank selects, "
                "e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::None>.");
  static constexpr double density = Density;
  static constexpr bool uses_topology = false;
  template <class Ctx>
  using engine = detail::oktopk_engine<Ctx, Density>;
  /// Under Sharding<ReduceScatter>: the split-and-reduce over the shards, no cut, no allgatherv.
  template <class Ctx>
  using sharded_engine = detail::oktopk_engine<Ctx, Density, true>;
};

/// OkTopK's run-time parameters (ex.sparsifier().set_params(p); same on every rank, between
/// iterations): threshold_period, boundary_period, local_adapt, capacity.
using oktopk_params = detail::oktopk_params;

static_assert(sparsifier_policy<Sparsifier<OkTopK<0.001>>>);
}  // namespace gflow
