// MPI's lifetime around gflow::mpi (ERRORS.md: the 'comm' and 'environment' errors), which the
// doctest executable cannot reach (MPI is initialised around it). One process, under mpiexec -n 1:
//   a transport before MPI is initialised, one on MPI_COMM_NULL, one after MPI_Finalize, and a
//   second environment after MPI_Finalize: each must raise the documented class, subject and text.
// Prints one line per check; exits 1 when any failed.
#include <cstdio>
#include <functional>
#include <string>

#include <gflow/transport/mpi.hpp>

namespace {
int failed = 0;

template <class Err>
void expect(const char* what, const std::string& subject, const std::string& text, const std::function<void()>& f) {
  std::string got = "no exception";
  bool ok = false;
  try {
    f();
  } catch (const Err& e) {
    got = e.what();
    ok = e.subject() == subject && got.find(text) != std::string::npos && got.find(" Fix: ") != std::string::npos;
  } catch (const std::exception& e) {
    got = std::string("another exception: ") + e.what();
  }
  std::printf("%s %s: %s\n", ok ? "ok  " : "FAIL", what, got.c_str());
  if (!ok) ++failed;
}
}  // namespace

int main(int argc, char** argv) {
  expect<gflow::usage_error>("transport before MPI_Init", "comm", "MPI is not initialised.", [] { gflow::mpi::transport t; });
  {
    gflow::mpi::environment env(argc, argv);
    expect<gflow::invalid_argument>("transport on MPI_COMM_NULL", "comm", "the communicator is MPI_COMM_NULL.",
                                    [] { gflow::mpi::transport t(MPI_COMM_NULL); });
  }  // MPI_Finalize
  expect<gflow::usage_error>("transport after MPI_Finalize", "comm", "MPI is already finalized.", [] { gflow::mpi::transport t; });
  expect<gflow::usage_error>("environment after MPI_Finalize", "environment", "it cannot be initialised again.",
                             [&] { gflow::mpi::environment again(argc, argv); });
  std::printf("%d failure(s)\n", failed);
  return failed == 0 ? 0 : 1;
}
