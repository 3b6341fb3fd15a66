// Runs the CUDA tests that need MPI, one process per rank: `mpiexec -n P gflow_cuda_mpi_tests
// [suite [name]]` (suite: mpi_device). Every rank probes the GPU the same way as gflow_cuda_tests
// (harness_main.cuh) and exits 77 (skipped) where there is none; otherwise the ranks run the
// tests together and each exits 1 when any rank had a failure (failures are summed over the ranks
// after the last test), so mpiexec's status is the job's.
#include <gflow/transport/mpi.hpp>

#include <cstdio>

#include "harness_main.cuh"

int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) std::freopen("/dev/null", "w", stdout);  // one rank's progress; failures go to stderr from every rank
  const int probed = gflow_cuda_test::probe_gpu();
  if (probed >= 0) return probed;
  const bool passed = gflow_cuda_test::run_registered(argc > 1 ? argv[1] : nullptr, argc > 2 ? argv[2] : nullptr);
  int failed = passed ? 0 : 1, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any && passed) std::printf("another rank failed\n");
  return any ? 1 : 0;
}
