#pragma once
// The checkpoint head every engine of the Top-k family writes first (TopK, GTopK: topk/engine.hpp;
// OkTopK: oktopk/engine.hpp), in one format with one reader: the index width, the density and its
// schedule. The residual follows it (written by each engine from its backend's memory), then each
// engine's own state. support/reshard.hpp copies these bytes without an engine: its schema
// reader (read_sparse) follows this format and must change with it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "../../../error.hpp"
#include "../../plan/density.hpp"
#include "../../support/checkpoint.hpp"

namespace gflow::detail {

/// Index width, density and schedule of a Top-k-family engine, as saved and as read back.
struct topk_family_head {
  bool wide = false;
  double density = 0.0;
  plan::density_schedule schedule = plan::density_schedule::constant(1.0);
};

inline void write_topk_family_head(checkpoint_writer& w, bool wide, double density, const plan::density_schedule& schedule) {
  w.u32(wide ? 8u : 4u);
  w.f64(density);
  w.u64(schedule.steps().size());
  for (const auto& st : schedule.steps()) {
    w.u64(st.until);
    w.f64(st.density);
  }
  w.f64(schedule.final_density());
}

/// Reads and validates the head (a pool of `pool_elements` limits the index width), then the
/// residual of `pool_elements` finite values. Fails through r (parse_error naming the field).
inline void read_topk_family_state(checkpoint_reader& r, std::uint64_t pool_elements, topk_family_head& h, std::vector<float>& residual) {
  const std::uint32_t ib = r.u32("index_bytes");
  if (ib != 4 && ib != 8) r.fail("index_bytes", fmt::format("the checkpoint's index width is {} bytes (4 or 8 expected).", ib));
  if (ib == 4 && pool_elements > (std::uint64_t{1} << 32))
    r.fail("index_bytes", "the checkpoint uses 32-bit indices for a pool of more than 2^32 elements.");
  h.wide = ib == 8;
  h.density = r.f64("density");
  if (!(h.density > 0.0 && h.density <= 1.0)) r.fail("density", fmt::format("the checkpoint's density {:f} is outside (0, 1].", h.density));
  const std::uint64_t nsteps = r.u64("the density schedule's step count");
  constexpr std::uint64_t max_steps = std::uint64_t{1} << 20;
  if (nsteps > max_steps)
    r.fail("density_schedule", fmt::format("the checkpoint's density schedule claims {} steps; at most {} are allowed.", nsteps, max_steps));
  std::vector<plan::density_step> steps;
  for (std::uint64_t i = 0; i < nsteps; ++i) {
    plan::density_step st;
    st.until = r.u64("a density schedule step");
    st.density = r.f64("a density schedule step");
    steps.push_back(st);
  }
  const double fin = r.f64("the final density");
  try {
    h.schedule = plan::density_schedule::per_iteration(std::move(steps), fin);
  } catch (const invalid_argument& e) {
    r.fail("density_schedule", std::string("the checkpoint's density schedule is invalid: ") + e.what());
  }
  r.array_exact(residual, pool_elements, "the residual");
  check_finite(residual.data(), residual.size(), "residual");
}

}  // namespace gflow::detail
