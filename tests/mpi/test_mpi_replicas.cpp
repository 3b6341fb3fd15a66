// broadcast_parameters and verify_replicas over MPI (replicas.hpp): ranks as processes, whose
// initial values differ until the broadcast; one flipped bit on the last rank caught and named
// on every rank; bad arguments raised on every rank; the communicator in step afterwards.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "mpi_test_util.hpp"

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

gflow::Layout small_layout() {
  return gflow::Layout({{"embed", {100, 8}, 800}, {"block.w", {8, 8}, 64}, {"block.b", {8}, 8}, {"head", {8, 3}, 24}});
}

/// Values that differ per rank (as seeded initialisation on ranks with different seeds would).
std::vector<float> rank_values(const gflow::Layout& l, int rank) {
  std::vector<float> v(l.total_numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = gflow_test::uniform(1000 + static_cast<std::uint64_t>(rank), i);
  return v;
}

template <class F>
std::string mismatch_of(F&& f) {
  try {
    f();
  } catch (const gflow::mismatch_error& e) {
    return std::string(e.subject()) + "|" + e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("mpi replicas: broadcast makes differently seeded replicas bitwise equal; verify passes, then names one flipped bit on every rank") {
  gflow::mpi::transport t;
  const int P = t.size();
  const gflow::Layout l = gflow::Layout::from_tsv(std::string(GFLOW_LAYOUT_DIR) + "/resnet20.tsv");
  std::vector<float> v = rank_values(l, t.rank());
  if (P > 1) CHECK(!mismatch_of([&] { gflow::verify_replicas(t, v, l); }).empty());  // seeded apart: they differ

  gflow::broadcast_parameters(t, v, P - 1);
  const std::vector<float> want = rank_values(l, P - 1);
  CHECK(std::memcmp(v.data(), want.data(), v.size() * sizeof(float)) == 0);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(v.data(), v.size() * sizeof(float))));
  gflow::verify_replicas(t, v, l);

  // One bit of the last element of tensor 5 on the last rank.
  std::size_t off = 0;
  for (std::size_t i = 0; i < 5; ++i) off += l[i].numel;
  off += l[5].numel - 1;
  if (t.rank() == P - 1 && P > 1) v[off] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(v[off]) ^ 1u);
  const std::string s = mismatch_of([&] { gflow::verify_replicas(t, v, l); });
  if (P > 1) {
    CHECK(has(s, "values|gflow: rank mismatch in 'values': verify_replicas: the replicas differ in 1 of " + std::to_string(l.size()) + " tensors."));
    CHECK(has(s, "The first is tensor 5 (layout index) '" + l[5].name + "'"));
    CHECK(has(s, "ranks that differ from rank 0 there: " + std::to_string(P - 1) + ";"));
    CHECK(has(s, "Raised on rank " + std::to_string(t.rank()) + " of " + std::to_string(P) + "."));
  } else {
    CHECK(s.empty());
  }
  // Every rank took the same path: a broadcast repairs the drift and the ranks are in step.
  gflow::broadcast_parameters(t, v, 0);
  gflow::verify_replicas(t, v, l);
  CHECK(gflow_test::same_on_all_ranks(t, t.collectives_started()));
}

TEST_CASE("mpi replicas: several ranks differ; bad sizes, layouts and roots are raised on every rank, the ranks stay in step") {
  gflow::mpi::transport t;
  const int P = t.size();
  const gflow::Layout l = small_layout();
  if (P >= 4) {
    std::vector<float> v = rank_values(l, 0);
    if (t.rank() == 1 || t.rank() == 3) v[800 + 64 + 2] += 1.0f;  // tensor 2 ('block.b')
    if (t.rank() == 2) v[800 + 64 + 8 + 1] = -v[800 + 64 + 8 + 1];  // tensor 3 ('head')
    const std::string s = mismatch_of([&] { gflow::verify_replicas(t, v, l); });
    CHECK(has(s, "the replicas differ in 2 of 4 tensors. The first is tensor 2 (layout index) 'block.b' [8] (8 elements): "
                 "ranks that differ from rank 0 there: 1, 3;"));
    CHECK(has(s, "Ranks whose values differ from rank 0's in any tensor: 1, 2, 3."));
  }
  {
    std::vector<float> v(t.rank() == P - 1 ? 10 : l.total_numel(), 0.0f);
    std::string s;
    try {
      gflow::verify_replicas(t, v, l);
    } catch (const gflow::invalid_argument& e) {
      s = e.what();
      CHECK(e.subject() == "values");
    }
    CHECK(has(s, "verify_replicas: rank " + std::to_string(P - 1) + " passed 10 values; its layout holds 896 elements in 4 tensors"));
  }
  if (P > 1) {
    const gflow::Layout other = t.rank() == 1 ? gflow::Layout::from_sizes({896}) : l;
    std::vector<float> v(896, 0.0f);
    const std::string s = mismatch_of([&] { gflow::verify_replicas(t, v, other); });
    CHECK(has(s, "layout|"));
    CHECK(has(s, "ranks whose layout differs from rank 0's: 1."));

    std::vector<float> w(t.rank() == 1 ? 5 : 6, 0.0f);
    const std::string b = mismatch_of([&] { gflow::broadcast_parameters(t, w); });
    CHECK(has(b, "the root, rank 0, passes 6, rank 1 passes 5; ranks whose count differs from the root's: 1."));
  }
  {
    std::vector<float> w(6, 0.0f);
    std::string s;
    try {
      gflow::broadcast_parameters(t, w, t.rank() == 0 ? P : 0);
    } catch (const gflow::invalid_argument& e) {
      s = e.what();
    }
    CHECK(has(s, "broadcast_parameters: root " + std::to_string(P) + " is outside the group of " + std::to_string(P) + " ranks."));
  }
  float x = 1.0f;
  t.all_reduce(&x, 1, gflow::reduce_op::sum);
  CHECK(x == static_cast<float>(P));
  CHECK(gflow_test::same_on_all_ranks(t, t.collectives_started()));
}
