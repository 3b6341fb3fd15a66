// Every supported composition (tests/compositions.hpp, gflow_test::supported) builds, exchanges on
// in-process ranks and reports the same status and results on every rank, and issues its calls on
// the mock transport. The list is the one place a supported composition is named for the tests.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mock.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compositions.hpp"

using namespace gflow;
using gflow_test::mock_t;
using gflow_test::on_inproc;
using gflow_test::on_mock;

namespace {

// Integer-valued gradients in [-4, 4], different on every rank, tensor, element and iteration.
float int_grad(int rank, std::size_t tensor, std::size_t j, int it) {
  return static_cast<float>(static_cast<int>((std::size_t(rank) * 7 + tensor * 3 + j * 5 + std::size_t(it)) % 9) - 4);
}

struct rank_run {
  std::vector<exchange_status> status;    // per iteration
  std::vector<std::vector<float>> views;  // per iteration: every view, in layout order
};

// What every rank reports alike. collectives and wire_bytes count this rank's own calls (a GTopK
// tree or a hierarchical group sends differently from rank to rank), so they are not compared.
bool same(const exchange_status& a, const exchange_status& b) { return a.iteration == b.iteration && a.nonfinite == b.nonfinite; }

// The mock for E: with a Topology of groups, one whose splits follow the group rule.
template <class E>
mock_t mock_for(int P) {
  using A = typename E::policies::topology::algorithm;
  if constexpr (requires { A::group_size; }) return gflow_test::played_rank(P, 0, A::group_size);
  else return mock_t(P);
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("every supported composition builds, exchanges on 3 in-process ranks, and reports the same status on every rank", E,
                          supported_id) {
  const Layout l = Layout::from_sizes({300, 17, 1024, 5, 64});
  constexpr int P = 3, iters = 2;
  std::vector<rank_run> runs(std::size_t{P});
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    auto& me = runs[static_cast<std::size_t>(t.rank())];
    for (int it = 0; it < iters; ++it) {
      for (std::size_t i = 0; i < l.size(); ++i) {
        auto v = ex.view(i);
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = int_grad(t.rank(), i, j, it);
      }
      for (std::size_t i = l.size(); i-- > 0;) ex.ready(i);  // backward order
      me.status.push_back(ex.finish());
      std::vector<float> all;
      for (std::size_t i = 0; i < l.size(); ++i) all.insert(all.end(), ex.view(i).begin(), ex.view(i).end());
      me.views.push_back(std::move(all));
    }
  });
  for (int it = 0; it < iters; ++it) {
    CAPTURE(it);
    CHECK(runs[0].status[std::size_t(it)].finite());
    CHECK(runs[0].status[std::size_t(it)].iteration == std::uint64_t(it));
    bool moved = false;  // the exchange wrote something other than rank 0's own input
    const auto& v0 = runs[0].views[std::size_t(it)];
    for (std::size_t i = 0, e = 0; i < l.size(); ++i)
      for (std::size_t j = 0; j < l[i].numel; ++j, ++e) moved = moved || v0[e] != int_grad(0, i, j, it);
    CHECK(moved);
    for (std::size_t r = 1; r < std::size_t{P}; ++r) {
      CAPTURE(r);
      CHECK(same(runs[r].status[std::size_t(it)], runs[0].status[std::size_t(it)]));
      const auto& v = runs[r].views[std::size_t(it)];
      REQUIRE(v.size() == v0.size());
      CHECK(std::memcmp(v.data(), v0.data(), v.size() * sizeof(float)) == 0);
    }
  }

  auto m = mock_for<E>(4);
  on_mock<E> ex(m, l);
  for (std::size_t i = 0; i < l.size(); ++i) ex.ready(i);
  CHECK(ex.finish().finite());
  CHECK_FALSE(m.calls().records.empty());
}

TEST_CASE_TEMPLATE_APPLY(supported_id, gflow_test::supported);
