// Sharding<ReduceScatter> with Sparsifier<OkTopK<d>> (policies/oktopk.hpp, engines/oktopk/engine.hpp
// "Sharded"): each bucket's split-and-reduce over the shard plan's blocks is the reduce-scatter.
// Checked against a reference built from each rank's own selection: the shard holds, bit for bit,
// the rank-order fp32 sum of what the ranks sent for it (divided by P with averaging), zero where
// nobody sent; every residual keeps exactly what its rank did not send; fed = P x applied + held
// exactly on dyadic inputs (fp32, fp16 and bf16 wires); Overlap<Funneled> gives the same; the ZeRO-2 step and
// gather_shards run over it; a checkpoint resumes it bitwise (a corrupt block: engines/test_oktopk.cpp).
#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/transport/inproc.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "compositions.hpp"
#include "topk_reference.hpp"

using namespace gflow;
using namespace gflow_test;

namespace {

/// The owner of pool element i under the ranks' shards (every element has exactly one).
std::vector<int> owners(const rank_trace& tr, std::size_t total) {
  std::vector<int> own(total, -1);
  for (std::size_t r = 0; r < tr.shard.size(); ++r)
    for (const pool_range g : tr.shard[r])
      for (std::size_t i = g.begin; i < g.end; ++i) {
        REQUIRE(own[i] == -1);
        own[i] = static_cast<int>(r);
      }
  for (const int o : own) REQUIRE(o >= 0);
  return own;
}

/// fp32 wire: every iteration, every rank's residual is G (= g + the previous residual) where it
/// did not select and 0 where it did, and the owner's shard holds the rank-order sum of the selected
/// G (times 1/P with averaging), 0 where no rank selected; exchanged() lists those indices.
template <class E, class Gfn>
void check_against_selection(int P, const Layout& l, int iters, Gfn gfn, std::size_t fusion_bytes, bool average) {
  exchange_options o;
  o.average = average;
  auto setup = [](auto& ex) {
    detail::oktopk_params p;
    p.threshold_period = 3;
    ex.sparsifier().set_params(p);
  };
  const auto tr = run_ranks<E>(P, l, iters, gfn, setup, o, fusion_bytes);
  const std::size_t total = l.total_numel();
  const auto own = owners(tr, total);
  const auto Pz = static_cast<std::size_t>(P);
  std::vector<std::vector<float>> prev(Pz, std::vector<float>(total, 0.0f));
  const float inv = 1.0f / static_cast<float>(P);
  for (int it = 0; it < iters; ++it) {
    const auto itz = static_cast<std::size_t>(it);
    CAPTURE(it);
    std::vector<float> sum(total, 0.0f);
    std::vector<char> sent(total, 0);
    for (std::size_t q = 0; q < Pz; ++q) {
      std::vector<char> sel(total, 0);
      for (const std::uint64_t i : tr.selected[itz][q]) sel[i] = 1;
      for (std::size_t i = 0; i < total; ++i) {
        const float G = gfn(static_cast<int>(q), i, it) + prev[q][i];
        const float want_res = sel[i] ? 0.0f : G;
        if (std::memcmp(&want_res, &tr.residual[itz][q][i], sizeof(float)) != 0) {
          CAPTURE(q);
          CAPTURE(i);
          FAIL("residual differs");
        }
        if (sel[i]) {
          sum[i] += G;
          sent[i] = 1;
        }
      }
      prev[q] = tr.residual[itz][q];
    }
    std::vector<std::vector<std::uint64_t>> want_x(Pz);
    for (std::size_t i = 0; i < total; ++i) {
      const auto r = static_cast<std::size_t>(own[i]);
      const float want = sent[i] ? (average ? sum[i] * inv : sum[i]) : 0.0f;
      if (sent[i]) want_x[r].push_back(i);
      if (std::memcmp(&want, &tr.result[itz][r][i], sizeof(float)) != 0) {
        CAPTURE(i);
        CAPTURE(r);
        CAPTURE(want);
        CAPTURE(tr.result[itz][r][i]);
        FAIL("shard value differs");
      }
    }
    for (std::size_t r = 0; r < Pz; ++r) CHECK(tr.exchanged[itz][r] == want_x[r]);
  }
}

float varied(int r, std::size_t i, int it) { return grad(0, r, i, it) * (1.0f + static_cast<float>(i % 7)); }
// Dyadic: multiples of 1/8 below 2^10, so every sum of up to 8 of them is exact.
float dyadic(int r, std::size_t i, int it) { return static_cast<float>(static_cast<int>(grad(0, r, i, it) * 64.0f)) / 8.0f; }

}  // namespace

TEST_CASE("sharded OkTopK: the shard is the rank-order sum of what the ranks selected for it, residuals keep the rest (fp32; fused or not; P = 1..5)") {
  const Layout la = Layout::from_sizes({40, 7, 900, 3, 640, 17, 330});
  const Layout lb = Layout::from_sizes({1, 2, 1000, 5, 257});
  for (int P = 1; P <= 5; ++P) {
    CAPTURE(P);
    check_against_selection<Exchanger<Sparsifier<OkTopK<0.05>>, Sharding<ReduceScatter>>>(P, la, 7, varied, 0, true);
    check_against_selection<Exchanger<Sparsifier<OkTopK<0.05>>, Sharding<ReduceScatter>>>(P, la, 7, varied, 2048, true);
    check_against_selection<Exchanger<Sparsifier<OkTopK<0.02>>, Sharding<ReduceScatter>>>(P, lb, 7, varied, 1024, false);
  }
}

TEST_CASE("sharded OkTopK: fed = P x applied + held exactly on dyadic inputs (fp32 and fp16 wires, fused or not)") {
  const Layout l = Layout::from_sizes({300, 41, 900});
  const std::size_t n = l.total_numel();
  auto run = [&]<class E>(int P, std::size_t fusion_bytes) {
    const int iters = 12;
    const auto tr = run_ranks<E>(P, l, iters, dyadic, {}, {}, fusion_bytes);
    const auto own = owners(tr, n);
    for (std::size_t i = 0; i < n; ++i) {
      double fed = 0, applied = 0, held = 0;
      for (int it = 0; it < iters; ++it) {
        for (int q = 0; q < P; ++q) fed += dyadic(q, i, it);
        applied += static_cast<double>(tr.result[static_cast<std::size_t>(it)][static_cast<std::size_t>(own[i])][i]) * P;
      }
      for (int q = 0; q < P; ++q) held += tr.residual[static_cast<std::size_t>(iters - 1)][static_cast<std::size_t>(q)][i];
      CAPTURE(i);
      REQUIRE(fed == applied + held);
    }
  };
  for (int P : {1, 2, 4, 8}) {
    CAPTURE(P);
    run.template operator()<Exchanger<Sparsifier<OkTopK<0.02>>, Sharding<ReduceScatter>>>(P, 0);
    run.template operator()<Exchanger<Sparsifier<OkTopK<0.02>>, Sharding<ReduceScatter>>>(P, 1024);
    run.template operator()<Exchanger<Sparsifier<OkTopK<0.02>>, Sharding<ReduceScatter>, Precision<half>>>(P, 2048);
    run.template operator()<Exchanger<Sparsifier<OkTopK<0.02>>, Sharding<ReduceScatter>, Precision<bfloat16>>>(P, 0);
  }
}

TEST_CASE("sharded OkTopK: Overlap<Funneled> gives the shards and residuals of Overlap<None> (OkTopK refuses Concurrent and Chained, sharded or not)") {
  const Layout l = Layout::from_sizes({40, 7, 900, 3, 640});
  const int P = 3, iters = 5;
  auto shards_of = [&]<class E>() {
    const auto tr = run_ranks<E>(P, l, iters, varied, {}, {}, 2048);
    const auto own = owners(tr, l.total_numel());
    std::vector<float> v;
    for (int it = 0; it < iters; ++it)
      for (std::size_t i = 0; i < own.size(); ++i) {
        v.push_back(tr.result[static_cast<std::size_t>(it)][static_cast<std::size_t>(own[i])][i]);
        for (int q = 0; q < P; ++q) v.push_back(tr.residual[static_cast<std::size_t>(it)][static_cast<std::size_t>(q)][i]);
      }
    return v;
  };
  using S = Sparsifier<OkTopK<0.05>>;
  const auto base = shards_of.template operator()<Exchanger<S, Sharding<ReduceScatter>>>();
  CHECK(same_bits(base, shards_of.template operator()<Exchanger<S, Sharding<ReduceScatter>, Overlap<Funneled>>>()));
}

TEST_CASE("sharded OkTopK: each rank sends only its selection (no all_gatherv): 3 collectives a bucket, bytes within the split's bound") {
  const Layout l = Layout::from_sizes({4000, 3000});
  const int P = 4;
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<OkTopK<0.01>>, Sharding<ReduceScatter>, Fusion<(16 << 10)>>> ex(t, l);
    for (int it = 0; it < 6; ++it) {
      for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = varied(t.rank(), i, it);
      for (std::size_t b = 0; b < l.size(); ++b) ex.ready(b);
      const auto st = ex.finish();
      const std::size_t units = ex.sparsifier().units();
      CHECK(st.collectives == 3 * units);  // counts (all_to_all), blocks (all_to_allv), fault marks (all_gather)
      // At most capacity x k entries (u32 index + f32 value) leave this rank, plus the fixed bytes per peer.
      const std::size_t cap = 2 * ex.sparsifier().k();
      CHECK(st.wire_bytes <= cap * 8 + units * static_cast<std::size_t>(P - 1) * 128);
    }
  });
}

TEST_CASE("sharded OkTopK: the ZeRO-2 step and gather_shards leave every rank with the same parameters") {
  const Layout l = Layout::from_sizes({40, 7, 900, 3, 640});
  const int P = 3;
  std::vector<std::vector<float>> params(P);
  inproc::run(P, [&](inproc::transport& t) {
    on_inproc<Exchanger<Sparsifier<OkTopK<0.05>>, Sharding<ReduceScatter>, Fusion<4096>>> ex(t, l);
    std::vector<float> w(l.total_numel(), 1.0f);
    for (int it = 0; it < 4; ++it) {
      for (std::size_t i = 0; i < w.size(); ++i) ex.pool_data()[i] = varied(t.rank(), i, it);
      for (std::size_t b = 0; b < l.size(); ++b) ex.ready(b);
      (void)ex.finish();
      for (const pool_range g : ex.shard())
        for (std::size_t i = g.begin; i < g.end; ++i) w[i] -= 0.1f * ex.pool_data()[i];
      ex.gather_shards(w);
    }
    params[static_cast<std::size_t>(t.rank())] = w;
  });
  for (int r = 1; r < P; ++r) CHECK(same_bits(params[0], params[static_cast<std::size_t>(r)]));
  CHECK(std::any_of(params[0].begin(), params[0].end(), [](float v) { return v != 1.0f; }));
}

TEST_CASE("sharded OkTopK: a checkpoint resumes it bit for bit (residual, thresholds)") {
  const Layout l = Layout::from_sizes({900, 77, 300});
  using E = Exchanger<Sparsifier<OkTopK<0.02>>, Sharding<ReduceScatter>, Fusion<2048>>;
  const int P = 3;
  std::vector<std::vector<float>> straight(P), resumed(P);
  auto feed = [&](auto& ex, int r, int it) {
    for (std::size_t i = 0; i < l.total_numel(); ++i) ex.pool_data()[i] = varied(r, i, it);
    for (std::size_t b = 0; b < l.size(); ++b) ex.ready(b);
    (void)ex.finish();
  };
  auto keep = [&](auto& ex, std::vector<float>& out) {
    for (const pool_range g : ex.shard()) out.insert(out.end(), ex.pool_data() + g.begin, ex.pool_data() + g.end);
    const auto res = ex.sparsifier().residual();
    out.insert(out.end(), res.begin(), res.end());
  };
  inproc::run(P, [&](inproc::transport& t) {
    const int r = t.rank();
    std::stringstream file;
    {
      on_inproc<E> a(t, l);
      for (int it = 0; it < 5; ++it) feed(a, r, it);
      a.save_state(file);
      for (int it = 5; it < 11; ++it) {
        feed(a, r, it);
        keep(a, straight[static_cast<std::size_t>(r)]);
      }
    }
    on_inproc<E> b(t, l);
    b.load_state(file);
    for (int it = 5; it < 11; ++it) {
      feed(b, r, it);
      keep(b, resumed[static_cast<std::size_t>(r)]);
    }
  });
  for (int r = 0; r < P; ++r) CHECK(same_bits(straight[static_cast<std::size_t>(r)], resumed[static_cast<std::size_t>(r)]));
}
