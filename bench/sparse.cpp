// bench/run sparse: Dense (Fusion at --threshold) against TopK, GTopK and OkTopK (selection over the whole
// pool: no Fusion; OkTopK-shard: OkTopK under Sharding<ReduceScatter>, one bucket) and CSC on the same gradients, on MPI ranks or on in-process ranks (--transport
// inproc: threads of one process). select_s is the exact top-k selection alone, comm_s = the
// iteration minus select_s (derived, reported as such; sparse.hpp).
// The schemes are run_sparse_on's list: to add one, add a measure_sparse line there (its
// exchanger, the name in the table and the JSON, whether it selects, how to set its density);
// --variants runs some of them.
#include "sparse.hpp"

#include <gflow/transport/inproc.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace gflow_bench {

namespace {

template <class T>
std::vector<sparse_result> run_sparse_on(T& t, const options& o, const gflow::Layout& l) {
  using gflow::Exchanger;
  using gflow::Sparsifier;
  auto wanted = [&](const char* n) { return o.variants.empty() || std::find(o.variants.begin(), o.variants.end(), n) != o.variants.end(); };
  std::vector<sparse_result> rs;
  if (wanted("dense"))
    rs.push_back(measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>>>(t, o, l, "dense", 1.0, false, [&](auto& ex) { ex.set_fusion(o.threshold); }));
  for (double d : o.densities) {
    auto dens = [d](auto& ex) { ex.sparsifier().set_density(d); };
    if (wanted("TopK")) rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::TopK<0.01>>>>(t, o, l, "TopK", d, true, dens));
    if (wanted("GTopK")) rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::GTopK<0.01>>>>(t, o, l, "GTopK", d, true, dens));
    if (wanted("OkTopK")) rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::OkTopK<0.01>>>>(t, o, l, "OkTopK", d, true, dens));
    // Sharded (ZeRO-2): the split-and-reduce over the shards, no cut and no allgatherv; one bucket
    // (one selection unit over the whole pool, as OkTopK's above), each rank's result its shard.
    if (wanted("OkTopK-shard"))
      rs.push_back(measure_sparse<Exchanger<Sparsifier<gflow::OkTopK<0.01>>, gflow::Sharding<gflow::ReduceScatter>, gflow::Fusion<(4u << 20)>>>(
          t, o, l, "OkTopK-shard", d, true, [&](auto& ex) {
            ex.set_fusion(l.total_numel() * sizeof(float));
            dens(ex);
          }));
    // CSC exchanges a whole percent of its 32K-element chunks: run it where d * 100 is whole.
    const double pct = d * 100.0;
    if (wanted("CSC") && pct >= 1.0 && pct == std::floor(pct)) {
      rs.push_back(measure_sparse<Exchanger<gflow::Fusion<(4u << 20)>, Sparsifier<gflow::CSC<32768, 15>>>>(
          t, o, l, "CSC", d, false, [&](auto& ex) {
            ex.set_fusion(o.threshold);
            ex.sparsifier().set_percent(static_cast<unsigned>(pct));
            ex.sparsifier().set_warmup(0, 0);  // iteration 0 is dense regardless: the warm-up iteration covers it
          }));
    }
  }
  return rs;
}

// Simulated with a GPU's local work (bench/simulate.sh --local-work gpu-h200): what each iteration
// was charged, or null where no GPU figure exists for this scheme; nothing otherwise.
std::string gpu_work_field(double charged_s) {
  if (std::isnan(charged_s)) return "";
  if (charged_s < 0) return ",\"gpu_local_work_s\":null";
  char b[64];
  std::snprintf(b, sizeof b, ",\"gpu_local_work_s\":%.9g", charged_s);
  return b;
}

// The window the MPI transport used (0: the MPI library's collectives); -1 for in-process ranks.
int variable_window_of(const options& o) {
  if (o.transport != "mpi") return -1;
  return o.variable_window >= 0 ? o.variable_window : gflow::mpi::default_variable_window;
}

void report_sparse(const options& o, const std::vector<sparse_result>& rs, const std::string& layout_name, const gflow::Layout& l, int P) {
  std::fprintf(stderr, "%-8s %9s %12s %12s %12s %12s %14s %8s %12s %9s\n", "variant", "density", "median_ms", "p10_ms", "p90_ms", "select_ms", "comm_ms",
               "vs_dense", "sent_KB", "entries");
  const double dense = !rs.empty() && rs.front().name == "dense" ? rs.front().total.median : std::nan("");  // vs_dense: nan without dense
  for (const auto& r : rs) {
    const double comm = r.total.median - r.select.median;
    const double sent = sent_bytes(r.name, r.wire_bytes, P);
    std::fprintf(stderr, "%-8s %9.4f %12.2f %12.2f %12.2f %12.2f %14.2f %8.3f %12.1f %9zu\n", r.name.c_str(), r.density, r.total.median * 1e3,
                 r.total.p10 * 1e3, r.total.p90 * 1e3, r.select.median * 1e3, comm * 1e3, r.total.median / dense, sent / 1e3, r.entries);
    std::printf(
        "{\"suite\":\"sparse\",\"layout\":\"%s\",\"ranks\":%d,\"transport\":\"%s\",\"variant\":\"%s\",\"wire\":\"%s\","
        "\"threshold_bytes\":%zu,\"density\":%.6g,\"median_s\":%.9g,\"p10_s\":%.9g,\"p90_s\":%.9g,\"select_s\":%.9g,"
        "\"comm_s\":%.9g,\"comm_s_derived\":true,\"bytes_per_rank\":%zu,\"sent_bytes_per_rank\":%.0f,\"result_entries\":%zu,"
        "\"exact_local\":%zu,\"boundary_estimates\":%zu,\"exact_global\":%zu,\"second_passes\":%zu,\"gradients\":\"%s\",\"pool_elements\":%zu,\"iterations\":%d,\"variable_window\":%d%s}\n",
        layout_name.c_str(), P, o.transport.c_str(), r.name.c_str(), o.wire.c_str(), r.name == "dense" ? o.threshold : std::size_t{0}, r.density,
        r.total.median, r.total.p10, r.total.p90, r.select.median, comm, r.wire_bytes, sent, r.entries, r.reest[0], r.reest[1], r.reest[2], r.reest[3],
        o.fresh_gradients ? "fresh" : "repeated", l.total_numel(), o.iters, variable_window_of(o), gpu_work_field(r.charged_s).c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int run_sparse_suite(const options& o, const gflow::Layout& l, const std::string& layout_name) {
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (o.transport == "inproc") {
    const int R = o.ranks > 0 ? o.ranks : 4;
    if (P != 1) {
      if (rank == 0) std::fprintf(stderr, "gflow_bench: --transport inproc runs its ranks as threads of one process (bench/run starts one)\n");
      return 2;
    }
    std::fprintf(stderr, "gflow bench: suite sparse, layout %s, %d in-process ranks, %d+%d iterations\n", layout_name.c_str(), R, o.warmup, o.iters);
    std::vector<sparse_result> rs;
    gflow::inproc::run(R, [&](gflow::inproc::transport& t) {
      auto mine = run_sparse_on(t, o, l);
      if (t.rank() == 0) rs = std::move(mine);
    }, std::chrono::minutes(10));
    report_sparse(o, rs, layout_name, l, R);
  } else {
    if (rank == 0)
      std::fprintf(stderr, "gflow bench: suite sparse, layout %s, %d MPI ranks, %d+%d iterations\n", layout_name.c_str(), P, o.warmup, o.iters);
    gflow::mpi::transport t(MPI_COMM_WORLD);
    if (o.variable_window >= 0) t.set_variable_window(o.variable_window);
    auto rs = run_sparse_on(t, o, l);
    if (rank == 0) report_sparse(o, rs, layout_name, l, P);
  }
  return 0;
}

}  // namespace gflow_bench
