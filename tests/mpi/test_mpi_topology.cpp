// Topology<Hierarchical<g>> and Topology<Hybrid<threshold, g>> over gflow::mpi::transport: the
// three-phase sum equals MPI_Allreduce (bitwise on integer-valued inputs, within rounding
// otherwise) for every group size 1..P, dividing P or not; results are bitwise identical on
// every rank; a group size above P is refused on every rank without a hang.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/policies/topology.hpp>
#include <gflow/transport/mpi.hpp>

#include "mpi_test_util.hpp"

namespace {

using mpi_t = gflow::mpi::transport;
using engine_t = gflow::Hierarchical<1>::engine<mpi_t>;  // group size given at run time below

// Integer-valued in [-8, 8]: sums are exact in every type and order.
double int_value(int rank, std::size_t j, int salt) {
  return static_cast<double>(static_cast<int>((static_cast<std::size_t>(rank) * 7 + j * 5 + static_cast<std::size_t>(salt) * 3) % 17) - 8);
}

template <class T, class E>
void check_engine_int(mpi_t& t, E& e, std::size_t n, int salt) {
  const int P = t.size(), r = t.rank();
  std::vector<T> hier(n), ring(n);
  for (std::size_t j = 0; j < n; ++j) hier[j] = ring[j] = gflow_test::from_double<T>(int_value(r, j, salt));
  e.run(hier.data(), n);
  t.all_reduce(ring.data(), n, gflow::reduce_op::sum);
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < n; ++j) {
    double sum = 0;
    for (int q = 0; q < P; ++q) sum += int_value(q, j, salt);
    if (gflow_test::to_double(hier[j]) != sum) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(std::memcmp(hier.data(), ring.data(), n * sizeof(T)) == 0);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(hier.data(), n * sizeof(T))));

  // start / wait gives the same sum (on MPI start runs the phases and returns completed).
  std::vector<T> again(n);
  for (std::size_t j = 0; j < n; ++j) again[j] = gflow_test::from_double<T>(int_value(r, j, salt));
  auto q = e.start(again.data(), n);
  e.wait(q);
  CHECK(std::memcmp(again.data(), hier.data(), n * sizeof(T)) == 0);
}

template <class E>
void check_engine_real(mpi_t& t, E& e, std::size_t n) {
  const int P = t.size(), r = t.rank();
  std::vector<float> hier(n), ring(n);
  for (std::size_t j = 0; j < n; ++j) hier[j] = ring[j] = gflow_test::uniform(gflow_test::mix(static_cast<std::uint64_t>(r)), j);
  e.run(hier.data(), n);
  t.all_reduce(ring.data(), n, gflow::reduce_op::sum);
  std::size_t off = 0;
  for (std::size_t j = 0; j < n; ++j) {
    double abs = 0;
    for (int q = 0; q < P; ++q) abs += std::fabs(gflow_test::uniform(gflow_test::mix(static_cast<std::uint64_t>(q)), j));
    // each side's sum is off the exact one by at most (P-1) u sum|g|
    if (std::fabs(static_cast<double>(hier[j]) - ring[j]) > 2.0 * P * 0x1p-24 * abs) ++off;
  }
  CHECK(off == 0);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(hier.data(), n * sizeof(float))));
}

gflow::Layout small_layout() { return gflow::Layout::from_sizes({1000, 3, 257, 4096, 1, 130}); }

float grad_int(int rank, std::size_t tensor, std::size_t j, int iter) {
  return static_cast<float>(int_value(rank, j + 31 * tensor, iter));
}
float grad_real(int rank, std::size_t tensor, std::size_t j, int iter) {
  return gflow_test::uniform(gflow_test::mix((static_cast<std::uint64_t>(iter) << 40) ^ (static_cast<std::uint64_t>(rank) << 32) ^ tensor), j);
}

/// Two iterations of composition E (ready in reverse on odd ranks); the pool afterwards.
template <class E, class G>
std::vector<float> exchange(mpi_t& t, G grad) {
  typename E::template on<mpi_t> ex(t, small_layout());
  for (int it = 0; it < 2; ++it) {
    const std::size_t L = ex.layout().size();
    for (std::size_t k = 0; k < L; ++k) {
      const std::size_t i = t.rank() % 2 ? L - 1 - k : k;
      auto v = ex.view(i);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = grad(t.rank(), i, j, it);
      ex.ready(i);
    }
    CHECK(ex.finish().finite());
  }
  return {ex.pool_data(), ex.pool_data() + ex.pool_size()};
}

template <class Topo, class... Extra>
void check_exchanger_int(mpi_t& t) {
  const auto hier = exchange<gflow::Exchanger<gflow::Topology<Topo>, Extra...>>(t, grad_int);
  const auto ring = exchange<gflow::Exchanger<Extra...>>(t, grad_int);
  REQUIRE(hier.size() == ring.size());
  CHECK(std::memcmp(hier.data(), ring.data(), hier.size() * sizeof(float)) == 0);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(hier.data(), hier.size() * sizeof(float))));
}

}  // namespace

TEST_CASE("mpi topology: the hierarchical engine sums like MPI_Allreduce for every group size 1..P") {
  mpi_t t;
  const int P = t.size();
  for (int g = 1; g <= P; ++g) {
    CAPTURE(g);
    engine_t e(t, g);
    const int groups = (P + g - 1) / g, k = t.rank() / g;
    CHECK(e.groups().groups == groups);
    CHECK(e.group().size() == (k + 1 < groups ? g : P - (groups - 1) * g));
    CHECK(e.group().rank() == t.rank() % g);
    CHECK(e.is_master() == (t.rank() % g == 0));
    if (e.is_master()) CHECK(e.masters().size() == groups);
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{100003}}) {
      CAPTURE(n);
      check_engine_int<float>(t, e, n, g);
      check_engine_int<double>(t, e, n, g);
      check_engine_int<std::int32_t>(t, e, n, g);
      check_engine_real(t, e, n);
    }
  }
}

TEST_CASE("mpi topology: Exchanger with Hierarchical / Hybrid equals the ring bit for bit on integer inputs") {
  mpi_t t;
  check_exchanger_int<gflow::Hierarchical<1>, gflow::Fusion<1024>>(t);
  check_exchanger_int<gflow::Hierarchical<2>, gflow::Fusion<1024>>(t);
  check_exchanger_int<gflow::Hierarchical<2>>(t);
  check_exchanger_int<gflow::Hybrid<2048, 2>>(t);  // no fusion: 1000 / 4096-element tensors ring, the rest hierarchical
  check_exchanger_int<gflow::Hybrid<8192, 2>, gflow::Fusion<1024>>(t);
  if (t.size() >= 3) {
    check_exchanger_int<gflow::Hierarchical<3>, gflow::Fusion<1024>>(t);  // 4 ranks: groups {0,1,2} {3}
    check_exchanger_int<gflow::Hybrid<2048, 3>>(t);
  }
}

TEST_CASE("mpi topology: fp16 wire through Hierarchical, within rounding of the ring and identical on every rank") {
  mpi_t t;
  using H = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<1024>, gflow::Topology<gflow::Hierarchical<2>>>;
  using R = gflow::Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<1024>>;
  const auto hier = exchange<H>(t, grad_real);
  const auto ring = exchange<R>(t, grad_real);
  const int P = t.size();
  // Inputs in [-1, 1) divided by P; a 16-bit MPI sum rounds at every pairwise combine, so each
  // side is within (P-1) u16 sum|g/P| (+ subnormal floors) of the exact sum.
  std::size_t off = 0;
  for (std::size_t j = 0; j < hier.size(); ++j)
    if (std::fabs(static_cast<double>(hier[j]) - ring[j]) > 2.0 * P * 0x1p-11 + 4 * P * 0x1p-25) ++off;
  CHECK(off == 0);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(hier.data(), hier.size() * sizeof(float))));
}

TEST_CASE("mpi topology: a group size above P is refused on every rank, and the ranks stay in step") {
  mpi_t t;
  int refused = 0;
  try {
    gflow::Exchanger<gflow::Topology<gflow::Hierarchical<5>>>::on<mpi_t> ex(t, small_layout());
  } catch (const gflow::invalid_argument& e) {
    refused = e.subject() == "group_size" && std::string(e.what()).find("exceeds the " + std::to_string(t.size()) + " ranks") != std::string::npos;
  }
  CHECK(refused == 1);
  int all = refused;
  t.all_reduce(&all, 1, gflow::reduce_op::sum);  // a rank left inside a split would hang here (ctest TIMEOUT)
  CHECK(all == t.size());
}
