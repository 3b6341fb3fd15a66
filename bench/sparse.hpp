#pragma once
// One exchange (dense or sparse) measured on a transport, shared by the sparse and model suites:
// the iteration's time (ready() on every tensor, then finish()), and for a selecting scheme the
// exact top-k selection alone (kernels::select_topk_sampled over the pool, what the engines run),
// timed on the same data in the same run; comm_s = the iteration minus select_s (derived).
// layering: kernels/topk.hpp and plan/density.hpp: the selection is timed alone, with the engines'
// own kernel at the engines' k, to split an iteration into selection and communication.
#include "common.hpp"
#include "sparse_oktopk.hpp"

#include <gflow/detail/kernels/topk.hpp>
#include <gflow/detail/plan/density.hpp>

#include <array>
#include <cstdint>
#include <limits>
#include <cstring>
#include <string>
#include <vector>

// bench/simulate.sh --local-work gpu-h200 (bench/simulate_gpu.cpp, linked only into the simulated
// build; absent elsewhere): charges the iteration a GPU's measured time for the scheme's own work.
extern "C" __attribute__((weak)) double gflow_sim_local_work(const char* scheme, double density, std::size_t pool_elements);

namespace gflow_bench {

struct sparse_result {
  std::string name;
  double density;
  stats total, select;
  std::size_t wire_bytes;
  std::size_t entries = 0;                   // entries in the result (sparse_oktopk.hpp)
  std::array<std::size_t, 4> reest{};        // OkTopK's re-estimations over the measured iterations
  double charged_s = std::numeric_limits<double>::quiet_NaN();  // simulated GPU work per iteration (-1: none measured)
};

template <class E, class T, class Setup>
sparse_result measure_sparse(T& t, const options& o, const gflow::Layout& l, const char* name, double density, bool selects, Setup setup) {
  typename E::template on<T> ex(t, l);
  setup(ex);
  const std::size_t total = l.total_numel();
  // The gradient of iteration `it`: the same values every iteration (--gradients repeated, the
  // default), or new ones (--gradients fresh): then every residual does not grow by the same amount
  // at once, and thresholds estimated on one iteration meet values they were not estimated on, as
  // in training. Filled outside the timed region.
  std::vector<float> fresh(total);
  auto fill = [&](int it) {
    const auto r = static_cast<std::uint64_t>(t.rank());
    if (!o.fresh_gradients) {
      for (std::size_t i = 0; i < total; ++i) fresh[i] = static_cast<float>(((i * 2654435761u + r * 40503u) % 20011)) / 10000.0f - 1.0f;
      return;
    }
    for (std::size_t i = 0; i < total; ++i) {  // splitmix64 of (element, rank, iteration)
      std::uint64_t x = i * 2654435761u + r * 40503u + static_cast<std::uint64_t>(it) * 0x9E3779B97F4A7C15ull;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      x ^= x >> 31;
      fresh[i] = static_cast<float>(x % 20011) / 10000.0f - 1.0f;
    }
  };
  fill(0);
  const std::size_t k = gflow::detail::plan::k_for(density, total);
  gflow::detail::kernels::topk_workspace ws;
  if (selects) ws.reserve(total, k);
  std::vector<std::uint64_t> picked(selects ? k : 0);
  std::vector<double> tt, st;
  std::size_t bytes = 0, entries = 0;
  std::array<std::size_t, 4> reest{};
  double charged = std::numeric_limits<double>::quiet_NaN();
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    if (o.fresh_gradients && it > 0) fill(it);
    std::memcpy(ex.pool_data(), fresh.data(), total * sizeof(float));
    t.barrier();
    const double t0 = MPI_Wtime();  // MPI's clock: the simulated one under SMPI (bench/simulate.sh)
    if (gflow_sim_local_work != nullptr) charged = gflow_sim_local_work(name, density, total);
    for (std::size_t q = l.size(); q-- > 0;) ex.ready(q);
    auto status = ex.finish();
    double dt = MPI_Wtime() - t0;
    bytes = status.wire_bytes;
    entries = result_entries(ex, total);
    if (it >= o.warmup)
      for (std::size_t j = 0; j < 4; ++j) reest[j] += reestimations(ex)[j];
    double ds = 0;
    if (selects) {
      t.barrier();
      const double s0 = MPI_Wtime();
      (void)gflow::detail::kernels::select_topk_sampled(fresh.data(), total, k, 0, picked.data(), ws);  // the engines' selection
      ds = MPI_Wtime() - s0;
    }
    t.all_reduce(&dt, 1, gflow::reduce_op::max);
    t.all_reduce(&ds, 1, gflow::reduce_op::max);
    if (it >= o.warmup) {
      tt.push_back(dt);
      st.push_back(ds);
    }
  }
  return {name, density, summarize(tt), summarize(st), bytes, entries, reest, charged};
}

}  // namespace gflow_bench
