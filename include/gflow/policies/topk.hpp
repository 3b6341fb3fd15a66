#pragma once
// Sparsifier<TopK<density>> and Sparsifier<GTopK<density>>: Top-k sparsification with
// residuals (gTop-k (Shi et al.) Algorithm 1) and global Top-k by a tree of pairwise merges
// (gTop-k (Shi et al.) Algorithms 3 and 4), for any number of ranks.
//
//   using Exchange = gflow::Exchanger<gflow::Sparsifier<gflow::GTopK<0.001>>, gflow::Fusion<4 << 20>>;
//   Exchange::on<gflow::mpi::transport> ex(comm, layout);
//   ex.sparsifier().set_schedule(gflow::density_schedule::gtopk_warmup(iterations_per_epoch));
//
// The density is a C++20 floating-point template argument (g++ 12 and nvcc 13 accept it); it
// must lie in (0, 1] (static_assert). It is the final density of the default schedule; the
// schedule is settable at run time (set_density, set_schedule; plan/density.hpp), validated.
//
// What one selection does, on a unit of n pool elements — each fused bucket when Fusion is
// present, else the whole pool once its last bucket is ready:
//   1. G = g + residual, stored into the residual (the pool keeps the gradients g until the
//      result is written: a rejected message leaves it untouched).
//   2. k = ceil(density * n) (plan::k_for); exact top-k of |G|, ties to the lower index
//      (kernels/topk.hpp). Steps 1 and 2 are one kernel, kernels::accumulate_select_topk: a
//      sampled threshold, one pass that stores G and gathers the candidates above it, a radix
//      select among them; the full three-pass selection only when the sample misjudged (same
//      result either way). Values travel in the Precision policy's wire type: with a 16-bit wire
//      and averaging they are divided by P before the cast (as the dense path does), and the
//      rounding error stays in the residual. Indices are pool positions, u32 when the pool has
//      at most 2^32 elements, else u64 (set_index_bytes overrides, validated).
//   3. residual = G minus what was sent.
//   Per unit that is one pass reading g and the residual and writing the residual, one write of
//   zeros over the unit once every message is validated, and work on k-sized lists (TopK
//   averages and counts inf / NaN at the union of the received indices only: every other
//   element is +0, and +0 * (1/P) = +0). Without Fusion the buckets before the last wait:
//   nothing reads G before the whole pool's selection, so the last bucket's call runs the one
//   pass over the whole pool; accumulating each bucket as it arrives and then selecting would
//   read the pool once more. (With an Overlap policy those per-bucket accumulations could have
//   hidden behind the backward pass; now all of a unit's work follows its last bucket.)
//   TopK : ONE all_gather of a packed message (header + k indices + k values, as bytes) per rank;
//          every rank validates all P messages, zeroes the unit and adds them in rank order 0..P-1
//          (bitwise identical everywhere), then averages (fp32: multiply by 1/P, as Dense does).
//   GTopK: ceil(log2 P) rounds of send/recv of one fixed-size message (plan/tree.hpp: in round j
//          rank r receives from r + 2^j when r % 2^(j+1) == 0 and that rank exists; the sender is
//          idle afterwards); the receiver merges (add equal indices, keep the k largest |sum| of
//          at most 2k, kernels::merge_topk) into its list; then rank 0 broadcasts the global list,
//          which every rank validates and writes (divided by P when averaging) into the zeroed
//          unit. Residuals, so that nothing is lost (shared DESIGN "Nothing is lost"):
//            - Algorithm 4 line 10: a rank's selected values whose index is not in the global
//              list go back into its residual;
//            - a merge that drops an entry whose index does end up in the global list (it got
//              there through another branch of the tree) puts the dropped sum back into the
//              merging rank's residual, and so does a merge whose 16-bit re-encoding rounded.
//              Algorithm 4 alone would lose those values; with both rules the sum over ranks of
//              everything fed in equals P x the applied average plus every residual.
//
// Received messages are validated before use (count <= k, index in the unit, strictly
// increasing indices, no NaN value; see kernels/topk.hpp for the format). A bad message raises
// gflow::parse_error whose subject names the parameter ("count", "index", "value") on EVERY rank:
// TopK's ranks all see the same gathered bytes; a GTopK rank that rejects a message marks its
// outgoing message and rank 0's broadcast carries the mark, so no rank waits for one that gave
// up. Before throwing, every rank puts its own selected values back into its residual, so the
// failed iteration's gradients are not lost (they are exchanged with the next iteration).
//
// Non-finite gradients: NaN travels as +inf (a received NaN is a corrupt message), inf values
// are applied and reported by Exchanger::finish(); non-finite values never enter a residual.
// They rank above every finite value, so they are selected first; should a rank hold more than
// k in a unit, it sends k (so the result is non-finite on every rank) and drops the rest. A
// finite value whose wire encoding overflows (fp16) travels as inf and is dropped likewise.
//
// Checkpoints (Exchanger::save_state / load_state): the residual, the density schedule, the
// index width and the last iteration's density. selected() / exchanged() are per iteration and
// start empty after a load.
//
// Introspection: residual() (pool order), selected() (this rank's indices this iteration),
// exchanged() (the indices the applied result has: TopK the union over ranks, GTopK the global
// top-k), k(), wire_bytes(), message_bytes(). Every rank must use the same layout, fusion,
// schedule and index width; change them between iterations only.
//
// The engine (memory spaces, buffers) is detail::topk_engine in engines/topk.hpp.
#include <concepts>

#include "../detail/engines/topk.hpp"
#include "family.hpp"
#include "sparsifier.hpp"

namespace gflow {

/// A density schedule for TopK, GTopK and OkTopK (ex.sparsifier().set_schedule(s)): constant(d),
/// per_iteration(steps, final), per_epoch(densities, final, iterations_per_epoch), gtopk_warmup(...).
using density_schedule = detail::plan::density_schedule;
/// One step of a schedule: `density` until iteration `until` (exclusive).
using density_step = detail::plan::density_step;

namespace detail {
/// What TopK<d> and GTopK<d> share: the density, the scheme, the engine they name, and that their
/// exchange never goes through the Topology (their own all_gather / merge tree: Ring only).
template <double Density, bool Global>
struct topk_tag {
  static constexpr double density = Density;
  static constexpr bool global = Global;
  static constexpr bool uses_topology = false;
  template <class Ctx>
  using engine = topk_engine<Ctx, Density, Global>;
};
}  // namespace detail

/// Top-k sparsification, exchanged by one all_gather (gTop-k (Shi et al.) Algorithm 1).
template <double Density>
struct TopK : detail::topk_tag<Density, false> {
  static_assert(Density > 0.0 && Density <= 1.0,
                "gflow::TopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank sends, "
                "e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::None>.");
};

/// Global Top-k by pairwise tree merges and a broadcast (gTop-k (Shi et al.) Algorithms 3 and 4), any P.
template <double Density>
struct GTopK : detail::topk_tag<Density, true> {
  static_assert(Density > 0.0 && Density <= 1.0,
                "gflow::GTopK<density>: the density must lie in (0, 1] (the fraction of gradients each rank sends, "
                "e.g. 0.001). For an exchange of everything use gflow::Sparsifier<gflow::None>.");
};

/// A Top-k scheme: its density (in (0, 1]) and whether the selection is global.
template <class S>
concept topk_scheme = requires {
  { S::density } -> std::convertible_to<double>;
  { S::global } -> std::convertible_to<bool>;
} && (S::density > 0.0) && (S::density <= 1.0);

static_assert(topk_scheme<TopK<0.001>>);
static_assert(topk_scheme<GTopK<0.001>>);
static_assert(topk_scheme<TopK<1.0>>);
static_assert(!topk_scheme<detail::dense_scheme>);
static_assert(sparsifier_policy<Sparsifier<TopK<0.001>>>);
static_assert(sparsifier_policy<Sparsifier<GTopK<0.01>>>);
}  // namespace gflow
