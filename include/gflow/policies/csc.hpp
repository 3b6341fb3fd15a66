#pragma once
// Sparsifier<CSC<chunk_elems, percent>>: coarse-grained sparse communication (GradientFlow (Sun et al.) section
// 3.2, Figures 17-18, Algorithm 1).
//
//   using Exchange = gflow::Exchanger<gflow::Sparsifier<gflow::CSC<32768, 15>>, gflow::Fusion<4 << 20>>;
//   Exchange::on<gflow::mpi::transport> ex(comm, layout);
//   ex.sparsifier().set_warmup(500, 2000);            // optional: dense iterations, ramp iterations
//   ... ready(i) ...; auto st = ex.finish();
//   if (st.finite()) opt.step(weights, {ex.pool_data(), ex.pool_size()},        // optim/momentum_sgd.hpp
//                             ex.sparsifier().selected_chunks(), ex.sparsifier().chunk_elems());
//
// What one iteration does (every rank holds the same selection S, a sorted list of chunks):
//   1. The pool is cut into chunks of chunk_elems elements (plan/chunks.hpp; the last is partial).
//   2. As buckets complete (exchange(b), pool order), every chunk that is now complete (its end
//      <= the bucket's end) is handled, Algorithm 1's "AllReduce Preprocess Step":
//        - c in S: g + hg is compacted into a buffer and hg = 0 (fp32 wire); with a 16-bit wire
//          the compaction casts, W((g + hg) / P) (or W(g + hg) for sums), and hg keeps the
//          rounding error of that encoding, (g + hg) - P * float(W) (kernels::
//          compact_chunks_to_wire), so that the 16-bit wire loses nothing a rank could keep;
//        - c not in S: g = g + hg, hg = momentum * g, and the pool is cleared there.
//      With Fusion the buffer is allreduced once it holds at least the fusion threshold in wire
//      bytes; without Fusion it is allreduced after each bucket that added to it. The allreduce
//      applies the Precision policy as the exchanger's dense one does (divide by P and cast
//      before, reduce through the Topology, cast back / average and count inf/NaN after), with
//      the steps fused into the compaction and the scatter of the result back into the pool.
//   3. end_iteration(): the rest of the buffer is exchanged; then the chunk norms (below) are
//      allreduced in fp32 through the Topology, and the top `percent` of chunks, ceil, ties to the
//      lower index (kernels::select_top_chunks), become S for the next iteration.
//
// After finish(), the views hold:
//   - chunks in S: the average over ranks of the accumulated gradient g + hg (the sum with
//     exchange_options::average = false), identical on every rank;
//   - other chunks: zero. Algorithm 1's SGD step makes no update there (the optimizer leaves the
//     weight and its momentum alone), and zero keeps an optimizer that ignores the selection
//     (plain SGD) correct. The rank's own accumulated gradient lives on in residual() as
//     momentum * g.
//
// Accounting ("nothing is lost", docs/DESIGN.md): for every element, summed over ranks and
// iterations,  fed in  =  applied  +  residual held now  +  decayed,  where applied is what the
// views held after each finish() (times P when averaged; zero on kept-back chunks) and
// decayed = (1 - momentum) * g at each iteration the element was kept back. Algorithm 1 keeps
// momentum * g, so with momentum = 1 nothing decays and the identity is the plain conservation
// law; momentum < 1 is the paper's choice to let the history decay like a momentum term.
// tests/engines/test_csc_results.cpp checks the identity in fp64 over 1000+ random iterations (relative error
// <= 1e-5: fp32 additions round), and to the last bit with a 16-bit wire on values for which only
// the 16-bit encoding rounds. What no rank can keep is the rounding of the 16-bit sum itself
// (the wire carries W(sum of the ranks' W values)).
//
// Chunk norms (GradientFlow (Sun et al.), Figure 18): each rank computes, per chunk, the L1 norm of
//   - chunks in S: the exchanged values divided by P as a sum, i.e. L1(sum over ranks) / P (the
//     paper's "divide its L1 norm by the number of GPUs": the allreduce then restores L1(sum));
//   - other chunks: its own accumulated gradient g + hg (before the momentum scaling).
// so both are on the scale of the sum over ranks. The norms are allreduced only when the next
// iteration is sparse or this one was (dense warm-up iterations issue no norm collective).
// Non-finite gradients (docs/DESIGN.md, "Non-finite values"):
//   - in a selected chunk, inf/NaN travels and is counted in the averaged result on every rank
//     (exchange_status::nonfinite); the history there is 0 (no rounding error is kept for a
//     value whose encoding is inf/NaN, nor for a finite value whose fp16 encoding overflows);
//   - in a kept-back chunk, the element's history becomes 0 instead of m * g (kernels::
//     defer_chunks: an inf/NaN history would poison every later exchange of the chunk), and the
//     chunk's norm becomes inf/NaN. Every sparse iteration allreduces the norms, so every rank
//     sees the non-finite sum and counts the chunk once in exchange_status::nonfinite; NaN
//     ranking highest, the chunk is exchanged next iteration (without the dropped value).
//   A finite chunk whose L1 norm overflows fp32 (elements near 1e34) is reported the same way.
//
// Checkpoints (Exchanger::save_state / load_state): the history, the next selection, the last
// one (selected_chunks()), the norms and the settings (momentum, warm-up, ramp, percent).
//
// Warm-up (paper: "start from dense training ... linearly ramping up the sparsity ratio"): every
// chunk for the first max(warmup, 1) iterations, then the fraction ramps linearly to `percent`
// over `ramp` iterations (plan::csc_schedule). The paper gives the warm-up as "several percent
// of iterations" and no momentum value; gflow's defaults are warmup 100, ramp 1000, momentum 1.
// Momentum 1 keeps a kept-back gradient whole (hg = g: nothing is lost, DESIGN.md's invariant holds
// exactly). A trainer that follows Algorithm 1's momentum correction sets set_momentum(m) to its
// optimizer's momentum and updates with gflow::optim::momentum_sgd; the (1 - m) part of a kept-back
// gradient is then accounted for by the optimizer's historical update, not by the residual.
// Set the warm-up to the run: set_warmup(total_iterations / 100, total_iterations / 25) follows
// "several percent".
//
// The engine (memory, memory spaces) is detail::csc_engine in engines/csc.hpp.
#include <cstddef>
#include <cstdint>

#include "../detail/engines/csc.hpp"
#include "sparsifier.hpp"

namespace gflow {

template <std::size_t ChunkElems = 32768, unsigned Percent = 15>
struct CSC {
  static_assert(ChunkElems > 0,
                "gflow::CSC<0, ...>: the chunk size must be positive. Pass the number of gradient elements per chunk, "
                "e.g. gflow::CSC<32768, 15> (the paper's 32K-element chunks).");
  static_assert(Percent > 0 && Percent <= 100,
                "gflow::CSC<..., Percent>: the percent of chunks exchanged per iteration must lie in (0, 100]. "
                "Pass e.g. gflow::CSC<32768, 15> (100 exchanges every chunk, like gflow::Sparsifier<gflow::None>).");
  static constexpr std::size_t chunk_elems = ChunkElems;
  static constexpr unsigned percent = Percent;

  static constexpr std::uint64_t default_warmup = detail::csc_defaults::warmup;
  static constexpr std::uint64_t default_ramp = detail::csc_defaults::ramp;
  static constexpr float default_momentum = detail::csc_defaults::momentum;  // nothing lost; Algorithm 1 trainers pass theirs

  template <class Ctx>
  using engine = detail::csc_engine<Ctx, ChunkElems, Percent>;
};

static_assert(sparsifier_policy<Sparsifier<CSC<>>>);
static_assert(sparsifier_policy<Sparsifier<CSC<32768, 15>>>);
static_assert(!Sparsifier<CSC<>>::dense);

}  // namespace gflow
