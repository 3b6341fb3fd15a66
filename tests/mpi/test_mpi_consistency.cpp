// Issue 6 over MPI: the exchanger's cross-rank consistency check, and the transport's two wait
// paths (blocking calls without a timeout, non-blocking calls polled against a deadline with
// one) giving the same results. Faults that leave a collective unfinished (a rank that never
// arrives, one that exits) run in their own processes: fault_driver.cpp and run_fault.cmake.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "mpi_test_util.hpp"

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

gflow::Layout layout_for(int rank, bool differ) {
  std::vector<gflow::tensor_desc> ts = {{"embed", {100, 8}, 800}, {"block.w", {8, 8}, 64}, {"block.b", {8}, 8}, {"head", {8, 3}, 24}};
  if (differ && rank == 1) ts[1] = {"block.w", {8, 4}, 32};
  return gflow::Layout(ts);
}

/// Every rank's message from constructing `E` over t ("" if it did not throw mismatch_error).
template <class E>
std::string construct(gflow::mpi::transport& t, const gflow::Layout& l, gflow::exchange_options o = {}) {
  try {
    typename E::template on<gflow::mpi::transport> ex(t, l, o);
  } catch (const gflow::mismatch_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("mpi consistency: a layout that differs on rank 1 raises mismatch_error on every rank, then the transport works on") {
  gflow::mpi::transport t;
  const std::string s = construct<gflow::Exchanger<gflow::Fusion<256>>>(t, layout_for(t.rank(), true));
  CHECK(has(s, "gflow: rank mismatch in 'layout'"));
  CHECK(has(s, "the first difference is tensor 1 (layout index, forward order): rank 0 has 'block.w' [8x8] (64 elements), "
               "rank 1 has 'block.w' [8x4] (32 elements)"));
  CHECK(has(s, "ranks whose layout differs from rank 0's: 1."));
  CHECK(has(s, "Raised on rank " + std::to_string(t.rank()) + " of " + std::to_string(t.size()) + "."));
  // Every rank took the same path: the communicator is in step and usable.
  float v = 1.0f;
  t.all_reduce(&v, 1, gflow::reduce_op::sum);
  CHECK(v == static_cast<float>(t.size()));
  CHECK(gflow_test::same_on_all_ranks(t, t.collectives_started()));
}

TEST_CASE("mpi consistency: different compositions and options are named; identical ones pass") {
  gflow::mpi::transport t;
  using Fp32 = gflow::Exchanger<gflow::Fusion<256>>;
  using Fp16 = gflow::Exchanger<gflow::Fusion<256>, gflow::Precision<gflow::half>>;
  const gflow::Layout l = layout_for(t.rank(), false);
  const std::string s = t.rank() == t.size() - 1 ? construct<Fp16>(t, l) : construct<Fp32>(t, l);
  CHECK(has(s, "rank mismatch in 'policies'"));
  CHECK(has(s, "uses <gflow::Precision<gflow::half>"));
  CHECK(has(s, "composition differs from rank 0's: " + std::to_string(t.size() - 1) + "."));

  gflow::exchange_options o;
  o.average = t.rank() == 0;
  const std::string s2 = construct<Fp32>(t, l, o);
  CHECK(has(s2, "rank mismatch in 'exchange_options'"));
  CHECK(has(s2, "rank 0 has average true, find_unused false, learn_order false, uneven_inputs false, rank 1 has average false, "
                "find_unused false, learn_order false, uneven_inputs false"));

  CHECK(construct<Fp16>(t, l).empty());
}

TEST_CASE("mpi timeouts: blocking (no timeout) and polled (timeout) paths give the same results") {
  using namespace std::chrono_literals;
  for (auto timeout : {0ms, 30000ms}) {
    CAPTURE(timeout.count());
    gflow::mpi::transport t(MPI_COMM_WORLD, timeout);
    CHECK(t.timeout() == timeout);
    const int P = t.size(), r = t.rank();
    std::vector<float> a(333, static_cast<float>(r + 1));
    t.all_reduce(a.data(), a.size(), gflow::reduce_op::sum);
    CHECK(a[332] == static_cast<float>(P * (P + 1) / 2));
    std::vector<std::int32_t> mine(5, r), all(5 * static_cast<std::size_t>(P));
    t.all_gather(mine.data(), all.data(), mine.size());
    for (int q = 0; q < P; ++q) CHECK(all[static_cast<std::size_t>(q) * 5 + 4] == q);
    double b = r == P - 1 ? 2.5 : 0.0;
    t.broadcast(&b, 1, P - 1);
    CHECK(b == 2.5);
    std::int64_t red = r + 1;
    t.reduce(&red, 1, gflow::reduce_op::max, 0);
    if (r == 0) CHECK(red == P);
    t.barrier();
    // a ring of sends, and the i-forms
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    std::uint64_t out = static_cast<std::uint64_t>(r) * 10, in = 0;
    auto rq = t.irecv(&in, 1, prev);
    auto sq = t.isend(&out, 1, next);
    t.wait(sq);
    t.wait(rq);
    CHECK(in == static_cast<std::uint64_t>(prev) * 10);
    if (P % 2 == 0) {  // even ranks send to the odd ones (blocking forms)
      if (r % 2 == 0) t.send(&out, 1, next);
      if (r % 2 == 1) {
        t.recv(&in, 1, prev);
        CHECK(in == static_cast<std::uint64_t>(prev) * 10);
      }
    }
    float s = 1.0f;
    auto iq = t.iall_reduce(&s, 1, gflow::reduce_op::sum);
    t.wait(iq);
    CHECK(s == static_cast<float>(P));
    gflow::mpi::transport sub = t.split(r % 2, r);
    CHECK(sub.timeout() == timeout);  // sub-groups inherit it
    float u = 1.0f;
    sub.all_reduce(&u, 1, gflow::reduce_op::sum);
    CHECK(u == static_cast<float>(sub.size()));
    CHECK(gflow_test::same_on_all_ranks(t, t.collectives_started()));
  }
}

TEST_CASE("mpi timeouts: bad timeouts are invalid_argument before any collective") {
  gflow::mpi::transport t;
  CHECK_THROWS_AS(t.set_timeout(std::chrono::milliseconds(-1)), gflow::invalid_argument);
  try {  // ERRORS.md X10
    gflow::mpi::transport bad(MPI_COMM_WORLD, std::chrono::milliseconds(-5));
    FAIL("no exception");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "timeout");
    CHECK(std::string(e.what()).find("a timeout of -5 ms is negative. Fix: pass a duration >= 0 (0 turns timeouts off).") != std::string::npos);
  }
  gflow::mpi::transport fresh;  // no environment variable changes it
  CHECK(fresh.timeout() == gflow::mpi::default_timeout);
  CHECK(fresh.timeout() == std::chrono::minutes(10));  // README: timeouts on by default, 10 min
  gflow::mpi::transport explicit_(MPI_COMM_WORLD, std::chrono::milliseconds(30500));
  CHECK(explicit_.timeout() == std::chrono::milliseconds(30500));
}
