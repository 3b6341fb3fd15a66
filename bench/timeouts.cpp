// gflow_bench_timeouts: what a bounded (timed) collective costs against the plain blocking call.
//   mpiexec -n P build/bench/gflow_bench_timeouts
// For all_reduce of 1 KiB ... 16 MiB (fp32, in place), the median time per call of:
//   blocking   MPI_Allreduce on this thread (what an untimed transport does)
//   polled-nb  MPI_Iallreduce polled with MPI_Test (the old timed path; libnbc's schedules)
//   timed      gflow::mpi::transport::all_reduce with the default timeout (the blocking call
//              on the transport's issuing thread, the caller waiting on a condition variable)
// Five interleaved rounds per size. docs/DESIGN.md "Timeouts" quotes the figures.
#include <gflow/transport/mpi.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  gflow::mpi::transport timed(MPI_COMM_WORLD);
  if (rank == 0) std::printf("%d ranks; median us per all_reduce (ratio to blocking)\n%10s %12s %20s %20s\n", P, "bytes", "blocking", "polled-nb", "timed");
  for (std::size_t bytes = 1024; bytes <= (16u << 20); bytes *= 4) {
    const std::size_t n = bytes / 4;
    std::vector<float> buf(n, 1.0f);
    const int iters = std::max<int>(20, static_cast<int>(200000000 / (bytes * 50 + 200000)));
    std::vector<double> t[3];
    for (int round = 0; round < 5; ++round)
      for (int v = 0; v < 3; ++v) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          if (v == 0) {
            MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          } else if (v == 1) {
            MPI_Request r = MPI_REQUEST_NULL;
            MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
            int done = 0;
            while (!done) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
          } else {
            timed.all_reduce(buf.data(), n, gflow::reduce_op::sum);
          }
        }
        t[v].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
      }
    for (auto& x : t) std::sort(x.begin(), x.end());
    if (rank == 0)
      std::printf("%10zu %12.2f %12.2f (%.2fx) %12.2f (%.2fx)\n", bytes, t[0][2], t[1][2], t[1][2] / t[0][2], t[2][2], t[2][2] / t[0][2]);
  }
  return 0;
}
