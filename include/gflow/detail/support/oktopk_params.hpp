#pragma once
// OkTopK's run-time parameters, their check and their bytes in a checkpoint, below the engines:
// the engine (engines/oktopk/engine.hpp) takes them in set_params and writes and reads them in its
// checkpoint, and the re-sharder (support/reshard.hpp) reads them, and the saved thresholds, by the
// same rules before it writes a set, so that it never writes one the engine would refuse.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "../../error.hpp"
#include "checkpoint.hpp"

namespace gflow::detail {

/// OkTopK's run-time parameters (Sparsifier<OkTopK<d>>::set_params); the defaults are the
/// authors' code's (Shigangli/Ok-Topk, VGG/allreducer.py).
struct oktopk_params {
  std::uint64_t threshold_period = 32;  // exact local top-k every this many iterations
  std::uint64_t boundary_period = 64;   // region boundaries re-estimated every this many iterations
  double local_adapt = 1.012;           // local threshold x / ÷ this when a selection leaves [2k/3, 5k/4]
  double capacity = 2.0;                // a threshold selection keeps at most capacity * k entries (else exact top-k)
  // (The global selection has no parameter: engines/oktopk/cut.hpp agrees on it every iteration.)
};

/// What is wrong with p, if anything: the parameter, why, and the fix for a caller of set_params.
struct oktopk_params_problem {
  const char* subject;
  std::string why;
  const char* fix;
};

inline std::optional<oktopk_params_problem> find_oktopk_params_problem(const oktopk_params& p) {
  if (p.threshold_period == 0) return oktopk_params_problem{"threshold_period", "the threshold re-estimation period is 0.", "pass a period >= 1 (1: exact top-k every iteration)."};
  if (p.boundary_period == 0) return oktopk_params_problem{"boundary_period", "the boundary re-estimation period is 0.", "pass a period >= 1 (1: boundaries every iteration)."};
  if (!(p.local_adapt >= 1.0 && p.local_adapt <= 2.0))
    return oktopk_params_problem{"local_adapt", fmt::format("the local threshold's adaptation factor {:f} is outside [1, 2].", p.local_adapt),
                                 "pass e.g. 1.012 (1: no adaptation)."};
  if (!(p.capacity >= 1.0 && p.capacity <= 64.0))
    return oktopk_params_problem{"capacity", fmt::format("the selection capacity {:f} x k is outside [1, 64].", p.capacity), "pass e.g. 2 (the default)."};
  return std::nullopt;
}

/// set_params' check: invalid_argument naming the parameter.
inline void check_oktopk_params(const oktopk_params& p) {
  if (const auto q = find_oktopk_params_problem(p)) throw invalid_argument(q->subject, q->why, q->fix);
}

/// The parameters in a checkpoint (the engine's save_state): four fields in this order, which
/// read_oktopk_params reads back for the engine's load and for the re-sharder.
inline void write_oktopk_params(checkpoint_writer& w, const oktopk_params& p) {
  w.u64(p.threshold_period);
  w.u64(p.boundary_period);
  w.f64(p.local_adapt);
  w.f64(p.capacity);
}

/// The parameters write_oktopk_params wrote, checked as set_params checks them: the reader's parse
/// error naming the parameter (without set_params' fix).
inline oktopk_params read_oktopk_params(checkpoint_reader& r) {
  oktopk_params p;
  p.threshold_period = r.u64("threshold_period");
  p.boundary_period = r.u64("boundary_period");
  p.local_adapt = r.f64("local_adapt");
  p.capacity = r.f64("capacity");
  if (const auto q = find_oktopk_params_problem(p)) r.fail(q->subject, "the checkpoint's OkTopK parameters are invalid: " + q->why);
  return p;
}

/// A unit's saved local or global threshold: finite and >= 0, or -1 (not estimated).
inline void check_saved_oktopk_threshold(const checkpoint_reader& r, std::uint64_t unit, float v) {
  if (!(std::isfinite(v) && (v >= 0.0f || v == -1.0f)))
    r.fail("threshold", fmt::format("unit {} has threshold {:f} (finite and >= 0, or -1 for not estimated, expected).", unit, v));
}

}  // namespace gflow::detail
