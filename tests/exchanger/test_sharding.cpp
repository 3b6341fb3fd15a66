// Sharding<ReduceScatter> (policies/sharding.hpp; docs/GUIDE.md, "Sharding"): the shard plan, the
// shard's values against the unsharded exchange (bitwise, every wire, fused or not, P = 1..5, every
// Overlap), the ZeRO-2 step (reduce-scatter, step the shard, gather_shards) against allreduce and
// a full step (bitwise, fp32, momentum SGD), the 16-bit gather, the agreed inf / NaN count, and the
// typed errors. In-process transport: it sums in rank order for reduce_scatter and all_reduce alike.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/transport/inproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "compositions.hpp"
#include "test_values.hpp"

using namespace gflow;
using namespace gflow_test;

namespace {

Layout layout_a() { return Layout::from_sizes({40, 7, 90, 3, 64, 17, 33}); }
Layout layout_b() { return Layout::from_sizes({1, 2, 1000, 5, 257}); }

template <class E>
exchange_status exchange_values(E& ex, int rank, int iter) {
  for (std::size_t i = 0; i < ex.layout().size(); ++i) {
    auto v = ex.view(i);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = uniform_value(rank, i, j, iter);
    ex.ready(i);
  }
  return ex.finish();
}

bool same_bits(const float* a, const float* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

// One momentum-SGD step after a's and b's finish(): every element of wa from a's pool (momentum
// hu_full), this rank's shard of wb from b's (its momentum packed in hu_shard), gather_shards of wb;
// the parameters must agree bit for bit.
template <class A, class B>
void step_and_compare(A& a, B& b, std::vector<float>& wa, std::vector<float>& wb, std::vector<float>& hu_full, std::vector<float>& hu_shard,
                      float lr = 0.05f, float momentum = 0.9f) {
  optim::kernels::momentum_sgd_step_all(wa.data(), a.pool_data(), hu_full.data(), wa.size(), lr, momentum);
  std::size_t at = 0;
  for (const pool_range g : b.shard()) {
    optim::kernels::momentum_sgd_step_all(wb.data() + g.begin, b.pool_data() + g.begin, hu_shard.data() + at, g.size(), lr, momentum);
    at += g.size();
  }
  b.gather_shards(wb);
  CHECK(same_bits(wa.data(), wb.data(), wa.size()));
}

// Every rank's shard, gathered: disjoint, covering the pool once, block q of each bucket on rank q
// within one element of count / P.
void check_cover(const std::vector<std::vector<pool_range>>& shards, const std::vector<bucket>& buckets, std::size_t total) {
  const int P = static_cast<int>(shards.size());
  std::vector<int> owners(total, 0);
  for (int r = 0; r < P; ++r) {
    REQUIRE(shards[static_cast<std::size_t>(r)].size() == buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const pool_range g = shards[static_cast<std::size_t>(r)][b];
      CHECK(g.begin >= buckets[b].offset);
      CHECK(g.end <= buckets[b].offset + buckets[b].count);
      const double fair = static_cast<double>(buckets[b].count) / P;
      CHECK(std::abs(static_cast<double>(g.size()) - fair) < 1.0);
      for (std::size_t e = g.begin; e < g.end; ++e) ++owners[e];
    }
  }
  CHECK(std::all_of(owners.begin(), owners.end(), [](int k) { return k == 1; }));
}

// The shard of the sharded exchange holds the bits of the unsharded one, on every rank, for three
// iterations; the shards cover the pool once.
template <class Plain, class Sharded>
void shard_matches_allreduce(int P, const Layout& l) {
  std::mutex mu;
  std::vector<std::vector<pool_range>> shards(static_cast<std::size_t>(P));
  std::vector<bucket> buckets;
  std::size_t total = 0;
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Plain> a(t, l);
    on_inproc<Sharded> b(t, l);
    REQUIRE(a.buckets().size() == b.buckets().size());
    for (int it = 0; it < 3; ++it) {
      const auto sa = exchange_values(a, t.rank(), it);
      const auto sb = exchange_values(b, t.rank(), it);
      CHECK(sa.finite());
      CHECK(sb.finite());
      for (const pool_range g : b.shard()) CHECK(same_bits(a.pool_data() + g.begin, b.pool_data() + g.begin, g.size()));
    }
    std::lock_guard lk(mu);
    shards[static_cast<std::size_t>(t.rank())].assign(b.shard().begin(), b.shard().end());
    buckets = b.buckets();
    total = b.pool_size();
  });
  check_cover(shards, buckets, total);
}

template <class W, class F>
void shard_matches_allreduce_all_ranks() {
  using Plain = Exchanger<Precision<W>, F>;
  using Sharded = Exchanger<Precision<W>, F, Sharding<ReduceScatter>>;
  for (int P = 1; P <= 5; ++P) {
    CAPTURE(P);
    shard_matches_allreduce<Plain, Sharded>(P, layout_a());
    shard_matches_allreduce<Plain, Sharded>(P, layout_b());
  }
}

// ZeRO-2: reduce-scatter, momentum SGD on the shard only (velocity for the shard's elements),
// gather_shards of the parameters; against allreduce and momentum SGD on every element.
template <class F>
void sharded_step_matches_full_step(int P, const Layout& l) {
  using Plain = Exchanger<F>;
  using Sharded = Exchanger<F, Sharding<ReduceScatter>>;
  constexpr float lr = 0.05f, momentum = 0.9f;
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Plain> a(t, l);
    on_inproc<Sharded> b(t, l);
    const std::size_t n = a.pool_size();
    std::vector<float> wa(n), wb(n), hu_full(n, 0.0f);
    for (std::size_t j = 0; j < n; ++j) wa[j] = wb[j] = uniform_value(99, 0, j, 0);  // the same start on every rank
    std::size_t shard_elems = 0;
    for (const pool_range g : b.shard()) shard_elems += g.size();
    CHECK(shard_elems <= n / static_cast<std::size_t>(P) + b.buckets().size());
    std::vector<float> hu_shard(shard_elems, 0.0f);  // the optimizer state: this rank's shard only
    for (int it = 0; it < 4; ++it) {
      REQUIRE(exchange_values(a, t.rank(), it).finite());
      REQUIRE(exchange_values(b, t.rank(), it).finite());
      step_and_compare(a, b, wa, wb, hu_full, hu_shard, lr, momentum);
    }
  });
}

}  // namespace

TEST_CASE("sharding: the shard plan cuts each bucket into P blocks within one element, covering it once") {
  for (std::size_t n : {0u, 1u, 2u, 3u, 7u, 64u, 1001u})
    for (int P = 1; P <= 6; ++P) {
      std::vector<bucket> bs{{0, 1, 5, n}, {1, 2, 5 + n, n + 1}};
      std::vector<std::vector<pool_range>> all;
      for (int r = 0; r < P; ++r) {
        const auto sp = detail::plan::plan_shards(bs, P, r);
        all.push_back(sp.mine);
        std::size_t mine = 0;
        for (std::size_t b = 0; b < bs.size(); ++b) {
          CHECK(sp.counts_of(b)[r] == sp.mine[b].size());
          CHECK(sp.scratch[b] == mine);
          mine += sp.mine[b].size();
        }
        CHECK(sp.scratch_total == mine);
      }
      // the buckets start at 5: shift the check's pool by that
      std::vector<bucket> shifted = bs;
      std::vector<std::vector<pool_range>> moved = all;
      for (auto& b : shifted) b.offset -= 5;
      for (auto& rs : moved)
        for (auto& g : rs) g = {g.begin - 5, g.end - 5};
      check_cover(moved, shifted, 2 * n + 1);
    }
  CHECK_THROWS_AS(detail::plan::plan_shards({}, 0, 0), invalid_argument);
  CHECK_THROWS_AS(detail::plan::plan_shards({}, 2, 2), invalid_argument);
}

TEST_CASE("sharding: the shard holds the unsharded exchange's bits (fp32, fp16, bf16; fused or not; P = 1..5)") {
  shard_matches_allreduce_all_ranks<float, detail::no_fusion>();
  shard_matches_allreduce_all_ranks<float, Fusion<256>>();
  shard_matches_allreduce_all_ranks<half, Fusion<256>>();
  shard_matches_allreduce_all_ranks<bfloat16, detail::no_fusion>();
}

TEST_CASE("sharding: every Overlap strategy gives the same shard as Overlap<None>") {
  using F = Fusion<256>;
  for (int P : {2, 3}) {
    CAPTURE(P);
    shard_matches_allreduce<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>, Overlap<Funneled>>>(P, layout_a());
    shard_matches_allreduce<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>, Overlap<Concurrent<2>>>>(P, layout_a());
    shard_matches_allreduce<Exchanger<F>, Exchanger<F, Sharding<ReduceScatter>, Overlap<Chained>>>(P, layout_b());
    shard_matches_allreduce<Exchanger<Precision<half>, F>,
                            Exchanger<Precision<half>, F, Sharding<ReduceScatter>, Overlap<Chained>>>(P, layout_b());
  }
}

TEST_CASE("sharding: reduce-scatter, step the shard, gather_shards is bitwise allreduce and a full step (momentum SGD)") {
  for (int P = 1; P <= 5; ++P) {
    CAPTURE(P);
    sharded_step_matches_full_step<Fusion<256>>(P, layout_a());
    sharded_step_matches_full_step<detail::no_fusion>(P, layout_b());
    sharded_step_matches_full_step<Fusion<1 << 20>>(P, layout_b());
  }
}

TEST_CASE("sharding: a 16-bit gather rounds every value, the owner's too, so every rank holds the same bits") {
  const Layout l = layout_b();
  std::mutex mu;
  std::vector<std::vector<float>> got(3);
  std::vector<float> owner_view;
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<Exchanger<Precision<half>, Fusion<512>, Sharding<ReduceScatter>>> ex(t, l);
    std::vector<float> w(ex.pool_size());
    for (std::size_t j = 0; j < w.size(); ++j) w[j] = uniform_value(t.rank(), 1, j, 7);  // differs per rank: the owner's wins
    std::vector<float> expect(w.size());
    ex.gather_shards(w);
    std::lock_guard lk(mu);
    got[static_cast<std::size_t>(t.rank())] = w;
    if (owner_view.empty()) owner_view.assign(w.size(), 0.0f);
    for (const pool_range g : ex.shard())
      for (std::size_t e = g.begin; e < g.end; ++e)
        owner_view[e] = detail::kernels::to_float(detail::kernels::wire_cast<half>(uniform_value(t.rank(), 1, e, 7)));
  });
  CHECK(same_bits(got[0].data(), got[1].data(), got[0].size()));
  CHECK(same_bits(got[0].data(), got[2].data(), got[0].size()));
  CHECK(same_bits(got[0].data(), owner_view.data(), got[0].size()));
}

TEST_CASE("sharding: the inf / NaN count is the job's, the same on every rank, though each rank checks its shard") {
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Sharding<ReduceScatter>>> ex(t, layout_a());
    for (std::size_t i = 0; i < ex.layout().size(); ++i) {
      auto v = ex.view(i);
      std::fill(v.begin(), v.end(), 1.0f);
      if (t.rank() == 0 && i == 2) v[5] = std::numeric_limits<float>::quiet_NaN();
      ex.ready(i);
    }
    const auto st = ex.finish();
    CHECK(st.nonfinite == 1);
    CHECK(!st.finite());
  });
}

TEST_CASE("sharding: find_unused and no_sync give the unsharded shard") {
  inproc::run(3, [&](inproc::transport& t) {
    exchange_options o;
    o.find_unused = true;
    on_inproc<Exchanger<Fusion<256>>> a(t, layout_a(), o);
    on_inproc<Exchanger<Fusion<256>, Sharding<ReduceScatter>>> b(t, layout_a(), o);
    auto fill = [&](auto& ex, int it) {
      {
        auto scope = ex.no_sync();  // one accumulated micro-batch, then the exchanged one
        for (std::size_t i = 0; i < ex.layout().size(); ++i) {
          auto v = ex.view(i);
          for (std::size_t j = 0; j < v.size(); ++j) v[j] = uniform_value(t.rank(), i, j, 50 + it);
          ex.ready(i);
        }
      }
      for (std::size_t i = 0; i < ex.layout().size(); ++i) {
        if (i == 3 && t.rank() != 1) continue;  // tensor 3: used by rank 1 only
        if (i == 5) continue;                   // tensor 5: unused everywhere
        ex.ready(i, std::vector<float>(ex.layout()[i].numel, 0.25f * static_cast<float>(t.rank() + 1)));
      }
      return ex.finish();
    };
    for (int it = 0; it < 2; ++it) {
      const auto sa = fill(a, it), sb = fill(b, it);
      CHECK(sa.unused == sb.unused);
      for (const pool_range g : b.shard()) CHECK(same_bits(a.pool_data() + g.begin, b.pool_data() + g.begin, g.size()));
    }
  });
}

TEST_CASE("sharding: learn_order lays the pool out at the first finish(), before any bucket launches; the shards are cut from that layout") {
  // exchange_values marks the tensors ready in forward order, the reverse of the default pool
  // order, so the learned layout differs and the pool (and every shard) moves once.
  for (int P = 1; P <= 4; ++P) {
    CAPTURE(P);
    std::mutex mu;
    std::vector<std::vector<pool_range>> shards(static_cast<std::size_t>(P));
    std::vector<bucket> buckets;
    std::size_t total = 0;
    inproc::run(P, [&](inproc::transport& t) {
      exchange_options o;
      o.learn_order = true;
      on_inproc<Exchanger<Fusion<256>>> a(t, layout_a(), o);
      on_inproc<Exchanger<Fusion<256>, Sharding<ReduceScatter>>> b(t, layout_a(), o);
      const std::size_t n = a.pool_size();
      std::vector<float> wa(n), wb(n), hu_full(n, 0.0f), hu_shard;
      for (int it = 0; it < 4; ++it) {
        REQUIRE(exchange_values(a, t.rank(), it).finite());
        REQUIRE(exchange_values(b, t.rank(), it).finite());
        CHECK(b.generation() == 1);  // moved once, at the first finish()
        CHECK(b.pool_plan().tensor_at == a.pool_plan().tensor_at);
        for (const pool_range g : b.shard()) CHECK(same_bits(a.pool_data() + g.begin, b.pool_data() + g.begin, g.size()));
        if (it == 0) {  // the optimizer state is sized after the move, from the final shard
          for (std::size_t j = 0; j < n; ++j) wa[j] = wb[j] = uniform_value(97, 0, j, 0);
          for (const pool_range g : b.shard()) hu_shard.resize(hu_shard.size() + g.size(), 0.0f);
        }
        step_and_compare(a, b, wa, wb, hu_full, hu_shard);
      }
      std::lock_guard lk(mu);
      shards[static_cast<std::size_t>(t.rank())].assign(b.shard().begin(), b.shard().end());
      buckets = b.buckets();
      total = b.pool_size();
    });
    check_cover(shards, buckets, total);
  }
}

// State packed over a shard: element k of the packed buffer holds the pool index it belongs to.
std::vector<float> indices_of(std::span<const pool_range> shard) {
  std::vector<float> v;
  for (const pool_range g : shard)
    for (std::size_t e = g.begin; e < g.end; ++e) v.push_back(static_cast<float>(e));
  return v;
}

template <class Topo>
void move_follows_replan(int P) {
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>> ex(t, layout_b());
    CHECK(ex.shard_generation() == 0);
    auto state = indices_of(ex.shard());
    CHECK(ex.move_shard_state(state, 0) == state);  // nothing moved yet
    ex.set_fusion(1 << 20);  // one bucket: every block moves
    CHECK(ex.shard_generation() == 1);
    state = ex.move_shard_state(state, 0);
    CHECK(state == indices_of(ex.shard()));
    ex.set_fusion(1 << 20);  // the same plan: no move
    CHECK(ex.shard_generation() == 1);
    ex.set_fusion(64, 8);
    CHECK(ex.shard_generation() == 2);
    state = ex.move_shard_state(state, 1);
    CHECK(state == indices_of(ex.shard()));
    // Errors: a generation not kept, a state of the wrong size; both leave nothing half done.
    try {
      (void)ex.move_shard_state(state, 0);
      FAIL("moved a state two generations old");
    } catch (const usage_error& e) {
      CHECK(e.subject() == "move_shard_state");
      CHECK(std::string(e.what()).find("the state is of shard generation 0; the shards are at generation 2") != std::string::npos);
    }
    std::vector<float> long_state(state.size() + 1);
    try {
      (void)ex.move_shard_state(long_state, 2);
      FAIL("moved a state of the wrong size");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "state");
      CHECK(std::string(e.what()).find(fmt::format("move_shard_state got {} values; this rank's shard of generation 2 holds {}.",
                                                   long_state.size(), state.size())) != std::string::npos);
    }
  });
}

TEST_CASE("sharding: move_shard_state carries a trainer's per-element state to the new shard when the buckets are re-planned") {
  for (int P = 1; P <= 5; ++P) {
    CAPTURE(P);
    move_follows_replan<Topology<Ring>>(P);
  }
  move_follows_replan<Topology<Hierarchical<2>>>(2);
  move_follows_replan<Topology<Hierarchical<2>>>(4);
  move_follows_replan<Topology<Hierarchical<3>>>(6);
}

TEST_CASE("sharding: move_shard_state refuses to move across a new pool layout (learn_order)") {
  inproc::run(2, [&](inproc::transport& t) {
    exchange_options o;
    o.learn_order = true;
    on_inproc<Exchanger<Fusion<256>, Sharding<ReduceScatter>>> ex(t, layout_a(), o);
    const auto before = indices_of(ex.shard());
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());  // the pool is laid out in the learned order
    REQUIRE(ex.shard_generation() == 1);
    try {
      (void)ex.move_shard_state(before, 0);
      FAIL("moved state across a new pool layout");
    } catch (const usage_error& e) {
      CHECK(e.subject() == "move_shard_state");
      CHECK(std::string(e.what()).find("the pool was laid out anew") != std::string::npos);
    }
  });
}

TEST_CASE("sharding: Fusion<Auto> re-plans while it tunes; a ZeRO-2 step that moves its momentum at each re-plan is bitwise the unsharded step") {
  // Tensors of 120 KB: the tuner's probes (64 KiB .. 16 MiB) cut the pool into different buckets.
  const Layout l = Layout::from_sizes(std::vector<std::size_t>(24, 30000));
  for (int P : {2, 3}) {
    CAPTURE(P);
    std::mutex mu;
    std::uint64_t moves = 0;
    inproc::run(P, [&](inproc::transport& t) {
      on_inproc<Exchanger<Fusion<Auto>>> a(t, l);
      on_inproc<Exchanger<Fusion<Auto>, Sharding<ReduceScatter>>> b(t, l);
      const std::size_t n = a.pool_size();
      std::vector<float> wa(n), wb(n), hu_full(n, 0.0f);
      for (std::size_t j = 0; j < n; ++j) wa[j] = wb[j] = uniform_value(96, 0, j, 0);
      std::vector<float> hu_shard(indices_of(b.shard()).size(), 0.0f);
      std::uint64_t gen = b.shard_generation();
      for (int it = 0; it < 40; ++it) {
        REQUIRE(exchange_values(a, t.rank(), it).finite());
        REQUIRE(exchange_values(b, t.rank(), it).finite());
        // The tuner's plan applies at an iteration's first ready(), so after finish() shard() is
        // where this iteration's averages are; the momentum follows the shard when it moved.
        if (b.shard_generation() != gen) {
          hu_shard = b.move_shard_state(hu_shard, gen);
          gen = b.shard_generation();
        }
        step_and_compare(a, b, wa, wb, hu_full, hu_shard);
      }
      std::lock_guard lk(mu);
      moves = b.shard_generation();
    });
    CHECK(moves > 0);  // the tuner did move the shards
  }
}

// Hierarchical<g>: the group's g ranks split each bucket; every group holds the whole average.
template <int G>
void hierarchical_shard_matches(int P) {
  using F = Fusion<256>;
  using Plain = Exchanger<F, Topology<Hierarchical<G>>>;
  using Sharded = Exchanger<F, Topology<Hierarchical<G>>, Sharding<ReduceScatter>>;
  std::mutex mu;
  std::vector<std::vector<pool_range>> shards(static_cast<std::size_t>(P));
  std::vector<bucket> buckets;
  std::size_t total = 0;
  inproc::run(P, [&](inproc::transport& t) {
    const Layout l = layout_a();
    on_inproc<Plain> a(t, l);
    on_inproc<Sharded> b(t, l);
    const std::size_t n = a.pool_size();
    std::vector<float> wa(n), wb(n), hu_full(n, 0.0f), hu_shard;
    for (std::size_t j = 0; j < n; ++j) wa[j] = wb[j] = uniform_value(98, 0, j, 0);
    for (const pool_range g : b.shard()) hu_shard.resize(hu_shard.size() + g.size(), 0.0f);
    for (int it = 0; it < 3; ++it) {
      REQUIRE(exchange_values(a, t.rank(), it).finite());
      REQUIRE(exchange_values(b, t.rank(), it).finite());
      for (const pool_range g : b.shard()) CHECK(same_bits(a.pool_data() + g.begin, b.pool_data() + g.begin, g.size()));
      step_and_compare(a, b, wa, wb, hu_full, hu_shard);
    }
    std::lock_guard lk(mu);
    shards[static_cast<std::size_t>(t.rank())].assign(b.shard().begin(), b.shard().end());
    buckets = b.buckets();
    total = b.pool_size();
  });
  for (int k = 0; k < P / G; ++k)  // each group's shards cover the pool once
    check_cover({shards.begin() + k * G, shards.begin() + (k + 1) * G}, buckets, total);
}

TEST_CASE("sharding: Hierarchical<g> splits each bucket among the group and allreduces each block across groups, bitwise") {
  hierarchical_shard_matches<2>(2);
  hierarchical_shard_matches<2>(4);
  hierarchical_shard_matches<2>(6);
  hierarchical_shard_matches<3>(6);
  hierarchical_shard_matches<1>(3);
  hierarchical_shard_matches<4>(4);
  // every group must hold g ranks
  inproc::run(5, [&](inproc::transport& t) {
    try {
      on_inproc<Exchanger<Topology<Hierarchical<2>>, Sharding<ReduceScatter>>> ex(t, layout_a());
      FAIL("5 ranks in groups of 2 were accepted");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "group_size");
    }
  });
  // the agreed inf / NaN count: each group covers the pool, counted once
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Topology<Hierarchical<2>>, Sharding<ReduceScatter>>> ex(t, layout_a());
    for (std::size_t i = 0; i < ex.layout().size(); ++i) {
      auto v = ex.view(i);
      std::fill(v.begin(), v.end(), 1.0f);
      if (t.rank() == 3 && i == 4) v[0] = v[1] = std::numeric_limits<float>::infinity();
      ex.ready(i);
    }
    CHECK(ex.finish().nonfinite == 2);
  });
}

TEST_CASE("sharding: bad input is a typed error naming the parameter") {
  inproc::run(2, [&](inproc::transport& t) {
    using E = Exchanger<Fusion<256>, Sharding<ReduceScatter>>;
    on_inproc<E> ex(t, layout_a());
    std::vector<float> short_buf(ex.pool_size() - 1);
    try {
      ex.gather_shards(short_buf);
      FAIL("gather_shards accepted a buffer shorter than the pool");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "values");
    }
    ex.ready(0);  // mid-iteration
    std::vector<float> w(ex.pool_size());
    CHECK_THROWS_AS(ex.gather_shards(w), usage_error);
    for (std::size_t i = 1; i < ex.layout().size(); ++i) ex.ready(i);
    (void)ex.finish();
    exchange_options o;
    o.uneven_inputs = true;
    try {
      on_inproc<E> bad(t, layout_a(), o);
      FAIL("a sharded exchanger accepted uneven_inputs");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "uneven_inputs");
    }
  });
  // The transport: ranks that cut the blocks differently.
  inproc::run(2, [&](inproc::transport& t) {
    std::vector<float> send(4, 1.0f), recv(3);
    const std::size_t even[2] = {2, 2}, odd[2] = {3, 1};
    CHECK_THROWS_AS(t.reduce_scatter(send.data(), recv.data(), t.rank() == 0 ? even : odd, reduce_op::sum), mismatch_error);
  });
}
