// broadcast_parameters and verify_replicas (replicas.hpp) on the mock and in-process transports:
// what goes on the wire when replicas are equal, one flipped bit anywhere caught and named on
// every rank, several differing ranks, broadcasts that leave replicas bitwise equal. The misuses'
// messages are E68-E73 in test_errors.cpp; the MPI runs are tests/mpi/test_mpi_replicas.cpp.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

using namespace gflow;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Layout model_layout() {
  return Layout({{"conv1.weight", {64, 3, 7, 7}, 9408}, {"conv1.bias", {64}, 64}, {"fc.weight", {10, 64}, 640}, {"fc.bias", {10}, 10}});
}

/// The same values on every rank (a function of the index only).
std::vector<float> model_values(const Layout& l) {
  std::vector<float> v(l.total_numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 0.37f);
  return v;
}

void flip_bit(std::vector<float>& v, std::size_t at, int bit) {
  std::uint32_t w = std::bit_cast<std::uint32_t>(v[at]);
  w ^= std::uint32_t{1} << bit;
  v[at] = std::bit_cast<float>(w);
}

std::size_t offset_of(const Layout& l, std::size_t tensor) {
  std::size_t off = 0;
  for (std::size_t i = 0; i < tensor; ++i) off += l[i].numel;
  return off;
}

/// Runs verify_replicas on P thread ranks after `edit(rank, values)`; returns each rank's
/// mismatch_error message ("" where it returned) and checks the subject and class.
std::vector<std::string> verify_on(int P, const Layout& l, const std::function<void(int, std::vector<float>&)>& edit) {
  std::vector<std::string> msgs(static_cast<std::size_t>(P));
  std::mutex m;
  inproc::run(
      P,
      [&](inproc::transport& t) {
        std::vector<float> v = model_values(l);
        edit(t.rank(), v);
        try {
          verify_replicas(t, v, l);
        } catch (const mismatch_error& e) {
          std::lock_guard lk(m);
          msgs[static_cast<std::size_t>(t.rank())] = e.what();
          CHECK(e.subject() == "values");
        }
      },
      std::chrono::seconds(20));
  return msgs;
}

std::string shared_part(const std::string& s) { return s.substr(0, s.find("Raised on rank")); }

}  // namespace

TEST_CASE("replicas: values_fingerprint changes with every bit of every element, -0.0 and NaN payloads included") {
  for (std::size_t n = 1; n <= 9; ++n) {  // every lane and the tail loop
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) - 3.5f;
    const std::uint64_t base = detail::values_fingerprint(v.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      for (int bit = 0; bit < 32; ++bit) {
        std::vector<float> w = v;
        flip_bit(w, i, bit);
        CHECK_MESSAGE(detail::values_fingerprint(w.data(), n) != base, "n " << n << ", element " << i << ", bit " << bit);
      }
    CHECK(detail::values_fingerprint(v.data(), n - 1) != base);  // the count is part of it
  }
  const float pz = 0.0f, nz = -0.0f;
  CHECK(detail::values_fingerprint(&pz, 1) != detail::values_fingerprint(&nz, 1));
  const float nan1 = std::bit_cast<float>(0x7fc00000u), nan2 = std::bit_cast<float>(0x7fc00001u);
  CHECK(detail::values_fingerprint(&nan1, 1) != detail::values_fingerprint(&nan2, 1));
  const float nan1_again = std::bit_cast<float>(0x7fc00000u);
  CHECK(detail::values_fingerprint(&nan1, 1) == detail::values_fingerprint(&nan1_again, 1));
  // Swapped elements in one lane's reach, or across lanes, are caught too (order matters).
  std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = {5, 2, 3, 4, 1, 6, 7, 8}, c = {2, 1, 3, 4, 5, 6, 7, 8};
  CHECK(detail::values_fingerprint(a.data(), 8) != detail::values_fingerprint(b.data(), 8));
  CHECK(detail::values_fingerprint(a.data(), 8) != detail::values_fingerprint(c.data(), 8));
}

TEST_CASE("replicas: equal replicas cost one control all_gather of 5 u64 (mock); one rank none; broadcast is the transport's") {
  const Layout l = model_layout();
  std::vector<float> v = model_values(l);
  auto m = mock::transport(4, 1);
  verify_replicas(m, v, l);
  REQUIRE(m.calls().control.size() == 1);
  CHECK(m.calls().control[0].kind == mock::op::all_gather);
  CHECK(m.calls().control[0].type == dtype::u64);
  CHECK(m.calls().control[0].count == 5);
  CHECK(m.calls().records.empty());  // no gradient traffic

  m.calls().clear();
  broadcast_parameters(m, v, 2);
  REQUIRE(m.calls().control.size() == 1);  // (count, root) from every rank
  CHECK(m.calls().control[0].count == 2);
  REQUIRE(m.calls().records.size() == 1);
  CHECK(m.calls().records[0].kind == mock::op::broadcast);
  CHECK(m.calls().records[0].count == v.size());
  CHECK(m.calls().records[0].type == dtype::f32);
  CHECK(m.calls().records[0].peer == 2);

  auto solo = mock::transport(1, 0);
  verify_replicas(solo, v, l);
  broadcast_parameters(solo, v);
  CHECK(solo.calls().control.empty());
  CHECK(solo.calls().records.empty());
}

TEST_CASE("replicas: equal replicas pass on 1..5 in-process ranks, a real layout included") {
  const Layout resnet20 = Layout::from_tsv(std::string(GFLOW_LAYOUT_DIR) + "/resnet20.tsv");
  for (const Layout* l : {&resnet20}) {
    for (int P = 1; P <= 5; ++P) {
      auto msgs = verify_on(P, *l, [](int, std::vector<float>&) {});
      for (const auto& s : msgs) CHECK(s.empty());
    }
  }
}

TEST_CASE("replicas: one bit flipped in one tensor on one rank is named on every rank") {
  const Layout l = model_layout();
  const int P = 4;
  for (std::size_t tensor = 0; tensor < l.size(); ++tensor) {
    for (std::size_t at : {std::size_t{0}, l[tensor].numel / 2, l[tensor].numel - 1}) {
      for (int bit : {0, 31}) {
        CAPTURE(tensor);
        CAPTURE(at);
        CAPTURE(bit);
        auto msgs = verify_on(P, l, [&](int rank, std::vector<float>& v) {
          if (rank == 2) flip_bit(v, offset_of(l, tensor) + at, bit);
        });
        for (int r = 0; r < P; ++r) {
          const std::string& s = msgs[static_cast<std::size_t>(r)];
          REQUIRE_MESSAGE(!s.empty(), "rank " << r << " raised nothing");
          CHECK(has(s, "gflow: rank mismatch in 'values': verify_replicas: the replicas differ in 1 of 4 tensors."));
          CHECK(has(s, "The first is tensor " + std::to_string(tensor) + " (layout index) '" + l[tensor].name + "'"));
          CHECK(has(s, "ranks that differ from rank 0 there: 2; ranks that differ from the majority (3 of 4 ranks, rank 0 among them): 2."));
          CHECK(has(s, "Ranks whose values differ from rank 0's in any tensor: 2."));
          CHECK(has(s, "Raised on rank " + std::to_string(r) + " of 4."));
          CHECK(has(s, "Fix: start every rank from the same values (gflow::broadcast_parameters"));
          CHECK(shared_part(s) == shared_part(msgs[0]));
        }
      }
    }
  }
  SUBCASE("the shape is named as the layout gives it") {
    auto msgs = verify_on(2, l, [&](int rank, std::vector<float>& v) {
      if (rank == 1) flip_bit(v, offset_of(l, 2) + 5, 3);
    });
    for (const auto& s : msgs) CHECK(has(s, "tensor 2 (layout index) 'fc.weight' [10x64] (640 elements): ranks that differ from rank 0 there: 1; "
                                             "no bit pattern is held by a majority (2 different ones among 2 ranks)."));
  }
}

TEST_CASE("replicas: several differing ranks; rank 0 the odd one out; no majority; -0.0 and NaN payloads") {
  const Layout l = model_layout();
  SUBCASE("ranks 1 and 3 differ in tensor 3, rank 4 in tensor 1: the first differing tensor is 1") {
    auto msgs = verify_on(5, l, [&](int rank, std::vector<float>& v) {
      if (rank == 1 || rank == 3) flip_bit(v, offset_of(l, 3), 7);
      if (rank == 4) flip_bit(v, offset_of(l, 1) + 63, 22);
    });
    for (const auto& s : msgs) {
      CHECK(has(s, "the replicas differ in 2 of 4 tensors. The first is tensor 1 (layout index) 'conv1.bias' [64] (64 elements): "
                   "ranks that differ from rank 0 there: 4; ranks that differ from the majority (4 of 5 ranks, rank 0 among them): 4."));
      CHECK(has(s, "Ranks whose values differ from rank 0's in any tensor: 1, 3, 4."));
    }
  }
  SUBCASE("rank 0 drifted: the majority is named against it") {
    auto msgs = verify_on(3, l, [&](int rank, std::vector<float>& v) {
      if (rank == 0) flip_bit(v, 100, 0);
    });
    for (const auto& s : msgs)
      CHECK(has(s, "tensor 0 (layout index) 'conv1.weight' [64x3x7x7] (9408 elements): ranks that differ from rank 0 there: 1, 2; "
                   "ranks that differ from the majority (2 of 3 ranks, rank 0 not among them): 0."));
  }
  SUBCASE("two halves: no majority") {
    auto msgs = verify_on(4, l, [&](int rank, std::vector<float>& v) {
      if (rank >= 2) flip_bit(v, offset_of(l, 2), 30);
    });
    for (const auto& s : msgs)
      CHECK(has(s, "ranks that differ from rank 0 there: 2, 3; no bit pattern is held by a majority (2 different ones among 4 ranks)."));
  }
  SUBCASE("-0.0 against +0.0, and two NaN payloads, differ bitwise") {
    auto zeros = verify_on(2, l, [&](int rank, std::vector<float>& v) { v[offset_of(l, 3) + 1] = rank == 0 ? 0.0f : -0.0f; });
    for (const auto& s : zeros) CHECK(has(s, "The first is tensor 3"));
    auto nans = verify_on(2, l, [&](int rank, std::vector<float>& v) { v[7] = std::bit_cast<float>(rank == 0 ? 0x7fc00000u : 0x7fc00001u); });
    for (const auto& s : nans) CHECK(has(s, "The first is tensor 0"));
    auto same_nan = verify_on(2, l, [&](int, std::vector<float>& v) { v[7] = std::numeric_limits<float>::quiet_NaN(); });
    for (const auto& s : same_nan) CHECK(s.empty());
  }
}

TEST_CASE("replicas: broadcast_parameters makes replicas bitwise equal (every root, -0.0 and NaN payloads), then verify passes") {
  const Layout l = model_layout();
  for (int P : {1, 2, 3, 4}) {
    for (int root = 0; root < P; ++root) {
      CAPTURE(P);
      CAPTURE(root);
      std::mutex m;
      std::vector<std::vector<float>> after(static_cast<std::size_t>(P)), before(static_cast<std::size_t>(P));
      inproc::run(P, [&](inproc::transport& t) {
        std::vector<float> v(l.total_numel());
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(t.rank()) * 13) % 101) - 50.0f;
        v[3] = t.rank() % 2 ? -0.0f : 0.0f;
        v[4] = std::bit_cast<float>(0x7fc00000u + static_cast<std::uint32_t>(t.rank()));
        {
          std::lock_guard lk(m);
          before[static_cast<std::size_t>(t.rank())] = v;
        }
        broadcast_parameters(t, v, root);
        verify_replicas(t, v, l);  // throws (and fails the run) if any bit still differs
        std::lock_guard lk(m);
        after[static_cast<std::size_t>(t.rank())] = v;
      });
      const auto& want = before[static_cast<std::size_t>(root)];
      for (int r = 0; r < P; ++r)
        CHECK(std::memcmp(after[static_cast<std::size_t>(r)].data(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("replicas: after a mismatch every rank is in step: a broadcast repairs the drift and the check passes") {
  const Layout l = model_layout();
  inproc::run(3, [&](inproc::transport& t) {
    std::vector<float> v = model_values(l);
    if (t.rank() == 1) flip_bit(v, 9000, 12);
    CHECK_THROWS_AS(verify_replicas(t, v, l), mismatch_error);
    broadcast_parameters(t, v, 0);
    verify_replicas(t, v, l);
    CHECK(std::memcmp(v.data(), model_values(l).data(), v.size() * sizeof(float)) == 0);
  });
}
