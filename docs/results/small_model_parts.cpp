// Standalone check behind docs/BENCHMARKS.md "Issue 10" (resnet20 gap), kept for reproduction:
//   mpicxx -O3 -std=c++20 -Iinclude docs/results/small_model_parts.cpp -o /tmp/parts -pthread
//   mpiexec --oversubscribe --bind-to none -n 2 /tmp/parts   (run from the repository root)
#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>
#include <cstdio>
#include <vector>
#include <chrono>
#include <algorithm>
#include <cstring>
// exchanger vs hand loop on the same kind of buffers, values as in the bench
int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  int rank, P; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &P);
  auto l = gflow::Layout::from_tsv("bench/layouts/resnet20.tsv");
  gflow::mpi::transport tr(MPI_COMM_WORLD, std::chrono::milliseconds(0));
  using E = gflow::Exchanger<gflow::Precision<gflow::wire::fp32>, gflow::Fusion<(4u << 20)>>;
  gflow::exchange_options eo; eo.threshold_bytes = 4u << 20;
  E::on<gflow::mpi::transport> ex(tr, l, eo);
  const std::size_t n = l.total_numel();
  std::vector<float> fresh(n), hand(n);
  for (std::size_t i = 0; i < n; ++i) fresh[i] = static_cast<float>(((i * 2654435761u + static_cast<std::size_t>(rank) * 40503u) % 2001)) / 1000.0f - 1.0f;
  float* pool = ex.pool_data();
  const int V = 5;
  std::vector<double> t[V];
  for (int it = 0; it < 400; ++it) {
    for (int j = 0; j < V; ++j) {
      int v = (j + it) % V;
      std::memcpy(v >= 3 ? hand.data() : pool, fresh.data(), n * 4);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (v == 0) { for (std::size_t k = l.size(); k-- > 0;) ex.ready(k); (void)ex.finish(); }
      else if (v == 1) { tr.all_reduce(pool, n, gflow::reduce_op::sum); gflow::kernels::scale_in_place(pool, n, 1.0f / P); }
      else if (v == 2) { MPI_Allreduce(MPI_IN_PLACE, pool, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); for (std::size_t i = 0; i < n; ++i) pool[i] *= 1.0f / P; }
      else if (v == 3) { MPI_Allreduce(MPI_IN_PLACE, hand.data(), (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); for (std::size_t i = 0; i < n; ++i) hand[i] *= 1.0f / P; }
      else { MPI_Allreduce(MPI_IN_PLACE, hand.data(), (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); gflow::kernels::scale_in_place(hand.data(), n, 1.0f / P); }
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= 20) t[v].push_back(dt * 1e6);
    }
  }
  for (auto& x : t) std::sort(x.begin(), x.end());
  if (rank == 0) std::printf("P=%d us: exchanger %.1f | transport.all_reduce(pool)+scale_in_place %.1f | MPI(pool)+loop %.1f | MPI(vec)+loop %.1f | MPI(vec)+scale_in_place %.1f\n", P, t[0][t[0].size()/2], t[1][t[1].size()/2], t[2][t[2].size()/2], t[3][t[3].size()/2], t[4][t[4].size()/2]);
}
