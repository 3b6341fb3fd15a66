// Sharding<ReduceScatter> (policies/sharding.hpp; docs/GUIDE.md, "Sharding"): the shard plan, the
// shard's values against the unsharded exchange (bitwise, every wire, fused or not, P = 1..5, every
// Overlap), the ZeRO-2 step (reduce-scatter, step the shard, gather_shards) against allreduce and
// a full step (bitwise, fp32, momentum SGD), the 16-bit gather, the agreed inf / NaN count, and the
// typed errors. In-process transport: it sums in rank order for reduce_scatter and all_reduce alike.
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/optim/momentum_sgd.hpp>
#include <gflow/reshard.hpp>
#include <gflow/transport/inproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <limits>
#include <memory>
#include <span>
#include <mutex>
#include <utility>
#include <sstream>
#include <vector>

#include "checkpoint_streams.hpp"
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

TEST_CASE("sharding: subtract_ranges and unite_ranges agree with element sets on random range lists") {
  std::uint64_t seed = 12345;
  const auto next = [&](std::size_t m) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::size_t>((seed >> 33) % m);
  };
  const std::size_t n = 40;
  const auto random_list = [&] {
    std::vector<pool_range> out;
    for (std::size_t x = next(4); x < n;) {
      const std::size_t e = std::min(n, x + 1 + next(6));
      out.push_back({x, e});
      x = e + next(4);  // touching (0) or apart
    }
    return out;
  };
  const auto elements = [&](const std::vector<pool_range>& l) {
    std::vector<char> in(n, 0);
    for (const pool_range& r : l) {
      CHECK(r.begin < r.end);
      for (std::size_t x = r.begin; x < r.end; ++x) in[x] = 1;
    }
    return in;
  };
  for (int trial = 0; trial < 500; ++trial) {
    const auto a = random_list(), b = random_list();
    const auto ea = elements(a), eb = elements(b);
    const auto d = detail::plan::subtract_ranges(a, b), u = detail::plan::unite_ranges(a, b);
    const auto ed = elements(d), eu = elements(u);
    for (std::size_t x = 0; x < n; ++x) {
      CHECK(ed[x] == (ea[x] && !eb[x]));
      CHECK(eu[x] == (ea[x] || eb[x]));
    }
    for (std::size_t i = 1; i < d.size(); ++i) CHECK(d[i - 1].end <= d[i].begin);  // ascending, disjoint
    for (std::size_t i = 1; i < u.size(); ++i) CHECK(u[i - 1].end < u[i].begin);   // touching ranges joined
  }
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

// Hybrid<t, g>: a bucket below t bytes on the wire is split in the group (two levels), one at or
// above it among all P ranks. In each aligned set of ways[b] ranks, the blocks of bucket b are
// within one element of count / ways[b] and cover it once.
void check_split_cover(const std::vector<std::vector<pool_range>>& shards, const std::vector<bucket>& buckets, const std::vector<int>& ways) {
  const int P = static_cast<int>(shards.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const int w = ways[b];
    REQUIRE(P % w == 0);
    for (int k = 0; k < P / w; ++k) {
      std::vector<int> owners(buckets[b].count, 0);
      for (int q = 0; q < w; ++q) {
        const pool_range g = shards[static_cast<std::size_t>(k * w + q)][b];
        REQUIRE(g.begin >= buckets[b].offset);
        REQUIRE(g.end <= buckets[b].offset + buckets[b].count);
        CHECK(std::abs(static_cast<double>(g.size()) - static_cast<double>(buckets[b].count) / w) < 1.0);
        for (std::size_t e = g.begin; e < g.end; ++e) ++owners[e - buckets[b].offset];
      }
      CHECK(std::all_of(owners.begin(), owners.end(), [](int c) { return c == 1; }));
    }
  }
}

// Plain and Sharded over the same layout on P ranks, three iterations: the shard holds the
// unsharded exchange's bits, and a ZeRO-2 step is bitwise the full step. Returns every rank's shard
// and the buckets.
template <class Plain, class Sharded>
std::pair<std::vector<std::vector<pool_range>>, std::vector<bucket>> shards_after_matching(int P, const Layout& l, int seed) {
  std::mutex mu;
  std::vector<std::vector<pool_range>> shards(static_cast<std::size_t>(P));
  std::vector<bucket> buckets;
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Plain> a(t, l);
    on_inproc<Sharded> b(t, l);
    const std::size_t n = a.pool_size();
    std::vector<float> wa(n), wb(n), hu_full(n, 0.0f), hu_shard(indices_of(b.shard()).size(), 0.0f);
    for (std::size_t j = 0; j < n; ++j) wa[j] = wb[j] = uniform_value(seed, 0, j, 0);
    for (int it = 0; it < 3; ++it) {
      REQUIRE(exchange_values(a, t.rank(), it).finite());
      REQUIRE(exchange_values(b, t.rank(), it).finite());
      for (const pool_range g : b.shard()) CHECK(same_bits(a.pool_data() + g.begin, b.pool_data() + g.begin, g.size()));
      step_and_compare(a, b, wa, wb, hu_full, hu_shard);
    }
    std::lock_guard lk(mu);
    shards[static_cast<std::size_t>(t.rank())].assign(b.shard().begin(), b.shard().end());
    buckets = b.buckets();
  });
  return {shards, buckets};
}

// Hierarchical<g>: the group's g ranks split each bucket; every group holds the whole average.
template <int G>
void hierarchical_shard_matches(int P) {
  using F = Fusion<256>;
  const auto [shards, buckets] =
      shards_after_matching<Exchanger<F, Topology<Hierarchical<G>>>, Exchanger<F, Topology<Hierarchical<G>>, Sharding<ReduceScatter>>>(P, layout_a(), 98);
  check_split_cover(shards, buckets, std::vector<int>(buckets.size(), G));  // each group's shards cover every bucket once
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

// The sharded Hybrid exchange against the unsharded one (the shard's bits and a ZeRO-2 step, three
// iterations), and the split of each bucket: its ways are G below 1024 bytes, P at or above.
template <int G>
void hybrid_shard_matches(int P) {
  using Topo = Topology<Hybrid<1024, G>>;
  // layout_b: 1000 and 257 elements go ring (4000 and 1028 bytes), 1, 2 and 5 hierarchical
  const auto [shards, buckets] = shards_after_matching<Exchanger<Fusion<256>, Topo>, Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>>(P, layout_b(), 97);
  std::vector<int> ways;
  for (const bucket& bk : buckets) ways.push_back(bk.count * sizeof(float) < 1024 ? G : P);
  REQUIRE(std::find(ways.begin(), ways.end(), P) != ways.end());  // both kinds of bucket
  REQUIRE(std::find(ways.begin(), ways.end(), G) != ways.end());
  check_split_cover(shards, buckets, ways);
}

TEST_CASE("sharding: Hybrid<t, g> splits small buckets in the group and large ones among all ranks, bitwise the unsharded Hybrid") {
  hybrid_shard_matches<2>(2);
  hybrid_shard_matches<2>(4);
  hybrid_shard_matches<2>(6);
  hybrid_shard_matches<3>(6);
  hybrid_shard_matches<1>(3);
  // every group must hold g ranks, whatever the threshold
  inproc::run(3, [&](inproc::transport& t) {
    try {
      on_inproc<Exchanger<Topology<Hybrid<1, 2>>, Sharding<ReduceScatter>>> ex(t, layout_a());
      FAIL("3 ranks in groups of 2 were accepted");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "group_size");
    }
  });
  // the agreed inf / NaN count: a small bucket's block is held once per group, a large one's once
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Topology<Hybrid<1024, 2>>, Sharding<ReduceScatter>>> ex(t, layout_b());
    for (std::size_t i = 0; i < ex.layout().size(); ++i) {
      auto v = ex.view(i);
      std::fill(v.begin(), v.end(), 1.0f);
      if (t.rank() == 3 && i == 0) v[0] = std::numeric_limits<float>::infinity();  // 1 element: hierarchical
      if (t.rank() == 1 && i == 2) v[0] = v[999] = std::numeric_limits<float>::quiet_NaN();  // 1000: ring
      ex.ready(i);
    }
    CHECK(ex.finish().nonfinite == 3);
  });
}

TEST_CASE("sharding: a Hybrid threshold moved between iterations re-cuts the shards at the next ready(); the momentum follows, bitwise") {
  using Topo = Topology<Hybrid<1024, 2>>;
  for (int P : {2, 4, 6}) {
    CAPTURE(P);
    inproc::run(P, [&](inproc::transport& t) {
      on_inproc<Exchanger<Fusion<256>, Topo>> a(t, layout_b());
      on_inproc<Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>> b(t, layout_b());
      const std::size_t n = a.pool_size();
      std::vector<float> wa(n), wb(n), hu_full(n, 0.0f), hu_shard(indices_of(b.shard()).size(), 0.0f);
      for (std::size_t j = 0; j < n; ++j) wa[j] = wb[j] = uniform_value(95, 0, j, 0);
      std::uint64_t gen = 0;
      for (int it = 0; it < 6; ++it) {
        if (it == 2 || it == 4) {
          const std::size_t to = it == 2 ? (1 << 20) : 1;  // every bucket hierarchical, then every one ring
          a.topology().set_threshold(to);
          b.topology().set_threshold(to);
          CHECK(b.shard_generation() == gen);  // nothing moves before the iteration starts
        }
        REQUIRE(exchange_values(a, t.rank(), it).finite());
        REQUIRE(exchange_values(b, t.rank(), it).finite());
        if (b.shard_generation() != gen) {
          hu_shard = b.move_shard_state(hu_shard, gen);
          gen = b.shard_generation();
          CHECK(hu_shard.size() == indices_of(b.shard()).size());
        }
        step_and_compare(a, b, wa, wb, hu_full, hu_shard);
      }
      CHECK(gen == (P == 2 ? 0u : 2u));  // at 2 ranks in groups of 2 both splits are the same
    });
  }
  // the placement: a state of pool indices lands where the new shard wants it
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>> b(t, layout_b());
    auto state = indices_of(b.shard());
    b.topology().set_threshold(1 << 20);
    REQUIRE(exchange_values(b, t.rank(), 0).finite());
    REQUIRE(b.shard_generation() == 1);
    state = b.move_shard_state(state, 0);
    CHECK(state == indices_of(b.shard()));
    b.set_fusion(1 << 20);  // one bucket, and still hierarchical: a new plan of both kinds of change
    b.topology().set_threshold(1);
    REQUIRE(exchange_values(b, t.rank(), 1).finite());
    REQUIRE(b.shard_generation() == 3);  // set_fusion re-cut once, the threshold at the next ready() once more
  });
}

TEST_CASE("sharding: load_state of a moved Hybrid threshold gives the saver's shards") {
  using E = Exchanger<Fusion<256>, Topology<Hybrid<1024, 2>>, Sharding<ReduceScatter>>;
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<E> a(t, layout_b());
    a.topology().set_threshold(1 << 20);
    REQUIRE(exchange_values(a, t.rank(), 0).finite());
    std::stringstream ss;
    a.save_state(ss);
    on_inproc<E> b(t, layout_b());
    REQUIRE(indices_of(b.shard()) != indices_of(a.shard()));
    b.load_state(ss);
    CHECK(indices_of(b.shard()) == indices_of(a.shard()));
    CHECK(b.topology().threshold() == (1u << 20));
  });
}

// Uneven inputs: rank r trains batches[r] iterations, then joins. The unsharded job steps every
// element on the ranks that trained (a joined rank's copy goes stale: the last rank to train has
// the job's parameters); the sharded job's joined ranks step their shards in join(after_each) and
// gather, so every rank ends with the unsharded job's parameters, bit for bit.
// With learn_order, a rank that joins before the first finish() learns rank 0's order inside its
// first shadow iteration: its pool and shard move there, and after_each steps the moved shard.
template <class Topo>
void sharded_join_matches(const std::vector<int>& batches, const Layout& l, bool learn_order = false) {
  const int P = static_cast<int>(batches.size());
  const int most = *std::max_element(batches.begin(), batches.end());
  exchange_options o;
  o.uneven_inputs = true;
  o.learn_order = learn_order;
  std::mutex mu;
  std::vector<std::vector<float>> plain(static_cast<std::size_t>(P)), sharded(static_cast<std::size_t>(P));
  std::vector<join_status> plain_js(static_cast<std::size_t>(P));
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Topo>> a(t, l, o);
    std::vector<float> w(a.pool_size()), hu(a.pool_size(), 0.0f);
    for (std::size_t j = 0; j < w.size(); ++j) w[j] = uniform_value(94, 0, j, 0);
    for (int it = 0; it < batches[static_cast<std::size_t>(t.rank())]; ++it) {
      REQUIRE(exchange_values(a, t.rank(), it).finite());
      optim::kernels::momentum_sgd_step_all(w.data(), a.pool_data(), hu.data(), w.size(), 0.05f, 0.9f);
    }
    const join_status js = a.join();
    std::lock_guard lk(mu);
    plain[static_cast<std::size_t>(t.rank())] = w;
    plain_js[static_cast<std::size_t>(t.rank())] = js;
  });
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>> b(t, l, o);
    std::vector<float> w(b.pool_size()), hu;
    for (std::size_t j = 0; j < w.size(); ++j) w[j] = uniform_value(94, 0, j, 0);
    bool sized = false;
    const auto step = [&] {  // the state is sized at the first step, after the first finish() (learn_order's move)
      if (!sized) hu.assign(indices_of(b.shard()).size(), 0.0f);
      sized = true;
      std::size_t at = 0;
      for (const pool_range g : b.shard()) {
        optim::kernels::momentum_sgd_step_all(w.data() + g.begin, b.pool_data() + g.begin, hu.data() + at, g.size(), 0.05f, 0.9f);
        at += g.size();
      }
      b.gather_shards(w);
    };
    const int mine = batches[static_cast<std::size_t>(t.rank())];
    for (int it = 0; it < mine; ++it) {
      REQUIRE(exchange_values(b, t.rank(), it).finite());
      step();
    }
    std::uint64_t stepped = 0;
    const join_status js = b.join([&](const exchange_status& st) {
      CHECK(st.finite());
      CHECK(st.contributors < P);
      step();
      ++stepped;
    });
    CHECK(js.shadowed == static_cast<std::uint64_t>(most - mine));
    CHECK(stepped == js.shadowed);
    CHECK(b.iteration() == static_cast<std::uint64_t>(most));
    if (learn_order) CHECK(b.generation() == 1);  // moved once, at the first finish(), joined or not
    std::lock_guard lk(mu);
    sharded[static_cast<std::size_t>(t.rank())] = w;
  });
  const auto last = static_cast<std::size_t>(plain_js[0].last_rank);
  REQUIRE(batches[last] == most);
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(same_bits(sharded[static_cast<std::size_t>(r)].data(), plain[last].data(), plain[last].size()));
  }
}

TEST_CASE("sharding: join(after_each) steps a joined rank's shard; every rank ends with the unsharded job's parameters, bitwise") {
  for (const auto& b : std::vector<std::vector<int>>{{3, 1}, {0, 2}, {2, 3, 1}, {4, 1, 2, 4}, {1, 1, 1, 3, 2}}) {
    CAPTURE(b.size());
    sharded_join_matches<Topology<Ring>>(b, layout_a());
  }
  sharded_join_matches<Topology<Hierarchical<2>>>({4, 1, 2, 4}, layout_a());
  sharded_join_matches<Topology<Hybrid<1024, 2>>>({2, 4, 1, 3}, layout_b());
  sharded_join_matches<Topology<Hybrid<1024, 3>>>({2, 4, 1, 3, 3, 0}, layout_b());
}

TEST_CASE("sharding: join(after_each) with learn_order on a rank that joins before the first finish(): its shard moves with the learned layout") {
  // exchange_values marks tensors in forward order, the reverse of the default pool order, so
  // rank 0's learned order moves the pool; ranks with 0 batches learn it inside join().
  for (const auto& b : std::vector<std::vector<int>>{{2, 0}, {3, 0, 1}, {2, 0, 0, 3}}) {
    CAPTURE(b.size());
    sharded_join_matches<Topology<Ring>>(b, layout_a(), true);
  }
  sharded_join_matches<Topology<Hierarchical<2>>>({3, 0, 2, 0}, layout_a(), true);
  sharded_join_matches<Topology<Hybrid<1024, 2>>>({1, 0, 3, 2}, layout_b(), true);
}

// ---- checkpoints with the trainer's per-shard state ----------------------------------------------
std::filesystem::path fresh_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("gflow_shard_ckpt_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d;
}

std::vector<float> negated(std::vector<float> v) {
  for (float& x : v) x = -x;
  return v;
}

// Saved on P ranks with two arrays holding each element's pool index (and its negation), loaded on
// P2: each rank's arrays hold its new shard's pool indices, whatever the old and new shards were.
template <class Topo>
void shard_state_follows(int P, int P2, const Layout& l, std::size_t threshold_before_save = 0) {
  using E = Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>;
  const auto root = fresh_dir("follows");
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    if constexpr (requires { ex.topology().set_threshold(std::size_t{1}); })
      if (threshold_before_save) ex.topology().set_threshold(threshold_before_save);
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());
    const auto idx = indices_of(ex.shard());
    const auto neg = negated(idx);
    const auto f = save_checkpoint(ex, root, {idx, neg});
    CHECK(std::filesystem::exists(f));
    CHECK(std::filesystem::exists(shard_state_file(f.parent_path(), t.rank())));
  });
  inproc::run(P2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    std::vector<std::vector<float>> st;
    CHECK(load_checkpoint(ex, root, st) == 1);
    REQUIRE(st.size() == 2);
    const auto want = indices_of(ex.shard());
    CHECK(st[0] == want);
    CHECK(st[1] == negated(want));
  });
  std::filesystem::remove_all(root);
}

TEST_CASE("sharding: a checkpoint holds the per-shard state with its shard; loading on another number of ranks re-shards it") {
  for (auto [P, P2] : std::vector<std::pair<int, int>>{{4, 4}, {4, 3}, {4, 6}, {3, 1}, {1, 3}, {5, 2}}) {
    CAPTURE(P);
    CAPTURE(P2);
    shard_state_follows<Topology<Ring>>(P, P2, layout_a());
  }
  shard_state_follows<Topology<Hierarchical<2>>>(4, 4, layout_a());
  shard_state_follows<Topology<Hierarchical<2>>>(4, 2, layout_a());
  shard_state_follows<Topology<Hierarchical<2>>>(2, 6, layout_a());
  shard_state_follows<Topology<Hybrid<1024, 2>>>(4, 6, layout_b());
  shard_state_follows<Topology<Hybrid<1024, 2>>>(6, 4, layout_b());
  shard_state_follows<Topology<Hybrid<1024, 2>>>(4, 4, layout_b(), 1 << 20);  // the restored threshold gives the saver's shards
  shard_state_follows<Topology<Hybrid<1024, 2>>>(4, 2, layout_b(), 1);
}

TEST_CASE("sharding: resuming a ZeRO-2 loop from a checkpoint with its momentum is bitwise the loop that went on") {
  using E = Exchanger<Fusion<256>, Sharding<ReduceScatter>>;
  const auto root = fresh_dir("resume");
  std::mutex mu;
  std::vector<std::vector<float>> went_on(3), resumed(3), saved_w(3);
  const auto run_iterations = [](auto& ex, int rank, std::vector<float>& w, std::vector<float>& hu, int from, int to) {
    for (int it = from; it < to; ++it) {
      REQUIRE(exchange_values(ex, rank, it).finite());
      std::size_t at = 0;
      for (const pool_range g : ex.shard()) {
        optim::kernels::momentum_sgd_step_all(w.data() + g.begin, ex.pool_data() + g.begin, hu.data() + at, g.size(), 0.05f, 0.9f);
        at += g.size();
      }
      ex.gather_shards(w);
    }
  };
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    std::vector<float> w(ex.pool_size()), hu(indices_of(ex.shard()).size(), 0.0f);
    for (std::size_t j = 0; j < w.size(); ++j) w[j] = uniform_value(93, 0, j, 0);
    run_iterations(ex, t.rank(), w, hu, 0, 3);
    (void)save_checkpoint(ex, root, {hu});
    {
      std::lock_guard lk(mu);
      saved_w[static_cast<std::size_t>(t.rank())] = w;  // the trainer's parameters, saved its own way
    }
    run_iterations(ex, t.rank(), w, hu, 3, 6);
    std::lock_guard lk(mu);
    went_on[static_cast<std::size_t>(t.rank())] = w;
  });
  inproc::run(3, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    std::vector<std::vector<float>> st;
    REQUIRE(load_checkpoint(ex, root, st) == 3);
    REQUIRE(st.size() == 1);
    std::vector<float> w = saved_w[static_cast<std::size_t>(t.rank())];
    run_iterations(ex, t.rank(), w, st[0], 3, 6);
    std::lock_guard lk(mu);
    resumed[static_cast<std::size_t>(t.rank())] = w;
  });
  for (std::size_t r = 0; r < 3; ++r) CHECK(same_bits(went_on[r].data(), resumed[r].data(), went_on[r].size()));
  std::filesystem::remove_all(root);
}

TEST_CASE("sharding: checkpoints with shard state refuse bad input with typed errors") {
  using E = Exchanger<Fusion<256>, Sharding<ReduceScatter>>;
  const auto root = fresh_dir("errors");
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());
    std::vector<float> short_state(indices_of(ex.shard()).size() - 1);
    try {
      (void)save_checkpoint(ex, root, {short_state});
      FAIL("saved a shard state of the wrong size");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "shard_state");
      CHECK(std::string(e.what()).find(fmt::format("shard state array 0 has {} values; this rank's shard holds {}.", short_state.size(),
                                                   short_state.size() + 1)) != std::string::npos);
    }
    (void)save_checkpoint(ex, root);  // without shard state
  });
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    std::vector<std::vector<float>> st{{1.0f}};
    try {
      (void)load_checkpoint(ex, root, st);
      FAIL("loaded shard state from a set saved without it");
    } catch (const invalid_argument& e) {
      CHECK(e.subject() == "root");
      CHECK(std::string(e.what()).find("the checkpoint set has no shard state file") != std::string::npos);
    }
    CHECK(st == std::vector<std::vector<float>>{{1.0f}});  // unchanged
  });
  std::filesystem::remove_all(root);
  // A shard file of another save (another iteration) in the set; then a changed byte.
  const auto other = fresh_dir("errors_other");
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());
    const auto idx = indices_of(ex.shard());
    (void)save_checkpoint(ex, other, {idx});
    REQUIRE(exchange_values(ex, t.rank(), 1).finite());
    (void)save_checkpoint(ex, root, {idx});
  });
  const auto set = checkpoint_set_dir(root, 2);
  std::filesystem::copy_file(shard_state_file(checkpoint_set_dir(other, 1), 0), shard_state_file(set, 0), std::filesystem::copy_options::overwrite_existing);
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    std::vector<std::vector<float>> st;
    if (t.rank() == 0) {
      try {
        (void)load_checkpoint(ex, root, st);
        FAIL("loaded a shard file of another iteration");
      } catch (const mismatch_error& e) {
        CHECK(e.subject() == "shard_state");
        CHECK(std::string(e.what()).find("holds the state of iteration 1; the exchanger's checkpoint is of iteration 2.") != std::string::npos);
      }
      CHECK(ex.iteration() == 0);  // the exchanger's own state was put back: the failed load changed nothing
    } else {
      CHECK(load_checkpoint(ex, root, st) == 2);  // rank 1's own file covers its shard
    }
  });
  {
    const auto f = shard_state_file(set, 1);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-12, std::ios::end);  // inside the last array
    io.put('\x7f');
  }
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    std::vector<std::vector<float>> st;
    if (t.rank() == 1) CHECK_THROWS_AS((void)load_checkpoint(ex, root, st), parse_error);
    else CHECK_THROWS_AS((void)load_checkpoint(ex, root, st), mismatch_error);
  });
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(other);
}

// ---- the offline re-shard of a set with shard state (reshard_checkpoints, gflow-reshard) ---------
std::string file_bytes(const std::filesystem::path& f) {
  std::ifstream in(f, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Saved on P ranks (state: each element's pool index, and the index + 10000 x the saving rank),
// rewritten offline for P2 ranks, written as a set of P2 and loaded there: every rank's state holds
// its new shard's indices, and the second array names the rank the rule took each element from (the
// lowest old rank that held it, where groups hold the same block; with P2 = P the rank's own). The
// new shard files cover the pool, once when P2 != P; with P2 = P they are the old bytes.
template <class Topo>
void offline_reshard_follows(int P, int P2, const Layout& l) {
  namespace fs = std::filesystem;
  using E = Exchanger<Fusion<256>, Topo, Sharding<ReduceScatter>>;
  const auto root = fresh_dir("offline_in"), root2 = fresh_dir("offline_out");
  std::size_t pool = 0;
  std::vector<std::vector<float>> saved_shards(static_cast<std::size_t>(P));
  const auto tagged = [](std::vector<float> v, int rank) {
    for (float& x : v) x += 10000.0f * static_cast<float>(rank);
    return v;
  };
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    if (t.rank() == 0) pool = ex.pool_size();
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());
    const auto idx = indices_of(ex.shard());
    saved_shards[std::size_t(t.rank())] = idx;
    (void)save_checkpoint(ex, root, {idx, tagged(idx, t.rank())});
  });
  std::vector<int> lowest(pool, -1);  // the lowest old rank whose shard held each element
  for (int r = P - 1; r >= 0; --r)
    for (float e : saved_shards[std::size_t(r)]) lowest[std::size_t(e)] = r;
  const fs::path dir = checkpoint_set_dir(root, 1);
  std::vector<std::string> ck, sh;
  for (int r = P - 1; r >= 0; --r) {  // any order
    ck.push_back(file_bytes(checkpoint_file(dir, r)));
    sh.push_back(file_bytes(shard_state_file(dir, r)));
  }
  const streams cks(ck), shs(sh);
  const resharded_set out = reshard_checkpoints(cks.span(), shs.span(), P2);
  REQUIRE(out.checkpoints.size() == std::size_t(P2));
  REQUIRE(out.shard_states.size() == std::size_t(P2));
  std::vector<detail::plan::pool_range> covered;
  std::size_t held = 0;
  for (int r = 0; r < P2; ++r) {
    std::istringstream in(out.shard_states[std::size_t(r)], std::ios::binary);
    const detail::shard_image img = detail::read_shard_image(in);
    CHECK(img.id.rank == std::uint32_t(r));
    CHECK(img.id.size == std::uint32_t(P2));
    REQUIRE(img.arrays.size() == 2);
    for (const auto& g : img.ranges) held += g.size();
    covered = detail::plan::unite_ranges(covered, img.ranges);
    if (P2 == P) CHECK(out.shard_states[std::size_t(r)] == file_bytes(shard_state_file(dir, r)));
  }
  if (P2 != P) CHECK(held == pool);  // disjoint (P2 = P: the old files, whose groups may hold the same blocks) ...
  CHECK(covered == std::vector<detail::plan::pool_range>{{0, pool}});  // ... and covering
  const fs::path dir2 = checkpoint_set_dir(root2, 1);
  fs::create_directories(dir2);
  for (int r = 0; r < P2; ++r) {
    write_file_atomically(shard_state_file(dir2, r), out.shard_states[std::size_t(r)]);
    write_file_atomically(checkpoint_file(dir2, r), out.checkpoints[std::size_t(r)]);
  }
  inproc::run(P2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, l);
    std::vector<std::vector<float>> st;
    CHECK(load_checkpoint(ex, root2, st) == 1);
    REQUIRE(st.size() == 2);
    const auto want = indices_of(ex.shard());
    CHECK(st[0] == want);
    std::vector<float> from = want;
    for (float& x : from) x += 10000.0f * static_cast<float>(P2 == P ? t.rank() : lowest[std::size_t(x)]);
    CHECK(st[1] == from);
  });
#ifdef GFLOW_RESHARD_EXE
  // The tool, given the whole directory's files (rank and shard files mixed), writes the same bytes.
  const fs::path tool_out = root2 / "tool";
  std::string args;
  for (int r = 0; r < P; ++r) args += " " + shard_state_file(dir, r).string() + " " + checkpoint_file(dir, r).string();
  REQUIRE(std::system((std::string(GFLOW_RESHARD_EXE) + " --size " + std::to_string(P2) + " --out " + tool_out.string() + args + " > /dev/null").c_str()) == 0);
  for (int r = 0; r < P2; ++r) {
    CHECK(file_bytes(shard_state_file(tool_out, r)) == out.shard_states[std::size_t(r)]);
    CHECK(file_bytes(checkpoint_file(tool_out, r)) == out.checkpoints[std::size_t(r)]);
  }
#endif
  fs::remove_all(root);
  fs::remove_all(root2);
}

TEST_CASE("sharding: gflow-reshard and reshard_checkpoints rewrite the shard state for another number of ranks; load_checkpoint takes it") {
  for (auto [P, P2] : std::vector<std::pair<int, int>>{{4, 4}, {4, 3}, {4, 6}, {3, 1}, {1, 3}, {5, 2}}) {
    CAPTURE(P);
    CAPTURE(P2);
    offline_reshard_follows<Topology<Ring>>(P, P2, layout_a());
  }
  offline_reshard_follows<Topology<Hierarchical<2>>>(4, 2, layout_a());  // ranks 0 and 2, 1 and 3 hold the same blocks
  offline_reshard_follows<Topology<Hierarchical<2>>>(4, 4, layout_a());
  offline_reshard_follows<Topology<Hierarchical<2>>>(2, 6, layout_a());
  offline_reshard_follows<Topology<Hierarchical<2>>>(6, 4, layout_a());
  offline_reshard_follows<Topology<Hybrid<1024, 2>>>(6, 4, layout_b());
}

TEST_CASE("sharding: a rank whose shard is empty may save no arrays; loading online and offline takes the count from the others") {
  namespace fs = std::filesystem;
  using E = Exchanger<Fusion<256>, Sharding<ReduceScatter>>;
  const Layout tiny = Layout::from_sizes({1, 2});  // one bucket of 3 elements: at 4 ranks, rank 3's shard is empty
  const auto root = fresh_dir("empty_shard"), root2 = fresh_dir("empty_shard_out");
  inproc::run(4, [&](inproc::transport& t) {
    on_inproc<E> ex(t, tiny);
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());
    const auto idx = indices_of(ex.shard());
    CHECK(idx.empty() == (t.rank() == 3));
    if (idx.empty()) (void)save_checkpoint(ex, root, {});  // as a Python optimizer with no view saves
    else (void)save_checkpoint(ex, root, {idx});
  });
  const auto check_load = [&](const fs::path& r, int P2) {
    inproc::run(P2, [&](inproc::transport& t) {
      on_inproc<E> ex(t, tiny);
      std::vector<std::vector<float>> st;
      REQUIRE(load_checkpoint(ex, r, st) == 1);
      REQUIRE(st.size() == 1);  // the set's count, an empty-shard rank included
      CHECK(st[0] == indices_of(ex.shard()));
    });
  };
  check_load(root, 4);
  check_load(root, 2);
  const fs::path dir = checkpoint_set_dir(root, 1);
  for (int P2 : {4, 2, 5}) {
    CAPTURE(P2);
    std::vector<std::string> ck, sh;
    for (int r = 0; r < 4; ++r) {
      ck.push_back(file_bytes(checkpoint_file(dir, r)));
      sh.push_back(file_bytes(shard_state_file(dir, r)));
    }
    const streams cks(ck), shs(sh);
    const resharded_set out = reshard_checkpoints(cks.span(), shs.span(), P2);
    fs::remove_all(root2);
    const fs::path dir2 = checkpoint_set_dir(root2, 1);
    fs::create_directories(dir2);
    for (int r = 0; r < P2; ++r) {
      if (P2 == 4) CHECK(out.shard_states[std::size_t(r)] == sh[std::size_t(r)]);
      write_file_atomically(shard_state_file(dir2, r), out.shard_states[std::size_t(r)]);
      write_file_atomically(checkpoint_file(dir2, r), out.checkpoints[std::size_t(r)]);
    }
    check_load(root2, P2);
  }
  fs::remove_all(root);
  fs::remove_all(root2);
}

TEST_CASE("sharding: an offline re-shard refuses shard files of another save, size or a missing rank, and writes nothing") {
  namespace fs = std::filesystem;
  using E = Exchanger<Fusion<256>, Sharding<ReduceScatter>>;
  const auto root = fresh_dir("offline_bad");
  inproc::run(2, [&](inproc::transport& t) {
    on_inproc<E> ex(t, layout_a());
    REQUIRE(exchange_values(ex, t.rank(), 0).finite());
    const auto idx = indices_of(ex.shard());
    (void)save_checkpoint(ex, root, {idx});
    REQUIRE(exchange_values(ex, t.rank(), 1).finite());
    (void)save_checkpoint(ex, root, {idx});
  });
  const fs::path one = checkpoint_set_dir(root, 1), two = checkpoint_set_dir(root, 2);
  const std::vector<std::string> ck{file_bytes(checkpoint_file(two, 0)), file_bytes(checkpoint_file(two, 1))};
  const auto refuse = [&](const std::vector<std::string>& shards, const std::string& subject, const std::string& says) {
    const streams cks(ck), shs(shards);
    try {
      (void)reshard_checkpoints(cks.span(), shs.span(), 3);
      FAIL("re-sharded a bad set");
    } catch (const error& e) {
      CHECK(e.subject() == subject);
      CHECK_MESSAGE(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  refuse({file_bytes(shard_state_file(two, 0))}, "shard_states", "rank 1's is missing");
  refuse({file_bytes(shard_state_file(one, 0)), file_bytes(shard_state_file(one, 1))}, "iteration",
         "the shard state files are of iteration 1; the checkpoints of iteration 2.");
  refuse({file_bytes(shard_state_file(two, 0)), file_bytes(shard_state_file(one, 1))}, "iteration", "the set mixes generations");
  refuse({file_bytes(shard_state_file(two, 0)), file_bytes(shard_state_file(two, 0))}, "shard_states", "rank 0 appears twice");
  std::string cut = file_bytes(shard_state_file(two, 1));
  cut.resize(cut.size() - 5);
  refuse({file_bytes(shard_state_file(two, 0)), cut}, "shard_states", "shard state file 1 of the set cannot be read");
#ifdef GFLOW_RESHARD_EXE
  const fs::path out = root / "out";
  const std::string exe = GFLOW_RESHARD_EXE;
  CHECK(std::system((exe + " --size 3 --out " + out.string() + " " + checkpoint_file(two, 0).string() + " " + checkpoint_file(two, 1).string() + " " +
                     shard_state_file(two, 0).string() + " 2> /dev/null")
                        .c_str()) == 256);
  CHECK_FALSE(fs::exists(out));
  CHECK(std::system((exe + " --size 3 --out " + out.string() + " " + shard_state_file(two, 0).string() + " " + shard_state_file(two, 1).string() +
                     " 2> /dev/null")
                        .c_str()) == 512);  // usage: no checkpoints
  CHECK_FALSE(fs::exists(out));
#endif
  fs::remove_all(root);
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
  });
  // The transport: ranks that cut the blocks differently.
  inproc::run(2, [&](inproc::transport& t) {
    std::vector<float> send(4, 1.0f), recv(3);
    const std::size_t even[2] = {2, 2}, odd[2] = {3, 1};
    CHECK_THROWS_AS(t.reduce_scatter(send.data(), recv.data(), t.rank() == 0 ? even : odd, reduce_op::sum), mismatch_error);
  });
}
