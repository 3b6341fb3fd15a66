#pragma once
// The usage errors of basic_exchanger (exchanger.hpp): calls made in the wrong state of an
// iteration, each with what happened and the fix (docs/ERRORS.md lists them with their tests).
#include <cstddef>
#include <cstdint>
#include <string>

#include "../../error.hpp"
#include "../../layout.hpp"

namespace gflow::detail {

inline std::string tensor_named(const Layout& l, std::size_t i) { return fmt::format("tensor {} ('{}')", i, l[i].name); }

inline invalid_argument index_error(const Layout& l, std::size_t i, const char* where) {
  return invalid_argument("tensor", fmt::format("{}({}): index out of range; the layout has "
                                        "{} tensors.", where, i, l.size()),
                          fmt::format("pass a layout index in [0, {}), forward order.", l.size()));
}

inline usage_error double_ready_error(const Layout& l, std::size_t i, std::uint64_t iteration) {
  return usage_error("ready", fmt::format("{} was marked ready twice in iteration {}.", tensor_named(l, i), iteration),
                     "call ready(i) once per tensor per iteration; finish() starts the next iteration. To add several "
                     "micro-batches' gradients before one exchange, run all but the last backward inside ex.no_sync().");
}

inline usage_error missing_error(const Layout& l, std::size_t missing, std::size_t first, std::uint64_t iteration) {
  return usage_error("finish", fmt::format("{} of {} tensors are not ready in iteration "
                                   "{}; the first is {}.", missing, l.size(), iteration, tensor_named(l, first)),
                     "call ready(i) for every tensor of the layout before finish(); if some parameters get no gradient in some "
                     "iterations, construct the exchanger with exchange_options::find_unused = true (on every rank).");
}

inline usage_error mid_iteration_error(const char* what, std::size_t ready, std::size_t n, std::uint64_t iteration) {
  return usage_error(what, fmt::format("{} was called in the middle of iteration {} ("
                               "{} of {} tensors ready).", what, iteration, ready, n),
                     "call " + std::string(what) + "() between finish() and the next ready().");
}

inline usage_error accumulating_error(const char* what, int depth) {
  return usage_error(what, std::string(what) + " was called " +
                               (depth > 0 ? std::string("inside a no_sync() scope") : std::string("while the views hold gradients accumulated under no_sync()")) +
                               ", before the exchange that ends the accumulation.",
                     "end the accumulation first: leave the no_sync() scope, run the last micro-batch's backward (ready() for its "
                     "tensors) and finish(); then call it.");
}

inline usage_error finish_in_no_sync_error() {
  return usage_error("finish", "finish() was called inside a no_sync() scope: the scope's backward passes only accumulate, nothing is exchanged.",
                     "let the scope end before the last micro-batch's backward, then call finish() after it "
                     "({ auto s = ex.no_sync(); backward(1); ... } backward(N); ex.finish();).");
}

inline usage_error join_without_option_error() {
  return usage_error("join", "join() needs exchange_options::uneven_inputs, which makes every iteration count the ranks still training.",
                     "construct the exchanger with exchange_options::uneven_inputs = true on every rank.");
}

inline usage_error set_fusion_mid_iteration_error(std::uint64_t iteration) {
  return usage_error("set_fusion", fmt::format("called in the middle of iteration {}.", iteration),
                     "change the fusion threshold between finish() and the next ready().");
}

inline invalid_argument fusion_threshold_zero_error() {
  return invalid_argument("threshold_bytes", "the fusion threshold must be positive (got 0).",
                          "pass a byte count such as 4 << 20; to exchange one collective per tensor, leave Fusion out.");
}

}  // namespace gflow::detail
