// doctest under MPI: every rank runs the same test cases in the same order (the tests issue
// collectives, so every rank must take part in each). Rank 0 prints the usual report; the
// other ranks print only their failures, prefixed with their rank. The number of failing
// ranks is allreduced, so a failure anywhere makes every rank, and mpiexec, exit non-zero.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include <gflow/transport/mpi.hpp>

int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  std::ostringstream quiet;
  if (rank != 0) {
    ctx.setOption("minimal", true);  // failures only
    ctx.setOption("no-colors", true);
    ctx.setCout(&quiet);
  }
  const int res = ctx.run();

  if (rank != 0 && res != 0) {
    std::istringstream lines(quiet.str());
    std::string out, line;
    while (std::getline(lines, line)) out += "[rank " + std::to_string(rank) + "] " + line + "\n";
    std::fputs(out.c_str(), stderr);
  }
  int failed = res != 0 ? 1 : 0;
  int failed_ranks = failed;
  MPI_Allreduce(&failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    if (failed_ranks != 0)
      std::printf("gflow_mpi_tests: FAILED on %d of %d rank(s) (see the [rank N] lines for ranks other than 0)\n", failed_ranks, size);
    else
      std::printf("gflow_mpi_tests: passed on all %d rank(s); MPI thread level %d\n", size, env.provided());
  }
  if (ctx.shouldExit()) return res;
  return failed_ranks != 0 ? 1 : 0;
}
