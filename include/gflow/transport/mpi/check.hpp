#pragma once
// gflow::mpi, part 1 of 6: <mpi.h> and the check every MPI call goes through.
// (transport/mpi.hpp includes all the parts; include that one.)
// The MPI-2 C++ bindings (deprecated, removed in MPI-3) are not used: skip them, so that
// gflow::mpi needs only the C library (MPI::MPI_C) and compiles without their warnings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

// SimGrid's SMPI (bench/simulate.sh) compiles gflow::mpi against its own <mpi.h> (MPI 3.1, its
// macro SMPI_SHARED_MALLOC tells it apart). Its ranks are user-level contexts of one process, so
// the transport adapts in two places, and only there (docs/DESIGN.md "Simulated clusters"):
//   - MPI_Comm_idup is not implemented: the control communicator comes from MPI_Comm_dup;
//   - no MPI call may come from a thread SMPI did not start: timeouts are not applied (timed()
//     is false whatever set_timeout says; SimGrid reports a deadlock itself), so no issuing thread.
namespace gflow::mpi::detail {
#if defined(SMPI_SHARED_MALLOC)
inline constexpr bool smpi = true;
#else
inline constexpr bool smpi = false;
#endif
}  // namespace gflow::mpi::detail

#include "../../error.hpp"

namespace gflow::mpi::detail {

inline std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS || len <= 0) return fmt::format("MPI error code {}", code);
  return std::string(buf, static_cast<std::size_t>(len));
}

/// Throws transport_error for a failed call. `where` is "on rank R of N" or similar.
inline void check(int rc, const char* op, const std::string& where, const char* fix = nullptr) {
  if (rc == MPI_SUCCESS) return;
  throw transport_error(op, error_text(rc) + " " + where + ".",
                        fix ? fix
                            : "check that every rank issues the same operations in the same order with matching counts, "
                              "element types and roots, and that MPI is initialised (gflow::mpi::environment).");
}

}  // namespace gflow::mpi::detail
