// gflow_bench_replicas: what --verify-replicas N costs per check (replicas.hpp).
//   mpiexec -n P build/bench/gflow_bench_replicas [layout.tsv ...]   (default: resnet50)
// For each layout, with equal replicas (the check passes), the time per call of:
//   fingerprint     the local pass alone: values_fingerprint over every tensor (no communication)
//   verify          gflow::verify_replicas (the pass, then one all_gather of 5 u64 per rank)
//   all_reduce      for scale: one all_reduce of the whole parameter vector (an iteration's dense exchange)
//   broadcast       gflow::broadcast_parameters of the whole vector (once per run at start)
// 7 interleaved rounds of a few calls each; rank 0 prints the median over rounds (of the slowest
// rank's mean per call) with the min and max. docs/BENCHMARKS.md quotes the figures.
// layering: gflow::detail::replica_reader: the fingerprint pass is timed alone, apart from the
// collective of verify_replicas.
#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  gflow::mpi::transport t(MPI_COMM_WORLD);
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) paths.emplace_back(argv[i]);
  if (paths.empty()) paths.push_back(std::string(GFLOW_LAYOUT_DIR) + "/resnet50.tsv");
  if (t.rank() == 0) std::printf("%d ranks; ms per call, median over 7 rounds [min, max] (slowest rank per round)\n", t.size());
  for (const std::string& path : paths) {
    const gflow::Layout l = gflow::Layout::from_tsv(path);
    std::vector<float> w(l.total_numel());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i % 100003) * 0.001f);
    std::vector<std::uint64_t> fp(l.size());
    const int calls = 5;
    std::vector<double> t_ms[4];
    for (int round = 0; round < 7; ++round)
      for (int v = 0; v < 4; ++v) {
        t.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) {
          if (v == 0) gflow::detail::replica_reader<gflow::host_memory>::fingerprints(t, w.data(), l, fp.data());
          else if (v == 1) gflow::verify_replicas(t, w, l);
          else if (v == 2) t.all_reduce(w.data(), w.size(), gflow::reduce_op::max);  // max: the values stay as they are
          else gflow::broadcast_parameters(t, w, 0);
        }
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / calls;
        MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        t_ms[v].push_back(ms);
      }
    if (t.rank() != 0) continue;
    std::printf("%s: %zu tensors, %zu elements (%.1f MB)\n", path.c_str(), l.size(), w.size(), static_cast<double>(w.size()) * 4e-6);
    const char* names[4] = {"fingerprint", "verify", "all_reduce", "broadcast"};
    for (int v = 0; v < 4; ++v) {
      std::sort(t_ms[v].begin(), t_ms[v].end());
      std::printf("  %-12s %9.3f ms  [%.3f, %.3f]\n", names[v], t_ms[v][3], t_ms[v].front(), t_ms[v].back());
    }
  }
  return 0;
}
