#pragma once
// What a trainer passes to an exchanger at construction (exchange_options) and what finish()
// returns (exchange_status), for gflow::Exchanger (exchanger.hpp).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gflow {

/// Run-time settings, fixed at construction and the same on every rank (the fusion plan is the
/// Fusion policy's; Exchanger::set_fusion re-plans it between iterations).
struct exchange_options {
  bool average = true;  // false: leave the sum of the ranks' gradients
  // Compare layout, policies and the options above across ranks at construction (one small
  // all_gather); a difference raises mismatch_error on every rank instead of a hang. Must be
  // the same on every rank (a rank that skips the check would leave the others waiting).
  bool verify = true;
  // A tensor this rank did not mark ready by finish() is exchanged as zeros (DDP's
  // find_unused_parameters: a rank that used it averages with zeros from the ranks that did not,
  // divided by P); exchange_status::unused lists the tensors no rank marked ready. Costs one
  // all_gather of a bit per tensor per iteration. Without it a missing tensor is a usage_error.
  bool find_unused = false;
  // Watch the order of ready() calls in the first iteration, take rank 0's, and lay the pool and
  // buckets out in that order (each bucket contiguous in the observed order). The first
  // iteration then exchanges at finish(); views move once (generation() counts the moves).
  bool learn_order = false;
  // Allows join() (uneven inputs): each iteration starts with one all_gather of a flag per rank
  // that counts the ranks still training; averages divide by that count.
  bool uneven_inputs = false;
};

/// What finish() reports about one iteration. The result is bitwise identical on every rank,
/// so every rank reports the same status.
struct exchange_status {
  std::uint64_t iteration = 0;
  std::size_t nonfinite = 0;    // inf / NaN elements in the exchanged gradients
  std::size_t collectives = 0;  // allreduces issued
  std::size_t wire_bytes = 0;   // bytes this rank handed to those allreduces
  int contributors = 0;         // ranks whose gradients are in the sum: the divisor of the average
                                // (the job's size unless ranks have join()ed, exchange_options::uneven_inputs)
  std::vector<std::size_t> unused;  // find_unused: tensors no rank marked ready (ascending layout index)
  [[nodiscard]] bool finite() const noexcept { return nonfinite == 0; }
};

/// What join() reports once every rank has joined (identical on every rank).
struct join_status {
  std::uint64_t shadowed = 0;  // iterations this rank shadowed with zero contributions
  // The lowest rank that trained in the last iteration anyone trained in (0 when every rank
  // joined at once): its parameters are the freshest. Broadcast them to make the replicas equal
  // again: gflow::broadcast_parameters(transport, params, st.last_rank).
  int last_rank = 0;
};

}  // namespace gflow
