#pragma once
// gflow::mpi: the int count and displacement arrays of the variable-size collectives
// (MPI_Alltoallv, MPI_Allgatherv; transport/mpi.hpp). Their MPI-3 forms take int counts and int
// displacements; a count or a running total above INT_MAX raises gflow::invalid_argument("count")
// on the calling rank before any MPI call.
#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "../../error.hpp"

namespace gflow::mpi::detail {

/// counts[0..P) as int, and their packed displacements (prefix sums).
struct v_layout {
  std::vector<int> counts, displs;
  v_layout(const std::size_t* c, int P, const char* op) : counts(static_cast<std::size_t>(P)), displs(static_cast<std::size_t>(P)) {
    std::size_t at = 0;
    for (int q = 0; q < P; ++q) {
      const std::size_t n = c[q];
      if (n > static_cast<std::size_t>(INT_MAX) || at > static_cast<std::size_t>(INT_MAX) - n)
        throw invalid_argument("count",
                               fmt::format("{}: the block of rank {} ({} elements at offset {}) passes INT_MAX, the largest count or displacement "
                                           "MPI_Alltoallv / MPI_Allgatherv accept.",
                                           op, q, n, at),
                               "exchange fewer elements per call (smaller buckets: Fusion<bytes>).");
      counts[static_cast<std::size_t>(q)] = static_cast<int>(n);
      displs[static_cast<std::size_t>(q)] = static_cast<int>(at);
      at += n;
    }
  }
};

/// n as an int count for the MPI-3 forms, or invalid_argument("count").
inline int int_count(std::size_t n, const char* op) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw invalid_argument("count", fmt::format("{}: {} elements exceed INT_MAX.", op, n),
                           "exchange fewer elements per call (smaller buckets: Fusion<bytes>).");
  return static_cast<int>(n);
}

}  // namespace gflow::mpi::detail
