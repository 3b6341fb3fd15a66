// Fault injection under mpiexec: what the surviving ranks report when a rank does not arrive.
// Run by tests/mpi/run_fault.cmake, which checks the printed lines and the elapsed time.
//
//   gflow_mpi_faults SCENARIO TIMEOUT_MS
//     never  the last rank stops before a bucket of iteration 1 and arrives only long after the
//            others timed out; everyone then completes the abandoned collective with raw MPI so
//            the job finalizes cleanly.
//     stuck  rank 1 waits in a recv from rank 0 that is never sent while the others wait in an
//            all_reduce: each side is named with what it is waiting in.
//     exit   the last rank calls std::_Exit in the middle of iteration 1 (run with Open MPI's
//            orte_allowed_exit_without_sync so that the job is not killed at once); survivors
//            report, then leave with _Exit too (their collective can never complete).
//
// Every rank prints one line:
//   FAULT rank=R kind=<timeout_error|transport_error|none> subject=<op> ms=<elapsed> what=<message>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>  // brings <mpi.h> without the deprecated C++ bindings

namespace {

using clock_type = std::chrono::steady_clock;

void report(int rank, const char* kind, const std::string& subject, clock_type::time_point since, const std::string& what) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - since).count();
  std::printf("FAULT rank=%d kind=%s subject=%s ms=%lld what=%s\n", rank, kind, subject.c_str(), static_cast<long long>(ms), what.c_str());
  std::fflush(stdout);
}

// Runs f and prints what it raised (or kind=none).
template <class F>
bool run_reporting(int rank, F&& f) {
  const auto t0 = clock_type::now();
  try {
    f();
  } catch (const gflow::timeout_error& e) {
    report(rank, "timeout_error", e.subject(), t0, e.what());
    return true;
  } catch (const gflow::transport_error& e) {
    report(rank, "transport_error", e.subject(), t0, e.what());
    return true;
  } catch (const std::exception& e) {
    report(rank, "other", "-", t0, e.what());
    return true;
  }
  report(rank, "none", "-", t0, "");
  return false;
}

constexpr std::size_t tensor_elems = 4096;  // 16 KiB: one bucket per tensor with an 8 KiB threshold
using Exchange = gflow::Exchanger<gflow::Fusion<8192>>;

void fill_and_ready(Exchange::on<gflow::mpi::transport>& ex, std::size_t i) {
  for (float& v : ex.view(i)) v = 1.0f;
  ex.ready(i);
}

int scenario_never(MPI_Comm comm, std::chrono::milliseconds timeout) {
  gflow::mpi::transport t(comm, timeout);
  const int me = t.rank(), late = t.size() - 1;
  const gflow::Layout l = gflow::Layout::from_sizes({tensor_elems, tensor_elems, tensor_elems, tensor_elems});
  Exchange::on<gflow::mpi::transport> ex(t, l);
  for (std::size_t i = l.size(); i-- > 0;) fill_and_ready(ex, i);  // iteration 0 on every rank
  (void)ex.finish();
  fill_and_ready(ex, 3);
  fill_and_ready(ex, 2);
  if (me == late) std::this_thread::sleep_for(timeout + t.grace() + std::chrono::milliseconds(1500));
  run_reporting(me, [&] { fill_and_ready(ex, 1); });
  // Every rank has now started that bucket's all_reduce on its issuing thread (the callers gave
  // up on it): it completes once the late rank joins, so MPI finalizes cleanly. Until it has, MPI
  // may still write the exchanger's pool: settle() before the exchanger goes.
  MPI_Barrier(MPI_COMM_WORLD);
  if (!t.settle(std::chrono::seconds(30))) std::printf("FAULT rank=%d unsettled\n", me);
  return 0;
}

int scenario_stuck(MPI_Comm comm, std::chrono::milliseconds timeout) {
  gflow::mpi::transport t(comm, timeout);
  const int me = t.rank();
  std::vector<float> buf(64, 1.0f);
  t.barrier();
  if (me == 1) {
    // Starts later than the others, so it is still waiting when they time out and ask.
    std::this_thread::sleep_for(t.grace() + std::chrono::milliseconds(300));
    run_reporting(me, [&] { t.recv(buf.data(), buf.size(), 0); });
    // Complete the collective the others abandoned (their issuing threads are still in it), so
    // that MPI can finalize. Blocking, as theirs: MPI never matches a blocking collective with a
    // non-blocking one.
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm);
  } else {
    run_reporting(me, [&] { t.all_reduce(buf.data(), buf.size(), gflow::reduce_op::sum); });
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 1 has given up on its recv: now send what it waited for
  if (me == 0) MPI_Send(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, 1, gflow::mpi::transport::tag, comm);
  MPI_Barrier(MPI_COMM_WORLD);
  if (!t.settle(std::chrono::seconds(30))) std::printf("FAULT rank=%d unsettled\n", me);  // buf outlives the abandoned all_reduce
  return 0;
}

int scenario_exit(MPI_Comm comm, std::chrono::milliseconds timeout) {
  gflow::mpi::transport t(comm, timeout);
  const int me = t.rank(), dying = t.size() - 1;
  const gflow::Layout l = gflow::Layout::from_sizes({tensor_elems, tensor_elems, tensor_elems, tensor_elems});
  Exchange::on<gflow::mpi::transport> ex(t, l);
  for (std::size_t i = l.size(); i-- > 0;) fill_and_ready(ex, i);
  (void)ex.finish();
  fill_and_ready(ex, 3);
  if (me == dying) {
    std::printf("FAULT rank=%d exits\n", me);
    std::fflush(stdout);
    std::_Exit(0);
  }
  run_reporting(me, [&] { fill_and_ready(ex, 2); });
  std::fflush(stdout);
  std::_Exit(0);  // the abandoned collective can never complete: MPI_Finalize could wait for the dead rank
}

}  // namespace

int main(int argc, char** argv) {
  gflow::mpi::environment env(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: gflow_mpi_faults never|stuck|exit TIMEOUT_MS\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const std::chrono::milliseconds timeout(std::atoll(argv[2]));
  MPI_Comm comm = MPI_COMM_NULL;  // the faults happen on a communicator of their own
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  int rc = 2;
  if (scenario == "never") rc = scenario_never(comm, timeout);
  else if (scenario == "stuck") rc = scenario_stuck(comm, timeout);
  else if (scenario == "exit") rc = scenario_exit(comm, timeout);
  else std::fprintf(stderr, "gflow_mpi_faults: unknown scenario '%s'\n", scenario.c_str());
  MPI_Comm_free(&comm);
  return rc;
}
