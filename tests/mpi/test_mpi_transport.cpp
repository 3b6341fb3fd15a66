// gflow::mpi::transport semantics on MPI_COMM_WORLD (any size >= 2; ctest runs 2 and 4 ranks).
// Every rank runs every test case and issues the same collectives in the same order; checks
// are CHECKs (not REQUIREs) wherever an early return on one rank would leave the others
// waiting in a collective.
#include <doctest/doctest.h>

#include <climits>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gflow/transport/mpi.hpp>

#include "mpi_test_util.hpp"

using gflow::reduce_op;
using gflow_test::from_double;
using gflow_test::to_double;

namespace {

constexpr std::size_t n = 1000;

// Rank r's element j: small integers, exact in every wire type (bf16 holds integers to 256).
double val(int r, std::size_t j) { return r + 1 + static_cast<double>(j % 7); }

template <class T>
std::vector<T> rank_values(int r, std::size_t count = n) {
  std::vector<T> v(count);
  for (std::size_t j = 0; j < count; ++j) v[j] = from_double<T>(val(r, j));
  return v;
}

double expect(reduce_op op, int P, std::size_t j) {
  switch (op) {
    case reduce_op::sum: return P * (P + 1) / 2.0 + P * static_cast<double>(j % 7);
    case reduce_op::max: return val(P - 1, j);
    case reduce_op::min: return val(0, j);
  }
  return 0;
}

template <class T>
int count_wrong(const std::vector<T>& got, reduce_op op, int P) {
  int wrong = 0;
  for (std::size_t j = 0; j < got.size(); ++j) wrong += to_double(got[j]) != expect(op, P, j);
  return wrong;
}

}  // namespace

#define GFLOW_MPI_TYPES float, double, gflow::half, gflow::bfloat16, std::int32_t

TEST_CASE("mpi transport: world group") {
  gflow::mpi::transport t;
  int r = -1, s = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  CHECK(t.rank() == r);
  CHECK(t.size() == s);
  CHECK(t.comm() == MPI_COMM_WORLD);
  CHECK_FALSE(t.owns_comm());
  CHECK(t.size() >= 2);
  gflow::mpi::transport::request none;
  CHECK_NOTHROW(t.wait(none));  // a default request is a no-op
  CHECK_NOTHROW(t.barrier());
}

TEST_CASE_TEMPLATE("mpi transport: all_reduce sum / max / min", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport t;
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
    const std::string op_name(gflow::to_string(op));
    CAPTURE(op_name);
    auto v = rank_values<T>(t.rank());
    t.all_reduce(v.data(), v.size(), op);
    CHECK(count_wrong(v, op, t.size()) == 0);

    auto w = rank_values<T>(t.rank());
    auto req = t.iall_reduce(w.data(), w.size(), op);
    t.wait(req);
    CHECK(count_wrong(w, op, t.size()) == 0);
    CHECK_NOTHROW(t.wait(req));  // already completed: no-op
  }
  // zero elements is a valid (empty) collective
  CHECK_NOTHROW(t.all_reduce(static_cast<T*>(nullptr), 0, reduce_op::sum));
}

TEST_CASE_TEMPLATE("mpi transport: all_gather is in rank order", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport t;
  const auto P = static_cast<std::size_t>(t.size());
  const auto mine = rank_values<T>(t.rank());
  std::vector<T> all(n * P, from_double<T>(-1));
  t.all_gather(mine.data(), all.data(), n);
  int wrong = 0;
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t j = 0; j < n; ++j) wrong += to_double(all[r * n + j]) != val(static_cast<int>(r), j);
  CHECK(wrong == 0);

  std::vector<T> all2(n * P, from_double<T>(-1));
  auto req = t.iall_gather(mine.data(), all2.data(), n);
  t.wait(req);
  CHECK(gflow_test::hash_bytes(all.data(), all.size() * sizeof(T)) == gflow_test::hash_bytes(all2.data(), all2.size() * sizeof(T)));
}

TEST_CASE_TEMPLATE("mpi transport: broadcast from a non-zero root", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport t;
  const int root = t.size() - 1;
  auto v = rank_values<T>(t.rank());
  t.broadcast(v.data(), v.size(), root);
  int wrong = 0;
  for (std::size_t j = 0; j < n; ++j) wrong += to_double(v[j]) != val(root, j);
  CHECK(wrong == 0);

  const int root2 = 1;
  auto w = rank_values<T>(t.rank());
  auto req = t.ibroadcast(w.data(), w.size(), root2);
  t.wait(req);
  wrong = 0;
  for (std::size_t j = 0; j < n; ++j) wrong += to_double(w[j]) != val(root2, j);
  CHECK(wrong == 0);
}

TEST_CASE_TEMPLATE("mpi transport: reduce to a non-zero root leaves the others' buffers alone", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport t;
  const int root = 1;
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
    const std::string op_name(gflow::to_string(op));
    CAPTURE(op_name);
    auto v = rank_values<T>(t.rank());
    const auto before = v;
    t.reduce(v.data(), v.size(), op, root);
    if (t.rank() == root) CHECK(count_wrong(v, op, t.size()) == 0);
    else CHECK(gflow_test::hash_bytes(v.data(), n * sizeof(T)) == gflow_test::hash_bytes(before.data(), n * sizeof(T)));

    auto w = rank_values<T>(t.rank());
    auto req = t.ireduce(w.data(), w.size(), op, root);
    t.wait(req);
    if (t.rank() == root) CHECK(count_wrong(w, op, t.size()) == 0);
    else CHECK(gflow_test::hash_bytes(w.data(), n * sizeof(T)) == gflow_test::hash_bytes(before.data(), n * sizeof(T)));
  }
}

TEST_CASE_TEMPLATE("mpi transport: send / recv around a ring", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport t;
  const int P = t.size(), r = t.rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  // Large enough to leave the eager protocol: a blocking send may wait for its receive, so
  // rank 0 sends first and everyone else receives first.
  const std::size_t big = 1 << 18;
  const auto mine = rank_values<T>(r, big);
  std::vector<T> got(big, from_double<T>(-1));
  if (r == 0) {
    t.send(mine.data(), big, next);
    t.recv(got.data(), big, prev);
  } else {
    t.recv(got.data(), big, prev);
    t.send(mine.data(), big, next);
  }
  int wrong = 0;
  for (std::size_t j = 0; j < big; ++j) wrong += to_double(got[j]) != val(prev, j);
  CHECK(wrong == 0);
}

TEST_CASE_TEMPLATE("mpi transport: isend / irecv in both directions", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport t;
  const int P = t.size(), r = t.rank();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  const auto mine = rank_values<T>(r);
  std::vector<T> from_prev(n, from_double<T>(-1)), from_next(n, from_double<T>(-1));
  auto a = t.irecv(from_prev.data(), n, prev);
  auto b = t.irecv(from_next.data(), n, next);
  auto c = t.isend(mine.data(), n, next);
  auto d = t.isend(mine.data(), n, prev);
  t.wait(d);
  t.wait(c);
  t.wait(b);
  t.wait(a);
  // With two ranks prev == next: the two messages from the peer arrive in the order sent
  // (MPI does not overtake), and both carry the same data.
  int wrong = 0;
  for (std::size_t j = 0; j < n; ++j) wrong += (to_double(from_prev[j]) != val(prev, j)) + (to_double(from_next[j]) != val(next, j));
  CHECK(wrong == 0);
}

TEST_CASE_TEMPLATE("mpi transport: split into even / odd ranks", T, GFLOW_MPI_TYPES) {
  gflow::mpi::transport world;
  const int P = world.size(), r = world.rank();
  // key = -rank: the sub-group is ordered by descending world rank.
  gflow::mpi::transport sub = world.split(r % 2, -r);
  CHECK(sub.owns_comm());
  CHECK(sub.comm() != MPI_COMM_WORLD);
  std::vector<int> members;
  for (int q = P - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  CHECK(sub.size() == static_cast<int>(members.size()));
  int expect_rank = 0;
  while (members[static_cast<std::size_t>(expect_rank)] != r) ++expect_rank;
  CHECK(sub.rank() == expect_rank);

  // A collective on the sub-group: sum of (world rank + 1) over same-parity ranks.
  T v[3] = {from_double<T>(r + 1), from_double<T>(1), from_double<T>(r)};
  sub.all_reduce(v, 3, reduce_op::sum);
  double want = 0;
  for (int q : members) want += q + 1;
  CHECK(to_double(v[0]) == want);
  CHECK(to_double(v[1]) == static_cast<double>(members.size()));
  T mx = from_double<T>(r);
  sub.all_reduce(&mx, 1, reduce_op::max);
  CHECK(to_double(mx) == members.front());

  // Copies share the communicator; it is freed when the last one goes.
  {
    gflow::mpi::transport copy = sub;
    CHECK(copy.comm() == sub.comm());
    copy.barrier();
  }
  sub.barrier();
  // A sub-group of the sub-group, then back on the world.
  gflow::mpi::transport solo = sub.split(sub.rank(), 0);
  CHECK(solo.size() == 1);
  CHECK(solo.rank() == 0);
  world.barrier();
}

TEST_CASE("mpi transport: every wire element maps to an MPI datatype") {
  gflow::mpi::transport t;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    auto v = rank_values<T>(t.rank(), 64);
    t.all_reduce(v.data(), v.size(), reduce_op::sum);
    CHECK(count_wrong(v, reduce_op::sum, t.size()) == 0);
    std::vector<T> all(64 * static_cast<std::size_t>(t.size()));
    const auto mine = rank_values<T>(t.rank(), 64);
    t.all_gather(mine.data(), all.data(), 64);
    CHECK(to_double(all.back()) == val(t.size() - 1, 63));
  };
  run(float{});
  run(double{});
  run(gflow::half{});
  run(gflow::bfloat16{});
  run(std::int32_t{});
  run(std::int64_t{});
  run(std::uint32_t{});
  run(std::uint64_t{});
  run(std::uint8_t{});
}

TEST_CASE_TEMPLATE("mpi transport: large random all_reduce is bitwise identical on every rank", T, float, gflow::half, gflow::bfloat16) {
  // Big enough for Open MPI's segmented / ring algorithms; values that do not add exactly,
  // so any rank-dependent summation order would show up in the bits.
  gflow::mpi::transport t;
  const std::size_t big = (1 << 20) + 17;
  std::vector<T> v(big);
  const std::uint64_t seed = gflow_test::mix(0x5eedull + static_cast<std::uint64_t>(t.rank()));
  for (std::size_t j = 0; j < big; ++j) v[j] = from_double<T>(gflow_test::uniform(seed, j));
  t.all_reduce(v.data(), big, reduce_op::sum);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(v.data(), big * sizeof(T))));
  auto req = t.iall_reduce(v.data(), big, reduce_op::sum);
  t.wait(req);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(v.data(), big * sizeof(T))));
}

TEST_CASE("mpi transport: 16-bit reductions: exact sums, fp16 overflow to inf, bf16 range") {
  gflow::mpi::transport t;
  // 1.0 on every rank: exact in fp16 at any of the tested sizes.
  gflow::half h = gflow::detail::kernels::to_half(1.0f);
  t.all_reduce(&h, 1, reduce_op::sum);
  CHECK(gflow::detail::kernels::to_float(h) == static_cast<float>(t.size()));
  // fp16 max is 65504: the sum of 40000 on two or more ranks overflows to +inf.
  gflow::half big = gflow::detail::kernels::to_half(40000.0f);
  t.all_reduce(&big, 1, reduce_op::sum);
  CHECK(gflow::detail::kernels::to_float(big) == std::numeric_limits<float>::infinity());
  // bf16 has float's range.
  gflow::bfloat16 b = gflow::detail::kernels::to_bfloat16(1e30f);
  t.all_reduce(&b, 1, reduce_op::max);
  CHECK(gflow::detail::kernels::to_float(b) == gflow::detail::kernels::to_float(gflow::detail::kernels::to_bfloat16(1e30f)));
}

TEST_CASE("mpi transport: invalid peers, roots, counts and colors raise invalid_argument") {
  gflow::mpi::transport t;
  const int P = t.size();
  float x[4] = {};
  CHECK_THROWS_AS(t.broadcast(x, 4, P), gflow::invalid_argument);
  CHECK_THROWS_AS(t.broadcast(x, 4, -1), gflow::invalid_argument);
  CHECK_THROWS_AS((void)t.ibroadcast(x, 4, P), gflow::invalid_argument);
  CHECK_THROWS_AS(t.reduce(x, 4, reduce_op::sum, P), gflow::invalid_argument);
  CHECK_THROWS_AS(t.reduce(x, 4, reduce_op::sum, -1), gflow::invalid_argument);
  CHECK_THROWS_AS(t.send(x, 4, P), gflow::invalid_argument);
  CHECK_THROWS_AS(t.recv(x, 4, -1), gflow::invalid_argument);
  CHECK_THROWS_AS((void)t.isend(x, 4, P + 7), gflow::invalid_argument);
  CHECK_THROWS_AS((void)t.irecv(x, 4, P), gflow::invalid_argument);
  try {
    t.broadcast(x, 4, P);
    FAIL("no exception");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "root");
    CHECK(std::string(e.what()).find("outside the group of " + std::to_string(P) + " ranks") != std::string::npos);
  }
  try {  // ERRORS.md M4
    (void)t.split(-1, 0);
    FAIL("no exception");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "color");
    CHECK(std::string(e.what()).find("split color -1 is negative; MPI_Comm_split needs a non-negative color.") != std::string::npos);
    CHECK(std::string(e.what()).find("Fix: pass a color >= 0") != std::string::npos);
  }

  // Counts beyond what this MPI can address are refused before any MPI call (no buffer is
  // touched, so none is allocated here).
  if constexpr (!gflow::mpi::has_large_count) {
    const std::size_t huge = static_cast<std::size_t>(INT_MAX) + 1;
    try {
      t.all_reduce(static_cast<float*>(nullptr), huge, reduce_op::sum);
      FAIL("no exception");
    } catch (const gflow::invalid_argument& e) {
      CHECK(e.subject() == "count");
      CHECK(std::string(e.what()).find("INT_MAX") != std::string::npos);
    }
    CHECK_THROWS_AS(t.all_gather(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), huge), gflow::invalid_argument);
    CHECK_THROWS_AS(t.broadcast(static_cast<double*>(nullptr), huge, 0), gflow::invalid_argument);
    CHECK_THROWS_AS((void)t.isend(static_cast<const float*>(nullptr), huge, 0), gflow::invalid_argument);
  }
  t.barrier();
}

TEST_CASE("mpi transport: MPI failures come back as transport_error / mismatch_error") {
  gflow::mpi::transport t;
  const int r = t.rank();
  float out[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float in[8] = {};
  // Truncation: rank 0 sends 8 floats, rank 1 has room for 4. MPI reports MPI_ERR_TRUNCATE.
  if (r == 0) t.send(out, 8, 1);
  if (r == 1) {
    try {
      t.recv(in, 4, 0);
      FAIL("no exception");
    } catch (const gflow::transport_error& e) {
      const std::string msg = e.what();
      CHECK(e.subject() == "recv");
      CHECK(msg.find("on rank 1 of " + std::to_string(t.size())) != std::string::npos);
      CHECK(msg.find("Fix:") != std::string::npos);
    }
  }
  // A short message: rank 0 sends 4 floats, rank 1 expects 8.
  if (r == 0) t.send(out, 4, 1);
  if (r == 1) {  // ERRORS.md M2
    try {
      t.recv(in, 8, 0);
      FAIL("no exception");
    } catch (const gflow::mismatch_error& e) {
      CHECK(e.subject() == "recv");
      CHECK(std::string(e.what()).find("rank 1 expected 8 elements from rank 0 but the message held 4.") != std::string::npos);
      CHECK(std::string(e.what()).find("Fix: make send and recv agree on count and element type.") != std::string::npos);
    }
  }
  t.barrier();
}
