// Topology<Hierarchical<g>> and Topology<Hybrid<threshold, g>>: what goes on the wire (mock
// transport with a split rule), results against the flat ring on the in-process transport for
// P = 1..9 and every group size 1..P, and bad input. The group plan itself: plan/test_groups.cpp.
#include <doctest/doctest.h>

#include "compositions.hpp"
#include "test_values.hpp"
#include <gflow/exchanger.hpp>
#include <gflow/detail/plan/groups.hpp>
#include <gflow/policies/topology.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace gflow;
using gflow_test::mock_t;
using gflow_test::played_rank;

namespace {

struct call {
  mock::op kind;
  std::string group;
  std::size_t count;
  int peer;
};
std::vector<call> calls_of(const mock_t& m) {
  std::vector<call> out;
  for (const auto& r : m.calls().records) out.push_back({r.kind, r.group, r.count, r.peer});
  return out;
}
void check_calls(const std::vector<call>& got, const std::vector<call>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(mock::to_string(got[i].kind) == std::string(mock::to_string(want[i].kind)));
    CHECK(got[i].group == want[i].group);
    CHECK(got[i].count == want[i].count);
    CHECK(got[i].peer == want[i].peer);
  }
}

}  // namespace

// ============================================================================================
// Mock transport: what goes on the wire
// ============================================================================================

TEST_CASE("mock: Hierarchical<4> on 10 ranks splits once and issues reduce / allreduce / broadcast on the right groups") {
  using engine = Hierarchical<4>::engine<mock_t>;
  // P = 10, g = 4: groups {0..3} {4..7} {8,9}; masters 0, 4, 8 (colour 3); spare group colour 4.
  struct row {
    int rank;
    std::string group;
    int group_size, local;
    bool master;
  };
  const row rows[] = {{0, "world/0", 4, 0, true}, {1, "world/0", 4, 1, false}, {4, "world/1", 4, 0, true},
                      {7, "world/1", 4, 3, false}, {8, "world/2", 2, 0, true}, {9, "world/2", 2, 1, false}};
  for (const auto& w : rows) {
    CAPTURE(w.rank);
    auto m = played_rank(10, w.rank, 4);
    engine e(m);
    // Construction: exactly two splits of the world, group first.
    const int group_colour = w.rank / 4;
    check_calls(calls_of(m), {{mock::op::split, "world", 0, group_colour}, {mock::op::split, "world", 0, w.master ? 3 : 4}});
    CHECK(e.group().size() == w.group_size);
    CHECK(e.group().rank() == w.local);
    CHECK(e.is_master() == w.master);
    if (w.master) {
      CHECK(e.masters().size() == 3);
      CHECK(e.masters().rank() == w.rank / 4);
    } else {
      CHECK(e.masters().size() == 7);  // the spare group of non-masters
    }

    m.calls().clear();
    std::vector<float> buf(100, 1.0f);
    e.run(buf.data(), buf.size());
    std::vector<call> want{{mock::op::reduce, w.group, 100, 0}};
    if (w.master) want.push_back({mock::op::all_reduce, "world/3", 100, -1});
    want.push_back({mock::op::broadcast, w.group, 100, 0});
    check_calls(calls_of(m), want);
    for (const auto& r : m.calls().records) {
      CHECK(r.type == dtype::f32);
      CHECK(r.bytes == 400);
      CHECK_FALSE(r.async);
    }

    // Host transport: start runs the same phases (blocking) and hands back a completed request.
    m.calls().clear();
    auto q = e.start(buf.data(), buf.size());
    check_calls(calls_of(m), want);
    e.wait(q);
    CHECK(m.calls().records.size() == want.size());  // nothing left to wait for
  }
}

TEST_CASE("mock: one-rank phases are skipped (g = 1: masters' allreduce only; g = P: reduce and broadcast only)") {
  auto a = played_rank(4, 2, 1);
  Hierarchical<1>::engine<mock_t> e1(a);
  CHECK(e1.is_master());
  a.calls().clear();
  std::vector<half> h(7);
  e1.run(h.data(), h.size());
  check_calls(calls_of(a), {{mock::op::all_reduce, "world/4", 7, -1}});
  CHECK(a.calls().records[0].type == dtype::f16);
  CHECK(a.calls().records[0].bytes == 14);

  auto b = played_rank(4, 0, 4);
  Hierarchical<4>::engine<mock_t> e4(b);
  CHECK(e4.masters().size() == 1);
  b.calls().clear();
  std::vector<float> f(5);
  e4.run(f.data(), f.size());
  check_calls(calls_of(b), {{mock::op::reduce, "world/0", 5, 0}, {mock::op::broadcast, "world/0", 5, 0}});

  mock_t solo(1, 0);  // P = 1: both splits of one rank, nothing on the wire
  Hierarchical<1>::engine<mock_t> e0(solo);
  solo.calls().clear();
  e0.run(f.data(), f.size());
  CHECK(solo.calls().records.empty());
}

TEST_CASE("mock: Hybrid picks hierarchical below the threshold and ring at or above it, by wire bytes") {
  auto m = played_rank(4, 0, 2);  // groups {0,1} {2,3}; masters colour 2
  Hybrid<400, 2>::engine<mock_t> e(m);
  CHECK(e.threshold() == 400);
  const std::vector<call> hier99{{mock::op::reduce, "world/0", 99, 0}, {mock::op::all_reduce, "world/2", 99, -1}, {mock::op::broadcast, "world/0", 99, 0}};
  std::vector<float> f(200);
  std::vector<half> h(200);

  m.calls().clear();
  e.run(f.data(), 99);  // 396 B < 400: hierarchical
  check_calls(calls_of(m), hier99);
  m.calls().clear();
  e.run(f.data(), 100);  // 400 B: ring, the transport's own allreduce on the world
  check_calls(calls_of(m), {{mock::op::all_reduce, "world", 100, -1}});
  m.calls().clear();
  e.run(h.data(), 199);  // 398 B of fp16: hierarchical
  CHECK(m.calls().of(mock::op::reduce).size() == 1);
  CHECK(m.calls().of(mock::op::all_reduce).at(0).group == "world/2");
  m.calls().clear();
  e.run(h.data(), 200);  // 400 B of fp16: ring
  check_calls(calls_of(m), {{mock::op::all_reduce, "world", 200, -1}});

  SUBCASE("start / wait: ring uses the non-blocking allreduce, hierarchical completes in start") {
    m.calls().clear();
    auto r = e.start(f.data(), 100);
    CHECK(m.calls().records.at(0).async);
    e.wait(r);
    CHECK(m.calls().of(mock::op::wait).size() == 1);
    m.calls().clear();
    auto q = e.start(f.data(), 99);
    e.wait(q);
    check_calls(calls_of(m), hier99);
  }
  SUBCASE("run-time threshold override, validated") {
    e.set_threshold(1000);
    CHECK(e.hierarchical_for<float>(100));
    CHECK_FALSE(e.hierarchical_for<float>(250));
    try {
      e.set_threshold(0);
      FAIL("expected an error");
    } catch (const gflow::invalid_argument& err) {
      CHECK(err.subject() == "threshold_bytes");
      CHECK(std::string(err.what()).find("Fix: pass the message size in bytes") != std::string::npos);
    }
    CHECK(e.threshold() == 1000);  // a rejected value leaves the threshold as it was
  }
}

TEST_CASE("mock: the Exchanger routes every bucket through Hybrid, by the bucket's wire size") {
  // No fusion: one message per tensor, generation order t3, t2, t1, t0. Threshold 400 B.
  auto l = Layout::from_sizes({10, 200, 10, 300});
  auto m = played_rank(4, 1, 2);  // rank 1: non-master of group {0,1}
  Exchanger<Topology<Hybrid<400, 2>>>::on<mock_t> ex(m, l);
  m.calls().clear();
  for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
  (void)ex.finish();
  check_calls(calls_of(m), {{mock::op::all_reduce, "world", 300, -1},  // t3: 1200 B, ring
                            {mock::op::reduce, "world/0", 10, 0},      // t2: 40 B, hierarchical (non-master: no allreduce)
                            {mock::op::broadcast, "world/0", 10, 0},
                            {mock::op::all_reduce, "world", 200, -1},  // t1: 800 B, ring
                            {mock::op::reduce, "world/0", 10, 0},      // t0
                            {mock::op::broadcast, "world/0", 10, 0}});

  // fp16 wire: the threshold counts wire bytes, so 200 elements (400 B) now go ring and the
  // hierarchical phases carry f16.
  auto m2 = played_rank(4, 0, 2);
  Exchanger<Precision<half>, Topology<Hybrid<401, 2>>>::on<mock_t> ex2(m2, l);
  m2.calls().clear();
  for (std::size_t i = 0; i < l.size(); ++i) ex2.ready(i);
  (void)ex2.finish();
  const auto ar = m2.calls().of(mock::op::all_reduce);
  REQUIRE(ar.size() == 4);
  CHECK(ar[0].group == "world");    // t3: 600 B
  CHECK(ar[1].group == "world/2");  // t2: 20 B, masters' allreduce
  CHECK(ar[2].group == "world/2");  // t1: 400 B < 401
  CHECK(ar[3].group == "world/2");  // t0
  CHECK(ar[1].type == dtype::f16);
}

TEST_CASE("mock: a transport whose split ignores colours is refused, not trusted") {
  mock_t m(4, 0);  // no split rule: sub-groups keep all 4 ranks
  try {
    Hierarchical<2>::engine<mock_t> e(m);
    FAIL("expected an error");
  } catch (const gflow::transport_error& err) {
    CHECK(err.subject() == "split");
    CHECK(std::string(err.what()).find("group sub-group of rank 0 of 4 has 4 ranks") != std::string::npos);
  }
}

TEST_CASE("bad group sizes and thresholds raise invalid_argument naming the parameter") {
  mock_t m(4, 0);
  try {
    Exchanger<Topology<Hierarchical<5>>>::on<mock_t> ex(m, Layout::from_sizes({3}));
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "group_size");
    CHECK(std::string(e.what()).find("group size 5 exceeds the 4 ranks of the transport") != std::string::npos);
  }
  CHECK(m.calls().of(mock::op::split).empty());  // refused before any collective
  CHECK_THROWS_AS((Hierarchical<2>::engine<mock_t>(m, 0)), gflow::invalid_argument);
  CHECK_THROWS_AS((Exchanger<Topology<Hybrid<64, 8>>>::on<mock_t>(m, Layout::from_sizes({3}))), gflow::invalid_argument);
  try {
    Hybrid<64, 2>::engine<mock_t> e(m, 0, 2);
    FAIL("expected an error");
  } catch (const gflow::invalid_argument& e) {
    CHECK(e.subject() == "threshold_bytes");
  }
}

// ============================================================================================
// In-process transport: results against the flat ring
// ============================================================================================

namespace {

std::vector<std::size_t> grid_sizes() { return {1000, 3, 257, 64, 1, 77, 130}; }

// Integer-valued gradients in [-8, 8]: every sum is exact in fp32, whatever the order.
float int_value(int rank, std::size_t tensor, std::size_t j, int iter) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 7 + tensor * 13 + j * 5 + static_cast<std::size_t>(iter) * 3) % 17) - 8);
}
using gflow_test::uniform_value;

/// Runs `iters` iterations of exchanger E on P in-process ranks with gradients value(rank, ...),
/// ready in reverse order on odd ranks; returns every rank's pool after the last iteration.
template <class E, class V>
std::vector<std::vector<float>> exchange(int P, const Layout& l, V value, int iters = 2) {
  std::vector<std::vector<float>> pools(static_cast<std::size_t>(P));
  inproc::run(
      P,
      [&](inproc::transport& t) {
        typename E::template on<inproc::transport> ex(t, l);
        for (int it = 0; it < iters; ++it) {
          for (std::size_t k = 0; k < l.size(); ++k) {
            const std::size_t i = t.rank() % 2 ? l.size() - 1 - k : k;
            auto v = ex.view(i);
            for (std::size_t j = 0; j < v.size(); ++j) v[j] = value(t.rank(), i, j, it);
            ex.ready(i);
          }
          (void)ex.finish();
        }
        pools[static_cast<std::size_t>(t.rank())].assign(ex.pool_data(), ex.pool_data() + ex.pool_size());
      },
      std::chrono::seconds(30));
  return pools;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void check_identical_across_ranks(const std::vector<std::vector<float>>& pools) {
  for (std::size_t r = 1; r < pools.size(); ++r) {
    CAPTURE(r);
    CHECK(same_bits(pools[r], pools[0]));
  }
}

/// Integer inputs: bitwise equal to the ring, to the exact mean (sum * (1/P) in fp32, what the
/// exchanger computes), and across ranks.
template <class Topo, class Fuse>
void check_against_ring_int(int P, const Layout& l) {
  using H = Exchanger<Fuse, Topology<Topo>>;
  using R = Exchanger<Fuse>;
  const auto hier = exchange<H>(P, l, int_value);
  const auto ring = exchange<R>(P, l, int_value);
  check_identical_across_ranks(hier);
  CHECK(same_bits(hier[0], ring[0]));
  const auto pool = gflow::detail::plan::plan_pool(l);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < l.size(); ++i)
    for (std::size_t j = 0; j < l[i].numel; ++j) {
      float sum = 0;
      for (int r = 0; r < P; ++r) sum += int_value(r, i, j, 1);
      if (hier[0][pool.offset[i] + j] != sum * (1.0f / static_cast<float>(P))) ++wrong;
    }
  CHECK(wrong == 0);
}

/// Real-valued inputs: within rounding of the ring (each side's sum is off the exact one by at
/// most (P-1) u sum|g|), and bitwise identical across ranks.
/// `floor`: the largest rounding error of one subnormal result of the wire type.
template <class Topo, class Fuse, class Prec = Precision<float>>
void check_against_ring_real(int P, const Layout& l, double u, double floor) {
  using H = Exchanger<Prec, Fuse, Topology<Topo>>;
  using R = Exchanger<Prec, Fuse>;
  const auto hier = exchange<H>(P, l, uniform_value);
  const auto ring = exchange<R>(P, l, uniform_value);
  check_identical_across_ranks(hier);
  const auto pool = gflow::detail::plan::plan_pool(l);
  std::size_t off = 0;
  double worst = 0;
  for (std::size_t i = 0; i < l.size(); ++i)
    for (std::size_t j = 0; j < l[i].numel; ++j) {
      double abs = 0;
      for (int r = 0; r < P; ++r) abs += std::fabs(uniform_value(r, i, j, 1)) / P;
      const double bound = 2.0 * P * u * abs + 4.0 * floor;
      const double d = std::fabs(static_cast<double>(hier[0][pool.offset[i] + j]) - ring[0][pool.offset[i] + j]);
      worst = std::max(worst, d / bound);
      if (d > bound) ++off;
    }
  CAPTURE(worst);
  CHECK(off == 0);
}

template <int P, int... G>
void grid_row(std::integer_sequence<int, G...>) {
  const auto l = Layout::from_sizes(grid_sizes());
  (
      [&] {
        if constexpr (G + 1 <= P) {
          CAPTURE(P);
          const int g = G + 1;
          CAPTURE(g);
          check_against_ring_int<Hierarchical<G + 1>, Fusion<1024>>(P, l);
        }
      }(),
      ...);
}

template <int... P>
void grid(std::integer_sequence<int, P...>) {
  (grid_row<P + 1>(std::make_integer_sequence<int, 9>{}), ...);
}

}  // namespace

TEST_CASE("in-process: Hierarchical<g> equals the ring bit for bit on integer inputs, P = 1..9, g = 1..P") {
  grid(std::make_integer_sequence<int, 9>{});
}

TEST_CASE("in-process: Hierarchical within rounding of the ring on real inputs, identical on every rank") {
  const auto l = Layout::from_sizes(grid_sizes());
  for (int P : {2, 5, 7, 9}) {
    CAPTURE(P);
    check_against_ring_real<Hierarchical<2>, Fusion<1024>>(P, l, 0x1p-24, 0x1p-150);
    if (P >= 3) check_against_ring_real<Hierarchical<3>, detail::no_fusion>(P, l, 0x1p-24, 0x1p-150);
    // fp16 wire: each phase rounds to fp16 once (the in-process sum rounds once per collective).
    check_against_ring_real<Hierarchical<2>, Fusion<1024>, Precision<half>>(P, l, 0x1p-11, 0x1p-25);
  }
}

TEST_CASE("in-process: Hybrid equals the ring bit for bit on integer inputs, on either side of the threshold") {
  // No fusion, 512 B threshold: the 1000, 257 and 130-element tensors go ring, the rest hierarchical.
  const auto l = Layout::from_sizes(grid_sizes());
  for (int P = 1; P <= 9; ++P) {
    CAPTURE(P);
    if (P >= 2) check_against_ring_int<Hybrid<512, 2>, detail::no_fusion>(P, l);
    if (P >= 3) check_against_ring_int<Hybrid<512, 3>, detail::no_fusion>(P, l);
    check_against_ring_int<Hybrid<2048, 1>, Fusion<1024>>(P, l);
  }
}

TEST_CASE("in-process: a group size above P raises invalid_argument on every rank, without a hang") {
  const auto l = Layout::from_sizes({4, 5});
  std::mutex mu;
  int refused = 0;
  inproc::run(
      3,
      [&](inproc::transport& t) {
        try {
          Exchanger<Topology<Hierarchical<4>>>::on<inproc::transport> ex(t, l);
        } catch (const gflow::invalid_argument& e) {
          if (e.subject() == "group_size") {
            std::lock_guard lk(mu);
            ++refused;
          }
        }
      },
      std::chrono::seconds(5));
  CHECK(refused == 3);
}
