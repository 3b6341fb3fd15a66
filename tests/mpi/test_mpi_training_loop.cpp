// The training-loop features over gflow::mpi::transport (docs/DESIGN.md, "Training loops"), on
// every rank count ctest runs (mpi_2, mpi_4): accumulation bitwise equal to one exchange of the
// summed gradient, unused tensors, uneven inputs with join(), and the learned order.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/mpi.hpp>

#include "../accumulation_steps.hpp"
#include "mpi_test_util.hpp"

namespace {

using gflow::Exchanger;
using Dense32 = Exchanger<gflow::Fusion<1024>>;
using Dense16Funneled = Exchanger<gflow::Precision<gflow::half>, gflow::Fusion<1024>, gflow::Overlap<gflow::Funneled>>;
using HierChained = Exchanger<gflow::Fusion<1024>, gflow::Topology<gflow::Hierarchical<2>>, gflow::Overlap<gflow::Chained>>;
using TopKFused = Exchanger<gflow::Sparsifier<gflow::TopK<0.05>>, gflow::Fusion<1024>>;
using CscFp16 = Exchanger<gflow::Sparsifier<gflow::CSC<64, 25>>, gflow::Precision<gflow::half>>;

gflow::Layout layout() { return gflow::Layout::from_sizes({1000, 3, 257, 4096, 1, 77}); }

float g(int rank, int step, int mb, std::size_t i, std::size_t j) {
  return gflow_test::uniform(gflow_test::mix((std::uint64_t(step * 16 + mb) << 40) ^ (std::uint64_t(rank) << 32) ^ i), j);
}

std::uint64_t hash_pool(auto& ex) { return gflow_test::hash_bytes(ex.pool_data(), ex.pool_size() * sizeof(float)); }

}  // namespace

TEST_CASE_TEMPLATE("mpi training loop: M micro-batches under no_sync are bitwise one exchange of the sum", E, Dense32, Dense16Funneled,
                   HierChained, TopKFused, CscFp16) {
  gflow::mpi::transport t;
  const auto l = layout();
  for (int M : {1, 3, 8}) {
    typename E::template on<gflow::mpi::transport> a(t, l), b(t, l);
    for (int step = 0; step < 3; ++step) {
      gflow_test::accumulate_then_exchange(a, b, M, [&](std::size_t i, std::size_t j, int mb) { return g(t.rank(), step, mb, i, j); });
      CHECK_MESSAGE(std::memcmp(a.pool_data(), b.pool_data(), a.pool_size() * sizeof(float)) == 0, "M = ", M, " step ", step);
    }
  }
}

TEST_CASE_TEMPLATE("mpi training loop: find_unused on some ranks and on all", E, Dense32, Dense16Funneled, TopKFused) {
  gflow::mpi::transport t;
  const auto l = layout();
  gflow::exchange_options o;
  o.find_unused = true;
  typename E::template on<gflow::mpi::transport> ex(t, l, o);
  const int P = t.size();
  auto skips = [&](int r, std::size_t i) { return i == 1 || (i == 4 && r == P - 1) || (i == 5 && r != 0); };
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = l.size(); i-- > 0;) {
      auto v = ex.view(i);
      if (skips(t.rank(), i)) {
        std::fill(v.begin(), v.end(), 1e30f);  // stale: must not reach the exchange
        continue;
      }
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(t.rank() + 1);
      ex.ready(i);
    }
    const auto st = ex.finish();
    CHECK(st.unused == std::vector<std::size_t>{1});
    CHECK(gflow_test::same_on_all_ranks(t, hash_pool(ex)));
    if constexpr (E::policies::sparsifier::dense) {
      CHECK(ex.view(1)[0] == 0.0f);
      CHECK(ex.view(5)[0] == doctest::Approx(1.0 / P).epsilon(1e-3));           // rank 0's 1 averaged with zeros
      CHECK(ex.view(4)[0] == doctest::Approx((P * (P + 1) / 2.0 - P) / P).epsilon(1e-3));  // every rank but the last
    }
  }
}

TEST_CASE_TEMPLATE("mpi training loop: join with uneven inputs averages over the ranks that train", E, Dense32, Dense16Funneled, HierChained) {
  gflow::mpi::transport t;
  const auto l = layout();
  const int P = t.size();
  // Rank r has r + 1 batches; then rank 0 alone keeps training (all but one run out early).
  for (int split = 0; split < 2; ++split) {
    auto batches = [&](int r) { return split == 0 ? r + 1 : (r == 0 ? 3 : 1); };
    gflow::exchange_options o;
    o.uneven_inputs = true;
    typename E::template on<gflow::mpi::transport> ex(t, l, o);
    const int mine = batches(t.rank());
    for (int step = 0; step < mine; ++step) {
      for (std::size_t i = l.size(); i-- > 0;) {
        auto v = ex.view(i);
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>((t.rank() + 1) * (step + 1));
        ex.ready(i);
      }
      const auto st = ex.finish();
      float sum = 0.0f;
      int active = 0;
      for (int q = 0; q < P; ++q)
        if (batches(q) > step) sum += static_cast<float>((q + 1) * (step + 1)), ++active;
      CHECK(st.contributors == active);
      const float want = sum * (1.0f / static_cast<float>(active));
      if constexpr (sizeof(typename E::template on<gflow::mpi::transport>::wire_type) == 4) CHECK(ex.view(3)[100] == want);
      else CHECK(ex.view(3)[100] == doctest::Approx(want).epsilon(1e-2));
    }
    const auto js = ex.join();
    int most = 0;
    for (int q = 0; q < P; ++q) most = std::max(most, batches(q));
    CHECK(js.shadowed == static_cast<std::uint64_t>(most - mine));
    CHECK(js.last_rank == (split == 0 ? P - 1 : 0));
  }
}

TEST_CASE("mpi training loop: the learned order is rank 0's on every rank") {
  gflow::mpi::transport t;
  const auto l = layout();
  gflow::exchange_options o;
  o.learn_order = true;
  Dense16Funneled::on<gflow::mpi::transport> ex(t, l, o);
  std::vector<std::size_t> order(l.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::rotate(order.begin(), order.begin() + t.rank() % static_cast<int>(l.size()), order.end());  // each rank its own
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i : order) {
      auto v = ex.view(i);
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = g(t.rank(), step, 0, i, j);
      ex.ready(i);
    }
    (void)ex.finish();
    CHECK(ex.generation() == 1);
    std::vector<std::size_t> rank0(l.size());
    std::iota(rank0.begin(), rank0.end(), std::size_t{0});
    CHECK(ex.pool_plan().tensor_at == rank0);
    CHECK(gflow_test::same_on_all_ranks(t, hash_pool(ex)));
  }
}
