// Sharding<ReduceScatter> over gflow::mpi::transport (mpi_2, mpi_4): the shard against the
// unsharded exchange (bitwise at 2 ranks, where any summation order is the same; within float
// rounding of the rank-order sum from 3 ranks on, where Open MPI's MPI_Reduce_scatter and
// MPI_Allreduce may add in different orders), the shards' cover, gather_shards (every rank the
// same bits, the owner's values), with fp16 and every Overlap strategy; sharded OkTopK bitwise the
// same job on in-process ranks (its sums are the engine's own, in rank order).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>
#include <gflow/transport/mpi.hpp>

#include "mpi_test_util.hpp"

namespace {

using gflow::Exchanger;
using gflow::ReduceScatter;
using gflow::Sharding;

gflow::Layout layout() { return gflow::Layout::from_sizes({1000, 3, 257, 4096, 1, 77}); }

float g(int rank, int step, std::size_t i, std::size_t j) {
  return gflow_test::uniform(gflow_test::mix((std::uint64_t(step) << 40) ^ (std::uint64_t(rank) << 32) ^ i), j);
}

template <class Ex>
void exchange(Ex& ex, int rank, int step) {
  for (std::size_t i = 0; i < ex.layout().size(); ++i) {
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = g(rank, step, i, j);
    ex.ready(i);
  }
  REQUIRE(ex.finish().finite());
}

// group: the ranks a bucket is split among (P with Ring, g with Hierarchical<g>: each of the P / g
// groups covers the pool once).
template <class Plain, class Sharded>
void shard_matches(gflow::mpi::transport& t, int group = 0) {
  const auto l = layout();
  typename Plain::template on<gflow::mpi::transport> a(t, l);
  typename Sharded::template on<gflow::mpi::transport> b(t, l);
  const int P = t.size();
  // the element at pool offset e of tensor i, element j: the average in rank order, in double
  std::vector<std::pair<std::size_t, std::size_t>> where(b.pool_size());
  for (std::size_t i = 0; i < l.size(); ++i)
    for (std::size_t j = 0; j < l[i].numel; ++j) where[b.pool_plan().offset[i] + j] = {i, j};
  for (int step = 0; step < 2; ++step) {
    exchange(a, t.rank(), step);
    exchange(b, t.rank(), step);
    std::size_t differ = 0, far = 0;
    for (const gflow::pool_range r : b.shard())
      for (std::size_t e = r.begin; e < r.end; ++e) {
        if (std::memcmp(a.pool_data() + e, b.pool_data() + e, sizeof(float)) != 0) ++differ;
        double ref = 0;
        for (int q = 0; q < P; ++q) ref += g(q, step, where[e].first, where[e].second);
        ref /= P;
        if (std::abs(b.pool_data()[e] - ref) > 1e-3 * (1.0 + std::abs(ref))) ++far;  // fp16 wires round to 2^-11
      }
    // Every sum of two values is the same in any order: 2 ranks, and Hierarchical<2> at 4 ranks (a sum
    // inside each pair, then one across the two pairs, sharded or not) are bitwise.
    if (P == 2 || (group == 2 && P == 4)) CHECK(differ == 0);
    CHECK(far == 0);
  }
  // The cover: every pool element in exactly one rank's shard.
  std::vector<std::uint8_t> owned(b.pool_size(), 0);
  for (const gflow::pool_range r : b.shard())
    for (std::size_t e = r.begin; e < r.end; ++e) owned[e] = 1;
  t.all_reduce(owned.data(), owned.size(), gflow::reduce_op::sum);
  const int covers = group == 0 ? 1 : P / group;  // every group's shards cover the pool
  std::size_t not_once = 0;
  for (std::uint8_t o : owned) not_once += o != covers;
  CHECK(not_once == 0);
  // gather_shards: the owner's values everywhere, the same bits on every rank.
  std::vector<float> w(b.pool_size());
  // (With Hierarchical<g> each group gathers from its own g ranks: the ranks of one local rank hold
  // the same shard values in training, as they do here.)
  const int source = group == 0 ? t.rank() : t.rank() % group;
  for (std::size_t e = 0; e < w.size(); ++e) w[e] = g(source, 9, 0, e);
  std::vector<float> mine = w;
  b.gather_shards(w);
  std::size_t wrong = 0;
  for (const gflow::pool_range r : b.shard())
    for (std::size_t e = r.begin; e < r.end; ++e)
      if (std::abs(w[e] - mine[e]) > 1e-3f * (1.0f + std::abs(mine[e]))) ++wrong;
  CHECK(wrong == 0);
  CHECK(gflow_test::same_on_all_ranks(t, gflow_test::hash_bytes(w.data(), w.size() * sizeof(float))));
}

}  // namespace

TEST_CASE("mpi sharding: the shard is the unsharded exchange's (bitwise at 2 ranks), the shards cover the pool, gather_shards") {
  gflow::mpi::transport t;
  using F = gflow::Fusion<4096>;
  shard_matches<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>>>(t);
  shard_matches<Exchanger<>, Exchanger<Sharding<ReduceScatter>>>(t);
  shard_matches<Exchanger<gflow::Precision<gflow::half>, F>, Exchanger<gflow::Precision<gflow::half>, F, Sharding<ReduceScatter>>>(t);
  shard_matches<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>, gflow::Overlap<gflow::Funneled>>>(t);
  shard_matches<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>, gflow::Overlap<gflow::Concurrent<2>>>>(t);
  shard_matches<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>, gflow::Overlap<gflow::Chained>>>(t);
}

TEST_CASE("mpi sharding: Hierarchical<2> (a reduce-scatter in each pair of ranks, each block allreduced across pairs)") {
  gflow::mpi::transport t;
  using F = gflow::Fusion<4096>;
  using H = gflow::Topology<gflow::Hierarchical<2>>;
  if (t.size() % 2 != 0) return;  // every group must hold 2 ranks (the refusal is tested in the unit tests)
  shard_matches<Exchanger<F, H>, Exchanger<F, H, Sharding<ReduceScatter>>>(t, 2);
  shard_matches<Exchanger<F, H>, Exchanger<F, H, Sharding<ReduceScatter>, gflow::Overlap<gflow::Funneled>>>(t, 2);
}

TEST_CASE("mpi sharding: OkTopK's split-and-reduce over the shards gives the in-process job's shard and residual, bitwise") {
  gflow::mpi::transport t;
  const auto l = layout();
  using E = Exchanger<gflow::Sparsifier<gflow::OkTopK<0.01>>, Sharding<ReduceScatter>, gflow::Fusion<4096>>;
  auto record = [&](auto& ex, int rank, std::vector<float>& out) {
    for (int step = 0; step < 4; ++step) {
      exchange(ex, rank, step);
      for (const gflow::pool_range r : ex.shard()) out.insert(out.end(), ex.pool_data() + r.begin, ex.pool_data() + r.end);
      const auto res = ex.sparsifier().residual();
      out.insert(out.end(), res.begin(), res.end());
    }
  };
  std::vector<float> over_mpi;
  {
    E::on<gflow::mpi::transport> ex(t, l);
    record(ex, t.rank(), over_mpi);
  }
  std::vector<std::vector<float>> in_process(static_cast<std::size_t>(t.size()));
  gflow::inproc::run(t.size(), [&](gflow::inproc::transport& it) {
    E::on<gflow::inproc::transport> ex(it, l);
    record(ex, it.rank(), in_process[static_cast<std::size_t>(it.rank())]);
  });
  const auto& mine = in_process[static_cast<std::size_t>(t.rank())];
  REQUIRE(mine.size() == over_mpi.size());
  CHECK(std::memcmp(mine.data(), over_mpi.data(), mine.size() * sizeof(float)) == 0);
}
